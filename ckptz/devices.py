"""The device a command asks for, read before anything heavy loads, and its CUDA context
started then.

This module imports nothing of ckptz's pipeline or engines (nor numpy), so the CLI can call
:func:`warm_named_gpu` as soon as it has parsed its options: creating a CUDA context and
importing the modules a compression needs both take a noticeable part of a second, and they
overlap only if the context is started first.
Choosing the engine itself is :mod:`ckptz.engines`'.
"""

from __future__ import annotations

import importlib.util

from ckptz import settings
from ckptz.errors import UsageError

#: ``--codec`` values that name the portable bitstream, which CPU and GPU both write.
PORTABLE_CODECS: tuple[str, ...] = ("auto", "zstd")


def requested_device(device: str | None) -> str:
    """The device the user asked for: the flag, else ``$CKPTZ_DEVICE``, else ``auto``."""
    value = (device or str(settings.value("device"))).strip().lower()
    if value in ("auto", "cpu", "cuda") or (value.startswith("cuda:") and value[5:].isdigit()):
        return value
    raise UsageError(f"unknown device {value!r}", hint="use auto, cpu, cuda or cuda:N")


def nvcomp_installed() -> bool:
    """Whether nvCOMP's C library (the ``nvidia-libnvcomp`` wheel) is installed."""
    return (
        importlib.util.find_spec("nvidia") is not None
        and importlib.util.find_spec("nvidia.libnvcomp") is not None
    )


def warm_context(want: str) -> None:
    """Start creating the CUDA context of ``want`` (``auto``/``cuda``: device 0) on a thread
    of its own (:func:`ckptz.cuda.warm`, once per device), where nvCOMP is installed."""
    if nvcomp_installed():
        from ckptz import cuda

        cuda.warm(int(want[5:]) if want.startswith("cuda:") else 0)


def warm_named_gpu(device: str | None, codec: str) -> None:
    """Start the CUDA context at once where a command names a GPU: such a run codes on that
    GPU from its first frame whatever its size or codec (:func:`ckptz.engines.engine_kind`).
    With ``auto``, where that depends on the job's size or codec, :func:`ckptz.engines.warm_gpu`
    decides later, once they are known (warming twice starts one context). A bad device name
    is left for the run to report."""
    try:
        want = requested_device(device)
    except UsageError:
        return
    if want.startswith("cuda"):
        warm_context(want)
