"""Choosing where the codec runs: ``auto``, ``cpu`` or ``cuda[:N]`` (also ``$CKPTZ_DEVICE``).

Probing a GPU asks the CUDA driver how many devices it sees (no torch), so it happens only
when a GPU could be used; on a machine without nvCOMP ``auto`` settles on the CPU at once.
"""

from __future__ import annotations

import importlib.util

from ckptz.codecs.table import CHOOSABLE
from ckptz.devices import PORTABLE_CODECS, nvcomp_installed, requested_device, warm_context
from ckptz.engines.base import Engine
from ckptz.engines.cpu import CpuEngine
from ckptz.engines.hybrid import GPU_JOIN_BYTES, HybridEngine, join_bytes, write_bytes
from ckptz.errors import DeviceError, UsageError

#: ``--codec`` values the CPU engine accepts: its coder writes these bitstreams itself.
CODECS_CPU: tuple[str, ...] = ("auto", *(b.name for b in CHOOSABLE if b.cpu is not None))
#: ``--codec`` values only a GPU can write (and decode).
GPU_ONLY_CODECS: tuple[str, ...] = tuple(b.name for b in CHOOSABLE if b.cpu is None)


def gpu_setup_reason() -> str | None:
    """Why no GPU engine can run here, where that shows without starting the CUDA driver
    (loading its library is cheap; starting it is not): no driver comes first, since
    installing nvCOMP would not help a machine without one."""
    from ckptz import cuda

    if not cuda.driver_installed():
        return "no CUDA driver on this machine"
    if not nvcomp_installed():
        return "nvCOMP is not installed (pip install 'ckptz[gpu]')"
    if importlib.util.find_spec("ckptz.engines.gpu") is None:
        return "this ckptz build has no GPU engine"
    return None


def gpu_unavailable_reason() -> str | None:
    """Why no GPU engine can run here, or None if one can."""
    reason = gpu_setup_reason()
    if reason is not None:
        return reason
    from ckptz import cuda

    try:
        if cuda.device_count() == 0:
            return "no CUDA device is visible"
    except OSError:
        return "no CUDA driver on this machine"
    except cuda.DriverError as exc:
        return f"the CUDA driver would not start ({exc})"
    return None


def check_device(device: str | None, codec: str = "auto", writes: bool = False) -> None:
    """Refuse, before a run creates anything, a GPU it cannot have: one named with
    ``--device cuda[:N]``, or one that a compression with a GPU-only ``codec`` needs. Only
    what shows without starting the CUDA driver is checked here (:func:`open_engine`
    checks the rest while the run scans its files).

    Raises:
        UsageError: unknown device.
        DeviceError: no GPU can be used here.
    """
    want = requested_device(device)
    named = want.startswith("cuda")
    if not (named or (writes and codec.lower() in GPU_ONLY_CODECS)):
        return
    reason = gpu_setup_reason()
    if reason is None:
        return
    if named:
        raise DeviceError(f"cannot use {want}: {reason}", hint="use --device cpu or --device auto")
    raise DeviceError(f"codec {codec.lower()!r} runs only on a GPU: {reason}", hint="use --codec zstd")


def writes_portable_on_gpu(want: str, codec: str, writes: bool, job_bytes: int = 0) -> bool:
    """Whether an engine that ``writes`` (compresses) on device ``want`` with ``codec`` codes
    the portable bitstream on the GPU from the first frame, where the GPU writes its literal
    frames (:mod:`ckptz.engines.gpu.literals`, nvCOMP installed): where a GPU was asked for by name, for a job of
    :func:`~ckptz.engines.hybrid.write_bytes` or more (smaller ones finish sooner on the CPU
    threads than the GPU starts), or with ``auto`` for a job of
    :func:`~ckptz.engines.hybrid.join_bytes` or more (the size at which the GPU would join
    the CPU threads anyway; a GPU shared with training is left alone below it); there the GPU
    codes faster than the CPU threads. Restores of the bitstream stay on the CPU threads
    (:class:`HybridEngine`)."""
    if not writes or codec not in PORTABLE_CODECS or not nvcomp_installed():
        return False
    if want.startswith("cuda"):
        return job_bytes >= write_bytes()
    return want == "auto" and job_bytes >= join_bytes()


