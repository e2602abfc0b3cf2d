"""The GPU engine: nvCOMP codecs and the transform on the GPU.

Importing this package loads neither CUDA nor nvCOMP; :func:`open_gpu_engine` does, when
called (the engine needs no torch), and :func:`raw_codec` (``ckptz bench``'s reference rows,
through nvCOMP's Python binding) imports torch. Decoding a container into device memory is the
pipeline's (:mod:`ckptz.pipeline.device`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ckptz.codecs.table import CHOOSABLE
from ckptz.errors import DeviceError, UsageError

if TYPE_CHECKING:
    from ckptz.engines.gpu.engine import GpuEngine
    from ckptz.engines.gpu.nvcomp_codecs import RawNvcomp

#: ``--codec`` values the GPU engine accepts besides ``auto``.
GPU_CODECS: tuple[str, ...] = tuple(b.name for b in CHOOSABLE)


def _codec_name(codec: str, level: int) -> str:
    name = codec.lower()
    if name == "auto":
        return "zstd"
    if name not in GPU_CODECS:
        raise UsageError(f"codec {codec!r} has no GPU implementation", hint="use --codec zstd or ans")
    return name


def open_gpu_engine(
    want: str, *, threads: int | None = None, level: int = 3, codec: str = "auto", memory: int | None = None
) -> GpuEngine:
    """Open the GPU engine on ``want`` (``auto``, ``cuda`` or ``cuda:N``).

    ``auto`` and ``cuda`` take the first device where CUDA and nvCOMP work. ``level`` is the
    CPU coder's, which codes the metadata frames (:data:`~ckptz.engines.base.HOST_COMPONENTS`).

    Raises:
        UsageError: the codec has no GPU implementation.
        DeviceError: no such device, or CUDA/nvCOMP fail on it.
    """
    from ckptz import cuda

    name = _codec_name(codec, level)
    try:
        count = cuda.device_count()
    except (OSError, cuda.DriverError) as exc:
        raise DeviceError(f"CUDA is not usable here: {exc}", hint="use --device cpu") from None
    if want.startswith("cuda:"):
        candidates = [int(want[5:])]
        if candidates[0] >= count:
            raise DeviceError(
                f"no device {want}: this machine has {count} GPU(s)", hint="use cuda:0 .. cuda:N-1"
            )
    else:
        candidates = list(range(count))
    from ckptz.engines.gpu.engine import GpuEngine

    failures = []
    for index in candidates:
        try:
            return GpuEngine(index, codec=name, memory=memory, threads=threads, level=level)
        except (RuntimeError, OSError) as exc:
            failures.append(f"cuda:{index}: {exc}")
    raise DeviceError(
        "no GPU could run nvCOMP (" + "; ".join(failures or ["no CUDA device"]) + ")", hint="use --device cpu"
    )


def raw_codec(algorithm: str, device: str = "cuda") -> RawNvcomp:
    """nvCOMP ``zstd`` or ``ans`` straight on raw bytes, host in and out (``ckptz bench``'s
    reference rows for the blog's recipe; see :class:`ckptz.engines.gpu.nvcomp_codecs.RawNvcomp`)."""
    from ckptz.engines.gpu.nvcomp_codecs import RawNvcomp

    return RawNvcomp(algorithm, device)


__all__ = ["GPU_CODECS", "open_gpu_engine", "raw_codec"]
