"""The threads a run shares, and the two things every file needs from them.

Reading, writing, hashing and numpy copies release the GIL, so plain threads run them in
parallel: :class:`Workers` holds a pool of readers and one of writers for every file of a
run, so one large file uses the whole machine and many small ones share it.
:class:`FrameSlots` bounds the frames a file holds in memory, and :class:`FileDigest` takes a
file's whole-file digest from frames that arrive in any order.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from contextlib import contextmanager, suppress

import numpy as np

from ckptz import trace
from ckptz.digest import Digest, LeafJoins, Piecewise, no_frame
from ckptz.pipeline.plan import Frame

#: Reader threads by default: page-cache reads scale to about eight threads, each also
#: hashes what it read, and more threads only contend for the GIL.
MAX_READERS = 8
#: Writer threads at most by default (one per core): a file system takes parallel writes
#: (NVMe RAID, Lustre, and tmpfs through mapped windows); where one writer is the wall, more
#: threads cost nothing, and compressions to tmpfs ran faster with every doubling up to 16.
MAX_WRITERS = 16


#: The interpreter's thread switch interval while a pipeline runs. Its threads hold the GIL
#: in short stretches between long calls that release it; at the default 5 ms, a thread
#: coming back from such a call waits for whichever thread holds the GIL to be asked to
#: give it up, so a shorter interval lets the pipeline's threads take turns much faster.
SWITCH_INTERVAL_S = 0.0002

_switch_lock = threading.Lock()
_switch_users = 0
_switch_before = 0.0
_collecting_before = False


@contextmanager
def tuned_interpreter() -> Iterator[None]:
    """Run the body with :data:`SWITCH_INTERVAL_S` and the cyclic garbage collector paused;
    the process's own settings come back when the last body in any thread ends.

    A run makes many small objects (each frame's future, views and tables) that reference
    counting frees as each frame is done; the collections they trigger would walk the
    caller's whole heap, tens of milliseconds each in a process holding a large model."""
    global _switch_users, _switch_before, _collecting_before
    with _switch_lock:
        if _switch_users == 0:
            _switch_before = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_before, SWITCH_INTERVAL_S))
            _collecting_before = gc.isenabled()
            gc.disable()
        _switch_users += 1
    try:
        yield
    finally:
        with _switch_lock:
            _switch_users -= 1
            if _switch_users == 0:
                sys.setswitchinterval(_switch_before)
                if _collecting_before:
                    gc.enable()


class Workers:
    """Reader and writer thread pools shared by every file of a run.

    Args:
        readers: reader threads (default: one per core, at most :data:`MAX_READERS`).
        writers: writer threads (default: one per core, at least 2, at most
            :data:`MAX_WRITERS`).
    """

    _shared: Workers | None = None
    _shared_lock = threading.Lock()

    def __init__(self, readers: int | None = None, writers: int | None = None) -> None:
        self.readers = readers or _default_readers()
        self.writers = writers or max(2, min(MAX_WRITERS, os.cpu_count() or 1))
        self.read = ThreadPoolExecutor(self.readers, thread_name_prefix="ckptz-read")
        self.write = ThreadPoolExecutor(self.writers, thread_name_prefix="ckptz-write")

    @classmethod
    def shared(cls, readers: int = 0) -> Workers:
        """The process's one set, made on first use, with at least ``readers`` readers: every
        file of a run (and every run) shares its threads, so files in parallel do not
        multiply them. An engine that codes in its caller's thread asks for one reader per
        coding thread."""
        with cls._shared_lock:
            if cls._shared is None or cls._shared.readers < readers:
                # A smaller set still in use finishes its queued work; its idle threads stay.
                cls._shared = cls(readers=max(readers, _default_readers()))
            return cls._shared

    def close(self) -> None:
        """Wait for queued work and stop the threads."""
        self.read.shutdown(wait=True, cancel_futures=True)
        self.write.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _default_readers() -> int:
    return max(2, min(MAX_READERS, os.cpu_count() or 1))


class Stopped(Exception):
    """Raised in a file's helper threads once another of its stages has failed."""


