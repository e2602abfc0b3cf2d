"""A whole-file digest's leaves, hashed on the GPU where the file's bytes lie in pieces.

``ckptz.load`` decodes a container straight into the storages of the loaded tensors on the
GPU; the file's bytes then lie there in pieces (one storage per record, the zip's headers
and pickle beside them). FORMAT.md's whole-file digest is the xxh3_128 of the xxh3_64 of
every leaf (:mod:`ckptz.digest`). A leaf lying inside one piece is hashed where it lies;
a leaf that straddles pieces is first assembled in scratch memory, a batch of such leaves
at a time, by one copy kernel. Every leaf's blocks are summed in parallel, then one warp
per leaf chains them (:mod:`ckptz.engines.gpu.hash_source`).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from ckptz.digest import leaf_count, whole_leaves
from ckptz.engines.gpu.coder import Ops

#: Scratch memory for assembling straddling leaves, at most.
ASSEMBLY_BYTES = 256 << 20


def tree_leaves(ops: Ops, segments: Sequence[tuple[int, int, int]], size: int, leaf: int) -> np.ndarray:
    """The xxh3_64 of each ``leaf``-byte leaf of a ``size``-byte file whose bytes lie in
    device memory as ``segments`` (file offset, device address, bytes), tiling the file in
    order; uint64 by leaf number. ``ops`` is the GPU's (:class:`~ckptz.engines.gpu.kernels.CudaOps`)
    or, for bytes in host memory, :class:`~ckptz.engines.gpu.transform.HostOps`.

    Raises:
        ValueError: the segments do not tile the file.
    """
    pieces = [s for s in segments if s[2] > 0]
    at = 0
    for start, _, n in pieces:
        if start != at:
            raise ValueError(f"segments leave a gap or overlap at byte {at}")
        at += n
    if at != size:
        raise ValueError(f"segments cover {at} bytes of a {size}-byte file")
    count = leaf_count(size, leaf)
    numbers = np.arange(count, dtype=np.uint64)
    lengths = np.minimum((numbers + 1) * leaf, size) - numbers * leaf
    ptrs = np.zeros(count, np.uint64)
    inside = np.zeros(count, bool)
    for start, ptr, n in pieces:
        whole = whole_leaves(start, n, leaf, size)
        k = numbers[whole.start : whole.stop]
        ptrs[whole.start : whole.stop] = ptr + k * leaf - start
        inside[whole.start : whole.stop] = True
    out = np.zeros(count, np.uint64)
    found = np.flatnonzero(inside)
    out[found] = ops.xxh3(ptrs[found], lengths[found])
    straddle = np.flatnonzero(~inside)
    starts = [s[0] for s in pieces]
    per = max(1, ASSEMBLY_BYTES // leaf)
    for b in range(0, straddle.size, per):
        ks = straddle[b : b + per]
        scratch = ops.scratch("leaves", ks.size * leaf)
        src: list[int] = []
        dst: list[int] = []
        take: list[int] = []
        for slot, k in enumerate(ks.tolist()):
            lo, hi = k * leaf, min((k + 1) * leaf, size)
            j = bisect.bisect_right(starts, lo) - 1
            while lo < hi:
                start, ptr, n = pieces[j]
                m = min(hi, start + n) - lo
                src.append(ptr + lo - start)
                dst.append(scratch.ptr + slot * leaf + lo - k * leaf)
                take.append(m)
                lo += m
                j += 1
        ops.copy_ranges(np.array(src, np.uint64), np.array(dst, np.uint64), np.array(take, np.uint64))
        slots = scratch.ptr + np.arange(ks.size, dtype=np.uint64) * np.uint64(leaf)
        out[ks] = ops.xxh3(slots, lengths[ks])
    return out


__all__ = ["ASSEMBLY_BYTES", "tree_leaves"]
