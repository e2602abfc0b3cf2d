"""Page-locked host memory for the GPU engine, pinned fast and kept for the process.

Copies between host and GPU run asynchronously, at full PCIe speed, only from page-locked
memory. ``cudaHostAlloc`` (torch's pinned allocator) pins slowly enough that a restore can
spend most of its time pinning its buffers, while anonymous memory backed by transparent
huge pages, touched once and then registered (``cuMemHostRegister``), pins an order of
magnitude faster. So this module maps its
own regions, registers them through the driver (:mod:`ckptz.cuda`), and hands out
*leases*: numpy arrays over a region that give it back to the pool once the lease and every
view of it are gone. The pool belongs to the process, so a second engine (another file,
another ``ckptz.load``) finds its buffers already pinned.

Memory: regions are kept for reuse up to :data:`KEEP` bytes free; beyond that, the free
regions given back longest ago are unregistered and unmapped. (Closing the region just given
back instead, as ckptz once did, let regions of sizes no longer asked for hold the pool: a
GPU restore after a compression in one process pinned and unpinned each of its buffers.)
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import threading
import weakref
from collections.abc import Callable

import numpy as np

from ckptz import cuda

#: Regions come in multiples of a huge page, so that leases of similar sizes share them.
GRAIN = 2 << 20
#: Free regions kept pinned for later leases; more than this goes back to the system.
KEEP = 2 << 30
#: Mappings CUDA would not unregister, kept mapped for the process (see :func:`_release`).
_UNRELEASED: list[mmap.mmap] = []


class Region:
    """One mapping, registered with CUDA (or, where that fails, memory the driver allocates
    pinned). It is unpinned before its memory goes back to the system, whether it is closed
    or just dropped: a mapping unmapped while still registered leaves the driver taking
    whatever memory later lands at those addresses for pinned memory (a later copy of a
    pageable tensor there failed with "invalid argument").
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._map: mmap.mmap | None = None
        allocated = 0
        pinned = False
        try:
            self._map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            if hasattr(mmap, "MADV_HUGEPAGE"):
                self._map.madvise(mmap.MADV_HUGEPAGE)
            self.array = np.frombuffer(self._map, dtype=np.uint8)
            self.array[::4096] = 0  # fault the pages in here: registering them is then quick
            cuda.host_register(self.array.ctypes.data, size)
            pinned = True
        except (OSError, RuntimeError):
            self._map = None
            allocated = cuda.host_alloc(size)
            self.array = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(allocated))
        self.start = self.array.ctypes.data
        #: Whether CUDA has it registered (else it is copied from as pageable memory).
        self.pinned = pinned or allocated != 0
        #: When the region last came back to its pool (the pool's count of returns).
        self.returned = 0
        # Runs on close() or when the region is dropped, while the mapping is still mapped
        # (the finalizer holds it); not at exit, where the process's memory goes anyway.
        self._release = weakref.finalize(self, _release, self._map if pinned else None, allocated, self.start)
        self._release.atexit = False

    def close(self) -> None:
        """Unpin and unmap (no lease of it may be left)."""
        self._release()
        del self.array
        self._map = None


def _release(mapping: mmap.mmap | None, allocated: int, start: int) -> None:
    """Unpin a region's memory, then let it go."""
    if mapping is not None:
        if not cuda.host_unregister(start):
            # CUDA still counts these pages as pinned: unmapped, their addresses could come
            # back in a later allocation that the driver would then take for pinned memory.
            # Keep the mapping for the process instead.
            _UNRELEASED.append(mapping)
    elif allocated:
        cuda.host_free(allocated)


class PinnedPool:
    """Pinned regions of the process, leased out as numpy arrays.

    :meth:`take` leases a region (the smallest free one that fits, else a new one);
    :meth:`holds` tells whether an array lies in pinned memory, so a copy to the device can go
    straight from where a reader put the bytes.

    Args:
        keep: free bytes kept pinned for later leases (default :data:`KEEP`).
        make: makes a region of a given size (the tests' stand-in for pinned memory).
    """

    def __init__(self, keep: int = KEEP, make: Callable[[int], Region] = Region) -> None:
        self._lock = threading.Lock()
        self._free: list[Region] = []  # sorted by size
        self._starts: list[int] = []  # every region, by address
        self._regions: list[Region] = []
        self._kept = 0
        self._keep = keep
        self._make = make
        self._returns = 0

    def take(self, size: int) -> np.ndarray:
        """A lease of at least ``size`` bytes, returned ``size`` long; its contents are
        undefined. The region comes back to the pool when the lease and its views are gone."""
        region = self._reuse(size)
        if region is None:
            # Pinning takes a moment: not under the lock, which every copy to the device takes.
            region = self._make(max(GRAIN, -(-size // GRAIN) * GRAIN))
            with self._lock:
                at = bisect.bisect(self._starts, region.start)
                self._starts.insert(at, region.start)
                self._regions.insert(at, region)
        # A fresh buffer object per lease: views of the lease keep it (not the region's own
        # array) alive, so the finalizer runs when the last of them is gone.
        lease = np.frombuffer(region.array.data[:size], dtype=np.uint8)
        weakref.finalize(lease, self._give, region).atexit = False  # no CUDA calls at exit
        return lease

    def holds(self, arr: np.ndarray) -> bool:
        """Whether ``arr`` (non-empty, contiguous) lies in this pool's pinned memory."""
        return self.find(arr) is not None

    def find(self, arr: np.ndarray) -> Region | None:
        """The region ``arr`` (non-empty, contiguous) lies in, if one of this pool's."""
        if not arr.size or not arr.flags.c_contiguous:
            return None
        ptr = arr.ctypes.data
        with self._lock:
            at = bisect.bisect(self._starts, ptr) - 1
            if at >= 0 and ptr + arr.nbytes <= self._starts[at] + self._regions[at].size:
                return self._regions[at]
            return None

    def _reuse(self, size: int) -> Region | None:
        with self._lock:
            sizes = [r.size for r in self._free]
            at = bisect.bisect_left(sizes, size)
            if at == len(self._free) or self._free[at].size > 2 * size + GRAIN:
                return None  # nothing fits, or only a region far too big to tie up for this
            self._kept -= self._free[at].size
            return self._free.pop(at)

    def _give(self, region: Region) -> None:
        """Keep a region that came back; past :attr:`keep` free bytes, let go of the free
        regions given back longest ago."""
        stale = []
        with self._lock:
            self._returns += 1
            region.returned = self._returns
            sizes = [r.size for r in self._free]
            self._free.insert(bisect.bisect(sizes, region.size), region)
            self._kept += region.size
            while self._kept > self._keep:
                oldest = min(self._free, key=lambda r: r.returned)
                self._free.remove(oldest)
                self._kept -= oldest.size
                at = bisect.bisect(self._starts, oldest.start) - 1
                del self._starts[at], self._regions[at]
                stale.append(oldest)
        for r in stale:  # unpinning takes a moment: not under the lock
            r.close()


_POOL: PinnedPool | None = None
_POOL_LOCK = threading.Lock()


def pool() -> PinnedPool:
    """The process's pinned memory."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = PinnedPool()
        return _POOL


__all__ = ["GRAIN", "KEEP", "PinnedPool", "Region", "pool"]
