"""The compression pipeline's own ceiling: every stage but the coder, with a null engine.

A GPU compression is the pipeline (readers ``pread`` runs of frames into buffers, the
whole-file digest joins the leaves that straddle runs, the file's thread places each coded
frame, writers write) around an engine (:class:`ckptz.engines.gpu.engine.GpuEngine`). This
runs the real pipeline (:func:`ckptz.pipeline.compress.compress_file`, writes discarded)
around an engine that is shaped like the GPU engine (4 MiB frames, spans of a batch, its
look-ahead, results handed over from two worker threads) but codes and hashes nothing: each
frame comes back as stored planes, views of one zero block, with zero checksums. What it
measures is what the pipeline alone allows; ``bench/engine_ceiling.py`` measures the engine
alone. Needs no GPU.

    PYTHONPATH=. python3 bench/pipeline_ceiling.py PATH [--readers 8 16] [--ahead 1 2]
        [--repeats 5]

Prints one line per configuration: GB/s of input (every file under PATH the pipeline
compresses), the median of ``--repeats`` runs after two warm-up runs, with the spread.
"""

from __future__ import annotations

import argparse
import itertools
import queue
import statistics
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import numpy as np

from ckptz.codecs.frames import EncodedChunk
from ckptz.engines.base import EncodedFrame, EncodedSpan, FrameToCode, Ranges
from ckptz.engines.gpu.coder import RAW_ID
from ckptz.formats import is_checkpoint
from ckptz.pipeline.compress import compress_file
from ckptz.pipeline.workers import Workers, tuned_interpreter

#: The GPU engine's frames and its default budget's batches (``memory // (12 * workers)``).
FRAME = 4 << 20
WORKERS = 2
BATCH = (2 << 30) // (12 * WORKERS)


class NullEngine:
    """An engine with the GPU engine's shape that codes and hashes nothing."""

    device = "cuda:0"
    inline = False
    hashes = True
    checks = False
    frame_size = largest_frame = FRAME
    span_bytes = BATCH

    def __init__(self, ahead: int) -> None:
        self.threads = 16
        self.look_ahead = ahead * max(4 * self.threads + 4, 3 * WORKERS * BATCH // FRAME)
        self.restore_ahead = self.look_ahead
        self._zero = np.zeros(2 * BATCH, np.uint8)
        self._jobs: queue.SimpleQueue[tuple[list[FrameToCode], Ranges | None, Future[EncodedSpan]] | None]
        self._jobs = queue.SimpleQueue()
        self._workers = [threading.Thread(target=self._run, daemon=True) for _ in range(WORKERS)]
        for t in self._workers:
            t.start()

    def _run(self) -> None:
        view = memoryview(self._zero)  # type: ignore[arg-type]
        while (job := self._jobs.get()) is not None:
            frames, leaves, future = job
            coded, at = [], 0
            for f in frames:
                planes = max(f.stream.word, 1)
                raw = f.data.size // planes
                chunks = []
                for _ in range(planes):
                    chunks.append(EncodedChunk(RAW_ID, raw, view[at : at + raw]))  # type: ignore[arg-type]
                    at += -(-raw // 16) * 16
                coded.append(EncodedFrame(0, chunks))
            sums = np.zeros(sum(len(c.chunks) for c in coded), np.uint64)
            hashes = None if leaves is None else np.zeros(leaves.count, np.uint64)
            future.set_result(EncodedSpan(coded, self._zero[:at], hashes, sums))

    def host_buffer(self, size: int) -> np.ndarray:
        return np.empty(size, np.uint8)

    def free_buffer(self, buf: np.ndarray) -> None:
        pass

    def encode(self, stream: object, data: np.ndarray, checksum: int) -> Future[EncodedFrame]:
        done: Future[EncodedFrame] = Future()
        done.set_result(EncodedFrame(checksum, [EncodedChunk(RAW_ID, data.size, data)]))  # type: ignore[arg-type]
        return done

    def encode_span(
        self, frames: list[FrameToCode], buffer: np.ndarray | None, leaves: Ranges | None = None
    ) -> Future[EncodedSpan]:
        future: Future[EncodedSpan] = Future()
        self._jobs.put((frames, leaves, future))
        return future

    def flush(self) -> None:
        pass

    def codec_config(self) -> dict[str, dict[str, object]]:
        return {}

    def container_extras(self) -> dict[str, object]:
        return {}

    def close(self) -> None:
        for _ in self._workers:
            self._jobs.put(None)


def _files(path: Path) -> list[Path]:
    """The files under ``path`` that the pipeline compresses (checkpoint formats)."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return [p for p in files if is_checkpoint(p)]


def measure(path: Path, readers: int, ahead: int, repeats: int) -> list[float]:
    """GB/s of each timed run of one configuration."""
    files = _files(path)
    size = sum(p.stat().st_size for p in files)
    engine, workers = NullEngine(ahead), Workers(readers=readers)
    try:
        with tuned_interpreter():

            def once() -> float:
                start = time.perf_counter()
                for p in files:
                    compress_file(p, p.name, None, engine, workers=workers)  # type: ignore[arg-type]
                return time.perf_counter() - start

            once(), once()  # warm-up
            return [size / once() / 1e9 for _ in range(repeats)]
    finally:
        engine.close()
        workers.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", type=Path, help="a checkpoint file or folder, best in the page cache")
    ap.add_argument("--readers", type=int, nargs="+", default=[8])
    ap.add_argument("--ahead", type=int, nargs="+", default=[1], help="look-ahead, in multiples of the GPU's")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if not _files(args.path):
        raise SystemExit(f"no checkpoint files under {args.path}")
    for readers, ahead in itertools.product(args.readers, args.ahead):
        rates = measure(args.path, readers, ahead, args.repeats)
        print(
            f"null engine, readers {readers} look-ahead x{ahead}: {statistics.median(rates):6.2f} GB/s"
            f"  [{', '.join(f'{r:.2f}' for r in sorted(rates))}]",
            flush=True,
        )


if __name__ == "__main__":
    main()
