"""The dtype-aware transform: sign rotation and byte planes (CPU implementation).

A float word ``s|exponent|mantissa`` is rotated left by one bit so the sign sits at the
bottom and the exponent's high bits fill the top byte; the words are then split into
byte planes, plane 0 holding every word's lowest byte and plane ``word-1`` the exponent
byte. Integers are split without rotation. Words of one byte pass through unchanged.
The GPU transform must produce exactly these bytes.

The C extension (:mod:`ckptz.codecs.native`) makes each direction one pass over the words.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from ckptz.codecs.native import native
from ckptz.dtypes import DType

_local = threading.local()


def scratch(slot: str, n: int) -> np.ndarray:
    """This thread's reusable array of ``n`` bytes, named ``slot``.

    It grows to the largest size asked for and stays (a frame is at most a few MiB); its
    contents are garbage, and the next call on this thread with the same ``slot`` hands
    out the same memory, so nothing may keep a view of it. A fresh array per frame would
    fault its pages in anew every time.
    """
    pool: dict[str, np.ndarray] | None = getattr(_local, "pool", None)
    if pool is None:
        pool = _local.pool = {}
    buf = pool.get(slot)
    if buf is None or buf.size < n:
        buf = pool[slot] = np.empty(n, np.uint8)
    return buf[:n]


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
    (None where ``sample`` is 0 or the words are single bytes)."""
    w = dtype.word
    if w == 1:
        return [raw], None
    if raw.size % w:
        raise ValueError(f"{raw.size} bytes is not a whole number of {w}-byte words")
    n = raw.size // w
    if out is None:
        out = np.empty(raw.size, np.uint8)
    planes = [out[i * n : (i + 1) * n] for i in range(w)]
    stats = native.split(raw, out, w, dtype.is_float, sample)
    return planes, list(stats) if stats is not None else None


def split_owned(
    raw: np.ndarray, dtype: DType, sample: int = 0
) -> tuple[list[bytes], list[Stats] | None] | None:
    """:func:`split_sampled` into a new ``bytes`` per plane (for 2-, 4- and 8-byte words; else
    None): a plane that is stored as it is needs no copy of its own."""
    w = dtype.word
    if w == 1:
        return None
    planes, stats = native.split_planes(raw, w, dtype.is_float, sample)
    return list(planes), list(stats) if stats is not None else None


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
    native.merge(planes, out, w, dtype.is_float)
    return out
