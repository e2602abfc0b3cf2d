"""The Python around each file's native call: what a run spends outside C, per file.

Runs ``ckptz.api.compress`` and ``decompress`` in process with writes discarded (as
``bench/e2e.py``'s *writes discarded* rows do) on PATH, a checkpoint file or folder, warm,
and prints per file the median over ``--repeat`` runs of: the run's wall time, the time
inside the native calls (one per file), the rest, and the CPU each Python step took on the
file's job thread. The native call runs on a thread of its own, so the job thread's CPU is
the Python around it. Files go one at a time (``--parallel-files``, default 1), so that the
run's wall time is its native calls and the Python between them.

    python bench/python_overhead.py PATH [--device cpu] [--repeat 5] [--threads N]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ckptz.api as api
import ckptz.pipeline.compress as compress_module
import ckptz.pipeline.native_restore as native_restore
import ckptz.runs.jobs as jobs_module
import ckptz.runs.run as run_module
from ckptz.codecs.native import native

# The module itself: the package's ``restore`` is the function of that name.
restore_module = importlib.import_module("ckptz.pipeline.restore")

#: The steps timed: (module, name as that module calls it, label).
STEPS: tuple[tuple[Any, str, str], ...] = (
    (native, "compress_plan", "native call"),
    (native, "restore_plan", "native call"),
    (api, "compress_file", "file job"),
    (api, "restore", "file job"),
    (compress_module, "read_layout", "read layout"),
    (compress_module, "plan_streams", "plan streams"),
    (compress_module, "frame_map", "frame map"),
    (compress_module, "_make_index", "make index"),
    (api, "read_index", "read index"),
    (run_module, "read_index", "read index"),
    (restore_module, "FrameDecoder", "decoder plan"),
    (native_restore, "plan", "native plan"),
    (api, "index_stats", "file stats"),
)


class Clock:
    """Wall and thread-CPU seconds of every call of each step, from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def timed(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
                with self.lock:
                    self.wall[label] += wall
                    self.cpu[label] += cpu
                    self.calls[label] += 1

        return call


@contextmanager
def timing(clock: Clock) -> Iterator[None]:
    """Every step of :data:`STEPS` timed into ``clock`` while inside."""
    real = [(module, name, getattr(module, name)) for module, name, _ in STEPS]
    for (module, name, label), (_, _, fn) in zip(STEPS, real, strict=True):
        setattr(module, name, clock.timed(label, fn))
    try:
        yield
    finally:
        for module, name, fn in real:
            setattr(module, name, fn)


def measure(run: Callable[[], object], repeat: int) -> tuple[float, list[Clock]]:
    """Median wall seconds of ``repeat`` timed runs (after one untimed), and their clocks."""
    run()
    walls, clocks = [], []
    for _ in range(repeat):
        clock = Clock()
        with timing(clock):
            start = time.perf_counter()
            run()
            walls.append(time.perf_counter() - start)
        clocks.append(clock)
    return statistics.median(walls), clocks


def report(op: str, wall: float, clocks: list[Clock]) -> None:
    files = max(1, clocks[0].calls["file job"] or clocks[0].calls["native call"])
    native = statistics.median(c.wall["native call"] for c in clocks)
    print(
        f"{op}: {files} files, per file: wall {1e3 * wall / files:.2f} ms, native call"
        f" {1e3 * native / files:.2f} ms, outside it {1e3 * (wall - native) / files:.2f} ms"
    )
    for label in dict.fromkeys(label for _, _, label in STEPS):
        if label == "native call" or not clocks[0].calls[label]:
            continue
        cpu = statistics.median(c.cpu[label] for c in clocks)
        calls = clocks[0].calls[label] / files
        print(f"  {label:14s} {calls:4.1f} calls/file  thread CPU {1e3 * cpu / files:8.3f} ms/file")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--parallel-files", type=int, default=1)
    args = parser.parse_args()
    options = {"device": args.device, "threads": args.threads}
    # The api takes run_jobs' default width (its PARALLEL_FILES, bound when it was defined).
    jobs_module.run_jobs.__kwdefaults__["width"] = args.parallel_files
    with tempfile.TemporaryDirectory(prefix="ckptz-overhead-") as tmp:
        packed = Path(tmp) / "packed"
        api.compress(args.path, f"{packed}/" if args.path.is_dir() else f"{packed}.ckptz", **options)
        packed = packed if args.path.is_dir() else packed.with_suffix(".ckptz")
        wall, clocks = measure(lambda: api.compress(args.path, None, discard=True, **options), args.repeat)
        report("compress", wall, clocks)
        wall, clocks = measure(lambda: api.decompress(packed, None, discard=True, **options), args.repeat)
        report("decompress", wall, clocks)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
