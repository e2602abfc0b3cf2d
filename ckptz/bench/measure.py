"""Timing one codec configuration on one component's sample, with a verified round trip.

The first pass codes the sample, decodes it and compares byte for byte (it is also the
warm-up); ``repeats`` more passes are timed and the median reported. Speeds are GB/s of
original bytes held in host memory.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import xxhash

from ckptz.codecs import PORTABLE
from ckptz.engines import PORTABLE_CODECS, open_engine
from ckptz.engines.base import Engine, StoredChunk, run_all
from ckptz.errors import MismatchError
from ckptz.pipeline.sampling import ComponentSample


@dataclass(frozen=True, slots=True)
class Measurement:
    """A configuration on one sample: coded size, portability and median speeds (GB/s)."""

    compressed_bytes: int
    portable: bool
    compress_gbps: float
    decompress_gbps: float


class Runner:
    """Runs one configuration over samples, keeping its engine (if any) open between them.

    Args:
        name: a configuration of :data:`ckptz.bench.benchmark.CONFIGS`.
        gpu: the GPU device for GPU configurations.
        threads: CPU threads.
        repeats: timed passes per measurement.
    """

    def __init__(self, name: str, gpu: str | None, threads: int, repeats: int) -> None:
        self.name, self.gpu, self.threads, self.repeats = name, gpu, threads, repeats
        self.engine: Engine | None = None
        self.decoder: Engine | None = None
        self.device = (gpu or "cpu") if name.startswith("nvcomp-") else "cpu"
        if name.startswith("ckptz-"):
            codec = name.removeprefix("ckptz-").removesuffix("-gpu")
            device = (gpu or "cuda") if name.endswith("-gpu") else "cpu"
            # The engines a compression and its restore open: a GPU named writes and decodes
            # the portable bitstream there.
            self.engine, _ = open_engine(device, threads=threads, codec=codec, writes=True)
            self.device = self.engine.device
            if device != "cpu" and codec in PORTABLE_CODECS:
                self.decoder, _ = open_engine(device, threads=threads, codec="auto")

    def __call__(self, sample: ComponentSample) -> Measurement:
        if self.engine is not None:
            return _engine_run(self.engine, sample, self.repeats, self.decoder)
        if self.name == "zstd-raw":
            return _zstd_raw_run(sample, self.threads, self.repeats)
        return _raw_nvcomp_run(self.name, self.gpu or "cuda:0", sample, self.repeats)

    def close(self) -> None:
        for engine in (self.engine, self.decoder):
            if engine is not None:
                engine.close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _median_gbps(nbytes: int, seconds: list[float]) -> float:
    s = statistics.median(seconds)
    return nbytes / s / 1e9 if s > 0 else float("inf")


def _engine_run(
    engine: Engine, sample: ComponentSample, repeats: int, decoder: Engine | None = None
) -> Measurement:
    """Code a sample through an engine, and decode it through ``decoder`` (default: the
    same engine): (compressed bytes, portable, compress GB/s, decompress GB/s)."""
    frames = sample.frames

    def encode() -> list[list[StoredChunk]]:
        coded = run_all(
            engine,
            [partial(engine.encode, f.stream, f.data, xxhash.xxh3_64_intdigest(f.data.data)) for f in frames],
        )
        return [
            [
                StoredChunk(i, c.codec, c.raw_size, c.payload, xxhash.xxh3_64_intdigest(c.payload))
                for c in e.chunks
            ]
            for i, e in enumerate(coded)
        ]

    reader = decoder or engine

    def decode(stored: list[list[StoredChunk]]) -> list[np.ndarray]:
        calls = [
            partial(reader.decode, f.stream, chunks, f.data.size, f"frame {i}")
            for i, (f, chunks) in enumerate(zip(frames, stored, strict=True))
        ]
        return run_all(reader, calls)

    stored = encode()
    for i, (f, out) in enumerate(zip(frames, decode(stored), strict=True)):
        if not np.array_equal(np.asarray(out), f.data):
            raise MismatchError(f"{engine.device} round trip differs in frame {i} of {sample.name}")
    c_times, d_times = [], []
    for _ in range(repeats):
        c_times.append(_timed(encode))
        d_times.append(_timed(lambda: decode(stored)))
    packed = sum(len(c.payload) for chunks in stored for c in chunks)
    portable = all(c.codec in PORTABLE for chunks in stored for c in chunks)
    nbytes = sample.sample_bytes
    return Measurement(packed, portable, _median_gbps(nbytes, c_times), _median_gbps(nbytes, d_times))


def _zstd_raw_run(sample: ComponentSample, threads: int, repeats: int) -> Measurement:
    """Plain zstd -3 on the concatenated raw bytes: multithreaded compression, one-thread decoding."""
    import zstandard

    data = np.concatenate([f.data for f in sample.frames]) if sample.frames else np.empty(0, np.uint8)
    cctx = zstandard.ZstdCompressor(level=3, threads=threads if threads > 1 else 0)
    dctx = zstandard.ZstdDecompressor()
    blob = cctx.compress(data.data)
    if dctx.decompress(blob, max_output_size=data.size) != data.tobytes():
        raise MismatchError(f"zstd round trip differs on {sample.name}")
    c_times = [_timed(lambda: cctx.compress(data.data)) for _ in range(repeats)]
    d_times = [_timed(lambda: dctx.decompress(blob, max_output_size=data.size)) for _ in range(repeats)]
    return Measurement(len(blob), True, _median_gbps(data.size, c_times), _median_gbps(data.size, d_times))


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def raw_nvcomp_available() -> bool:
    try:
        import ckptz.engines.gpu as gpu_module  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return False
    return hasattr(gpu_module, "raw_codec")


def _raw_nvcomp_run(name: str, gpu: str, sample: ComponentSample, repeats: int) -> Measurement:
    """The blog's recipe through ``ckptz.engines.gpu.raw_codec(algorithm, device)``.

    That helper is expected to return an object with ``encode(np.ndarray) -> bytes`` and
    ``decode(bytes, size) -> np.ndarray`` that include the host↔device copies.
    """
    import ckptz.engines.gpu as gpu_module  # type: ignore[import-not-found,unused-ignore]

    algorithm = name.removeprefix("nvcomp-").removesuffix("-raw")
    coder = getattr(gpu_module, "raw_codec")(algorithm, gpu)  # noqa: B009 (not in every build)
    data = np.concatenate([f.data for f in sample.frames]) if sample.frames else np.empty(0, np.uint8)
    blob = coder.encode(data)
    if not np.array_equal(np.asarray(coder.decode(blob, data.size)), data):
        raise MismatchError(f"nvCOMP {algorithm} round trip differs on {sample.name}")
    c_times = [_timed(lambda: coder.encode(data)) for _ in range(repeats)]
    d_times = [_timed(lambda: coder.decode(blob, data.size)) for _ in range(repeats)]
    return Measurement(
        len(blob), algorithm == "zstd", _median_gbps(data.size, c_times), _median_gbps(data.size, d_times)
    )
