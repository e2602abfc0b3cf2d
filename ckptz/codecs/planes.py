"""The dtype-aware transform: sign rotation and byte planes (CPU implementation).

A float word ``s|exponent|mantissa`` is rotated left by one bit so the sign sits at the
bottom and the exponent's high bits fill the top byte; the words are then split into
byte planes, plane 0 holding every word's lowest byte and plane ``word-1`` the exponent
byte. Integers are split without rotation. Words of one byte pass through unchanged.
The GPU transform must produce exactly these bytes.

Speed: with the C extension (:mod:`ckptz.codecs.native`) each direction is one pass over
the words. Without it, both directions work by halving words (low half by truncation, high half by
shift-and-truncate), so every pass is a contiguous SIMD loop over ever narrower words; a
strided byte gather or scatter (``grid[:, i]``) is about half as fast. Every pass writes
into a preallocated array: the intermediates live in per-thread scratch buffers that are
reused frame after frame, and callers may pass the output. A fresh temporary per pass costs
more than the pass itself once the allocator hands back untouched pages (page faults: on a
2-core VM ~2 us per 4 KiB, the merge ran at half speed).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from ckptz.codecs.native import native
from ckptz.dtypes import DType

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_local = threading.local()


def scratch(slot: str, n: int, width: int = 1) -> np.ndarray:
    """This thread's reusable array of ``n`` ``width``-byte words, named ``slot``.

    It grows to the largest size asked for and stays (a frame is at most a few MiB); its
    contents are garbage, and the next call on this thread with the same ``slot`` hands
    out the same memory, so nothing may keep a view of it.
    """
    pool: dict[str, np.ndarray] | None = getattr(_local, "pool", None)
    if pool is None:
        pool = _local.pool = {}
    buf = pool.get(slot)
    if buf is None or buf.size < n * width:
        buf = pool[slot] = np.empty(n * width, np.uint8)
    return buf[: n * width].view(_UINT[width])


def _rotate_left(words: np.ndarray, w: int, out: np.ndarray) -> None:
    """``out = rotl(words, 1)`` on ``w``-byte words (sign to the bottom)."""
    carry = scratch("carry", words.size, w)
    np.left_shift(words, 1, out=out)
    np.right_shift(words, w * 8 - 1, out=carry)
    out |= carry


def _rotate_right(words: np.ndarray, w: int) -> None:
    """``words = rotr(words, 1)`` in place (sign back to the top)."""
    carry = scratch("carry", words.size, w)
    np.left_shift(words, w * 8 - 1, out=carry)
    words >>= 1
    words |= carry


def _halve(words: np.ndarray, w: int, planes: list[np.ndarray], depth: int = 0) -> None:
    """Write the ``w`` byte planes of ``w``-byte ``words`` (clobbered) into ``planes``."""
    if w == 1:
        planes[0][...] = words
        return
    h = w // 2
    if h == 1:
        low, high = planes[0], planes[1]
    else:
        low = scratch(f"low{depth}", words.size, h)
        high = scratch(f"high{depth}", words.size, h)
    np.copyto(low, words, casting="unsafe")  # truncation: the low half
    words >>= 8 * h
    np.copyto(high, words, casting="unsafe")
    if h > 1:
        _halve(low, h, planes[:h], depth + 1)
        _halve(high, h, planes[h:], depth + 1)


def split(raw: np.ndarray, dtype: DType, out: np.ndarray | None = None) -> list[np.ndarray]:
    """Split a 1-D uint8 array of whole words into ``dtype.word`` contiguous byte planes.

    Args:
        raw: the words' bytes.
        dtype: the transform.
        out: where to put the planes (``raw.size`` bytes, plane ``i`` at ``i * n``); by
            default a new array. The planes returned are views of it.
    """
    return split_sampled(raw, dtype, out)[0]


#: Per plane: sampled entropy (bits per byte), sampled share of zeros, AND and OR of all
#: its bytes (see ``ckptz.codecs.frames.PlaneStats``).
Stats = tuple[float, float, int, int]


def split_sampled(
    raw: np.ndarray, dtype: DType, out: np.ndarray | None = None, sample: int = 0
) -> tuple[list[np.ndarray], list[Stats] | None]:
    """:func:`split`, plus each plane's statistics over a ``sample``-byte strided sample
    where the C extension computes them in the same pass (else None)."""
    w = dtype.word
    if w == 1:
        return [raw], None
    if raw.size % w:
        raise ValueError(f"{raw.size} bytes is not a whole number of {w}-byte words")
    n = raw.size // w
    if out is None:
        out = np.empty(raw.size, np.uint8)
    planes = [out[i * n : (i + 1) * n] for i in range(w)]
    if native is not None and w in (2, 4, 8):
        stats = native.split(raw, out, w, dtype.is_float, sample)
        return planes, list(stats) if stats is not None else None
    words = raw.view(_UINT[w])
    work = scratch("work", n, w)
    if dtype.is_float:
        _rotate_left(words, w, work)
    else:
        np.copyto(work, words)
    _halve(work, w, planes)
    return planes, None


def split_owned(
    raw: np.ndarray, dtype: DType, sample: int = 0
) -> tuple[list[bytes], list[Stats] | None] | None:
    """:func:`split_sampled` into a new ``bytes`` per plane (the C extension's, for 2-, 4- and
    8-byte words; else None): a plane that is stored as it is needs no copy of its own."""
    w = dtype.word
    if native is None or w not in (2, 4, 8):
        return None
    planes, stats = native.split_planes(raw, w, dtype.is_float, sample)
    return list(planes), list(stats) if stats is not None else None


def _join(planes: list[np.ndarray], out: np.ndarray, depth: int = 0) -> None:
    """Inverse of :func:`_halve`: ``out`` (words of ``len(planes)`` bytes) from byte planes."""
    w = len(planes)
    h = w // 2
    if h == 1:
        low, high = planes
    else:
        low = scratch(f"low{depth}", out.size, h)
        high = scratch(f"high{depth}", out.size, h)
        _join(planes[:h], low, depth + 1)
        _join(planes[h:], high, depth + 1)
    np.copyto(out, high)  # widening copy, then an in-place shift: 2x a casting shift
    out <<= 8 * h
    out |= low


def merge(planes: Sequence[np.ndarray | int], dtype: DType, out: np.ndarray | None = None) -> np.ndarray:
    """Inverse of :func:`split`: interleave planes back and undo the rotation.

    Args:
        planes: ``dtype.word`` planes of equal size; an int stands for a plane of that one
            byte value (a ``const`` chunk), and needs ``out``.
        dtype: the transform.
        out: a 1-D uint8 array of ``word * plane size`` bytes to write into; by default a
            new array.

    Returns:
        ``out`` (or the new array); for one-byte words without ``out``, the plane itself.
    """
    w = dtype.word
    if w == 1 and out is None and not isinstance(planes[0], int):
        return planes[0]
    if out is None:
        arrays = [p for p in planes if not isinstance(p, int)]
        if len(arrays) != len(planes):
            raise ValueError("constant planes need an output array")
        out = np.empty(sum(a.size for a in arrays), np.uint8)
    if w == 1:
        out[...] = planes[0]
        return out
    if native is not None and w in (2, 4, 8):
        native.merge(planes, out, w, dtype.is_float)
        return out
    n = out.size // w
    arrays = [np.full(n, p, np.uint8) if isinstance(p, int) else p for p in planes]
    words = out.view(_UINT[w])
    _join(arrays, words)
    if dtype.is_float:
        _rotate_right(words, w)
    return out
