"""One large file restored by several processes at once, each a range of its bytes.

One process's GPU pipeline is bound by its interpreter, not by the machine: a GPU restore
holds the GIL most of the time, and two processes restoring at once move far more together
than one alone. So a large file is cut into *ranges* of whole digest leaves, and helper
processes, each with an engine of its own on the same device, restore some of them while
the calling process restores the others (:func:`~ckptz.pipeline.restore.restore_range`:
every frame holding a byte of the range is decoded and checked whole, and the range's bytes
given to the sink). Each range gives the hashes of its digest leaves; the caller puts them
together and checks the whole-file digest, so every check FORMAT.md promises still runs on
every byte. A frame that crosses a cut is decoded once on each side (a frame per stream at
most), which is why ranges are large (:data:`MIN_RANGE`).

A helper gets the container and the sink's file as descriptors passed over its socket
(``SCM_RIGHTS``): it restores into the very file the caller opened, at the same offsets,
and reads nothing by name. Helpers start beside the caller's own start-up, take ranges as
they come free (a helper still starting takes none), and die with the caller
(``PR_SET_PDEATHSIG``); they ignore Ctrl-C, which the caller handles. A helper that dies
gives its range back, and the caller restores it itself. Only plain containers with a
tree digest and a sink that is a file, a comparison or nothing are split; everything else
(stdout, GPU loads, series deltas, old digests) is restored whole by the caller.

Compression is split the same way (:meth:`Shards.code_parts`): a file is cut between
segments into parts whose streams are their own (:func:`~ckptz.pipeline.plan.split_plan`),
a helper codes a part into the caller's output at places the caller hands out run by run,
and the caller joins the digest leaves across each cut. A helper that dies after taking a
place leaves the file to be compressed again without helpers (:func:`compress_with`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import itertools
import os
import pickle
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, BinaryIO, TypeVar, cast

import numpy as np

from ckptz import children, trace
from ckptz.container import Index, read_index
from ckptz.digest import Digest, LeafHashes, leaf_count
from ckptz.engines.base import Engine
from ckptz.pipeline.compress import PartJob, PartResult, Places, code_part
from ckptz.pipeline.restore import (
    Comparer,
    DiscardSink,
    FileSink,
    Sink,
    conclude,
    prepare,
    restore,
    restore_range,
)
from ckptz.pipeline.transform import transformed

T = TypeVar("T")

#: Bytes of a range at least: each cut decodes up to one frame per stream twice.
MIN_RANGE = 512 << 20
#: Ranges per process of a file large enough. Each range costs its process a plan (the
#: index read, frames clipped, leaf table) and a pipeline's ramp and drain, so one range per
#: process restored fastest. A free helper takes a range first, so a late one takes none.
RANGES_PER_PROCESS = 1
#: A file this large but too small to split goes whole to a free helper.
MIN_WHOLE = 64 << 20
#: Seconds a helper has to end by itself once told to stop.
_GRACE_S = 5.0
#: Progress a helper reports at once, in bytes.
_REPORT_BYTES = 64 << 20


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """How a helper opens its engine (:func:`ckptz.engines.open_engine`'s arguments)."""

    device: str | None
    threads: int | None
    level: int
    codec: str
    memory: int | None
    #: The caller compresses a job large enough that its engine codes the portable
    #: bitstream on the GPU (:func:`~ckptz.engines.writes_portable_on_gpu`): so does the
    #: helper's (else it would code its parts on its CPU threads).
    gpu_writes: bool = False


def ranges(size: int, leaf: int, parts: int) -> list[tuple[int, int]]:
    """``[0, size)`` cut into at most ``parts`` ranges of whole leaves, of about equal size
    and at least :data:`MIN_RANGE` each (one range where the file is smaller)."""
    count = max(1, min(parts, size // MIN_RANGE))
    leaves = leaf_count(size, leaf)
    cuts = sorted({leaves * k // count * leaf for k in range(count)} | {size})
    return [(lo, hi) for lo, hi in itertools.pairwise(cuts) if lo < hi]


@dataclass(slots=True)
class _Task:
    """One share of one file's work (a range to restore, a part to code), for whichever
    process takes it first: a helper is sent ``message`` and ``fds``; the caller runs
    ``local``."""

    owner: object
    message: tuple[object, ...]
    fds: list[int]
    local: Callable[[], Any]
    progress: Callable[[int], None]
    size: int
    future: Future[Any] = field(default_factory=Future)
    places: Places | None = None
    placed: bool = False  # a helper took places in the container for it
    cancelled: bool = False  # its file failed: a helper coding it stops at its next run


class Shards:
    """Helper processes that restore ranges of large files, and code parts of them, beside
    the calling process.

    Args:
        spec: how each helper opens its engine (the caller's own, on the same device).
        helpers: processes to start (at once, in the background).
    """

    def __init__(self, spec: EngineSpec, helpers: int) -> None:
        self.spec = spec
        self._queue: list[_Task] = []
        self._cv = threading.Condition()
        self._closed = False
        self._lanes = [
            threading.Thread(target=self._lane, name=f"ckptz-shard-{n}", daemon=True) for n in range(helpers)
        ]
        self._children: list[subprocess.Popen[bytes]] = []
        self._started = threading.Semaphore(0)
        self._idle = 0  # helpers waiting for a range
        #: Helpers whose engine opened, and bytes of ranges they restored.
        self.helpers_ready = 0
        self.helped_bytes = 0
        for t in self._lanes:
            t.start()

    def wait_started(self) -> int:
        """Wait until every helper is ready or failed to start; return how many are ready."""
        for _ in self._lanes:
            self._started.acquire()
        for _ in self._lanes:
            self._started.release()
        return self.helpers_ready

    @classmethod
    def shared(cls, spec: EngineSpec, helpers: int) -> Shards:
        """The process's helpers of this kind, started on first use and kept for later runs
        (as the engine's pinned memory is): a library that restores again pays their
        start-up once. They stop when the process exits."""
        with _shared_lock:
            key = (spec, helpers)
            if key not in _shared:
                if not _shared:
                    atexit.register(_close_shared)
                _shared[key] = cls(spec, helpers)
            return _shared[key]

    @property
    def processes(self) -> int:
        """Processes a file may be restored or compressed by: the helpers and the caller."""
        return len(self._lanes) + 1

    def restore(
        self,
        container: BinaryIO,
        path: str,
        engine: Engine,
        sink: Sink,
        index: Index,
        progress: Callable[[int], None],
    ) -> bool:
        """Restore the file in ranges, the caller's thread taking those no helper took, and
        check its digest; False (nothing done) where the file is not split: too small, or a
        container or sink restored whole (module docstring).

        Raises:
            as :func:`~ckptz.pipeline.restore.restore`.
        """
        kind = index.source_digest.kind
        plain = kind.tree and not transformed(index.header)
        target = _sink_of(sink)
        cuts = ranges(index.source_size, kind.leaf, self.processes * RANGES_PER_PROCESS) if plain else []
        # A file too small to split still goes to a helper that is free (files in parallel).
        whole = len(cuts) == 1 and index.source_size >= MIN_WHOLE and self.helpers_ready > 0
        if target is None or not (len(cuts) > 1 or whole):
            return False
        prepare(sink, index)
        owner = object()
        kind_of_sink, fd, size = target
        fds = [container.fileno()] if fd < 0 else [container.fileno(), fd]

        def local(window: tuple[int, int]) -> Callable[[], np.ndarray]:
            return lambda: restore_range(
                container, path, engine, sink, window, index=index, progress=progress
            )

        tasks = [
            _Task(owner, ("range", path, w, kind_of_sink, size), fds, local(w), progress, w[1] - w[0])
            for w in cuts
        ]
        _, got = self._share(owner, tasks, None)
        hashes = LeafHashes(leaf_count(index.source_size, kind.leaf))
        for window, leaves in zip(cuts, got, strict=True):
            lo = window[0] // kind.leaf
            if leaves.size != leaf_count(window[1], kind.leaf) - lo:
                raise RuntimeError("a helper process gave the wrong number of leaf hashes")
            hashes.set_many(np.arange(lo, lo + leaves.size, dtype=np.int64), leaves)
        conclude(Digest(kind, hashes.hexdigest()), index, path, sink)
        return True

    def parts(self, size: int) -> int:
        """Into how many parts a ``size``-byte file is cut for compression: one per process
        where each is at least :data:`MIN_RANGE` (:meth:`code_parts`)."""
        return max(1, min(self.processes, size // MIN_RANGE))

    def code_parts(
        self,
        jobs: Sequence[PartJob],
        fds: tuple[int, int],
        places: Places,
        progress: Callable[[int], None],
        own: Callable[[], T],
        local: Callable[[PartJob], PartResult],
    ) -> tuple[T, list[PartResult]]:
        """Parts of one file coded by helpers while the caller codes its own
        (:class:`ckptz.pipeline.compress.Helpers`): each helper's runs are placed in the
        caller's container by ``places``, at its request."""
        owner = object()
        sent = [fds[0]] if fds[1] < 0 else list(fds)
        tasks = [
            _Task(
                owner,
                ("part", job),
                sent,
                functools.partial(local, job),
                progress,
                job.part.window[1] - job.part.window[0],
                places=places,
            )
            for job in jobs
        ]
        mine, got = self._share(owner, tasks, own)
        return cast(T, mine), got

    def close(self) -> None:
        """Stop the helpers: each ends once its range is done and its socket closed (killed
        after :data:`_GRACE_S`)."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        for t in self._lanes:
            t.join(2 * _GRACE_S)  # each ends once its helper has
        for child in self._children:  # one still busy with a range: the run has failed
            if child.poll() is None:
                child.kill()
        for t in self._lanes:
            t.join()

    def __enter__(self) -> Shards:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the caller's side ----------------------------------------------------------------

    def _share(
        self, owner: object, tasks: list[_Task], own: Callable[[], T] | None
    ) -> tuple[T | None, list[Any]]:
        """Queue ``tasks`` for the helpers, run ``own`` in this thread (if any), then run
        here each task no helper is free to take; every task's result, in order.

        Raises:
            the first error of ``own`` or a task, once every task is over (the tasks not
            started by then are not started).
        """
        with self._cv:
            self._queue.extend(tasks)
            self._cv.notify_all()
        for t in tasks:
            t.future.add_done_callback(self._wake)
        mine: T | None = None
        error: BaseException | None = None
        if own is not None:
            try:
                mine = own()
            except BaseException as exc:
                error = exc
                for t in tasks:
                    t.cancelled = True
                self._drop(owner)
        while (task := self._next_own(owner, tasks)) is not None:
            if error is not None or _first_error(tasks) is not None:  # the file has failed
                task.future.set_exception(_NotStarted())
                continue
            try:
                with trace.span("range"):
                    task.future.set_result(task.local())
            except BaseException as exc:
                task.future.set_exception(exc)
                self._drop(owner)
        first = error or _first_error(tasks)
        if first is not None:
            raise first
        return mine, [t.future.result() for t in tasks]

    def _wake(self, _: Future[Any]) -> None:
        with self._cv:
            self._cv.notify_all()

    def _next_own(self, owner: object, tasks: list[_Task]) -> _Task | None:
        """A range of the caller's file that no helper is free to take (None once all are
        done): a free helper goes first, since the caller's process is busy with the run's
        other files and stages too."""
        with self._cv:
            while True:
                if not self._idle:
                    for k, t in enumerate(self._queue):
                        if t.owner is owner:
                            return self._queue.pop(k)
                if all(t.future.done() for t in tasks):
                    return None
                self._cv.wait()

    def _drop(self, owner: object) -> None:
        """A range failed: the file's ranges no helper took yet are not started."""
        with self._cv:
            mine = [t for t in self._queue if t.owner is owner]
            self._queue = [t for t in self._queue if t.owner is not owner]
        for t in mine:
            t.future.set_exception(_NotStarted())

    def _take(self) -> _Task | None:
        with self._cv:
            self._idle += 1
            while not self._queue and not self._closed:
                self._cv.wait()
            self._idle -= 1
            self._cv.notify_all()  # a caller waiting for free helpers looks again
            return None if self._closed else self._queue.pop(0)

    def _give_back(self, task: _Task) -> None:
        with self._cv:
            self._queue.insert(0, task)
            self._cv.notify_all()

    # -- a helper's lane ------------------------------------------------------------------

    def _lane(self) -> None:
        """Start a helper, then hand it ranges one at a time while it lives; then end it
        (:func:`_reap`: a helper dies with the thread that started it, ``PR_SET_PDEATHSIG``,
        so this thread outlives it)."""
        try:
            started = self._start()
        finally:
            self._started.release()
        if started is None:
            return  # the caller restores every range
        child, sock = started
        try:
            with sock:
                while (task := self._take()) is not None:
                    try:
                        self._run(sock, task)
                    except (OSError, EOFError):
                        if not task.placed:
                            self._give_back(task)  # the helper died: the caller does it
                        else:  # the places it took in the container are lost: the file fails
                            task.future.set_exception(HelperDiedError())
                        return
        finally:
            _reap(child)

    def _start(self) -> tuple[subprocess.Popen[bytes], socket.socket] | None:
        """A helper, started and with its engine open (None: it could not start)."""
        try:
            with trace.span("start helper"):
                child, sock = _start(self.spec)
        except OSError:
            return None
        with self._cv:
            if self._closed:
                child.kill()
                child.wait()
                sock.close()
                return None
            self._children.append(child)
        try:
            reply = children.receive(sock)
        except (OSError, EOFError):
            reply = ("died",)
        if reply[0] != "ready":
            sock.close()
            _reap(child)
            return None
        with self._cv:
            self.helpers_ready += 1
        return child, sock

    def _run(self, sock: socket.socket, task: _Task) -> None:
        with trace.span("helper range"):
            children.send(sock, task.message, task.fds)
            while True:
                reply = children.receive(sock)
                if reply[0] == "progress":
                    with contextlib.suppress(BaseException):  # a stop shows in the caller's range
                        task.progress(reply[1])
                    continue
                if reply[0] == "place":  # where a helper's coded run goes in the container
                    assert task.places is not None
                    task.placed = True
                    children.send(sock, ("stop",) if task.cancelled else ("at", task.places.take(reply[1])))
                    continue
                if reply[0] == "done":
                    with self._cv:
                        self.helped_bytes += task.size
                    task.future.set_result(reply[1])
                else:
                    task.future.set_exception(children.rebuild_error(reply[1]))
                return


_shared: dict[tuple[EngineSpec, int], Shards] = {}
_shared_lock = threading.Lock()


def helpers_running() -> bool:
    """Whether this process has helpers started and ready (:meth:`Shards.shared`)."""
    with _shared_lock:
        return any(pool.helpers_ready for pool in _shared.values())


def _close_shared() -> None:
    with _shared_lock:
        pools = list(_shared.values())
        _shared.clear()
    for pool in pools:
        pool.close()


def compress_with(
    shards: Shards | None,
    attempt: Callable[[Shards | None, Callable[[int], None]], T],
    progress: Callable[[int], None],
) -> T:
    """``attempt(shards, progress)`` (a file's compression into an output of its own), and
    again without helpers where one died in the middle of it (:class:`HelperDiedError`; the
    attempt's output is gone with its failure). The second attempt's progress counts only
    what goes past the first's, so the file's bytes are counted once."""
    if shards is None:
        return attempt(None, progress)
    counted = _Counted(progress)
    try:
        return attempt(shards, counted)
    except HelperDiedError:
        return attempt(None, _Counted(progress, owed=counted.total))


class _Counted:
    """Progress passed on, less the first ``owed`` bytes (already counted), and totalled.
    Called from many threads; each call is passed on (a stop is noticed there) even when
    all of it was owed."""

    def __init__(self, progress: Callable[[int], None], owed: int = 0) -> None:
        self.progress, self.owed, self.total = progress, owed, 0
        self._lock = threading.Lock()

    def __call__(self, n: int) -> None:
        with self._lock:
            self.total += n
            skip = min(self.owed, n)
            self.owed -= skip
        self.progress(n - skip)


def restore_with(
    shards: Shards | None,
    container: BinaryIO,
    path: str,
    engine: Engine,
    sink: Sink,
    *,
    index: Index | None = None,
    progress: Callable[[int], None] = lambda _: None,
) -> Index:
    """:func:`~ckptz.pipeline.restore.restore`, split across ``shards``' processes where
    the file and sink allow it (:meth:`Shards.restore`)."""
    index = index or read_index(container, path)
    if shards is None or not shards.restore(container, path, engine, sink, index, progress):
        restore(container, path, engine, sink, index=index, progress=progress)
    return index


class HelperDiedError(RuntimeError):
    """A helper process died while coding a part of a file: the places it took in the
    container are lost, so the file must be compressed again (:func:`compress_with` does,
    without helpers)."""

    def __init__(self) -> None:
        super().__init__("a helper process died while compressing part of the file")


class _NotStarted(Exception):
    """A range left alone once another range of its file failed."""


def _first_error(tasks: list[_Task]) -> BaseException | None:
    """The error of the first range that failed by itself, if any (once done)."""
    errors = [t.future.exception() for t in tasks if t.future.done()]
    real = [e for e in errors if e is not None and not isinstance(e, _NotStarted)]
    return real[0] if real else None


def _sink_of(sink: Sink) -> tuple[str, int, int] | None:
    """What a helper needs to make the same sink: its kind, descriptor and size."""
    if type(sink) is DiscardSink:
        return ("discard", -1, 0)
    if type(sink) is FileSink and sink.size is not None:
        return ("file read back" if sink.read_back else "file", sink.fd, sink.size)
    if type(sink) is Comparer:
        return ("compare", sink.fd, 0)
    return None


# -- starting a helper, and the helper itself ----------------------------------------------


class _OwnOffset(io.RawIOBase):
    """A file read with ``pread`` at an offset of its own (left open: the caller closes ``fd``)."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd, self._at = fd, 0

    def fileno(self) -> int:
        return self._fd

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = os.preadv(self._fd, [buffer], self._at)
        self._at += n
        return n

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._at, os.SEEK_END: os.fstat(self._fd).st_size}[whence]
        self._at = max(0, base + offset)
        return self._at

    def tell(self) -> int:
        return self._at


_helper_numbers = itertools.count()


def _start(spec: EngineSpec) -> tuple[subprocess.Popen[bytes], socket.socket]:
    extra = {}
    if trace.PATH is not None:  # each helper's timeline beside the caller's
        extra["CKPTZ_TRACE"] = f"{os.path.abspath(trace.PATH)}.helper{next(_helper_numbers)}"
    return children.spawn("ckptz.pipeline.shards", pickle.dumps(spec).hex(), extra=extra)


def _reap(child: subprocess.Popen[bytes]) -> None:
    """End a helper told to stop (its socket closed). It is killed: every range it took
    was written and answered, and its engine's teardown (the GPU's context, its pinned
    memory) would only delay the caller's exit. When tracing, it is given
    :data:`_GRACE_S` to end by itself and write its timeline."""
    if trace.PATH is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(_GRACE_S)
    if child.poll() is None:
        child.kill()
    child.wait()


def _serve(sock: socket.socket, spec: EngineSpec) -> None:
    """A helper's life: open the engine, then restore ranges and code parts until the
    socket closes."""
    from ckptz.engines import open_engine
    from ckptz.pipeline.workers import tuned_interpreter

    try:
        engine, _ = open_engine(
            spec.device,
            threads=spec.threads,
            level=spec.level,
            codec=spec.codec,
            memory=spec.memory,
            writes=spec.gpu_writes,
            job_bytes=sys.maxsize if spec.gpu_writes else 0,  # the caller's job was large enough
        )
    except BaseException as exc:
        children.send(sock, ("failed", children.portable_error(exc)))
        return
    lock = threading.Lock()
    with contextlib.closing(engine), tuned_interpreter():
        children.send(sock, ("ready",))
        while True:
            fds: list[int] = []
            try:
                message = children.receive(sock, fds)
            except EOFError:
                return
            pending = [0]

            def report(n: int, pending: list[int] = pending) -> None:
                with lock:
                    pending[0] += n
                    if pending[0] >= _REPORT_BYTES:
                        children.send(sock, ("progress", pending[0]))
                        pending[0] = 0

            try:
                result: object
                if message[0] == "part":
                    result = _code_part(message[1], fds, engine, _AskPlaces(sock, lock), report)
                else:
                    result = _restore_range(message, fds, engine, report)
                reply: tuple[object, ...] = ("done", result)
            except Exception as exc:
                reply = ("error", children.portable_error(exc))
            with lock:
                if pending[0]:
                    children.send(sock, ("progress", pending[0]))
                    pending[0] = 0
                children.send(sock, reply)


def _restore_range(
    message: tuple[Any, ...], fds: list[int], engine: Engine, report: Callable[[int], None]
) -> np.ndarray:
    """A helper's range of a file to restore: its leaf hashes."""
    from ckptz.safeio import shared_output

    _, path, window, kind, size = message
    with contextlib.ExitStack() as stack:
        # Descriptors passed over a socket share their file offset with the caller's: the
        # container is read through an offset of its own (every other read and write of
        # the pipeline is at explicit offsets).
        files: list[BinaryIO] = [cast(BinaryIO, _OwnOffset(fds[0]))]
        stack.callback(os.close, fds[0])
        files += [stack.enter_context(open(fd, "rb" if kind == "compare" else "r+b")) for fd in fds[1:]]
        index = read_index(files[0], path)
        sink: Sink
        if kind.startswith("file"):
            stack.enter_context(shared_output(files[1].fileno(), size))
            sink = FileSink(files[1], size, read_back=kind == "file read back", path=path)
        elif kind == "compare":
            sink = Comparer(files[1], path)
        else:
            sink = DiscardSink()
        with trace.span("range"):
            return restore_range(files[0], path, engine, sink, window, index=index, progress=report)


def _code_part(
    job: PartJob, fds: list[int], engine: Engine, places: Places, report: Callable[[int], None]
) -> PartResult:
    """A helper's part of a file to compress (``fds``: the file, and the caller's output if
    any): written with plain ``pwrite`` at the places the caller gives, which also sizes
    the file (:class:`ckptz.pipeline.compress.Places`)."""
    with contextlib.ExitStack() as stack:
        stack.callback(os.close, fds[0])
        out = stack.enter_context(open(fds[1], "r+b")) if len(fds) > 1 else None
        with trace.span("part"):
            return code_part(job, fds[0], out, engine, places, report)


class _AskPlaces:
    """A helper's places in the caller's container, asked for run by run."""

    def __init__(self, sock: socket.socket, lock: threading.Lock) -> None:
        self._sock, self._lock = sock, lock

    def take(self, n: int) -> int:
        with self._lock:
            children.send(self._sock, ("place", n))
            reply = children.receive(self._sock)
        if reply[0] == "stop":
            raise _NotStarted()  # the caller's part of the file failed
        if reply[0] != "at":
            raise RuntimeError(f"the calling process answered {reply[0]!r} for a place")
        return int(reply[1])


def main(argv: list[str]) -> None:
    """``python -m ckptz.pipeline.shards FD SPEC``: a helper, on socket ``FD``."""
    children.run_child(argv, lambda sock, args: _serve(sock, pickle.loads(bytes.fromhex(args[0]))))


if __name__ == "__main__":
    main(sys.argv[1:])


__all__ = [
    "MIN_RANGE",
    "EngineSpec",
    "HelperDiedError",
    "Shards",
    "compress_with",
    "helpers_running",
    "ranges",
    "restore_with",
]
