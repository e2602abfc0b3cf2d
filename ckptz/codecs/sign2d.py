"""Row-predicted sign bits (bitstream 9, ``sign2d``): a rotated float's lowest plane, its sign
bits coded as residuals from a prediction by the signs left, up and up-left.

The transform rotates a float's sign into bit 0 of its lowest byte plane, beside seven
mantissa bits that are noise, so that plane is stored as it is and each sign costs a bit.
Signs of Adam's first moments are far from random where a tensor's rows move together
(embedding rows of tokens that never occur, gradients of low rank): there a sign is about
the product of a row's and a column's, ``s[j] = s[j-1] ^ s[j-W] ^ s[j-W-1]``. The encoder
finds the row width ``W`` (the width whose predictions miss least on a sample, as
:mod:`ckptz.codecs.order2d` does on exponents) and declines a plane no width predicts better
than the left sign.

For byte ``j`` of the plane ``x`` (``s[j]`` its bit 0)::

    pred(j) = s[j-1] ^ s[j-W] ^ s[j-W-1]   if j > W
            = s[j-1]                       if 0 < j <= W
            = 0                            if j = 0

and the residual bit is ``s[j] ^ pred(j)``. With ``m = ceil(n / 8)``, the payload
(integers little-endian)::

    offset   size  field
    0        4     W: u32, the row width, at least 1
    4        4     L: u32, bytes of the residual's zstd frame
    8        L     one zstd frame of raw, RLE and Huffman-compressed literal blocks only (no
                   sequences) that decodes to m bytes: residual bit j at bit (j mod 8) of
                   byte floor(j / 8); pad bits 0
    8+L      7*m   for b = 1..7: bit b of bytes 0..n-1, packed as bitpack's rows (byte j's
                   bit at bit (j mod 8) of byte floor(j / 8) of the row); pad bits 0

The payload MUST be exactly ``8 + L + 7m`` bytes. A decoder unpacks bits 1-7, then walks the
plane in order: ``s[j] = residual bit j ^ pred(j)``. The C extension
(``ckptz/native_src/sign2d.c``) writes and reads the payload; one it cannot read is damaged.
"""

from __future__ import annotations

import numpy as np

from ckptz.codecs.base import Codec
from ckptz.codecs.native import native
from ckptz.errors import CodecError


def encode(data: np.ndarray, width: int = 0, most_miss: float = 1.0) -> bytes | None:
    """``data``'s payload with rows of ``width`` bytes (0: the encoder finds the width), or
    None where no width predicts the signs better than the left one, or the residual's
    Huffman table cannot be described: the coders then leave ``sign2d`` out. A width it
    finds that mispredicts more than ``most_miss`` of the sampled signs is declined too,
    before the plane is coded."""
    payload: bytes | None = native.sign2d_encode(np.ascontiguousarray(data, dtype=np.uint8), width, most_miss)
    return payload


class Sign2dCodec(Codec):
    """A float's lowest plane with row-predicted sign bits (see module docs)."""

    def encode(self, data: np.ndarray) -> bytes:
        # Where no width pays, rows as long as the plane predict each sign by its left one.
        payload = encode(data) or encode(data, max(1, data.size))
        if payload is None:
            raise CodecError("sign2d cannot code this plane (the residual's Huffman table)", codec=self.name)
        return payload

    def decode(self, payload: bytes | memoryview, size: int) -> np.ndarray:
        return self.decode_into(payload, size, None)

    def decode_into(self, payload: bytes | memoryview, size: int, out: np.ndarray | None) -> np.ndarray:
        array = np.empty(size, np.uint8) if out is None else out
        if not native.sign2d_decode(payload, array):
            raise CodecError(
                f"sign2d payload of {len(payload)} bytes is damaged or does not decode to {size} bytes",
                codec=self.name,
            )
        return array
