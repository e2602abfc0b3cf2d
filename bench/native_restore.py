"""CPU restore: the native plane (one C call per file) against the Python loop, A/B.

Makes a checkpoint of fp32 and bf16 tensors (``--gib`` of them, half each), compresses it
once on the CPU, then restores it with each path, writes discarded (verify) and to a file
beside it: the median of ``--repeat`` runs, GB/s of original bytes and CPU seconds per GB. The Python loop is the
one that still serves GPU, memory and stdout sinks; here it is reached by declining the
native plan.

    python bench/native_restore.py [--gib 1] [--threads N] [--repeat 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import filecmp
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ckptz import api
from ckptz.engines.cpu import CpuEngine
from ckptz.pipeline import native_restore
from ckptz.pipeline.restore import DiscardSink, FileSink, restore


def make(root: Path, gib: float) -> Path:
    """A safetensors file of trained-like fp32 and bf16 weights, ``gib`` GiB in all."""
    import torch
    from safetensors.torch import save_file

    total = int(gib * (1 << 30))
    g = torch.Generator().manual_seed(0)
    tensors: dict[str, torch.Tensor] = {}
    per = 64 << 20
    n = 0
    while n * per < total:
        shape = (per // 4 if n % 2 == 0 else per // 2,)
        t = torch.randn(shape, generator=g) * 0.02
        tensors[f"layer{n}.weight"] = t if n % 2 == 0 else t.to(torch.bfloat16)
        n += 1
    path = root / "model.safetensors"
    save_file(tensors, str(path))
    return path


@contextmanager
def python_loop(on: bool) -> Iterator[None]:
    """The Python loop restores while ``on`` (the native plan is declined)."""
    real = native_restore.plan
    if on:
        native_restore.plan = lambda decoder, gpu=False: None  # type: ignore[assignment]
    try:
        yield
    finally:
        native_restore.plan = real  # type: ignore[assignment]


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def once(container: Path, out: Path | None, threads: int) -> tuple[float, float]:
    """Seconds of wall clock and of CPU (every thread's) for one restore (to ``out``, or
    discarded): on a shared machine the CPU seconds are the steadier measure."""
    engine = CpuEngine(threads)
    start, cpu = time.perf_counter(), _cpu()
    with open(container, "rb") as c:
        if out is None:
            restore(c, "m", engine, DiscardSink())
        else:
            with open(out, "wb+") as f:
                from ckptz.container import read_index

                index = read_index(c, "m")
                f.truncate(index.source_size)
                restore(c, "m", engine, FileSink(f, index.source_size), index=index)
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
        api.compress(src, device="cpu", threads=args.threads)
        container = root / "model.safetensors.ckptz"
        print(f"{size / 1e9:.2f} GB -> {container.stat().st_size / 1e9:.2f} GB, {args.threads} threads")
        for sink in ("discard", "file"):
            out = None if sink == "discard" else root / "restored"
            for name, python in (("python loop", True), ("native plane", False)):
                with python_loop(python):
                    once(container, out, args.threads)  # warm the page cache
                    runs = [once(container, out, args.threads) for _ in range(args.repeat)]
                t = statistics.median(r[0] for r in runs)
                cpu = statistics.median(r[1] for r in runs)
                print(
                    f"{sink:8s} {name:13s} {size / t / 1e9:6.2f} GB/s  {cpu / (size / 1e9):5.2f} CPU s/GB"
                    f"  (median of {args.repeat}: {t:.2f} s)"
                )
            if out is not None:
                assert filecmp.cmp(out, src, shallow=False), "the restore is not byte-exact"


if __name__ == "__main__":
    main()
