"""Bit-packed planes (bitstream 6, ``bitpack``): only the bits that vary are stored.

A plane whose bytes all agree on some bit positions (the sign-bit plane of fp32 values
that are bf16-exact holds only 0 and 1; ``exp_avg_sq``'s low plane has its lowest bit
fixed) costs exactly ``k`` bits per byte, ``k`` the number of varying positions, where a
byte-wise Huffman code cannot go below 1 bit and deflate's end-of-block symbol makes
two-symbol planes cost 1.5.

Payload for a chunk of ``n`` bytes, ``m = ceil(n / 8)``::

    offset  size  field
    0       1     fixed: bit ``b`` set if bit ``b`` is the same in every byte
    1       1     value: those fixed bits' values (no bit outside ``fixed`` may be set)
    2       k*m   for each varying bit ``b`` (bits clear in ``fixed``), ascending: bit ``b``
                  of bytes 0..n-1 packed eight to a byte, byte ``j``'s bit at position
                  ``j mod 8`` (LSB first) of packed byte ``j // 8``; pad bits are 0

The payload length must be exactly ``2 + k*m``; else :class:`~ckptz.errors.CodecError`.

The C extension (:mod:`ckptz.codecs.native`) codes it: one 8x8 bit-matrix transpose per 8
bytes (three delta swaps, Hacker's Delight ``transpose8``), both ways, in one pass.
"""

from __future__ import annotations

import numpy as np

from ckptz.codecs.base import Codec
from ckptz.codecs.native import native
from ckptz.errors import CodecError


def varying_bits(data: np.ndarray) -> tuple[int, int]:
    """``(fixed mask, fixed values)`` of a non-empty uint8 array."""
    ones = int(np.bitwise_and.reduce(data))
    any_set = int(np.bitwise_or.reduce(data))
    fixed = ~(ones ^ any_set) & 0xFF
    return fixed, ones & fixed


def packed_size(size: int, fixed: int) -> int:
    """Payload bytes for ``size`` bytes with ``fixed`` bit positions."""
    return 2 + (8 - bin(fixed).count("1")) * ((size + 7) // 8)


class BitpackCodec(Codec):
    """Stores each varying bit position as a packed bit plane (see module docs)."""

    def encode(self, data: np.ndarray, varying: tuple[int, int] | None = None) -> bytes:
        """Pack ``data``; ``varying`` is its :func:`varying_bits` if already known."""
        if data.size == 0:
            return bytes([0xFF, 0])
        fixed, value = varying if varying is not None else varying_bits(data)
        return bytes(native.bitpack_encode(np.ascontiguousarray(data), fixed, value))

    def decode(self, payload: bytes | memoryview, size: int) -> np.ndarray:
        return self.decode_into(payload, size, None)

    def decode_into(self, payload: bytes | memoryview, size: int, out: np.ndarray | None) -> np.ndarray:
        if len(payload) < 2:
            raise CodecError("bitpack payload is shorter than its header", codec=self.name)
        fixed, value = payload[0], payload[1]
        if value & ~fixed & 0xFF or len(payload) != packed_size(size, fixed):
            raise CodecError("bitpack payload header or length is corrupt", codec=self.name)
        packed = np.frombuffer(payload, dtype=np.uint8, offset=2)
        if out is None:
            out = np.empty(size, np.uint8)
        native.bitpack_decode(packed, fixed, value, out)
        return out
