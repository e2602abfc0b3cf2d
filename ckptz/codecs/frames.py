"""Frames: a run of a stream's bytes, transformed into planes, each plane coded as one chunk.

This is the CPU frame coder. It picks, per plane, the cheapest of the available bitstreams
and falls back to storing bytes raw whenever coding does not make them smaller.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ckptz.codecs import cpu_codec
from ckptz.codecs.cpu import ConstCodec, RawCodec, ZstdCodec
from ckptz.codecs.planes import merge, split
from ckptz.dtypes import DType
from ckptz.errors import CodecError


@dataclass(frozen=True, slots=True)
class EncodeOptions:
    """How hard to try.

    Attributes:
        level: zstd level for the planes worth coding (1-22).
    """

    level: int = 3


@dataclass(frozen=True, slots=True)
class EncodedChunk:
    """One coded plane of a frame."""

    codec: int
    raw_size: int
    payload: bytes


_RAW = RawCodec()
_CONST = ConstCodec()
_ZSTD: dict[int, ZstdCodec] = {}


def _zstd(level: int) -> ZstdCodec:
    codec = _ZSTD.get(level)
    if codec is None:
        codec = _ZSTD.setdefault(level, ZstdCodec(level))
    return codec


def encode_plane(plane: np.ndarray, options: EncodeOptions) -> EncodedChunk:
    """Code one plane with the cheapest bitstream."""
    size = plane.size
    if size and plane[0] == plane[-1] and bool(np.all(plane == plane[0])):
        return EncodedChunk(_CONST.id, size, _CONST.encode(plane))
    payload = _zstd(options.level).encode(plane)
    if len(payload) < size:
        return EncodedChunk(ZstdCodec.id, size, payload)
    return EncodedChunk(_RAW.id, size, _RAW.encode(plane))


def encode_frame(raw: np.ndarray, dtype: DType, options: EncodeOptions) -> list[EncodedChunk]:
    """Transform one frame (a 1-D uint8 array of whole words) and code each plane."""
    return [encode_plane(plane, options) for plane in split(raw, dtype)]


def decode_frame(chunks: list[tuple[int, int, bytes | memoryview]], dtype: DType) -> np.ndarray:
    """Decode ``(codec id, raw size, payload)`` per plane and undo the transform.

    Raises:
        CodecError: a payload is malformed, or the planes disagree in size.
        CodecUnavailableError: a plane's bitstream has no CPU decoder.
    """
    planes = [cpu_codec(codec).decode(payload, size) for codec, size, payload in chunks]
    if len(planes) != max(dtype.word, 1) or len({p.size for p in planes}) > 1:
        raise CodecError("frame planes do not match the stream's dtype", codec="frame")
    return merge(planes, dtype)
