"""The CPU engine: frames coded on a pool of threads (the C extension, zstandard, xxhash and
numpy release the GIL)."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import TypeVar

import numpy as np

from ckptz import trace
from ckptz.codecs.frames import EncodeOptions, decode_frame, encode_frame
from ckptz.container import StreamInfo
from ckptz.engines.base import (
    DecodedSpan,
    EncodedFrame,
    EncodedSpan,
    FrameToCode,
    Place,
    Ranges,
    StoredChunk,
    StoredSpan,
    decode_each,
    encode_each,
    stream_dtype,
)
from ckptz.errors import CodecError, CorruptionError


def decode_chunks(stream: StreamInfo, chunks: list[StoredChunk], length: int, where: str) -> np.ndarray:
    """Decode one frame on the CPU from payloads whose checksums were checked.

    Raises:
        CorruptionError: a payload does not decode; the message names ``where``.
        CodecUnavailableError: a bitstream has no CPU decoder.
    """
    try:
        with trace.span("decode"):
            return decode_frame([(c.codec, c.raw_size, c.payload) for c in chunks], stream_dtype(stream))
    except CodecError as exc:
        if exc.__class__ is not CodecError:  # unavailable codecs are not corruption
            raise
        raise CorruptionError(f"{where} does not decode ({exc.message})", chunk=chunks[0].index) from None


CPU_FRAME_SIZE = 4 << 20
#: Frames of large streams: a quarter of the per-frame Python again, at the same ratio, so
#: many threads sharing one GIL code faster both ways.
CPU_LARGEST_FRAME = 16 << 20

#: ``--level`` from which every float stream's exponent planes try ``huff1`` (each exponent
#: coded given the bucket of the one before it) and ``huff2d`` (its residual from its row
#: neighbours and the row above), and its lowest plane ``sign2d`` (signs given the row above),
#: each kept per plane only where it saves :data:`~ckptz.codecs.frames.CONTEXT_MARGIN`, and the
#: plane below its exponents ``huffexp`` (its bytes given their exponent's bucket) where it
#: saves :data:`~ckptz.codecs.frames.MANTISSA_MARGIN`: an archive level, which spends the
#: coding time on every plane (frames code 2-4x slower, and restore up to 3x slower).
#:
#: Below it, float streams try the same coders but ``huffexp`` only where a cheap measurement
#: says they pay
#: (:attr:`~ckptz.codecs.frames.EncodeOptions.measured_contexts`): ``huff1`` and ``huff2d``
#: on exponent planes whose sparsely sampled byte pairs estimate a clear order-1 saving
#: (Adam's second moments, whatever their keys are named: 10-12% off their exponents, about
#: 1.2% of their bytes, for about half their coding speed), and ``sign2d`` on lowest planes
#: whose row width predicts most signs (first moments whose embedding rows see no tokens:
#: ~1%). Planes where none pays cost 15-23% more coding time for the measurements
#: (BENCHMARKS.md), which keeps the default near the speed of the storage users write to.
CONTEXT_LEVEL = 10


class CpuEngine:
    """Frame coding on the CPU, in the calling thread (:attr:`inline`): the pipeline calls it
    from its reader threads, so a frame is read, hashed and coded by one thread while its
    bytes are in that core's cache, and no other pool contends for the GIL."""

    device = "cpu"
    #: 4 MiB frames: a quarter of the per-frame Python (futures, calls, checksums) of 1 MiB
    #: ones, which on 16 threads is what holds the GIL; the ratio is the same (measured
    #: 1.2615 against 1.2614 on a mixed checkpoint) and one thread codes faster (+10%).
    frame_size = CPU_FRAME_SIZE
    largest_frame = CPU_LARGEST_FRAME
    inline = True
    #: The pipeline's readers hash a run of frames in one call while its bytes are in cache.
    hashes = False
    checks = False
    #: A frame at a time: each is decoded by the reader thread that read it.
    span_bytes = 0

    def __init__(self, threads: int | None = None, level: int = 3, *, measured_contexts: bool = True) -> None:
        """``measured_contexts``: below :data:`CONTEXT_LEVEL`, float streams try the context
        coders where a sample says they pay (the GPU engine's coder of its metadata frames
        turns it off, so that its containers stay those it has always written)."""
        self.threads = max(1, threads or os.cpu_count() or 1)
        self.look_ahead = 2 * self.threads + 4
        self.options = EncodeOptions(level=level)
        context = level >= CONTEXT_LEVEL
        self._context = replace(
            self.options, context_exponents=context, measured_contexts=measured_contexts and not context
        )

    @property
    def restore_ahead(self) -> int:
        """As many frames as a compression keeps in flight."""
        return self.look_ahead

    def options_for(self, stream: StreamInfo) -> EncodeOptions:
        """Order-1 exponents tried too on float streams from :data:`CONTEXT_LEVEL` (below it,
        where a sample says they pay): the measured sizes of each plane decide, not the
        component its key names, which the same tensor saved under other keys would not
        share."""
        return self._context if stream.rotate else self.options

    def _encode(self, stream: StreamInfo, data: np.ndarray, checksum: int) -> EncodedFrame:
        with trace.span("encode"):
            return EncodedFrame(checksum, encode_frame(data, stream_dtype(stream), self.options_for(stream)))

    def host_buffer(self, size: int) -> np.ndarray:
        return np.empty(size, np.uint8)

    def free_buffer(self, buf: np.ndarray) -> None:
        pass

    def encode(self, stream: StreamInfo, data: np.ndarray, checksum: int) -> Future[EncodedFrame]:
        return _now(self._encode, stream, data, checksum)

    def decode(
        self, stream: StreamInfo, chunks: list[StoredChunk], length: int, where: str
    ) -> Future[np.ndarray]:
        return _now(decode_chunks, stream, chunks, length, where)

    def encode_span(
        self, frames: list[FrameToCode], buffer: np.ndarray | None, leaves: Ranges | None = None
    ) -> Future[EncodedSpan]:
        return encode_each(self, frames, leaves)

    def flush(self) -> None:
        pass  # nothing waits: each frame is coded as it comes

    def decode_span(
        self,
        span: StoredSpan,
        place: Place | None = None,
        keep: bool = False,
        check: bool = False,
        leaves: Ranges | None = None,
    ) -> Future[DecodedSpan]:
        # Nothing is decoded on a GPU: ``place`` is not called, every frame comes back as bytes.
        return decode_each(self, span, check, leaves)

    def codec_config(self) -> dict[str, dict[str, object]]:
        return {"zstd": {"level": self.options.level, "implementation": "zstandard"}}

    def container_extras(self) -> dict[str, object]:
        return {}

    def close(self) -> None:
        pass

    def __enter__(self) -> CpuEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_T = TypeVar("_T")


def _now(fn: Callable[..., _T], *args: object) -> Future[_T]:
    """Run ``fn`` here and now; its result or error in a finished future."""
    fut: Future[_T] = Future()
    try:
        fut.set_result(fn(*args))
    except Exception as exc:
        fut.set_exception(exc)
    return fut


__all__ = ["CONTEXT_LEVEL", "CpuEngine", "decode_chunks"]
