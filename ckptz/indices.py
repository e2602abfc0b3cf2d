"""Index arithmetic on many runs of consecutive integers at once, without a Python loop.

A run's chunks, a leaf's parts, a payload's padding: the pipeline names many ranges at once
by where each starts and how long it is, and needs every index they cover, in order.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def runs(starts: ArrayLike, counts: ArrayLike) -> np.ndarray:
    """``starts[0] .. starts[0] + counts[0] - 1``, then ``starts[1] ..``, and so on: every
    index of each run, run after run (int64; a run of 0 gives none)."""
    counts = np.asarray(counts, np.int64)
    before = np.cumsum(counts) - counts
    return np.repeat(np.asarray(starts, np.int64) - before, counts) + np.arange(
        int(counts.sum()), dtype=np.int64
    )


__all__ = ["runs"]
