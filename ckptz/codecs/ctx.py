"""Context-split zstd (bitstream 4, ``ctx``): an exponent plane coded with neighbour context.

Adjacent float exponents are correlated (optimizer moments, rows of one scale), so a byte
costs fewer bits given its neighbours. To keep decoding fully parallel, the plane is coded
in three passes, each conditioned only on bytes of earlier passes:

* pass 0, the anchors ``x[0::4]``, in order;
* pass 1, ``x[2::4]``, context ``mid(x[i-2], x[i+2])``;
* pass 2, ``x[1::2]``, context ``mid(x[i-1], x[i+1])``;

where ``mid(a, b) = (a + b + 1) >> 1`` and a missing right neighbour (past the end) is
replaced by the left one. Passes 1 and 2 are stored *grouped by context*: a stable sort of
the pass's bytes by context value (0-255) — so the decoder, which knows every context once
the earlier passes are decoded, recovers each byte's position by the same stable sort. The
grouping is what lets zstd's per-block Huffman tables model each context: the encoder ends
a zstd block at the boundary of every large context group. That is an encoder choice; the
decoder needs only standard zstd.

Payload (integers little-endian)::

    offset  size  field
    0       1     version, 1
    1       4     u32 a = size of the zstd frame of pass 0
    5       4     u32 b = size of the zstd frame of pass 1
    9       a     zstd frame: pass 0, ceil(n / 4) bytes
    9+a     b     zstd frame: pass 1, grouped by context, the count of i = 2 mod 4 below n
    9+a+b   rest  zstd frame: pass 2, grouped by context, floor(n / 2) bytes

Every frame must decode to exactly its pass's size, and the three sizes must fill the
payload; anything else is a :class:`~ckptz.errors.CodecError`.
"""

from __future__ import annotations

import struct
import threading

import numpy as np
import zstandard

from ckptz.codecs.base import Codec
from ckptz.errors import CodecError

_HEAD = struct.Struct("<BII")
_VERSION = 1
#: A context group smaller than this shares a zstd block (and Huffman table) with the
#: next one: a table costs tens of bytes, more than a small group's gain.
_MIN_GROUP = 2048


def _mid(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return ((a.astype(np.uint16) + b + 1) >> 1).astype(np.uint8)


def _contexts(known: np.ndarray, step: int, n_out: int) -> np.ndarray:
    """Contexts of the bytes halfway between consecutive ``known`` bytes (``step`` apart)."""
    left = known[:n_out]
    right = known[1 : n_out + 1]
    if right.size < n_out:  # the last byte has no right neighbour: use the left one
        right = np.concatenate((right, left[right.size :]))
    return _mid(left, right)


def _order(ctx: np.ndarray) -> np.ndarray:
    # numpy's stable sort of uint8 keys is a radix sort: linear time.
    return np.argsort(ctx, kind="stable")


def _pass_sizes(n: int) -> tuple[int, int, int]:
    return (n + 3) // 4, (n + 1) // 4, n // 2


class CtxCodec(Codec):
    """Three-pass, context-grouped zstd coding of an exponent plane (see module docs)."""

    def __init__(self, level: int = 3) -> None:
        self.level = level
        self._local = threading.local()

    def _cctx(self) -> zstandard.ZstdCompressor:
        cctx = getattr(self._local, "cctx", None)
        if cctx is None:
            cctx = self._local.cctx = zstandard.ZstdCompressor(level=self.level, write_checksum=False)
        return cctx

    def _dctx(self) -> zstandard.ZstdDecompressor:
        dctx = getattr(self._local, "dctx", None)
        if dctx is None:
            dctx = self._local.dctx = zstandard.ZstdDecompressor()
        return dctx

    def _grouped(self, data: np.ndarray, ctx: np.ndarray) -> bytes:
        order = _order(ctx)
        grouped = data[order]
        counts = np.bincount(ctx, minlength=256)
        ends = np.cumsum(counts)
        obj = self._cctx().compressobj(size=data.size)
        parts, start = [], 0
        for end in ends[counts > 0].tolist():
            if end - start >= _MIN_GROUP:
                parts.append(obj.compress(grouped[start:end].tobytes()))
                parts.append(obj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK))
                start = end
        parts.append(obj.compress(grouped[start:].tobytes()))
        parts.append(obj.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH))
        return b"".join(parts)

    def encode(self, data: np.ndarray) -> bytes:
        p0 = np.ascontiguousarray(data[0::4])
        p1 = data[2::4]
        p2 = data[1::2]
        a = self._cctx().compress(p0.data)
        b = self._grouped(p1, _contexts(p0, 4, p1.size))
        even = np.ascontiguousarray(data[0::2])
        c = self._grouped(p2, _contexts(even, 2, p2.size))
        return _HEAD.pack(_VERSION, len(a), len(b)) + a + b + c

    def _frame(self, payload: bytes | memoryview, size: int) -> np.ndarray:
        try:
            if zstandard.frame_content_size(payload) != size:
                raise CodecError("ctx pass declares another size", codec=self.name)
            out = self._dctx().decompress(payload, max_output_size=max(size, 1))
        except zstandard.ZstdError as exc:
            raise CodecError(f"corrupt zstd frame in ctx payload ({exc})", codec=self.name) from None
        if len(out) != size:
            raise CodecError(f"ctx pass decoded to {len(out)} bytes, expected {size}", codec=self.name)
        return np.frombuffer(out, dtype=np.uint8)

    def decode(self, payload: bytes | memoryview, size: int) -> np.ndarray:
        view = memoryview(payload)
        if len(view) < _HEAD.size:
            raise CodecError("ctx payload is shorter than its header", codec=self.name)
        version, a, b = _HEAD.unpack_from(view)
        if version != _VERSION or _HEAD.size + a + b > len(view):
            raise CodecError("ctx payload header is corrupt", codec=self.name)
        n0, n1, n2 = _pass_sizes(size)
        out = np.empty(size, dtype=np.uint8)
        p0 = self._frame(view[_HEAD.size : _HEAD.size + a], n0)
        out[0::4] = p0
        p1 = self._frame(view[_HEAD.size + a : _HEAD.size + a + b], n1)
        target = np.empty(n1, dtype=np.uint8)
        target[_order(_contexts(p0, 4, n1))] = p1
        out[2::4] = target
        p2 = self._frame(view[_HEAD.size + a + b :], n2)
        target = np.empty(n2, dtype=np.uint8)
        target[_order(_contexts(out[0::2], 2, n2))] = p2
        out[1::2] = target
        return out
