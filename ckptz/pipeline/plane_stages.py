"""Where a native plane's threads spend their time, step by step.

Each thread of a native call (``compress_plan``, ``restore_plan``) times its own steps on
its own clock (reading, hashing, coding, writing, waiting for work or for the order lock:
the extension's ``compress_stages`` and ``restore_stages``) and reports them in a table that
:func:`table` makes and :func:`read` reads. :func:`record` adds each call to this process's
totals (:func:`totals`, what benchmarks read) and, with ``CKPTZ_TRACE`` set, to the trace
(:func:`ckptz.trace.call`), so a trace says which step held a native call up.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import NamedTuple, TypeVar

import numpy as np

from ckptz import trace
from ckptz.codecs.native import native

#: Most GPU workers a plane runs beside its threads: their rows follow the threads'.
GPU_WORKERS: int = native.gpu_max_workers
#: A row's columns (native.h's STAGE_*): role, start, run time, CPU time, then each step's
#: nanoseconds and each step's count.
_ROLE, _BORN, _LIFE, _CPU, _NS = 0, 1, 2, 3, 4
#: Roles of a row: a plane's thread, a GPU worker (0: no thread).
CPU, GPU = "thread", "gpu worker"
_ROLES = {1: CPU, 2: GPU}

K = TypeVar("K")


class ThreadStages(NamedTuple):
    """One native thread's clock.

    Attributes:
        role: :data:`CPU` or :data:`GPU`.
        born_ns: when it started (CLOCK_MONOTONIC, perf_counter_ns's clock on Linux).
        life_ns: how long it ran.
        cpu_ns: how much of that on a CPU (the rest it waited for a lock, the disk, or a
            core another process held).
        ns: nanoseconds in each step (the steps it took).
        counts: times it took each step.
    """

    role: str
    born_ns: int
    life_ns: int
    cpu_ns: int
    ns: dict[str, int]
    counts: dict[str, int]


class CallStages(NamedTuple):
    """One native call's threads' clocks, and how long the call took."""

    plane: str
    wall_ns: int
    threads: tuple[ThreadStages, ...]

    def summed(self, role: str = CPU) -> dict[str, int]:
        """Nanoseconds in each step, summed over the threads of ``role``."""
        out: dict[str, int] = {}
        for t in self.threads:
            if t.role == role:
                for name, ns in t.ns.items():
                    out[name] = out.get(name, 0) + ns
        return out


def table(threads: int) -> np.ndarray:
    """A table for a call on ``threads`` threads (and a GPU's workers) to report in."""
    return np.zeros((threads + GPU_WORKERS, native.stage_columns), np.int64)


def read(plane: str, names: Sequence[str], rows: np.ndarray, wall_ns: int) -> CallStages:
    """The clocks a call of ``plane`` (whose steps are ``names``) reported in ``rows``."""
    count = len(names)
    threads = []
    for row in rows.tolist():
        role = _ROLES.get(row[_ROLE])
        if role is None:
            continue
        ns = row[_NS : _NS + count]
        counts = row[_NS + (len(row) - _NS) // 2 :][:count]
        threads.append(
            ThreadStages(
                role,
                row[_BORN],
                row[_LIFE],
                row[_CPU],
                {n: v for n, v, c in zip(names, ns, counts, strict=True) if c},
                {n: c for n, c in zip(names, counts, strict=True) if c},
            )
        )
    return CallStages(plane, wall_ns, tuple(threads))


class PlaneTotals:
    """A plane's calls in this process, added up.

    Attributes:
        calls: native calls.
        wall_ns: their time, end to end.
        capacity_ns: per role, each call's time times its threads of that role.
        cpu_ns: per role, its threads' CPU time.
        ns: per role and step, nanoseconds summed over threads.
        counts: per role and step, times taken.
    """

    # A plain class, not a dataclass: this module is imported with every native call's, and
    # dataclasses cost milliseconds to make at import.
    __slots__ = ("calls", "capacity_ns", "counts", "cpu_ns", "ns", "wall_ns")

    def __init__(
        self,
        calls: int = 0,
        wall_ns: int = 0,
        capacity_ns: dict[str, int] | None = None,
        cpu_ns: dict[str, int] | None = None,
        ns: dict[tuple[str, str], int] | None = None,
        counts: dict[tuple[str, str], int] | None = None,
    ) -> None:
        self.calls = calls
        self.wall_ns = wall_ns
        self.capacity_ns = capacity_ns or {}
        self.cpu_ns = cpu_ns or {}
        self.ns = ns or {}
        self.counts = counts or {}

    def add(self, call: CallStages) -> None:
        self.calls += 1
        self.wall_ns += call.wall_ns
        for t in call.threads:
            self.capacity_ns[t.role] = self.capacity_ns.get(t.role, 0) + call.wall_ns
            self.cpu_ns[t.role] = self.cpu_ns.get(t.role, 0) + t.cpu_ns
            for name, ns in t.ns.items():
                self.ns[t.role, name] = self.ns.get((t.role, name), 0) + ns
                self.counts[t.role, name] = self.counts.get((t.role, name), 0) + t.counts[name]

    def copy(self) -> PlaneTotals:
        return PlaneTotals(
            self.calls,
            self.wall_ns,
            dict(self.capacity_ns),
            dict(self.cpu_ns),
            dict(self.ns),
            dict(self.counts),
        )

    def since(self, earlier: PlaneTotals) -> PlaneTotals:
        """What was added after ``earlier`` (a copy of these totals taken then)."""

        def minus(a: dict[K, int], b: dict[K, int]) -> dict[K, int]:
            return {k: v - b.get(k, 0) for k, v in a.items() if v - b.get(k, 0)}

        return PlaneTotals(
            self.calls - earlier.calls,
            self.wall_ns - earlier.wall_ns,
            minus(self.capacity_ns, earlier.capacity_ns),
            minus(self.cpu_ns, earlier.cpu_ns),
            minus(self.ns, earlier.ns),
            minus(self.counts, earlier.counts),
        )


_lock = threading.Lock()
_totals: dict[str, PlaneTotals] = {}


def totals(plane: str) -> PlaneTotals:
    """A copy of the totals of ``plane`` (``compress`` or ``restore``) in this process."""
    with _lock:
        return _totals.get(plane, PlaneTotals()).copy()


def record(call: CallStages, name: str, start_ns: int, end_ns: int) -> None:
    """Add ``call`` to this process's totals and, where tracing, to the trace: as the span
    ``name`` in this thread from ``start_ns`` to ``end_ns`` (perf_counter_ns) with its steps'
    totals, and each native thread's steps laid end to end on a row of its own."""
    with _lock:
        _totals.setdefault(call.plane, PlaneTotals()).add(call)
    if trace.PATH is None:
        return
    args: dict[str, object] = {
        "threads": sum(t.role == CPU for t in call.threads),
        "cpu_s": sum(t.cpu_ns for t in call.threads if t.role == CPU) / 1e9,
        "stage_s": {k: v / 1e9 for k, v in sorted(call.summed(CPU).items())},
    }
    if any(t.role == GPU for t in call.threads):
        args["gpu_workers"] = sum(t.role == GPU for t in call.threads)
        args["gpu_stage_s"] = {k: v / 1e9 for k, v in sorted(call.summed(GPU).items())}
    rows = []
    numbers = {CPU: 0, GPU: 0}
    for t in call.threads:
        rows.append((f"{name} {t.role}-{numbers[t.role]}", t.born_ns, tuple(t.ns.items())))
        numbers[t.role] += 1
    trace.call(name, start_ns, end_ns, args, rows)


__all__ = ["CPU", "GPU", "CallStages", "PlaneTotals", "ThreadStages", "read", "record", "table", "totals"]
