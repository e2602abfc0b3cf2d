"""Order-1 exponents (bitstream 7, ``huff1``): each byte coded given the byte before it.

Neighbouring float exponents are correlated: in optimizer moments a byte costs less given
its predecessor than alone. Here a byte's *context* is the *bucket* of the
byte before it, a bucket being a range of byte values chosen by the encoder. The plane's
bytes are grouped by context, keeping their order within a group, and each group is one
zstd frame (RFC 8878): with the C extension, frames of Huffman-coded literal blocks
(:class:`~ckptz.codecs.cpu.HuffmanZstd`), so every context gets its own adaptive tables.
A decoder decodes the groups, then walks the plane: byte ``i`` is the next unread byte of
the group that the bucket of byte ``i - 1`` names.

That walk is a chain of dependent loads, so the plane is cut into ``S`` segments of
``L = ceil(n / S)`` bytes (segment ``s``: bytes ``[s*L, min((s+1)*L, n))``), each
walked on its own, as if preceded by a byte 0: a decoder interleaves their walks. Group
``k`` holds segment 0's bytes of context ``k``, then segment 1's, and so on.

Payload for a plane of ``n`` bytes (integers little-endian), ``K`` buckets::

    offset        size          field
    0             1             version, 1
    1             1             K, buckets, 1-16
    2             1             S, segments, 1-8
    3             1             reserved, 0
    4             K-1           start of buckets 1..K-1: ascending byte values, the first
                                above 0; bucket k holds the values [start_k, start_k+1)
                                (start_0 = 0, start_K = 256)
    3+K           4*K           count_k: bytes in group k (they sum to n)
    3+5K          4*K           size_k: bytes of group k's zstd frame (0 if count_k is 0)
    3+9K          4*K*(S-1)     for segments s = 0..S-2, for k = 0..K-1: how many of
                                group k's bytes belong to segment s (the last segment's
                                are the rest)
    3+9K+4K(S-1)  sum(size_k)   group 0's zstd frame, group 1's, ...: each decodes to
                                count_k bytes

The counts of each segment must sum to its length, each group's segment counts to at most
its count, and the frames must fill the payload exactly. A walk that finds its group
exhausted, or any other inconsistency, is a :class:`~ckptz.errors.CodecError`.

The encoder chooses the buckets by dynamic programming over the plane's pair counts (each
range's cost: the order-0 entropy of the bytes that follow it, plus a fixed cost per
group); the C extension (``ckptz/native_src/order1.c``) writes and reads the payload
without the GIL, and its frame decoder (``native.decode_frame``) decodes ``huff1`` planes
in the same single call as the others. A plane the C writer declines is not coded
``huff1``; a payload the C reader declines (a group with libzstd matches, which older
writers made) is read by numpy and the zstandard binding, slowly.
"""

from __future__ import annotations

import itertools
import struct

import numpy as np

from ckptz.codecs.base import Codec
from ckptz.codecs.cpu import ZstdCodec
from ckptz.codecs.native import native
from ckptz.errors import CodecError

_VERSION = 1
MAX_BUCKETS = 16
MAX_SEGMENTS = 8
#: Segments the encoder cuts a plane of at least ``n`` bytes into (first match): eight
#: interleaved walks decode ~1.5x as fast as four and 5x as fast as one; each costs
#: 4 header bytes per group.
SEGMENTS = ((1 << 17, 8), (1 << 15, 4), (0, 1))
_ZSTD = ZstdCodec()


def header_size(buckets: int, segments: int) -> int:
    """Header bytes of a payload with ``buckets`` groups and ``segments`` segments."""
    return 4 + (buckets - 1) + 8 * buckets + 4 * buckets * (segments - 1)