def warm_gpu(device: str | None, codec: str = "auto", writes: bool = False, job_bytes: int = 0) -> None:
    """Start bringing up the GPU a run will code on from its first frame (its CUDA context,
    on a thread of its own) while the run scans and plans its files: where ``device`` names
    a GPU and ``codec`` is not the portable bitstream, or ``auto`` with a bitstream only a
    GPU codes, or where a compression of ``job_bytes`` writes the portable bitstream on the
    GPU (:func:`writes_portable_on_gpu`).
    Otherwise the portable bitstream is coded on the CPU threads first, and
    :class:`HybridEngine` brings the GPU up itself once a job is long enough
    (:func:`~ckptz.engines.hybrid.join_bytes`; at once where that is 0): a context made
    for nothing would cost the run its creation and, at exit, its teardown. Anything wrong
    is left for :func:`open_engine` to report."""
    try:
        want = requested_device(device)
        codec = codec.lower()
        portable_gpu = writes_portable_on_gpu(want, codec, writes, job_bytes)
        gpu_first = codec not in PORTABLE_CODECS or join_bytes() == 0 or portable_gpu
    except UsageError:
        return
    if (want.startswith("cuda") and gpu_first) or (
        want == "auto" and (codec in GPU_ONLY_CODECS or portable_gpu)
    ):
        # The GPU engine itself (not the hybrid, which brings the GPU up later).
        warm_context(want)


def open_gpu(want: str, *, threads: int | None, level: int, codec: str, memory: int | None) -> Engine:
    """The GPU engine on ``want``.

    Raises:
        DeviceError: no GPU engine can run here, or on ``want``.
    """
    warm_context(want)  # the context comes up while the engine's modules load
    reason = gpu_unavailable_reason()
    if reason is not None:
        gpu_only = want == "auto" and codec not in PORTABLE_CODECS
        what = (
            f"codec {codec!r} runs only on a GPU"
            if gpu_only
            else ("no GPU can be used" if want == "auto" else f"cannot use {want}")
        )
        hint = "use --codec zstd" if gpu_only else "use --device cpu"
        raise DeviceError(f"{what}: {reason}", hint=hint)
    from ckptz.engines.gpu import open_gpu_engine

    return open_gpu_engine(want, threads=threads, level=level, codec=codec, memory=memory)


def open_engine(
    device: str | None = None,
    *,
    threads: int | None = None,
    level: int = 3,
    codec: str = "auto",
    memory: int | None = None,
    writes: bool = False,
    job_bytes: int = 0,
) -> tuple[Engine, str | None]:
    """Open the engine for ``device``; return it with a notice for the user, if any. An
    engine that ``writes`` (compresses) ``job_bytes`` may code the portable bitstream on the
    GPU where one that restores decodes it on the CPU threads (:func:`writes_portable_on_gpu`).

    Raises:
        UsageError: unknown device or codec.
        DeviceError: a GPU was asked for explicitly and cannot be used.
    """
    want = requested_device(device)
    codec = codec.lower()
    if want.startswith("cuda"):
        # A GPU asked for by name codes there or the run fails: it never settles on the CPU
        # threads for want of a GPU, even where a small job would start on them.
        reason = gpu_unavailable_reason()
        if reason is not None:
            raise DeviceError(f"cannot use {want}: {reason}", hint="use --device cpu or --device auto")
    if writes_portable_on_gpu(want, codec, writes, job_bytes) and (
        want != "auto" or gpu_unavailable_reason() is None
    ):
        return open_gpu(want, threads=threads, level=level, codec="zstd", memory=memory), None
    if want != "cpu" and codec in PORTABLE_CODECS and nvcomp_installed():
        # The portable bitstream: CPU threads start at once, the GPU joins when it is up.
        def start_gpu() -> Engine:
            return open_gpu(want, threads=threads, level=level, codec="zstd", memory=memory)

        hybrid = HybridEngine(CpuEngine(threads, level), start_gpu, required=want != "auto")
        notice = None
        if want != "auto":
            # Only the job's size kept it off the GPU, or the GPU cannot write the bitstream.
            small = writes_portable_on_gpu(want, codec, writes, max(job_bytes, write_bytes()))
            why = (
                f"a job under {write_bytes() >> 30} GiB finishes there before the GPU starts"
                if small
                else "faster than nvCOMP Zstd"
            )
            notice = (
                f"{want}: the portable bitstream is coded on the CPU threads ({why}); the GPU joins"
                f" jobs over {GPU_JOIN_BYTES >> 30} GiB where it codes faster (--codec ans codes on the GPU)"
            )
        return hybrid, notice
    if want == "cpu" or (want == "auto" and codec not in GPU_ONLY_CODECS):
        reason = None if want == "cpu" else gpu_unavailable_reason()
        if want == "cpu" or reason is not None:
            if codec not in CODECS_CPU:
                raise DeviceError(
                    f"codec {codec!r} runs only on a GPU", hint="use --codec zstd or --device cuda"
                )
            notice = None if want == "cpu" else f"running on the CPU: {reason}"
            return CpuEngine(threads, level), notice
    try:
        engine = open_gpu(want, threads=threads, level=level, codec=codec, memory=memory)
    except DeviceError as exc:
        if want != "auto" or codec not in CODECS_CPU:
            raise
        return CpuEngine(threads, level), f"running on the CPU: {exc.message}"
    return engine, None
