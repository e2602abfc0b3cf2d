"""Every index of many runs at once (:func:`ckptz.indices.runs`) against a Python loop."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ckptz.indices import runs


@given(st.lists(st.tuples(st.integers(-1000, 1000), st.integers(0, 20)), max_size=30))
def test_runs_are_each_range_in_order(pairs: list[tuple[int, int]]) -> None:
    starts = np.array([a for a, _ in pairs], np.int64)
    counts = np.array([n for _, n in pairs], np.int64)
    got = runs(starts, counts)
    assert got.dtype == np.int64
    assert got.tolist() == [a + k for a, n in pairs for k in range(n)]
