"""What an engine is: the frame coder on one device, behind per-frame futures.

The pipeline (:mod:`ckptz.pipeline`) reads, hashes and writes; an engine only codes frames.
:class:`ckptz.engines.cpu.CpuEngine` and :class:`ckptz.engines.gpu.engine.GpuEngine` are
peers behind :class:`Engine`.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from ckptz.codecs.frames import EncodedChunk
from ckptz.container import StreamInfo
from ckptz.dtypes import DType, lookup


@dataclass(frozen=True, slots=True)
class EncodedFrame:
    """A coded frame: the checksum of its original bytes and one chunk per plane."""

    checksum: int
    chunks: list[EncodedChunk]


@dataclass(frozen=True, slots=True)
class StoredChunk:
    """Where one chunk of a frame lies in a container, as the decoder needs it."""

    index: int
    codec: int
    raw_size: int
    payload: bytes | memoryview
    checksum: int


class Engine(Protocol):
    """Runs frame coding somewhere; every method returns at once with a future."""

    device: str
    threads: int

    def encode(self, stream: StreamInfo, data: np.ndarray) -> Future[EncodedFrame]: ...

    def decode(
        self, stream: StreamInfo, chunks: list[StoredChunk], length: int, frame_checksum: int, where: str
    ) -> Future[np.ndarray]: ...

    def codec_config(self) -> dict[str, dict[str, object]]: ...

    def close(self) -> None: ...


def stream_dtype(stream: StreamInfo) -> DType:
    """The transform a stream was written with (its own record wins over the dtype table)."""
    return replace(lookup(stream.dtype), word=stream.word, is_float=stream.rotate)


__all__ = ["EncodedFrame", "Engine", "StoredChunk", "stream_dtype"]
