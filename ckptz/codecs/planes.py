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
        bits = w * 8
        words = (words << _UINT[w](1)) | (words >> _UINT[w](bits - 1))
    grid = words.view(np.uint8).reshape(-1, w)
    return [np.ascontiguousarray(grid[:, i]) for i in range(w)]


def merge(planes: list[np.ndarray], dtype: DType) -> np.ndarray:
    """Inverse of :func:`split`: interleave planes back and undo the rotation."""
    w = dtype.word
    if w == 1:
        return planes[0]
    n = planes[0].size
    grid = np.empty((n, w), dtype=np.uint8)
    for i, plane in enumerate(planes):
        grid[:, i] = plane
    if not dtype.is_float:
        return grid.reshape(-1)
    words = grid.reshape(-1).view(_UINT[w])
    bits = w * 8
    words = (words >> _UINT[w](1)) | (words << _UINT[w](bits - 1))
    return words.view(np.uint8)
