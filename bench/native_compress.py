"""CPU compression: the native plane (one C call per file) against the Python pipeline, A/B.

Makes a checkpoint of fp32 and bf16 tensors (``--gib`` of them, half each), then compresses
it with each path, writes discarded and to a file beside it: the median of ``--repeat`` runs,
GB/s of original bytes and CPU seconds per GB, and checks that both paths wrote the same
container. The Python pipeline is the one that still serves GPUs, series deltas and pipes;
here it is reached by declining the native plane.

    python bench/native_compress.py [--gib 1] [--threads N] [--repeat 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import filecmp
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from native_restore import _cpu, make

from ckptz.engines.cpu import CpuEngine
from ckptz.pipeline import native_compress
from ckptz.pipeline.compress import compress_file


@contextmanager
def python_pipeline(on: bool) -> Iterator[None]:
    """The Python pipeline compresses while ``on`` (the native plane is declined)."""
    real = native_compress.suits
    if on:
        native_compress.suits = lambda *args, **kwargs: False  # type: ignore[assignment]
    try:
        yield
    finally:
        native_compress.suits = real  # type: ignore[assignment]


def once(src: Path, out: Path | None, threads: int) -> tuple[float, float]:
    """Seconds of wall clock and of CPU (every thread's) for one compression (to ``out``, or
    discarded): on a shared machine the CPU seconds are the steadier measure."""
    engine = CpuEngine(threads)
    start, cpu = time.perf_counter(), _cpu()
    if out is None:
        compress_file(src, src.name, None, engine)
    else:
        with open(out, "wb") as f:
            compress_file(src, src.name, f, engine)
    return time.perf_counter() - start, _cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        src = make(root, args.gib)
        size = src.stat().st_size
        print(f"{size / 1e9:.2f} GB, {args.threads} threads")
        for sink in ("discard", "file"):
            written: list[Path] = []
            for name, python in (("python", True), ("native plane", False)):
                out = None if sink == "discard" else root / f"{name.replace(' ', '-')}.ckptz"
                with python_pipeline(python):
                    once(src, out, args.threads)  # warm the page cache
                    runs = [once(src, out, args.threads) for _ in range(args.repeat)]
                t = statistics.median(r[0] for r in runs)
                cpu = statistics.median(r[1] for r in runs)
                print(
                    f"{sink:8s} {name:13s} {size / t / 1e9:6.2f} GB/s  {cpu / (size / 1e9):5.2f} CPU s/GB"
                    f"  (median of {args.repeat}: {t:.2f} s)"
                )
                if out is not None:
                    written.append(out)
            if written:
                assert filecmp.cmp(*written, shallow=False), "the two paths wrote different containers"


if __name__ == "__main__":
    main()
