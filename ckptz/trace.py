"""Timelines of a run: where each thread's time goes, stage by stage.

Set ``CKPTZ_TRACE=run.json`` and every stage of the pipeline (reads, hashing, each GPU
batch's copies and coding, writes, waits) records when it ran and in which thread; the
process writes them as it exits, in the Chrome trace format that https://ui.perfetto.dev
and ``chrome://tracing`` open. ``python bench/timeline.py run.json`` sums them up per
thread and stage. Unset (the default), a stage costs one call that returns a shared no-op.

A native call (:func:`call`) is one span with its steps' totals in its ``args``, and each of
its native threads a row of its own: that thread's steps laid end to end from when it
started, each as long as the thread spent in it in all (how its time divides, not when each
step ran).
"""

from __future__ import annotations

import atexit
import json
import threading
from collections.abc import Sequence
from time import perf_counter_ns
from types import TracebackType
from typing import cast

from ckptz.settings import value

#: Where the trace goes (None: not tracing).
PATH = cast("str | None", value("trace"))

#: Spans: name, thread (name and id), start, end (perf_counter_ns), and args (or None).
_events: list[tuple[str, tuple[str, int], int, int, dict[str, object] | None]] = []


class _Span:
    __slots__ = ("name", "start")

    def __init__(self, name: str) -> None:
        self.name = name
        self.start = 0

    def __enter__(self) -> None:
        self.start = perf_counter_ns()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Name and id: an id alone is reused as pools' threads come and go, and a file's
        # helper threads share a name.
        thread = threading.current_thread()
        _events.append((self.name, (thread.name, thread.ident or 0), self.start, perf_counter_ns(), None))


class _Off:
    __slots__ = ()

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        pass


_OFF = _Off()


def span(name: str) -> _Span | _Off:
    """A context manager that records ``name`` running in this thread while its body runs."""
    return _OFF if PATH is None else _Span(name)


def call(
    name: str,
    start: int,
    end: int,
    args: dict[str, object],
    threads: Sequence[tuple[str, int, Sequence[tuple[str, int]]]],
) -> None:
    """Record a native call ``name`` that ran in this thread from ``start`` to ``end``
    (perf_counter_ns), with ``args`` (its steps' totals), and for each of its native
    threads (a row name, when it started, nanoseconds in each step) its steps laid end to end
    from its start (or the call's, where that start is not on this clock)."""
    if PATH is None:
        return
    caller = threading.current_thread().ident or 0
    _events.append((name, (threading.current_thread().name, caller), start, end, args))
    for row, born, steps in threads:
        at = born if start <= born <= end else start
        for step, ns in steps:
            # The calling thread's id keeps files coded at once on rows of their own.
            _events.append((step, (row, caller), at, at + ns, None))
            at += ns


def write(path: str) -> None:
    """Write the recorded stages as a Chrome trace."""
    rows = list(_events)
    origin = min((a for _, _, a, _, _ in rows), default=0)
    tids = {name: tid for tid, name in enumerate(sorted({t for _, t, _, _, _ in rows}))}
    out: list[dict[str, object]] = [
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": name[0]}}
        for name, tid in tids.items()
    ]
    for n, t, a, b, args in rows:
        event: dict[str, object] = {"name": n, "ph": "X", "pid": 0, "tid": tids[t], "ts": (a - origin) / 1e3}
        event["dur"] = (b - a) / 1e3
        if args is not None:
            event["args"] = args
        out.append(event)
    with open(path, "w") as f:
        # The clock's origin: timelines of several processes (CLOCK_MONOTONIC) line up.
        json.dump({"traceEvents": out, "displayTimeUnit": "ms", "otherData": {"origin_ns": origin}}, f)


if PATH is not None:
    atexit.register(write, PATH)


__all__ = ["PATH", "call", "span", "write"]
