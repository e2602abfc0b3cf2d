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


def split(raw: np.ndarray, dtype: DType) -> list[np.ndarray]:
    """Split a 1-D uint8 array of whole words into ``dtype.word`` contiguous byte planes."""
    w = dtype.word
    if w == 1:
        return [raw]
    if raw.size % w:
        raise ValueError(f"{raw.size} bytes is not a whole number of {w}-byte words")
    words = raw.view(_UINT[w])
    if dtype.is_float:
        rotated = np.left_shift(words, 1)
        rotated |= words >> (w * 8 - 1)
        words = rotated
    # Shift-and-truncate runs as contiguous SIMD loops; a strided byte gather
    # (``grid[:, i]``) is about half as fast.
    planes = [words.astype(np.uint8)]
    shifted = np.empty_like(words)
    for i in range(1, w):
        np.right_shift(words, 8 * i, out=shifted)
        planes.append(shifted.astype(np.uint8))
    return planes


def merge(planes: list[np.ndarray], dtype: DType) -> np.ndarray:
    """Inverse of :func:`split`: interleave planes back and undo the rotation."""
    w = dtype.word
    if w == 1:
        return planes[0]
    words = planes[0].astype(_UINT[w])
    widened = np.empty_like(words)
    for i in range(1, w):
        widened[...] = planes[i]
        widened <<= 8 * i
        words |= widened
    if dtype.is_float:
        np.left_shift(words, w * 8 - 1, out=widened)
        words >>= 1
        words |= widened
    return words.view(np.uint8)
