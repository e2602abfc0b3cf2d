"""Running per-file jobs a few at a time, and stopping them cleanly on Ctrl-C or SIGTERM.

Every job runs on a worker thread; the calling (main) thread only waits, so that is where
``KeyboardInterrupt`` lands (the CLI turns SIGTERM into one too). On it, jobs not yet
started are dropped and running ones are told to stop: each job calls :meth:`Stop.check`
between blocks (through its progress callback), which raises :class:`~ckptz.errors.StoppedError`
there. Writes go through :func:`ckptz.safeio.atomic_output`, so a stopped job removes its
temp file and leaves its input as it was. The caller learns which jobs finished.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from ckptz.errors import StoppedError
from ckptz.runs.tree import Entry

JobKind = Literal["convert", "finish", "link", "copy", "symlink", "temp"]


@dataclass(frozen=True, slots=True)
class Job:
    """One unit of work.

    Attributes:
        kind: what to do (see :data:`JobKind`).
        entry: the input.
        target: the output path.
        label: the input's name in reports (relative path; prefixed by its source's name
            when there are several sources).
        primary: for ``link``, the output (or, in place, the input) it links to.
    """

    kind: JobKind
    entry: Entry
    target: Path
    label: str
    primary: Path | None = None


T = TypeVar("T")
_batches = itertools.count()
R = TypeVar("R")

#: Files compressed or restored at once. One file's reads, hashing and writes run on one
#: thread while the engine codes; several files in flight overlap their I/O (the wall
#: once a GPU codes, measured in BENCHMARKS.md).
PARALLEL_FILES = 4


class Stop:
    """A flag the main thread raises and workers poll."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    @property
    def is_set(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        """Raise :class:`StoppedError` if the run is being stopped."""
        if self._event.is_set():
            raise StoppedError()

    def ticker(self, progress: Callable[[int], object]) -> Callable[[int], None]:
        """``progress`` that first checks the flag: how long-running work notices a stop."""

        def tick(n: int) -> None:
            self.check()
            progress(n)

        return tick


def run_jobs(
    fn: Callable[[T], R],
    jobs: Sequence[T],
    stop: Stop,
    *,
    name: Callable[[T], str],
    width: int = PARALLEL_FILES,
    done: list[str] | None = None,
) -> list[R]:
    """``fn`` over every job, up to ``width`` at once; results in job order.

    The first failure stops the jobs not yet started, lets the running ones finish (each
    leaves a complete output or none) and is raised. A ``KeyboardInterrupt`` in the waiting
    thread stops everything within a block's time and raises :class:`StoppedError` naming
    the finished jobs (``name`` of each), added to ``done`` if given (earlier phases' files).
    """
    done = done if done is not None else []
    if not jobs:
        return []
    prefix = f"ckptz-file-{next(_batches)}"
    pool = ThreadPoolExecutor(min(width, len(jobs)), thread_name_prefix=prefix)
    futures: list[Future[R]] = []
    try:
        futures = [pool.submit(fn, job) for job in jobs]
        wait(futures, return_when=FIRST_EXCEPTION)
    except KeyboardInterrupt:
        stop.set()
        _settle(futures, pool, prefix)
        finished = [name(j) for j, f in zip(jobs, futures, strict=False) if _succeeded(f)]
        done.extend(finished)
        raise StoppedError(tuple(done), len(jobs) - len(finished)) from None
    finally:
        for f in futures:
            f.cancel()  # only those not started
        _settle(futures, pool, prefix)
    for f in futures:
        if not f.cancelled() and (error := f.exception()) is not None:
            if isinstance(error, StoppedError):
                continue
            raise error
    if stop.is_set or any(f.cancelled() for f in futures):
        finished = [name(j) for j, f in zip(jobs, futures, strict=True) if _succeeded(f)]
        done.extend(finished)
        raise StoppedError(tuple(done), len(jobs) - len(finished))
    results = [f.result() for f in futures]
    done.extend(name(j) for j in jobs)
    return results


def _succeeded(f: Future[R]) -> bool:
    return f.done() and not f.cancelled() and f.exception() is None


def _settle(futures: list[Future[R]], pool: ThreadPoolExecutor, prefix: str) -> None:
    """Wait for running jobs to end, whatever further Ctrl-C presses arrive meanwhile.

    Threads are joined by name as well: a ``KeyboardInterrupt`` inside ``submit`` can land
    between a worker's start and its registration in the pool, and ``shutdown`` would not
    wait for that one (it would be killed at exit, leaving its temp file).
    """
    for f in futures:
        f.cancel()
    while True:
        try:
            wait(futures)
            pool.shutdown(wait=True, cancel_futures=True)
            for t in threading.enumerate():
                if t.name.startswith(prefix + "_") and t is not threading.current_thread():
                    _join(t)
            return
        except KeyboardInterrupt:
            continue  # a second Ctrl-C: the jobs are already stopping; let them clean up


def _join(t: threading.Thread, patience: float = 1.0) -> None:
    """Join ``t``, also when an interrupted ``start`` left it registered but not yet started."""
    deadline = time.monotonic() + patience
    while True:
        try:
            t.join()
            return
        except RuntimeError:  # "cannot join thread before it is started": it is about to be
            if time.monotonic() > deadline:
                return
            time.sleep(0.005)
