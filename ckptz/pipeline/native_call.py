"""One native call at a time per file, polled: what the compress and restore planes share.

A native call runs on a thread of its own with the GIL released; this thread polls its
progress counter and is where Ctrl-C and SIGTERM raise, which set the call's stop flag. The
threads a call may use are lent from one budget, so several files in flight stay within
the engine's thread count. Each call's threads report where their time went
(:mod:`ckptz.pipeline.plane_stages`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter_ns

import numpy as np

from ckptz.codecs.table import ANS
from ckptz.pipeline import plane_stages

#: Seconds between polls of the progress counter (and chances to take a signal).
POLL = 0.05

#: Most digest leaves the native plane holds the hashes of at once (128 MiB of them): a
#: container may declare any size with tiny leaves, and the Python loop, which hashes as it
#: goes, restores those in bounded memory.
MAX_LEAVES = 1 << 24

#: Failures of a series delta in either plane (delta_plane.c): the reference ends early,
#: cannot be read or is damaged, or a frame cuts a word or group of a tensor coded in value.
#: The Python transform applied to the failing frame words each as the Python pipeline does.
DELTA_FAILURES = frozenset(range(15, 20))


class _Threads:
    """Native threads lent to the native calls running at once (files in parallel):
    together they stay within the engine's thread count, so several files in flight do
    not multiply the threads and their per-thread buffers."""

    def __init__(self) -> None:
        self._lent = 0
        self._changed = threading.Condition()

    def borrow(self, limit: int) -> int:
        """At least one thread and at most what ``limit`` leaves free (waits for one)."""
        with self._changed:
            self._changed.wait_for(lambda: self._lent < limit)
            granted = limit - self._lent
            self._lent += granted
            return granted

    def give_back(self, n: int) -> None:
        with self._changed:
            self._lent -= n
            self._changed.notify_all()


THREADS = _Threads()


@dataclass(frozen=True, slots=True)
class Gpu:
    """The GPU on which a native plane codes or decodes nvCOMP's bitstreams.

    Attributes:
        device: the CUDA device's index.
        library: nvCOMP's shared library (the ``nvidia-libnvcomp`` wheel's).
        batch_bytes: bytes the GPU takes per call (and room for what comes back).
        workers: GPU worker threads, each with its own CUDA stream and device memory, so that
            one batch's copies overlap another's coding.
        zstd: (restores) whether the portable ``zstd`` chunks go to the GPU too (else the CPU
            threads decode them, and only ``ans`` chunks go there).
        codec: (compressions) the bitstream the GPU codes: ``ans`` (nvCOMP ANS) or ``zstd``
            (the portable bitstream, written by ckptz's kernels).
        kernels: (compressions of ``zstd``) the cubin of ckptz's kernels for the device.
    """

    device: int
    library: str
    batch_bytes: int
    workers: int = 2
    zstd: bool = True
    codec: int = ANS.id
    kernels: bytes = b""


class GpuTotals:
    """Batches, chunks and bytes a native plane sent to a GPU in this process (what tests
    and benchmarks read to know the GPU did the work)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = [0, 0, 0]

    def add(self, stats: np.ndarray) -> None:
        with self._lock:
            self._totals = [a + int(b) for a, b in zip(self._totals, stats.tolist(), strict=True)]

    def get(self) -> tuple[int, int, int]:
        with self._lock:
            batches, chunks, nbytes = self._totals
            return batches, chunks, nbytes


#: One native call: given the threads lent to it, its progress counter, its stop flag, the
#: row it fills with its first failure (kind, frame, detail) and the table its threads'
#: clocks go in (:func:`plane_stages.table`); returns 0 or that kind.
NativeCall = Callable[[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray], int]


def call_polled(
    call: NativeCall,
    name: str,
    threads: int,
    progress: Callable[[int], None],
    plane: str,
    steps: Sequence[str],
    frames: int,
) -> tuple[int, np.ndarray]:
    """Run ``call`` on a thread of its own and hand its progress counter to ``progress``
    until it returns; its result, and its failure row (kind, frame, detail). It is lent at
    most ``threads``, and no more than its ``frames``: a thread beyond them would find no
    frame to take, and holding it would keep another file's call from starting. Where it
    returned, its threads' clocks (``plane``'s ``steps``) are recorded
    (:func:`plane_stages.record`).

    Raises:
        what ``call`` raised (a plan it rejected), or what ``progress`` or a signal handler
        raised in this thread: then its stop flag is set and the call waited for first.
    """
    counter = np.zeros(1, np.int64)
    stop = np.zeros(1, np.uint8)
    error = np.zeros(3, np.int64)
    result: list[int] = []
    failure: list[BaseException] = []
    span: list[int] = []

    def run(lent: int) -> None:
        clocks = plane_stages.table(lent)
        try:
            span.append(perf_counter_ns())
            result.append(call(lent, counter, stop, error, clocks))
            span.append(perf_counter_ns())
            calls = plane_stages.read(plane, steps, clocks, span[1] - span[0])
            plane_stages.record(calls, name, span[0], span[1])
        except BaseException as exc:  # a rejected plan: raised in the caller's thread
            failure.append(exc)

    reported = 0
    lent = THREADS.borrow(max(1, min(threads, frames)))
    worker = threading.Thread(target=run, args=(lent,), name=name, daemon=True)
    try:
        worker.start()
        while worker.is_alive():
            worker.join(POLL)
            done = int(counter[0])
            progress(done - reported)  # also where a stop set by a signal is noticed
            reported = done
    except BaseException:
        stop[0] = 1  # the native threads end between frames; nothing more is written
        worker.join()
        raise
    finally:
        THREADS.give_back(lent)
    done = int(counter[0])
    if done > reported:
        progress(done - reported)
    if failure:
        raise failure[0]
    return result[0], error


__all__ = ["DELTA_FAILURES", "MAX_LEAVES", "POLL", "THREADS", "NativeCall", "call_polled"]
