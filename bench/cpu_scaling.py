"""How the CPU coder's per-frame work scales over threads, without the pipeline around it.

Each thread takes frames of one file in turn, ``pread``s each into a buffer of its own, and
then (by stage) xxh3s it and codes it with ``encode_frame`` and the CPU engine's options for
the given dtype (a float's measured contexts too, as the engine and its native plane code):
GB/s of input for each thread count and frame size, beside a plain memory copy's. Then, on
one thread, where one frame's coding goes (split into planes, each plane's bitstream). Compare with the pipeline's own rate (``bench/e2e.py``'s discarded cpu rows) to
see what the pipeline adds.

    python bench/cpu_scaling.py optimizer.pt [--dtype float32] [--threads 1 4 16] [--mib 4 16]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

from ckptz.checksums import xxh3_64
from ckptz.codecs import frames as fr
from ckptz.codecs.frames import EncodeOptions, encode_frame, encode_plane
from ckptz.codecs.planes import scratch, split_sampled
from ckptz.container import StreamInfo
from ckptz.dtypes import lookup
from ckptz.engines.cpu import CpuEngine

STAGES = ("pread", "pread+xxh3", "pread+xxh3+encode")


def _frames(size: int, frame: int, word: int) -> list[tuple[int, int]]:
    """(offset, bytes) of whole frames of whole words, past a 4 KiB header."""
    return [(at, frame // word * word) for at in range(4096, size - frame, frame)]


def engine_options(dtype: str, level: int = 3) -> EncodeOptions:
    """What the CPU engine codes a stream of ``dtype`` with (a float's measured contexts too)."""
    kind = lookup(dtype)
    stream = StreamInfo(0, "weights", dtype, max(kind.word, 1), kind.is_float, 0, 0, 0)
    return CpuEngine(1, level).options_for(stream)


def loop(
    fd: int,
    frames: list[tuple[int, int]],
    threads: int,
    stage: int,
    dtype: str,
    options: EncodeOptions | None = None,
) -> float:
    """GB/s of the bare loop up to ``stage`` (an index of :data:`STAGES`) on ``threads``,
    coding with ``options`` (default: the CPU engine's, :func:`engine_options`)."""
    kind = lookup(dtype)
    options = options or engine_options(dtype)
    todo = iter(range(len(frames)))
    lock = threading.Lock()
    largest = max(n for _, n in frames)

    def work() -> None:
        buf = np.empty(largest, np.uint8)
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            at, n = frames[i]
            view = buf[:n]
            os.preadv(fd, [view], at)
            if stage >= 1:
                xxh3_64(view)
            if stage >= 2:
                encode_frame(view, kind, options)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    start = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(n for _, n in frames) / (time.perf_counter() - start) / 1e9


def copy_rate(threads: int, size: int = 64 << 20, repeats: int = 20) -> float:
    """GB/s of numpy copies of ``size``-byte buffers, one pair per thread."""
    pairs = [(np.ones(size, np.uint8), np.empty(size, np.uint8)) for _ in range(threads)]

    def work(i: int) -> None:
        src, dst = pairs[i]
        for _ in range(repeats):
            np.copyto(dst, src)

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return threads * repeats * size / (time.perf_counter() - start) / 1e9


def planes(fd: int, frames: list[tuple[int, int]], dtype: str) -> None:
    """One thread: ms per frame in the split and in each plane's bitstream."""
    kind = lookup(dtype)
    options = engine_options(dtype)
    spent: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    raw: collections.Counter[str] = collections.Counter()
    coded: collections.Counter[str] = collections.Counter()
    buf = np.empty(max(n for _, n in frames), np.uint8)
    for at, n in frames:
        view = buf[:n]
        os.preadv(fd, [view], at)
        t = time.perf_counter()
        xxh3_64(view)
        spent["xxh3"] += time.perf_counter() - t
        t = time.perf_counter()
        split, sampled = split_sampled(view, kind, scratch("planes", n), fr.SAMPLE)
        spent["split"] += time.perf_counter() - t
        top = len(split) - 1
        for k, (plane, stats) in enumerate(zip(split, sampled or [None] * len(split), strict=True)):
            t = time.perf_counter()
            chunk = encode_plane(
                plane,
                options,
                exponent=kind.is_float and k == top,
                signs=kind.is_float and k == 0,
                stats=fr.PlaneStats(*stats) if stats is not None else None,
            )
            name = f"plane {k} {fr.cpu_codec(chunk.codec).name}"
            spent[name] += time.perf_counter() - t
            count[name] += 1
            raw[name] += plane.size
            coded[name] += len(chunk.payload)
    for name, seconds in sorted(spent.items()):
        times = count[name] or len(frames)
        ratio = f", {raw[name] / max(coded[name], 1):.3f}x" if count[name] else ""
        print(f"  {name:22s} {seconds * 1e3 / times:7.2f} ms a frame, {times} frames{ratio}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "file", type=Path, help="a file of one dtype's tensors (e.g. an optimizer.pt of fp32 moments)"
    )
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--mib", type=int, nargs="+", default=[4, 16], help="frame sizes, MiB")
    ap.add_argument(
        "--stages", type=int, nargs="+", default=[0, 1, 2], help="indices of " + ", ".join(STAGES)
    )
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    sys.setswitchinterval(0.0002)  # as the pipeline runs
    fd = os.open(args.file, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        word = max(lookup(args.dtype).word, 1)
        print("copy, GB/s:", " ".join(f"T{t}={copy_rate(t):.2f}" for t in args.threads), flush=True)
        for mib in args.mib:
            frames = _frames(size, mib << 20, word)
            if not frames:
                sys.exit(f"{args.file} holds no {mib} MiB frame")
            for stage in args.stages:
                rates = []
                for threads in args.threads:
                    loop(fd, frames, threads, stage, args.dtype)  # warm
                    rates.append(
                        statistics.median(
                            loop(fd, frames, threads, stage, args.dtype) for _ in range(args.repeats)
                        )
                    )
                shown = " ".join(f"T{t}={g:.2f}" for t, g in zip(args.threads, rates, strict=True))
                print(f"{mib:3d} MiB {STAGES[stage]:20s} GB/s: {shown}", flush=True)
        print(f"one thread, {args.mib[-1]} MiB frames:")
        planes(fd, _frames(size, args.mib[-1] << 20, word), args.dtype)
    finally:
        os.close(fd)


if __name__ == "__main__":
    main()
