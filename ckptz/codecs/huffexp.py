"""Mantissas given their exponent (bitstream 10, ``huffexp``): a lower plane of a float frame,
each byte coded given the bucket of the same element's byte in the frame's top plane.

Within one binade a trained weight's magnitude is not uniform (its density falls with the
magnitude), so how skewed a mantissa's top bits are depends on the exponent: near-uniform
for small exponents, clearly skewed for the largest. One code for the whole plane below the
exponents (a bf16's mantissa and sign, an fp32's top mantissa byte) sees a mixture that looks
like noise; one code per exponent bucket does not. The context of byte ``i`` of the plane is the bucket of byte ``i`` of the frame's top
plane (plane ``w - 1``: a rotated float's exponent), which a decoder decodes first.

The payload is laid out exactly as ``huff1``'s (:mod:`ckptz.codecs.order1`: version 1, ``K``
buckets, ``S`` segments, bucket starts, counts, frame sizes, segment counts, group frames),
only the contexts differ: group ``k`` holds, segment by segment and in order, the plane's
bytes whose top-plane byte falls in bucket ``k``. Every group's zstd frame MUST be made only
of raw, RLE and Huffman-compressed literal blocks (no sequences). A decoder decodes the
groups, then walks each segment in order: byte ``i`` is the next unread byte of the group
named by the bucket of the top plane's byte ``i``. The segments only let a decoder interleave
walks; the contexts do not depend on them.

A chunk of the top plane itself, or of a stream of single bytes, MUST NOT be ``huffexp``
(it has no context plane). The C extension (``ckptz/native_src/huffexp.c``) writes and reads
the payload; a payload it cannot read is damaged. The frame decoders
(:func:`ckptz.codecs.frames.decode_frame`, the native planes) decode the top plane first.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from ckptz.codecs.base import Codec
from ckptz.codecs.native import native
from ckptz.codecs.order1 import SEGMENTS
from ckptz.errors import CodecError


def _segments(size: int) -> int:
    return next(s for least, s in SEGMENTS if size >= least)


def encode(data: np.ndarray, context: np.ndarray) -> bytes | None:
    """``data``'s payload given the top plane ``context`` (as many bytes), or None where its
    sampled pair counts choose no split that pays, or a group's Huffman table cannot be
    described: the coders then leave ``huffexp`` out."""
    data = np.ascontiguousarray(data, dtype=np.uint8)
    context = np.ascontiguousarray(context, dtype=np.uint8)
    payload: bytes | None = native.huffexp_encode(data, context, _segments(data.size))
    return payload


class HuffexpCodec(Codec):
    """A lower plane grouped by the bucket of its element's top-plane byte (see module docs).

    It needs its frame's top plane: :meth:`encode_given` and :meth:`decode_given` take it, and
    the plane-only :meth:`encode` and :meth:`decode` refuse with a :class:`CodecError`.
    """

    needs_top_plane: ClassVar[bool] = True

    def encode(self, data: np.ndarray) -> bytes:
        raise CodecError("huffexp codes a plane given its frame's top plane", codec=self.name)

    def decode(self, payload: bytes | memoryview, size: int) -> np.ndarray:
        raise CodecError("huffexp decodes a plane given its frame's top plane", codec=self.name)

    def encode_given(self, data: np.ndarray, context: np.ndarray) -> bytes:
        """``data``'s payload given the top plane ``context``."""
        payload = encode(data, context)
        if payload is None:
            raise CodecError("huffexp found no context split that pays on this plane", codec=self.name)
        return payload

    def decode_given(
        self, payload: bytes | memoryview, size: int, context: np.ndarray, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Decode ``payload`` (``size`` bytes) given the frame's decoded top plane ``context``,
        into ``out`` where given."""
        array = np.empty(size, np.uint8) if out is None else out
        if context.size != size or not native.huffexp_decode(payload, np.ascontiguousarray(context), array):
            raise CodecError(
                f"huffexp payload of {len(payload)} bytes is damaged or does not decode to {size} bytes",
                codec=self.name,
            )
        return array
