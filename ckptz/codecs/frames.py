"""Frames: a run of a stream's bytes, transformed into planes, each plane coded as one chunk.

This is the CPU frame coder. Per plane, cheapest first:

1. a plane of one repeated byte (zero rows, the low planes of fp32 tensors that hold
   bf16-exact values) becomes ``const``: one byte;
2. a plane that looks like noise on a sample (near 8 bits of order-0 entropy and no zero
   runs: trained mantissas) is stored ``raw`` without trying a coder, which is where most
   of the time would otherwise go;
3. a float's exponent plane gets the better of ``ctx`` (neighbour-context coding, see
   :mod:`ckptz.codecs.ctx`) and plain ``zstd`` (which wins where LZ matches pay, e.g.
   ``exp_avg_sq``) at ``effort >= 1``, ``zstd`` alone at ``effort 0``;
4. any other plane gets ``zstd``;

and any coded chunk not smaller than its plane is stored ``raw`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ckptz.codecs import cpu_codec
from ckptz.codecs.cpu import ConstCodec, RawCodec, ZstdCodec
from ckptz.codecs.ctx import CtxCodec
from ckptz.codecs.planes import merge, split
from ckptz.dtypes import DType
from ckptz.errors import CodecError

#: Bytes sampled to judge whether a plane is noise; enough for an entropy estimate
#: within ~0.02 bit of 8 on uniform bytes.
_SAMPLE = 16384
#: Estimated bits per byte above which a plane is stored raw: Huffman could save at most
#: ~1% there, and zstd would spend most of the frame's time finding that out.
_NOISE_BITS = 7.9
#: Share of zero bytes in the sample above which a noisy plane is still worth zstd:
#: noise has 1/256 zeros, zero rows have many more, and zstd codes their runs nearly free.
_ZERO_SHARE = 0.02


@dataclass(frozen=True, slots=True)
class EncodeOptions:
    """How hard to try.

    Attributes:
        level: zstd level for the planes worth coding (1-22).
        effort: 0 codes exponent planes with zstd only; 1 (default) also tries ``ctx``
            and keeps the smaller.
    """

    level: int = 3
    effort: int = 1


@dataclass(frozen=True, slots=True)
class EncodedChunk:
    """One coded plane of a frame."""

    codec: int
    raw_size: int
    payload: bytes


_RAW = RawCodec()
_CONST = ConstCodec()
_ZSTD: dict[int, ZstdCodec] = {}
_CTX: dict[int, CtxCodec] = {}


def _zstd(level: int) -> ZstdCodec:
    codec = _ZSTD.get(level)
    if codec is None:
        codec = _ZSTD.setdefault(level, ZstdCodec(level))
    return codec


def _ctx(level: int) -> CtxCodec:
    codec = _CTX.get(level)
    if codec is None:
        codec = _CTX.setdefault(level, CtxCodec(level))
    return codec


def looks_like_noise(plane: np.ndarray) -> bool:
    """True if a strided sample of ``plane`` has near 8 bits of entropy and few zeros."""
    sample = plane[:: max(1, plane.size // _SAMPLE)]
    counts = np.bincount(sample, minlength=256)
    if counts[0] > _ZERO_SHARE * sample.size:
        return False
    p = counts[counts > 0] / sample.size
    return bool(-(p * np.log2(p)).sum() > _NOISE_BITS)


def encode_plane(plane: np.ndarray, options: EncodeOptions, *, exponent: bool = False) -> EncodedChunk:
    """Code one plane with the cheapest bitstream.

    Args:
        plane: the plane's bytes (1-D uint8).
        options: how hard to try.
        exponent: the plane holds float exponents (``ctx`` is worth trying).
    """
    size = plane.size
    if size == 0:
        return EncodedChunk(_RAW.id, 0, b"")
    if plane[0] == plane[-1] and bool(np.all(plane == plane[0])):
        return EncodedChunk(_CONST.id, size, _CONST.encode(plane))
    if size >= 256 and looks_like_noise(plane):
        return EncodedChunk(_RAW.id, size, _RAW.encode(plane))
    best = EncodedChunk(_RAW.id, size, b"")
    candidates: list[ZstdCodec | CtxCodec] = [_zstd(options.level)]
    if exponent and options.effort >= 1:
        candidates.append(_ctx(options.level))
    for codec in candidates:
        payload = codec.encode(plane)
        if len(payload) < (len(best.payload) if best.payload else size):
            best = EncodedChunk(codec.id, size, payload)
    if not best.payload:
        return EncodedChunk(_RAW.id, size, _RAW.encode(plane))
    return best


def encode_frame(raw: np.ndarray, dtype: DType, options: EncodeOptions) -> list[EncodedChunk]:
    """Transform one frame (a 1-D uint8 array of whole words) and code each plane."""
    planes = split(raw, dtype)
    top = len(planes) - 1
    return [encode_plane(p, options, exponent=dtype.is_float and i == top) for i, p in enumerate(planes)]


def decode_frame(chunks: list[tuple[int, int, bytes | memoryview]], dtype: DType) -> np.ndarray:
    """Decode ``(codec id, raw size, payload)`` per plane and undo the transform.

    Raises:
        CodecError: a payload is malformed, or the planes disagree in size.
        CodecUnavailableError: a plane's bitstream has no CPU decoder.
    """
    if len(chunks) != max(dtype.word, 1) or len({size for _, size, _ in chunks}) > 1:
        raise CodecError("frame planes do not match the stream's dtype", codec="frame")
    planes = []
    for codec, size, payload in chunks:
        if codec == _RAW.id and dtype.word > 1:
            # merge() copies the plane anyway: skip the codec's defensive copy.
            if len(payload) != size:
                raise CodecError(f"stored chunk holds {len(payload)} bytes, expected {size}", codec=_RAW.name)
            planes.append(np.frombuffer(payload, dtype=np.uint8))
        else:
            planes.append(cpu_codec(codec).decode(payload, size))
    return merge(planes, dtype)
