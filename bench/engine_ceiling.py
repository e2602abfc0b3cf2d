"""The GPU engine's own ceiling: spans coded as the pipeline hands them over, without the pipeline.

A GPU compression's readers fill pinned buffers (``GpuEngine.host_buffer``) with runs of
frames and hand each to ``GpuEngine.encode_span``, with the whole-file digest's leaves that
lie inside it. This does the same from buffers filled once, before the clock starts: no
file, no reads, no digest joins, no container. So what it measures is the engine alone:
its workers' copies to the device, hashes, coder, gather, copy back and result objects,
on synthetic fp32 optimizer moments (Gaussian values and their squares, 4 MiB frames of
the ``ans`` bitstream).

    PYTHONPATH=. python3 bench/engine_ceiling.py [--gb 8] [--workers 2 3] [--memory-gib 2 4]
        [--leaves on off] [--repeats 3] [--codec ans]

Prints one line per configuration: GB/s of input, the median of ``--repeats`` passes
(after one warm-up pass), with the spread. A pass keeps as many spans in flight as the
pipeline's look-ahead allows (``GpuEngine.look_ahead`` frames), waiting for the oldest
before it hands over the next.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections import deque
from concurrent.futures import Future

import numpy as np

from ckptz.container import StreamInfo
from ckptz.digest import LEAF
from ckptz.engines.base import EncodedSpan, FrameToCode, Ranges
from ckptz.engines.gpu.engine import GpuEngine


def _fill(buffers: list[np.ndarray]) -> None:
    """Gaussian float32 values (an ``exp_avg``) in even buffers, their squares (an
    ``exp_avg_sq``) in odd ones."""
    rng = np.random.default_rng(0)
    for k, buf in enumerate(buffers):
        values = buf[: buf.size // 4 * 4].view(np.float32)
        values[:] = rng.standard_normal(values.size, dtype=np.float32) * np.float32(1e-3)
        if k % 2:
            np.square(values, out=values)


def _span(engine: GpuEngine, buf: np.ndarray, leaves: bool) -> tuple[list[FrameToCode], Ranges | None]:
    """The frames of one buffer, and the digest leaves inside them."""
    frame = engine.frame_size
    count = buf.size // frame
    stream = StreamInfo(0, "exp_avg", "float32", 4, True, frame, count * frame, 1)
    frames = [FrameToCode(stream, buf[k * frame : (k + 1) * frame], None) for k in range(count)]
    if not leaves:
        return frames, None
    per = frame // LEAF
    ranges = Ranges(
        np.repeat(np.arange(count, dtype=np.int64), per),
        np.tile(np.arange(per, dtype=np.int64) * LEAF, count),
        np.full(count * per, LEAF, np.int64),
    )
    return frames, ranges


def _pass(
    engine: GpuEngine, spans: list[tuple[list[FrameToCode], Ranges | None, np.ndarray]], total: int
) -> float:
    """Seconds to code ``total`` spans, dealt from ``spans`` in turn, at most ``len(spans)``
    in flight."""
    flying: deque[Future[EncodedSpan]] = deque()
    start = time.perf_counter()
    for _, (frames, ranges, buf) in zip(range(total), itertools.cycle(spans)):
        if len(flying) == len(spans):
            flying.popleft().result()
        flying.append(engine.encode_span(frames, buf, ranges))
    engine.flush()  # the last span is queued: run what is there
    for fut in flying:
        fut.result()
    return time.perf_counter() - start


def measure(gb: float, workers: int, memory: int, leaves: bool, repeats: int, codec: str) -> list[float]:
    """GB/s of each timed pass of one configuration."""
    with GpuEngine(0, codec=codec, memory=memory, workers=workers) as engine:
        size = engine.batch_bytes // engine.frame_size * engine.frame_size
        depth = max(2, engine.look_ahead * engine.frame_size // size)
        buffers = [engine.host_buffer(size)[:size] for _ in range(depth)]
        _fill(buffers)
        spans = [(*_span(engine, b, leaves), b) for b in buffers]
        total = max(depth, int(gb * 1e9 // size))
        _pass(engine, spans, total)  # warm-up: kernels, scratch memory, pinned copies back
        return [total * size / _pass(engine, spans, total) / 1e9 for _ in range(repeats)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=8.0, help="input coded per pass")
    ap.add_argument("--workers", type=int, nargs="+", default=[2])
    ap.add_argument("--memory-gib", type=float, nargs="+", default=[2.0])
    ap.add_argument("--leaves", choices=["on", "off"], nargs="+", default=["on"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--codec", choices=["ans", "zstd"], default="ans")
    args = ap.parse_args()
    for w, mem, lv in itertools.product(args.workers, args.memory_gib, args.leaves):
        rates = measure(args.gb, w, int(mem * (1 << 30)), lv == "on", args.repeats, args.codec)
        print(
            f"{args.codec} workers {w} memory {mem:g} GiB leaves {lv}: {statistics.median(rates):6.2f} GB/s"
            f"  [{', '.join(f'{r:.2f}' for r in sorted(rates))}]",
            flush=True,
        )


if __name__ == "__main__":
    main()
