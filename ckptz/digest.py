"""Whole-file digests: the one a container records of its source, and how it is computed.

Two kinds exist (docs/FORMAT.md, *Integrity*):

- ``xxh3_128`` (containers 1.0-1.3): xxh3_128, seed 0, of the file's bytes in order. One
  thread must hash every byte in order, which on a many-core host is the slowest stage.
- ``xxh3_tree`` (1.4): the file is cut at fixed offsets into *leaves* of ``leaf`` bytes (the
  last one shorter; an empty file has none); each leaf's hash is its xxh3_64, seed 0; the
  digest is the xxh3_128, seed 0, of the leaf hashes as little-endian u64, in leaf order.
  Leaves are independent, so any thread holding a leaf's bytes can hash it.

:class:`Digest` is the recorded value, :class:`Hasher` computes either kind from bytes in
order, :func:`of_file` hashes a plain file's leaves in parallel, and :class:`Piecewise`
serves the pipelines, whose frames hold the file in *pieces* that arrive in any order: the
thread that holds a piece hashes the leaves lying whole inside it (:meth:`Piecewise.hash_whole`;
:func:`whole_leaves` alone decides which leaves those are), and a leaf that straddles pieces
is hashed from its parts (:class:`LeafTable` finds them all at once) by an engine that holds
a run of frames together, or else by whichever thread gives the last frame it lies in
(:class:`LeafJoins`). Only an ``xxh3_128`` digest is walked in file order.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import xxhash

from ckptz import indices, trace
from ckptz.checksums import Streams, xxh3_64, xxh3_64_nested, xxh3_64_ranges

#: Bytes per leaf that ckptz writes. python-xxhash releases the GIL only for inputs above
#: 100 000 bytes, so leaves are hashed in parallel by plain threads; but each leaf is one
#: release and one wait for the GIL, and smaller leaves cost a GPU pipeline much of its
#: time in those waits. 512 KiB leaves make four times fewer calls,
#: while most of a 1 MiB frame (and 7/8 of a 4 MiB one) still lies in whole leaves.
LEAF = 1 << 19
#: Leaf sizes a reader accepts: a power of two in this range (a tiny leaf would make the
#: leaf table of a hostile header's claimed size huge; a huge one, hashing sequential).
MIN_LEAF, MAX_LEAF = 1 << 12, 1 << 30
#: Bytes one :func:`of_file` task reads and hashes at once.
_BLOCK = 8 << 20
#: Leaf hashes a :class:`Hasher` gathers before handing them to the top-level hash.
_PENDING = 4096
#: Leaf hashes per block of a :class:`LeafHashes` (512 KiB of hashes for 8 GiB of file).
_BLOCK_SHIFT = 16
_HEX32 = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True, slots=True)
class Kind:
    """How a whole-file digest is computed.

    Attributes:
        name: ``xxh3_128`` (sequential) or ``xxh3_tree`` (leaves).
        leaf: bytes per leaf for ``xxh3_tree``; 0 for ``xxh3_128``.
    """

    name: Literal["xxh3_128", "xxh3_tree"]
    leaf: int = 0

    @property
    def tree(self) -> bool:
        return self.name == "xxh3_tree"

    def __str__(self) -> str:
        return f"xxh3_tree, {self.leaf // 1024} KiB leaves" if self.tree else self.name


#: The digest of containers 1.0-1.3 (still read, and kept when such a container is re-coded).
SEQUENTIAL = Kind("xxh3_128")
#: The digest ckptz writes (1.4).
TREE = Kind("xxh3_tree", LEAF)


@dataclass(frozen=True, slots=True)
class Digest:
    """A whole-file digest as a container records it. Digests of different kinds are
    simply unequal (one file's two digests cannot be compared without its bytes).

    Attributes:
        kind: how it was computed.
        hex: the digest, 32 lowercase hex characters.
    """

    kind: Kind
    hex: str

    def to_json(self) -> dict[str, object]:
        """The fields that hold it in a header's ``source`` (or ``reference``) object."""
        if self.kind.tree:
            return {"xxh3_tree": {"leaf": self.kind.leaf, "digest": self.hex}}
        return {"xxh3_128": self.hex}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Digest | None:
        """The digest recorded in ``obj`` (a ``source`` or ``reference`` object); None when it
        records neither kind. ``xxh3_tree`` wins where, against FORMAT.md, both are present.

        Raises:
            ValueError: a digest is present but malformed.
            TypeError: ``obj`` is not an object.
        """
        if not isinstance(obj, Mapping):
            raise TypeError("not an object")
        tree = obj.get("xxh3_tree")
        if tree is not None:
            if not isinstance(tree, Mapping):
                raise ValueError("xxh3_tree is not an object")
            leaf, hexdigest = tree.get("leaf"), tree.get("digest")
            if not isinstance(leaf, int) or isinstance(leaf, bool) or not MIN_LEAF <= leaf <= MAX_LEAF:
                raise ValueError("xxh3_tree leaf size out of range")
            if leaf & (leaf - 1) or not isinstance(hexdigest, str) or not _HEX32.fullmatch(hexdigest):
                raise ValueError("xxh3_tree leaf size or digest malformed")
            return cls(Kind("xxh3_tree", leaf), hexdigest)
        if "xxh3_128" in obj:
            # Read as leniently as 1.0-1.3 readers did: a malformed value just never matches.
            return cls(SEQUENTIAL, str(obj["xxh3_128"]))
        return None

    def __str__(self) -> str:
        return f"{self.hex} ({self.kind})"


def leaf_count(size: int, leaf: int) -> int:
    """Leaves of a ``size``-byte file: the last one may be shorter; an empty file has none."""
    return -(-size // leaf)


def whole_leaves(at: int, n: int, leaf: int, size: int) -> range:
    """The leaves lying entirely inside bytes ``[at, at + n)`` of a ``size``-byte file.

    This is the one rule that splits the work: whoever holds such a piece hashes these
    leaves; every other leaf is joined from its parts (:class:`LeafTable`). The file's last leaf ends at
    ``size``, so it lies inside a piece that reaches the end.
    """
    first = -(-at // leaf)
    end = at + n
    stop = leaf_count(end, leaf) if end == size else end // leaf
    return range(first, max(first, stop))


class Hasher:
    """A whole-file digest of bytes given in order, of either kind.

    Args:
        kind: :data:`TREE` (the default) or :data:`SEQUENTIAL`.
    """

    def __init__(self, kind: Kind = TREE) -> None:
        self.kind = kind
        self._top = xxhash.xxh3_128()
        self._leaf = xxhash.xxh3_64()
        self._in_leaf = 0  # bytes of the current leaf given so far
        self._pending = bytearray()  # leaf hashes not yet given to ``_top``

    def update(self, data: bytes | bytearray | memoryview | np.ndarray) -> None:
        """Hash the next bytes of the file."""
        view = (data.data if isinstance(data, np.ndarray) else memoryview(data)).cast("B")
        if not self.kind.tree:
            self._top.update(view)
            return
        leaf = self.kind.leaf
        while view:
            take = min(len(view), leaf - self._in_leaf)
            if take == leaf:  # a whole leaf at once: no streaming state
                self._pending += xxh3_64(view[:take]).to_bytes(8, "little")
            else:
                self._leaf.update(view[:take])
                self._in_leaf += take
                if self._in_leaf == leaf:
                    self._pending += self._leaf.intdigest().to_bytes(8, "little")
                    self._leaf.reset()
                    self._in_leaf = 0
            view = view[take:]
            if len(self._pending) >= 8 * _PENDING:
                self._top.update(self._pending)
                self._pending.clear()

    def digest(self) -> Digest:
        """The digest of the bytes given so far (more may follow)."""
        if not self.kind.tree:
            return Digest(self.kind, self._top.hexdigest())
        top = self._top.copy()
        top.update(self._pending)
        if self._in_leaf:
            top.update(self._leaf.intdigest().to_bytes(8, "little"))
        return Digest(self.kind, top.hexdigest())

    def hexdigest(self) -> str:
        """:meth:`digest`'s hex."""
        return self.digest().hex


class LeafHashes:
    """The hashes of a file's leaves, by leaf number, set from any thread (each leaf once).

    They are kept in blocks of 2^16, each made when a leaf in it is first set: memory
    follows the leaves hashed (1/16384 of the bytes), so the size a hostile header claims
    costs nothing up front.
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self._blocks: list[np.ndarray | None] = [None] * -(-count >> _BLOCK_SHIFT)
        self._lock = threading.Lock()

    def __setitem__(self, k: int, value: int) -> None:
        block = self._blocks[k >> _BLOCK_SHIFT]
        if block is None:
            block = self._make(k >> _BLOCK_SHIFT)
        block[k & ((1 << _BLOCK_SHIFT) - 1)] = value

    def set_many(self, numbers: np.ndarray, values: np.ndarray) -> None:
        """Set the leaves ``numbers`` to ``values``."""
        if not numbers.size:
            return
        lo, hi = int(numbers.min()) >> _BLOCK_SHIFT, int(numbers.max()) >> _BLOCK_SHIFT
        if lo == hi:  # a frame's leaves: almost always in one block
            block = self._blocks[lo]
            if block is None:
                block = self._make(lo)
            block[numbers & ((1 << _BLOCK_SHIFT) - 1)] = values
            return
        for b in np.unique(numbers >> _BLOCK_SHIFT).tolist():
            block = self._blocks[b]
            if block is None:
                block = self._make(b)
            inside = (numbers >> _BLOCK_SHIFT) == b
            block[numbers[inside] & ((1 << _BLOCK_SHIFT) - 1)] = values[inside]

    def _make(self, b: int) -> np.ndarray:
        with self._lock:
            block = self._blocks[b]
            if block is None:
                block = np.zeros(min(1 << _BLOCK_SHIFT, self.count - (b << _BLOCK_SHIFT)), "<u8")
                self._blocks[b] = block
            return block

    def hexdigest(self) -> str:
        """The xxh3_128 of the hashes as little-endian u64, in leaf order."""
        top = xxhash.xxh3_128()
        for b, block in enumerate(self._blocks):
            top.update((self._make(b) if block is None else block).data)
        return top.hexdigest()


class Piecewise:
    """The digest of a ``size``-byte file whose bytes come in pieces, in any order, from
    many threads (the pipelines' frames; see the module docstring).

    For :data:`TREE`, whoever holds a piece hashes the leaves lying whole inside it
    (:meth:`hash_whole`), and the leaves that straddle pieces are hashed from their parts
    (a :class:`LeafTable` tells which; an engine joins those inside a run of frames, and
    :class:`LeafJoins` the rest). For :data:`SEQUENTIAL`, :meth:`hash_whole` does nothing
    and every piece must be given to :meth:`walk`, once, in file order.

    Attributes:
        hashes: the leaf hashes, by leaf number (none for :data:`SEQUENTIAL`).
    """

    def __init__(self, kind: Kind, size: int) -> None:
        self.kind, self.size = kind, size
        self._walked = Hasher(kind) if not kind.tree else None
        self.hashes = LeafHashes(leaf_count(size, kind.leaf) if kind.tree else 0)

    def hash_whole(self, pieces: Iterable[tuple[int, int, int]], data: np.ndarray | memoryview) -> None:
        """Hash the leaves lying whole inside ``pieces``: ``(file offset, offset in data,
        bytes)`` of ``data``'s bytes (a frame's pieces). Safe from any thread."""
        if self._walked is not None:
            return
        numbers, starts, sizes = self._whole(pieces)
        if numbers.size:  # one call for the frame's leaves, without the GIL
            self.hashes.set_many(numbers, xxh3_64_ranges(data, starts, sizes))

    def hash_frames(
        self,
        pieces: Iterable[tuple[int, int, int]],
        data: np.ndarray | memoryview,
        offsets: np.ndarray,
        sizes: np.ndarray,
    ) -> np.ndarray:
        """:meth:`hash_whole`, and the xxh3_64 of each range ``offsets``/``sizes`` of
        ``data`` (the checksums of the frames whose pieces these are), in one pass over
        memory: each leaf is hashed while its frame's hash reads the same bytes
        (:func:`~ckptz.checksums.xxh3_64_nested`)."""
        if self._walked is not None:
            return xxh3_64_ranges(data, offsets, sizes)
        numbers, starts, lengths = self._whole(pieces)
        sums, hashes = xxh3_64_nested(data, offsets, sizes, starts, lengths)
        if numbers.size:
            self.hashes.set_many(numbers, hashes)
        return sums

    def _whole(self, pieces: Iterable[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The leaves lying whole inside ``pieces``: their numbers, and where they start in
        the pieces' data and their sizes."""
        leaf, size = self.kind.leaf, self.size
        numbers, starts = [], []
        for at, within, n in pieces:
            whole = whole_leaves(at, n, leaf, size)
            numbers.append(np.arange(whole.start, whole.stop, dtype=np.int64))
            starts.append(numbers[-1] * leaf + (within - at))
        if not numbers:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        k = np.concatenate(numbers)
        return k, np.concatenate(starts), np.minimum((k + 1) * leaf, size) - k * leaf

    def leaf_table(self, frames: Sequence[Sequence[tuple[int, int, int]]]) -> LeafTable:
        """The leaves inside each frame's pieces, and those straddling pieces (:class:`LeafTable`)."""
        return LeafTable(self, frames)

    @property
    def walks(self) -> bool:
        """Whether every piece must be given to :meth:`walk` in file order (:data:`SEQUENTIAL`)."""
        return self._walked is not None

    def walk(self, piece: memoryview) -> None:
        """The next piece of the file, in file order (:data:`SEQUENTIAL` only; one thread)."""
        assert self._walked is not None, "a tree digest is not walked"
        self._walked.update(piece)

    def digest(self) -> Digest:
        """The file's digest, once every leaf was hashed (every piece walked)."""
        if self._walked is not None:
            return self._walked.digest()
        return Digest(self.kind, self.hashes.hexdigest())


class LeafJoins:
    """The leaves of a :data:`TREE` digest that straddle frames and that no engine joins
    (:meth:`LeafTable.loose`), each hashed from its parts, in order, by the threads that give
    the frames they lie in (:meth:`give`), without waiting for the frames around them.

    Each leaf is hashed as a stream: a part is hashed as soon as its frame and every part
    before it are in, and a frame is released once its parts are hashed. So a frame is
    held no longer than an in-order walk of the file would hold it (a leaf spanning many
    small frames holds one at a time), while the leaves progress in parallel. Where
    streams interleave in a file (a ``torch.save`` archive's records between its tensors),
    such leaves are many: hashing them in one thread that walked the whole file in order
    was the slowest stage of a GPU compression.

    Args:
        digest: where the hashes go.
        table: the leaves (its runs planned first, where an engine joins theirs).
        on_done: called with each frame once no leaf needs its bytes any more (from
            :meth:`give` of it, or of the frame whose bytes let its last part be hashed).
    """

    def __init__(self, digest: Piecewise, table: LeafTable, on_done: Callable[[int], None]) -> None:
        self._digest, self._on_done = digest, on_done
        numbers, frame, start, size, bounds = table.loose()
        count, frames = numbers.size, table.frames
        self._numbers = numbers.tolist()
        self._parts = [
            list(
                zip(frame[a:b].tolist(), start[a:b].tolist(), (start[a:b] + size[a:b]).tolist(), strict=True)
            )
            for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
        ]
        # Each frame's leaves (once each), and its parts still to hash.
        leaf_of_part = np.repeat(np.arange(count, dtype=np.int64), np.diff(bounds))
        pair = np.unique(frame * max(count, 1) + leaf_of_part)  # by frame, then leaf
        self._frame_leaves = (pair % max(count, 1)).tolist()
        self._frame_bounds = np.searchsorted(pair // max(count, 1), np.arange(frames + 1)).tolist()
        self._unhashed = np.bincount(frame, minlength=frames).tolist()
        self._next = [0] * count  # each leaf's first part not hashed yet
        self._streams = Streams()
        self._state = [-1] * count  # a leaf's streaming state, from its first part to its last
        self._busy = [False] * count  # a thread is hashing the leaf's parts
        # Frames given whose parts are not all hashed (the parts still needed, once the
        # frame waits for another: :meth:`_keep_parts`).
        self._views: dict[int, np.ndarray | _Kept] = {}
        self._left = count + frames  # leaves to hash, and frames to be given
        self._lock = threading.Lock()
        self.done: Future[None] = Future()
        if not self._left:
            self.done.set_result(None)

    def give(self, frames: Sequence[tuple[int, np.ndarray]]) -> None:
        """Frames' numbers and bytes (each once, after :meth:`Piecewise.hash_whole` of them,
        from any thread; a run's at once): hash the parts they let through, in one call, and
        release the frames no leaf needs now."""
        mine, alone = [], []
        with self._lock:
            for i, data in frames:
                a, b = self._frame_bounds[i], self._frame_bounds[i + 1]
                if a == b:
                    alone.append(i)
                    continue
                self._views[i] = data
                for m in self._frame_leaves[a:b]:
                    if not self._busy[m]:
                        self._busy[m] = True
                        mine.append(m)
        for i in alone:
            self._on_done(i)
        if mine:
            self._advance(mine)
        with self._lock:
            for i, _ in frames:
                self._keep_parts(i)
            self._finish(len(frames))  # last: once done, the pipeline may close what on_done uses

    def _keep_parts(self, i: int) -> None:
        """Frame ``i`` waits for another frame's bytes (a leaf straddles them): keep a copy
        of the parts of it that leaves still need (under the lock), not the frame. A frame
        is often a view of a larger buffer (a GPU restore decodes a span of ~40 frames into
        one pinned buffer), which the view would keep whole, holding gigabytes for frames at
        tensor boundaries."""
        data = self._views.get(i)
        if not isinstance(data, np.ndarray):
            return
        a, b = self._frame_bounds[i], self._frame_bounds[i + 1]
        ranges = [
            (lo, hi)
            for m in self._frame_leaves[a:b]
            for f, lo, hi in self._parts[m][self._next[m] :]
            if f == i
        ]
        # numpy's copy lets go of the GIL while it copies (``tobytes`` held it: 4 % of a GPU
        # compression's GIL samples, the readers' copies of up to a leaf each).
        self._views[i] = _Kept({(lo, hi): data[lo:hi].copy() for lo, hi in ranges})

    def _advance(self, leaves: list[int]) -> None:
        """Hash ``leaves``' parts from their next ones while their frames are in (this thread
        alone, until it finds none: a frame given meanwhile is seen on the next round)."""
        while leaves:
            jobs, spans = [], []
            with self._lock:
                for m in leaves:
                    parts = self._parts[m]
                    first = stop = self._next[m]
                    while stop < len(parts) and parts[stop][0] in self._views:
                        stop += 1
                    if stop == first:
                        self._busy[m] = False
                        continue
                    spans.append((m, first, stop))
                    views = [_part(self._views[f], lo, hi) for f, lo, hi in parts[first:stop]]
                    fresh = first == 0  # the leaf's first part: a state of its own from here on
                    if fresh:
                        self._state[m] = self._streams.take()
                    jobs.append((self._state[m], views, fresh))
            if not jobs:
                return
            with trace.span("digest joins"):
                hashes = self._streams.update(jobs)
            free, leaves = [], []
            with self._lock:
                for (m, first, stop), got in zip(spans, hashes, strict=True):
                    parts = self._parts[m]
                    self._next[m] = stop
                    for f, _, _ in parts[first:stop]:
                        self._unhashed[f] -= 1
                        if not self._unhashed[f]:
                            free.append(f)
                            del self._views[f]
                    if stop < len(parts):
                        leaves.append(m)  # more of it may have come meanwhile
                        continue
                    self._digest.hashes[self._numbers[m]] = got
                    self._streams.give(self._state[m])
                    self._busy[m] = False
                    self._finish(1)
            for f in free:
                self._on_done(f)

    def close(self) -> None:
        """Once no thread gives a frame any more: drop ``on_done`` (see
        :meth:`ckptz.pipeline.workers.FileDigest.close`)."""
        self._on_done = no_frame

    def _finish(self, n: int) -> None:
        """``n`` more leaves hashed or frames given (under the lock)."""
        self._left -= n
        if not self._left and not self.done.done():
            self.done.set_result(None)

    def fail(self, exc: BaseException) -> None:
        """A stage failed: :meth:`result` raises ``exc`` rather than wait for frames that will not come."""
        with self._lock:
            if not self.done.done():
                self.done.set_exception(exc)

    def result(self) -> Digest:
        """The file's digest, once every frame was given and every leaf hashed."""
        self.done.result()
        return self._digest.digest()


def no_frame(i: int) -> None:
    """A digest's ``on_done`` once its run is over: nothing is left to release."""


class _Kept:
    """Copies of the parts of a frame that leaves still need, by ``(start, end)`` in it."""

    __slots__ = ("parts",)

    def __init__(self, parts: dict[tuple[int, int], np.ndarray]) -> None:
        self.parts = parts


def _part(frame: np.ndarray | _Kept, lo: int, hi: int) -> memoryview:
    """Bytes ``[lo, hi)`` of a given frame, whole or kept."""
    if isinstance(frame, _Kept):
        return frame.parts[(lo, hi)].data
    return frame.data[lo:hi]


class LeafTable:
    """The leaves of a whole-file digest inside each of a file's frames (their pieces, as
    :meth:`Piecewise.hash_whole` takes them), found for all frames at once, so that a run of
    consecutive frames takes its leaves as slices (:meth:`span`) rather than each frame
    working them out.

    A run's leaves are those lying whole inside one of its frames' pieces, and those that
    straddle pieces of its frames only (*joined* leaves: a frame boundary inside a large
    tensor, whose frames follow each other in a run): each is given as its parts, which
    whoever holds the run's bytes joins and hashes. The leaves that straddle runs (or all
    that straddle pieces, where no runs were planned with :meth:`joined`) are *loose*
    (:meth:`loose`): :class:`LeafJoins` hashes them.
    """

    def __init__(self, digest: Piecewise, frames: Sequence[Sequence[tuple[int, int, int]]]) -> None:
        self._digest = digest
        self.frames = len(frames)
        counts = [len(pieces) for pieces in frames]
        flat = np.array([p for pieces in frames for p in pieces], np.int64).reshape(-1, 3)
        at, within, n = flat[:, 0], flat[:, 1], flat[:, 2]
        owner = np.repeat(np.arange(len(frames), dtype=np.int64), counts)
        tree = digest.kind.tree
        leaf, size = (digest.kind.leaf, digest.size) if tree else (1, 0)
        end = at + n
        first = -(-at // leaf)
        stop = np.where(end == size, -(-end // leaf), end // leaf)
        whole = np.maximum(stop - first, 0) if tree else np.zeros_like(at)  # whole_leaves(), at once
        self.numbers = indices.runs(first, whole)
        self.frame = np.repeat(owner, whole)
        self.start = self.numbers * leaf + np.repeat(within - at, whole)
        self.size = np.minimum((self.numbers + 1) * leaf, size) - self.numbers * leaf
        self.bounds = np.concatenate([[0], np.cumsum(np.bincount(self.frame, minlength=len(frames)))])
        # Parts of the leaves that straddle pieces: a piece holds part of at most two, the
        # one it starts in and the one it ends in (each where not whole inside it).
        heads = (at // leaf < first) & (n > 0)
        tails = (stop * leaf < end) & (n > 0) & ((stop * leaf > at) | ~heads) if tree else heads & False
        heads &= tree
        k = np.concatenate([at[heads] // leaf, stop[tails]])
        j = np.concatenate([np.flatnonzero(heads), np.flatnonzero(tails)])
        order = np.lexsort((at[j], k))
        k, j = k[order], j[order]
        lo_byte = np.maximum(k * leaf, at[j])
        hi_byte = np.minimum(np.minimum((k + 1) * leaf, size), end[j])
        self._part_frame = owner[j]
        self._part_start, self._part_size = within[j] + lo_byte - at[j], hi_byte - lo_byte
        # Each straddling leaf: its number, its parts, and the frames they lie in.
        self._joined, first_part = np.unique(k, return_index=True)
        self._part_bounds = np.concatenate([first_part, [k.size]]).astype(np.int64)
        self._lo = np.minimum.reduceat(self._part_frame, first_part) if k.size else k
        self._hi = np.maximum.reduceat(self._part_frame, first_part) if k.size else k
        # Made by joined() for the runs it is given (span() of another range works it out).
        self._in_run = np.zeros(self._joined.size, bool)
        self._run_at: dict[int, int] = {}
        self._run_stop: list[int] = []

    def span(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The leaves of frames ``lo`` to ``hi - 1``: whole ones, then joined ones. Their
        numbers, and their parts: frame (counted from ``lo``), start in that frame, size,
        and how many parts each leaf has (in order). A run given to :meth:`joined` takes
        slices of tables made for every run at once there."""
        r = self._run_at.get(lo, -1)
        if r >= 0 and self._run_stop[r] == hi:
            a, b = self._by_run_leaves[r : r + 2].tolist()
            c, d = self._by_run_parts[r : r + 2].tolist()
            numbers, parts = self._run_tables[0], self._run_tables[4]
            frame, start, size = self._run_tables[1:4]
            return numbers[a:b], frame[c:d], start[c:d], size[c:d], parts[a:b]
        return self._span(lo, hi)

    def _span(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        a, b = int(self.bounds[lo]), int(self.bounds[hi])
        mine = np.flatnonzero((self._lo >= lo) & (self._hi < hi))
        numbers = self.numbers[a:b]
        if not mine.size:
            ones = np.ones(b - a, np.int64)
            return numbers, self.frame[a:b] - lo, self.start[a:b], self.size[a:b], ones
        firsts, lasts = self._part_bounds[mine], self._part_bounds[mine + 1]
        parts = lasts - firsts
        rows = indices.runs(firsts, parts)
        return (
            np.concatenate([numbers, self._joined[mine]]),
            np.concatenate([self.frame[a:b], self._part_frame[rows]]) - lo,
            np.concatenate([self.start[a:b], self._part_start[rows]]),
            np.concatenate([self.size[a:b], self._part_size[rows]]),
            np.concatenate([np.ones(b - a, np.int64), parts]),
        )

    def take(self, run: range, hashes: np.ndarray | None) -> None:
        """The hashes an engine gave for the leaves :meth:`span` gave it for ``run``, in
        order, into the digest.

        Raises:
            RuntimeError: the engine gave none, or not one per leaf.
        """
        numbers = self.span(run.start, run.stop)[0]
        if numbers.size:
            if hashes is None or hashes.size != numbers.size:
                raise RuntimeError("the engine did not hash the leaves it was given")
            self._digest.hashes.set_many(numbers, hashes)

    def joined(self, runs: Sequence[range]) -> None:
        """Plan ``runs`` (of consecutive frames, in order, tiling them) whose bytes an engine
        holds together: :meth:`span` of each gives the straddling leaves inside it too, and
        :meth:`loose` leaves them out."""
        starts = np.array([r.start for r in runs], np.int64)
        run_of_lo = np.searchsorted(starts, self._lo, side="right") - 1
        run_of_hi = np.searchsorted(starts, self._hi, side="right") - 1
        self._in_run = run_of_lo == run_of_hi
        self._by_runs(runs, starts, np.where(self._in_run, run_of_lo, -1))

    def loose(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The straddling leaves no planned run holds whole: their numbers, and their parts
        in order (frame, start in that frame, size), leaf ``m``'s from ``bounds[m]`` to
        ``bounds[m + 1]``."""
        mine = np.flatnonzero(~self._in_run)
        firsts, parts = self._part_bounds[mine], np.diff(self._part_bounds)[mine]
        rows = indices.runs(firsts, parts)
        bounds = np.concatenate([[0], np.cumsum(parts)]).astype(np.int64)
        return (
            self._joined[mine],
            self._part_frame[rows],
            self._part_start[rows],
            self._part_size[rows],
            bounds,
        )

    def _by_runs(self, runs: Sequence[range], starts: np.ndarray, run_of: np.ndarray) -> None:
        """What :meth:`span` gives each of ``runs`` (consecutive frames, in order, tiling
        them), made at once and kept run after run (``run_of``: the run holding each joined
        leaf, -1 for none)."""
        if not runs:
            return
        stops = np.array([r.stop for r in runs], np.int64)
        whole_run = np.searchsorted(starts, self.frame, side="right") - 1
        joined = np.flatnonzero(run_of >= 0)
        counts = np.diff(self._part_bounds)[joined]
        # Leaves in run order: a run's whole leaves, then its joined ones, each in order.
        key = np.concatenate([2 * whole_run, 2 * run_of[joined] + 1])
        order = np.argsort(key, kind="stable")
        numbers = np.concatenate([self.numbers, self._joined[joined]])[order]
        parts = np.concatenate([np.ones(self.numbers.size, np.int64), counts])[order]
        # Their parts, in the same order: a whole leaf is its own part.
        first = np.concatenate([np.arange(self.numbers.size), self.numbers.size + self._part_bounds[joined]])
        rows = indices.runs(first[order], parts)
        frame = np.concatenate([self.frame, self._part_frame])[rows]
        self._run_tables = (
            numbers,
            frame - starts[np.searchsorted(starts, frame, side="right") - 1],
            np.concatenate([self.start, self._part_start])[rows],
            np.concatenate([self.size, self._part_size])[rows],
            parts,
        )
        run_of_leaf = key[order] // 2
        self._by_run_leaves = np.searchsorted(run_of_leaf, np.arange(len(runs) + 1))
        run_of_part = np.repeat(run_of_leaf, parts)
        self._by_run_parts = np.searchsorted(run_of_part, np.arange(len(runs) + 1))
        self._run_at = {r.start: n for n, r in enumerate(runs)}
        self._run_stop = stops.tolist()


def of_file(file: int | str | os.PathLike[str], kind: Kind = TREE, threads: int | None = None) -> Digest:
    """The digest of a plain file (an open descriptor, read with ``pread``, or a path).

    :data:`TREE` leaves are read and hashed by ``threads`` threads (default: one per core,
    at most 8), blocks of leaves at a time; :data:`SEQUENTIAL` is read in order by one.
    The file's size is taken once, at the start.
    """
    if not isinstance(file, int):
        fd = os.open(file, os.O_RDONLY)
        try:
            return of_file(fd, kind, threads)
        finally:
            os.close(fd)
    size = os.fstat(file).st_size
    if not kind.tree:
        hasher, at = Hasher(kind), 0
        while block := os.pread(file, _BLOCK, at):
            hasher.update(block)
            at += len(block)
        return hasher.digest()
    leaves = Piecewise(kind, size)
    step = max(kind.leaf, _BLOCK // kind.leaf * kind.leaf)

    def hash_block(at: int) -> None:
        data = os.pread(file, min(step, size - at), at)
        # A short read (the file shrank) leaves leaves unhashed: the digest then cannot match.
        leaves.hash_whole([(at, 0, len(data))], memoryview(data))

    workers = threads or max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(workers, thread_name_prefix="ckptz-digest") as pool:
        for _ in pool.map(hash_block, range(0, size, step)):
            pass  # re-raises a task's error
    return leaves.digest()


__all__ = [
    "LEAF",
    "MAX_LEAF",
    "MIN_LEAF",
    "SEQUENTIAL",
    "TREE",
    "Digest",
    "Hasher",
    "Kind",
    "LeafHashes",
    "LeafJoins",
    "LeafTable",
    "Piecewise",
    "leaf_count",
    "of_file",
    "whole_leaves",
]