class Failures:
    """The errors of one file's run, from any of its threads.

    The first error that is not just another stage noticing the stop is the one the run
    raises; recording one fails every frame future still pending, so no stage waits forever.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._errors: list[BaseException] = []

    def add(self, exc: BaseException, pending: Sequence[Future[np.ndarray]]) -> None:
        with self._lock:
            self._errors.append(exc)
        for f in pending:
            if not f.done():
                with suppress(InvalidStateError):
                    f.set_exception(Stopped())

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._errors)

    def first(self) -> BaseException:
        """The error that stopped the run (call only once one was added)."""
        with self._lock:
            return next(
                (e for e in self._errors if not isinstance(e, Stopped | InvalidStateError)), self._errors[0]
            )


class FrameSlots:
    """At most ``count`` frames of one file in memory at once, each in a reused buffer.

    A buffer is taken before a frame is read and given back once every stage that uses the
    original bytes is done with it, so a file's memory is ``count × size`` whatever its size.
    Reusing buffers also spares the page faults of fresh allocations, and lets an engine hand
    out buffers it can copy from fastest (pinned host memory for a GPU).
    """

    def __init__(
        self, count: int, size: int, alloc: Callable[[int], np.ndarray], free: Callable[[np.ndarray], None]
    ) -> None:
        self._free: list[np.ndarray] = []
        self._left = count  # buffers not yet allocated: made only when none is free
        self._size = size
        self._alloc = alloc
        self._release = free
        self._cv = threading.Condition()
        self._stopped = False

    def take(self) -> np.ndarray:
        """A free buffer; blocks until one is given back.

        Raises:
            Stopped: :meth:`stop` was called.
        """
        with self._cv:
            while not self._free and not self._left and not self._stopped:
                self._cv.wait()
            if self._stopped:
                raise Stopped
            if self._free:
                return self._free.pop()
            self._left -= 1
        return self._alloc(self._size)

    def give(self, buf: np.ndarray) -> None:
        """Return a buffer taken with :meth:`take`."""
        with self._cv:
            self._free.append(buf)
            self._cv.notify()

    def close(self) -> None:
        """Hand the free buffers back to whoever allocated them."""
        with self._cv:
            free, self._free = self._free, []
        for buf in free:
            self._release(buf)

    def stop(self) -> None:
        """Wake and fail every waiting :meth:`take` (a stage failed)."""
        with self._cv:
            self._stopped = True
            self._cv.notify_all()


def slots_needed(units: int, streams: int, look_ahead: int) -> int:
    """Buffers a file keeps in memory, each holding a frame or a run of frames (``units`` in
    all): the engine's look-ahead, and never fewer than one per stream plus one, which the
    whole-file digest needs to make progress (a leaf that straddles two streams' frames
    holds the first until the second is read, so each stream's open frame may be held
    while the others are read)."""
    return max(1, min(units, max(look_ahead, streams + 2)))


class FileDigest:
    """A file's whole-file digest, taken from its frames as a pipeline finishes them, in any
    order (:mod:`ckptz.digest`).

    Whoever finishes frame ``i`` hashes the leaves lying whole inside it
    (:meth:`~ckptz.digest.Piecewise.hash_whole`), sets ``data[i]`` and gives it (:meth:`give`),
    which hashes the straddling leaves it completes (:class:`~ckptz.digest.LeafJoins`; those
    inside a run of ``runs`` are the engine's, which hands their hashes to
    :attr:`table`). An ``xxh3_128`` digest, or a sink that needs the file's bytes in order
    (``each``, like stdout), is walked in file order by :meth:`result`'s thread.
    ``on_done(i)`` is called once the digest (and ``each``) no longer need frame ``i``.

    Args:
        runs: runs of consecutive frames whose straddling leaves an engine hashes where it
            holds them (None: none does).
    """

    def __init__(
        self,
        digest: Piecewise,
        frames: Sequence[Frame],
        data: Sequence[Future[np.ndarray]],
        on_done: Callable[[int], None],
        runs: Sequence[range] | None = None,
        each: Callable[[memoryview], object] | None = None,
    ) -> None:
        self.digest, self._frames, self._data, self._each = digest, frames, data, each
        self._walks = digest.walks or each is not None
        self.table = digest.leaf_table([f.pieces for f in frames]) if digest.kind.tree else None
        if self.table is not None and runs is not None:
            self.table.joined(runs)
        self._joins = LeafJoins(digest, self.table, self._done) if self.table is not None else None
        # Who must be done with each frame: the joins and the walk, where there are both.
        both = self._walks and self._joins is not None
        self._on_done = on_done
        self._users = [2] * len(frames) if both else None
        self._lock = threading.Lock()

    @property
    def walks(self) -> bool:
        """Whether :meth:`result` reads the frames from ``data`` (else :meth:`give` is the
        last use of a frame's bytes: the joins keep copies of what they still need)."""
        return self._walks

    def give(self, frames: Sequence[tuple[int, np.ndarray]]) -> None:
        """Frames' numbers and bytes, hashed whole and set in ``data`` (any thread, each
        once; a run's at once, whose joins are then hashed in one call)."""
        if self._joins is not None:
            self._joins.give(frames)
        elif not self._walks:
            for i, _ in frames:
                self._on_done(i)

    def fail(self, exc: BaseException) -> None:
        """A stage failed: :meth:`result` raises rather than wait."""
        if self._joins is not None:
            self._joins.fail(exc)

    def close(self) -> None:
        """Once the run is over (no thread gives a frame any more): drop the callbacks, so
        that reference counting frees the run, its frames and their futures at once. Each
        callback is a bound method of what holds it (the run's ``on_done``, this digest's
        own for the joins): reference cycles, which only the cyclic collector frees, and a
        pipeline pauses it while it runs (:func:`tuned_interpreter`), so every file's run
        stayed in memory until the last file was done (6,400 objects per GB converted:
        ~5 million for a 782 GB checkpoint, and a collection of them all at the end)."""
        self._on_done = no_frame
        if self._joins is not None:
            self._joins.close()

    def result(self) -> Digest:
        """The digest, once every frame was given (walking the file first where needed)."""
        if self._walks:
            self._walk()
        return self._joins.result() if self._joins is not None else self.digest.digest()

    def _done(self, i: int) -> None:
        if self._users is not None:
            with self._lock:
                self._users[i] -= 1
                if self._users[i]:
                    return
        self._on_done(i)

    def _walk(self) -> None:
        """Every piece in file order, waiting for each frame as the walk reaches it."""
        frames = self._frames
        pieces = sorted((p[0], i, p[1], p[2]) for i, f in enumerate(frames) for p in f.pieces)
        left = [len(f.pieces) for f in frames]
        for _, i, within, n in pieces:
            with trace.span("wait frame"):
                piece = self._data[i].result().data[within : within + n]
            if self.digest.walks:
                with trace.span("digest walk"):
                    self.digest.walk(piece)
            if self._each is not None:
                self._each(piece)
            left[i] -= 1
            if not left[i]:
                self._done(i)


__all__ = [
    "MAX_READERS",
    "MAX_WRITERS",
    "Failures",
    "FileDigest",
    "FrameSlots",
    "Stopped",
    "Workers",
    "slots_needed",
]
