"""The context bound of ``ckptz bench``: what coding each float exponent given the one before
it could reach, beside the order-0 bounds of :func:`ckptz.pipeline.sampling.entropy_bound`.

The ``huff1`` bitstream (:mod:`ckptz.codecs.order1`) codes exponent planes this way; the
bound says how much that could save on a component, its measured ratio what it did save.
"""

from __future__ import annotations

import numpy as np

from ckptz.codecs.planes import split
from ckptz.engines.base import stream_dtype
from ckptz.pipeline.sampling import BOUND_CHUNK, Frame


def _bits(counts: np.ndarray) -> float:
    """Order-0 code length in bits of data with these byte counts: n·log2 n − Σ c·log2 c."""
    c = counts[counts > 0].astype(np.float64)
    n = c.sum()
    return float(n * np.log2(n) - (c * np.log2(c)).sum()) if n else 0.0


def _order1_bits(plane: np.ndarray) -> float:
    """Bits of ``plane`` coded given each byte's predecessor (one model for the plane)."""
    prev = np.empty(plane.size, np.int64)
    prev[0] = 0
    prev[1:] = plane[:-1]
    pairs = np.bincount(prev * 256 + plane, minlength=65536).astype(np.float64)
    rows = pairs.reshape(256, 256).sum(axis=1)
    # Σ over rows of (n_r·log2 n_r − Σ c·log2 c): the rows' order-0 codes, all at once
    return float(_xlogx(rows).sum() - _xlogx(pairs).sum())


def _xlogx(x: np.ndarray) -> np.ndarray:
    x = x[x > 0]
    return x * np.log2(x)


def context_bound(frames: tuple[Frame, ...]) -> float:
    """The chunk-adaptive order-0 bound (one histogram per 256 KiB of each plane) with each
    float stream's exponent plane counted given the preceding byte instead, as a ratio.

    Like the order-0 bounds it leaves out the cost of describing the models, so it is a bar,
    not a promise: more so here, where a model has a row per preceding byte value.
    """
    bits = 0.0
    total = 0
    for f in frames:
        total += f.data.size
        dtype = stream_dtype(f.stream)
        planes = split(f.data, dtype)
        for i, plane in enumerate(planes):
            exponent = dtype.is_float and i == len(planes) - 1
            for at in range(0, plane.size, BOUND_CHUNK):
                chunk = plane[at : at + BOUND_CHUNK]
                order0 = _bits(np.bincount(chunk, minlength=256))
                bits += min(order0, _order1_bits(chunk)) if exponent else order0
    return total * 8 / bits if bits else float("inf")
