"""The dtype-aware transform: sign rotation and byte planes (CPU implementation).

A float word ``s|exponent|mantissa`` is rotated left by one bit so the sign sits at the
bottom and the exponent's high bits fill the top byte; the words are then split into
byte planes, plane 0 holding every word's lowest byte and plane ``word-1`` the exponent
byte. Integers are split without rotation. Words of one byte pass through unchanged.
The GPU transform must produce exactly these bytes.
"""

from __future__ import annotations

import numpy as np

from ckptz.dtypes import DType

_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _halve(words: np.ndarray, w: int, out: list[np.ndarray]) -> None:
    """Append the ``w`` byte planes of ``w``-byte ``words``, lowest first, to ``out``.

    Halving (low half by truncation, high half by shift-and-truncate) keeps every pass
    a contiguous SIMD loop over ever narrower words; a strided byte gather
    (``grid[:, i]``) is about half as fast.
    """
    if w == 1:
        out.append(words)
        return
    h = w // 2
    half = _UINT[h] if h > 1 else np.uint8
    low = words.astype(half)
    words >>= 8 * h  # the caller's temporary: the high half, in place
    _halve(low, h, out)
    _halve(words.astype(half), h, out)


def split(raw: np.ndarray, dtype: DType) -> list[np.ndarray]:
    """Split a 1-D uint8 array of whole words into ``dtype.word`` contiguous byte planes."""
    w = dtype.word
    if w == 1:
        return [raw]
    if raw.size % w:
        raise ValueError(f"{raw.size} bytes is not a whole number of {w}-byte words")
    words = raw.view(_UINT[w])
    if dtype.is_float:
        work = np.left_shift(words, 1)
        work |= words >> (w * 8 - 1)
    else:
        work = words.copy()
    planes: list[np.ndarray] = []
    _halve(work, w, planes)
    return planes


def _join(planes: list[np.ndarray]) -> np.ndarray:
    """Inverse of :func:`_halve`: words of ``len(planes)`` bytes from their byte planes."""
    w = len(planes)
    if w == 1:
        return planes[0]
    h = w // 2
    words = np.left_shift(_join(planes[h:]), 8 * h, dtype=_UINT[w])
    words |= _join(planes[:h])
    return words


def merge(planes: list[np.ndarray], dtype: DType) -> np.ndarray:
    """Inverse of :func:`split`: interleave planes back and undo the rotation."""
    w = dtype.word
    if w == 1:
        return planes[0]
    words = _join(planes)
    if dtype.is_float:
        widened = np.left_shift(words, w * 8 - 1)
        words >>= 1
        words |= widened
    return words.view(np.uint8)
