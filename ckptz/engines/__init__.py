"""Choosing where the codec runs: ``auto``, ``cpu`` or ``cuda[:N]`` (also ``$CKPTZ_DEVICE``).

The rule (:func:`engine_kind`): ``cuda[:N]`` codes on that GPU from the first frame, in both
directions and for every job size, or the run fails; ``cpu`` codes on the CPU threads;
``auto`` codes on the CPU threads, with the first GPU (nvCOMP installed) joining jobs of
:data:`~ckptz.engines.hybrid.GPU_JOIN_BYTES` and more, and a GPU-only codec uses the GPU.

Probing a GPU asks the CUDA driver how many devices it sees (no torch), so it happens only
when a GPU could be used; on a machine without nvCOMP ``auto`` settles on the CPU at once.
"""

from __future__ import annotations

import importlib.util
from typing import Literal

from ckptz.codecs.table import CHOOSABLE
from ckptz.devices import PORTABLE_CODECS, nvcomp_installed, requested_device, warm_context
from ckptz.engines.base import Engine
from ckptz.engines.cpu import CpuEngine
from ckptz.engines.hybrid import GPU_JOIN_BYTES, HybridEngine
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


#: Which engine codes a job: the GPU engine, the CPU threads with the GPU joining
#: (:class:`HybridEngine`), or the CPU threads alone.
EngineKind = Literal["gpu", "hybrid", "cpu"]


def engine_kind(want: str, codec: str, *, writes: bool, job_bytes: int, nvcomp: bool) -> EngineKind:
    """The engine a job of ``job_bytes`` that ``writes`` (compresses; else restores) with
    ``codec`` opens on device ``want`` (as :func:`~ckptz.devices.requested_device` gives it),
    where nvCOMP is installed or not (``nvcomp``):

    - ``cuda[:N]``: the GPU engine, for every job in both directions (it writes the portable
      bitstream with its literal coder and decodes it with ckptz's kernels and nvCOMP);
    - ``cpu``: the CPU threads;
    - ``auto``: the GPU engine for a GPU-only codec, and for a compression of the portable
      bitstream of :data:`GPU_JOIN_BYTES` or more (the GPU codes it faster, and a GPU shared
      with training is left alone for smaller jobs); else the CPU threads, with the GPU
      joining jobs of :data:`GPU_JOIN_BYTES` and more where nvCOMP is installed."""
    if want.startswith("cuda"):
        return "gpu"
    if want == "cpu":
        return "cpu"
    if codec in GPU_ONLY_CODECS:
        return "gpu"
    if codec not in PORTABLE_CODECS or not nvcomp:
        return "cpu"
    return "gpu" if writes and job_bytes >= GPU_JOIN_BYTES else "hybrid"


def warm_gpu(device: str | None, codec: str = "auto", writes: bool = False, job_bytes: int = 0) -> None:
    """Start bringing up the GPU a run will code on from its first frame (its CUDA context,
    on a thread of its own) while the run scans and plans its files: where
    :func:`engine_kind` opens the GPU engine for it. :class:`HybridEngine` brings the GPU up
    itself once a job is long enough: a context made for nothing would cost the run its
    creation and, at exit, its teardown. Anything wrong is left for :func:`open_engine` to
    report."""
    try:
        want = requested_device(device)
    except UsageError:
        return
    codec = codec.lower()
    if engine_kind(want, codec, writes=writes, job_bytes=job_bytes, nvcomp=nvcomp_installed()) == "gpu":
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
    """Open the engine that :func:`engine_kind` picks for ``device``, for a job that
    ``writes`` (compresses; else restores) ``job_bytes``; return it with a notice for the
    user, if any.

    Raises:
        UsageError: unknown device or codec.
        DeviceError: a GPU was asked for explicitly and cannot be used.
    """
    want = requested_device(device)
    codec = codec.lower()
    kind = engine_kind(want, codec, writes=writes, job_bytes=job_bytes, nvcomp=nvcomp_installed())
    gpu_codec = "zstd" if codec in PORTABLE_CODECS else codec
    if want.startswith("cuda"):
        # A GPU asked for by name codes there or the run fails: it never settles on the CPU
        # threads, whatever the job's size.
        reason = gpu_unavailable_reason()
        if reason is not None:
            raise DeviceError(f"cannot use {want}: {reason}", hint="use --device cpu or --device auto")
        return open_gpu(want, threads=threads, level=level, codec=gpu_codec, memory=memory), None
    if kind == "gpu" and codec in PORTABLE_CODECS and gpu_unavailable_reason() is None:
        return open_gpu(want, threads=threads, level=level, codec=gpu_codec, memory=memory), None
    if kind != "cpu" and codec in PORTABLE_CODECS:
        # The portable bitstream: CPU threads start at once, the GPU joins when it is up.
        def start_gpu() -> Engine:
            return open_gpu(want, threads=threads, level=level, codec=gpu_codec, memory=memory)

        return HybridEngine(CpuEngine(threads, level), start_gpu, required=False), None
    if kind == "cpu":
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
