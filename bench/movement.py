"""The host's data-movement ceiling under a GPU compression, without the pipeline or a coder.

A GPU compression of a file in the page cache moves each input byte three times on the
host: ``pread`` from the page cache into pinned memory, a copy of it to the device, and
(compressed, ~0.8x) a copy back into pinned memory. This times those moves alone, by
``--threads`` threads at once, each with its own pinned buffers and CUDA stream, over the
file in ``--mib`` MiB pieces, in three variants: the reads alone, reads and copies to the
device, and all three (the copy back of 0.8x the piece from a device buffer). Nothing is
coded, so the third variant bounds any compression that takes the file's bytes from the
page cache through pinned memory, whatever its coder and interpreter.

    PYTHONPATH=. python3 bench/movement.py FILE [--threads 4 8 16] [--mib 64] [--repeats 3]

Prints one line per variant and thread count (GB/s of input, the median of ``--repeats``
passes over the file, its pieces dealt to the threads in turn; each thread waits for its
piece's copies before it reads the next).
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

from ckptz import cuda
from ckptz.engines.gpu import pinned

VARIANTS = ("read", "read+h2d", "read+h2d+d2h")
#: The compressed share of a piece that comes back (the e2e checkpoint codes at ~1.25x).
BACK = 0.8


class _Worker:
    """One thread's pinned buffers (from the GPU engine's own pool), device buffers and
    stream."""

    def __init__(self, piece: int) -> None:
        self.host = [pinned.pool().take(piece) for _ in range(2)]
        self.dev_in = cuda.alloc(piece)
        self.dev_out = cuda.alloc(piece)
        self.stream = cuda.Stream()

    def close(self) -> None:
        self.stream.close()
        cuda.free(self.dev_in, self.host[0].size)
        cuda.free(self.dev_out, self.host[0].size)
        self.host = []  # the leases go back to the pool


def _pass(fd: int, size: int, piece: int, workers: list[_Worker], variant: str) -> float:
    """Seconds for one pass over the file, pieces dealt to the threads round-robin."""
    offsets = list(range(0, size, piece))
    back = int(piece * BACK)

    failed: list[BaseException] = []

    def run(k: int) -> None:
        try:
            cuda.use_device(0)  # the context is current per thread
            w = workers[k]
            for at in offsets[k :: len(workers)]:
                n = os.preadv(fd, [w.host[0]], at)
                if variant != "read":
                    cuda.copy_to_device(w.dev_in, w.host[0].ctypes.data, n, w.stream.handle)
                if variant == "read+h2d+d2h":
                    cuda.copy_to_host(w.host[1].ctypes.data, w.dev_out, min(back, n), w.stream.handle)
                w.stream.synchronize()
        except BaseException as exc:  # a pass with a failed thread has no rate
            failed.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(workers))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--threads", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    cuda.use_device(0)
    piece = args.mib << 20
    fd = os.open(args.file, os.O_RDONLY)
    size = os.fstat(fd).st_size
    for threads in args.threads:
        workers = [_Worker(piece) for _ in range(threads)]
        try:
            _pass(fd, size, piece, workers, "read")  # warm: page cache, registrations
            for variant in VARIANTS:
                times = [_pass(fd, size, piece, workers, variant) for _ in range(args.repeats)]
                rates = sorted(size / t / 1e9 for t in times)
                print(
                    f"{variant:14s} {threads:2d} threads: {statistics.median(rates):6.2f} GB/s "
                    f"(runs {', '.join(f'{r:.2f}' for r in rates)})",
                    flush=True,
                )
        finally:
            for w in workers:
                w.close()
    os.close(fd)


if __name__ == "__main__":
    main()
