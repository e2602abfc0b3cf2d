"""Row-predicted exponents (bitstream 8, ``huff2d``): each byte coded as its residual from a
prediction made of its left, upper and upper-left neighbours.

An Adam second moment is roughly an outer product of a per-row and a per-column scale, so
its exponents are about the sum of a row's term and a column's term: the byte one row up,
plus the left one, minus the one up and left, predicts them far better than the left one
alone (``huff1``). A plane carries no shape, so the encoder finds the row width ``W`` itself
(the width whose predictions miss least on a sample) and declines a plane that no width
predicts better than the left neighbour (dense weights, first moments).

The plane is cut into ``S`` segments as in ``huff1`` (:mod:`ckptz.codecs.order1`), each
predicted on its own. For byte ``j`` of a segment ``x`` (``j`` counted from the segment's
start)::

    pred(j) = clamp(x[j-1] + x[j-W] - x[j-W-1], 0, 255)   if j > W
            = x[j-1]                                       if 0 < j <= W
            = 0                                            if j = 0

and the coded symbol is the residual ``(x[j] - pred(j)) mod 256``. The residuals are grouped
by the bucket of their prediction, exactly as ``huff1`` groups bytes by the bucket of the byte
before them, and the payload is a 4-byte ``W`` followed by a ``huff1`` payload of the
residuals with that grouping::

    offset  size  field
    0       4     W: u32, the row width, at least 1
    4       ...   a huff1 payload (version 1, K, S, bucket starts, counts, frame sizes,
                  segment counts, frames), whose contexts are the buckets of pred(j)
                  and whose bytes are the residuals

Every group's zstd frame MUST be made only of raw, RLE and Huffman-compressed literal blocks
(no sequences), which the C decoder reads without libzstd. A decoder walks each segment in
order: byte ``j`` is the next unread residual of the group named by the bucket of
``pred(j)``, plus ``pred(j)``, mod 256. The C extension (``ckptz/native_src/order2d.c``) writes
and reads the payload; a payload it cannot read is damaged.
"""

from __future__ import annotations

import numpy as np

from ckptz.codecs.base import Codec
from ckptz.codecs.native import native
from ckptz.codecs.order1 import SEGMENTS
from ckptz.errors import CodecError


def encode(data: np.ndarray, width: int = 0) -> bytes | None:
    """``data``'s payload with rows of ``width`` bytes (0: the encoder finds the width), or
    None where no width predicts better than the left neighbour, or a group's Huffman table
    cannot be described: the coders then leave ``huff2d`` out."""
    data = np.ascontiguousarray(data, dtype=np.uint8)
    segments = next(s for least, s in SEGMENTS if data.size >= least)
    payload: bytes | None = native.order2d_encode(data, segments, width)
    return payload


class Order2dCodec(Codec):
    """Exponent planes as residuals of a row prediction, grouped by it (see module docs)."""

    def encode(self, data: np.ndarray) -> bytes:
        # Where no width pays, rows as long as the plane predict each byte by its left one.
        payload = encode(data) or encode(data, max(1, data.size))
        if payload is None:
            raise CodecError("huff2d cannot code this plane (a group's Huffman table)", codec=self.name)
        return payload

    def decode(self, payload: bytes | memoryview, size: int) -> np.ndarray:
        return self.decode_into(payload, size, None)

    def decode_into(self, payload: bytes | memoryview, size: int, out: np.ndarray | None) -> np.ndarray:
        array = np.empty(size, np.uint8) if out is None else out
        if not native.order2d_decode(payload, array):
            raise CodecError(
                f"huff2d payload of {len(payload)} bytes is damaged or does not decode to {size} bytes",
                codec=self.name,
            )
        return array