def _segments(n: int, segments: int) -> list[tuple[int, int]]:
    length = -(-n // segments) if n else 0
    return [(min(s * length, n), min((s + 1) * length, n)) for s in range(segments)]


def encode(data: np.ndarray, contextual_only: bool = False) -> bytes | None:
    """``data``'s payload, or None where the C writer declines it (a group whose Huffman
    table a zstd frame cannot describe; with ``contextual_only``, also a plane whose sampled
    pair counts choose a single bucket, where no context pays): the coders then leave
    ``huff1`` out, the Python pipeline and the native plane alike."""
    data = np.ascontiguousarray(data, dtype=np.uint8)
    segments = next(s for least, s in SEGMENTS if data.size >= least)
    payload: bytes | None = native.order1_encode(data, segments, contextual_only)
    return payload


def saving(data: np.ndarray) -> float:
    """The share of an order-0 code of ``data`` that ``huff1``'s buckets are estimated to save,
    from a sparse sample of its byte pairs (64 runs of 1 KiB): cheap enough to ask of every
    exponent plane before trying ``huff1``. An order-0 code here is one table for the whole
    plane, so a plane whose statistics drift also scores a little."""
    data = np.ascontiguousarray(data, dtype=np.uint8)
    segments = next(s for least, s in SEGMENTS if data.size >= least)
    return float(native.order1_saving(data, segments))


class Order1Codec(Codec):
    """Exponent planes grouped by the preceding byte's bucket, one zstd frame per group
    (see module docs)."""

    def encode(self, data: np.ndarray) -> bytes:
        payload = encode(data)
        if payload is None:
            raise CodecError("huff1 cannot code this plane (a group's Huffman table)", codec=self.name)
        return payload

    def decode(self, payload: bytes | memoryview, size: int) -> np.ndarray:
        return self.decode_into(payload, size, None)

    def decode_into(self, payload: bytes | memoryview, size: int, out: np.ndarray | None) -> np.ndarray:
        array = np.empty(size, np.uint8) if out is None else out
        if native.order1_decode(payload, array):
            return array
        return self._decode_numpy(memoryview(payload), size, array)

    def _fail(self, what: str) -> CodecError:
        return CodecError(f"huff1 payload {what}", codec=self.name)

    def _decode_numpy(self, view: memoryview, size: int, out: np.ndarray) -> np.ndarray:
        if len(view) < 4:
            raise self._fail("is shorter than its header")
        version, buckets, segments, reserved = view[0], view[1], view[2], view[3]
        if (
            version != _VERSION
            or reserved
            or not 1 <= buckets <= MAX_BUCKETS
            or not 1 <= segments <= MAX_SEGMENTS
        ):
            raise self._fail("header is corrupt")
        head = header_size(buckets, segments)
        if len(view) < head:
            raise self._fail("is shorter than its header")
        starts = [0, *view[4 : 4 + buckets - 1], 256]
        if any(a >= b for a, b in itertools.pairwise(starts)):
            raise self._fail("bucket starts are not ascending")
        at = 3 + buckets
        counts = list(struct.unpack_from(f"<{buckets}I", view, at))
        sizes = list(struct.unpack_from(f"<{buckets}I", view, at + 4 * buckets))
        at += 8 * buckets
        if sum(counts) != size or sum(sizes) != len(view) - head:
            raise self._fail(
                f"declares {sum(counts)} bytes in {sum(sizes)} of frames, expected {size} in {len(view) - head}"
            )
        if any((c == 0) != (s == 0) for c, s in zip(counts, sizes, strict=True)):
            raise self._fail("has a frame for an empty group or none for a full one")
        spans = _segments(size, segments)
        seg_counts = []
        used = [0] * buckets
        for s in range(segments):
            if s + 1 < segments:
                row = list(struct.unpack_from(f"<{buckets}I", view, at + 4 * buckets * s))
            else:
                row = [c - u for c, u in zip(counts, used, strict=True)]
            used = [u + c for u, c in zip(used, row, strict=True)]
            if any(u > c for u, c in zip(used, counts, strict=True)) or sum(row) != spans[s][1] - spans[s][0]:
                raise self._fail("segment counts do not add up")
            seg_counts.append(row)
        groups, pos = [], head
        for count, frame_size in zip(counts, sizes, strict=True):
            frame = view[pos : pos + frame_size]
            pos += frame_size
            groups.append(_ZSTD.decode(frame, count).tolist() if count else [])
        bucket_of = np.searchsorted(np.asarray(starts[1:-1]), np.arange(256), side="right").tolist()
        result = bytearray(size)
        offsets = [0] * buckets
        for s, (a, b) in enumerate(spans):
            ends = [o + c for o, c in zip(offsets, seg_counts[s], strict=True)]
            ptr = list(offsets)
            prev = 0
            for i in range(a, b):
                k = bucket_of[prev]
                if ptr[k] >= ends[k]:
                    raise self._fail("walk ran out of a group")
                prev = result[i] = groups[k][ptr[k]]
                ptr[k] += 1
            offsets = ends
        out[:] = np.frombuffer(bytes(result), np.uint8)
        return out
