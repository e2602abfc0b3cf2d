"""The pinned pool's bookkeeping, with plain memory standing in for pinned regions."""

from __future__ import annotations

import gc
from typing import ClassVar

import numpy as np

from ckptz.engines.gpu.pinned import GRAIN, PinnedPool


class FakeRegion:
    """Host memory in place of a pinned region: counts what was made and let go."""

    made: ClassVar[list[FakeRegion]] = []

    def __init__(self, size: int) -> None:
        self.size = size
        self.array = np.zeros(size, np.uint8)
        self.start = self.array.ctypes.data
        self.returned = 0
        self.closed = False
        FakeRegion.made.append(self)

    def close(self) -> None:
        self.closed = True


def test_buffers_of_a_new_size_reuse_the_pool_once_old_sizes_are_let_go() -> None:
    """A run whose buffers change size (a compression's, then its decode-back's) must not pin
    a new region per buffer while regions of the old size hold the pool's keep."""
    FakeRegion.made = []
    pool = PinnedPool(keep=8 * GRAIN, make=FakeRegion)  # type: ignore[arg-type]
    small = [pool.take(GRAIN) for _ in range(8)]  # the old size fills the keep
    del small
    gc.collect()
    assert len(FakeRegion.made) == 8 and not any(r.closed for r in FakeRegion.made)
    for _ in range(10):  # the new size, two at a time
        a, b = pool.take(3 * GRAIN), pool.take(3 * GRAIN)
        del a, b
        gc.collect()
    big = [r for r in FakeRegion.made if r.size == 3 * GRAIN]
    assert len(big) == 2  # pinned once, then reused
    assert not any(r.closed for r in big)
    assert sum(r.closed for r in FakeRegion.made if r.size == GRAIN) >= 6  # the old size went
    kept = sum(r.size for r in FakeRegion.made if not r.closed)
    assert kept <= 8 * GRAIN


def test_a_region_larger_than_the_keep_is_let_go_when_it_comes_back() -> None:
    FakeRegion.made = []
    pool = PinnedPool(keep=2 * GRAIN, make=FakeRegion)  # type: ignore[arg-type]
    lease = pool.take(5 * GRAIN)
    assert pool.holds(lease[10:20])
    del lease
    gc.collect()
    assert FakeRegion.made[0].closed
    assert not pool.holds(FakeRegion.made[0].array[:16])
