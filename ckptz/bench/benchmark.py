"""``ckptz bench``: every codec configuration on a sample of each component, and what it saves.

Each configuration codes each component's sample once to measure the ratio and check that
the round trip is byte-exact (this pass is also the warm-up), then ``repeats`` more times
to time compression and decompression (the median is reported). Speeds are of original
bytes held in host memory: storage is measured apart and combined in :mod:`ckptz.bench.savings`.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ckptz.api import Reporter, SilentReporter
from ckptz.bench.context import context_bound
from ckptz.bench.measure import Runner, raw_nvcomp_available
from ckptz.bench.savings import (
    CodecPlan,
    CodecTotals,
    CostModel,
    Recommendation,
    StorageSpeed,
    plan_codec,
    recommend,
)
from ckptz.container import SUFFIX
from ckptz.engines import gpu_unavailable_reason, requested_device
from ckptz.errors import InputNotFoundError, UsageError
from ckptz.formats import is_checkpoint
from ckptz.pipeline.sampling import ComponentSample, entropy_bound, sample_components
from ckptz.safeio import is_temp

#: Sample per component by default: large enough to cover many tensors, quick on a CPU.
DEFAULT_SAMPLE = 256 << 20

#: Every configuration: name → (ckptz can write it, device kind, description).
CONFIGS: dict[str, tuple[bool, str, str]] = {
    "ckptz-auto": (True, "cpu", "ckptz pipeline, --codec auto"),
    "ckptz-zstd": (True, "cpu", "ckptz pipeline, --codec zstd"),
    "ckptz-zstd-gpu": (True, "cuda", "ckptz pipeline on the GPU, --codec zstd (restored on the CPU threads)"),
    "ckptz-ans-gpu": (True, "cuda", "ckptz pipeline on the GPU, --codec ans"),
    "zstd-raw": (False, "cpu", "zstd -3 on the raw bytes, all threads (like zstd -T0 -3)"),
    "nvcomp-zstd-raw": (False, "cuda", "nvCOMP Zstd on the raw bytes (the blog's recipe)"),
    "nvcomp-ans-raw": (False, "cuda", "nvCOMP ANS on the raw bytes (the blog's recipe)"),
}


@dataclass(frozen=True, slots=True)
class BenchRow:
    """One configuration on one component's sample.

    Attributes:
        component: component name.
        codec: configuration name (see :data:`CONFIGS`).
        device: where it ran.
        bytes: sample bytes coded.
        compressed_bytes: their coded size (payloads only, as ``inspect`` counts them).
        compress_gbps: median compression speed, GB/s of original bytes.
        decompress_gbps: median decompression speed.
        portable: True if the output decodes on a CPU-only machine.
        bound_ratio: the component's global order-0 bound of its byte planes.
        chunk_bound_ratio: the same with per-256 KiB chunk histograms.
        context_bound_ratio: the same with float exponents counted given the preceding
            exponent (:func:`ckptz.bench.context.context_bound`).
    """

    component: str
    codec: str
    device: str
    bytes: int
    compressed_bytes: int
    compress_gbps: float
    decompress_gbps: float
    portable: bool
    bound_ratio: float
    chunk_bound_ratio: float
    context_bound_ratio: float

    @property
    def ratio(self) -> float:
        return self.bytes / self.compressed_bytes if self.compressed_bytes else float("inf")


@dataclass(frozen=True, slots=True)
class SampleInfo:
    """How a component was sampled."""

    component: str
    bytes: int
    sample_bytes: int
    frames: int
    sampled_frames: int


@dataclass(frozen=True, slots=True)
class BenchResult:
    """Everything ``ckptz bench`` measured and concluded.

    Attributes:
        root: the path benchmarked.
        files: checkpoint files (relative paths).
        bytes: their total size.
        samples: per component, how it was sampled.
        rows: per component × configuration.
        skipped: configurations not run, with why.
        storage: the storage bandwidth used for the plans.
        plans: per configuration, checkpoint write/restore times and savings.
        recommendation: the configuration to use, or why none.
        cost: the projection's assumptions.
        threads: CPU threads.
        repeats: timed repetitions per measurement.
        seconds: wall time of the benchmark.
    """

    root: str
    files: tuple[str, ...]
    bytes: int
    samples: tuple[SampleInfo, ...]
    rows: tuple[BenchRow, ...]
    skipped: tuple[tuple[str, str], ...]
    storage: StorageSpeed
    plans: tuple[CodecPlan, ...]
    recommendation: Recommendation
    cost: CostModel
    threads: int
    repeats: int
    seconds: float


def _checkpoint_files(src: Path) -> list[tuple[Path, str]]:
    if not src.exists():
        raise InputNotFoundError("no such file or folder", path=str(src))
    if src.is_file():
        paths = [src]
    else:
        paths = sorted(p for p in src.rglob("*") if p.is_file() and not p.is_symlink() and is_checkpoint(p))
    if any(p.name.endswith(SUFFIX) for p in paths):
        raise UsageError("bench measures raw checkpoints, not .ckptz containers", path=str(src))
    files = [(p, p.name if p == src else p.relative_to(src).as_posix()) for p in paths if not is_temp(p)]
    if not files:
        raise UsageError("no checkpoint files found", path=str(src))
    return files


def _choose(
    codecs: list[str] | None, device: str | None
) -> tuple[list[str], list[tuple[str, str]], str | None]:
    """Configurations to run, those skipped with why, and the GPU device (if any)."""
    names = codecs or list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise UsageError(
            f"unknown codec configuration {unknown[0]!r}", hint="choose from " + ", ".join(CONFIGS)
        )
    want = requested_device(device)
    gpu: str | None = None
    skipped: list[tuple[str, str]] = []
    reason = "--device cpu" if want == "cpu" else gpu_unavailable_reason()
    if reason is None:
        gpu = "cuda:0" if want in ("auto", "cuda") else want
    elif want.startswith("cuda"):
        from ckptz.errors import DeviceError

        raise DeviceError(f"cannot use {want}: {reason}", hint="use --device cpu")
    run = []
    for name in names:
        kind = CONFIGS[name][1]
        if kind == "cuda" and gpu is None:
            skipped.append((name, f"no GPU: {reason}"))
        elif name.startswith("nvcomp-") and not raw_nvcomp_available():
            skipped.append((name, "ckptz.engines.gpu exposes no raw nvCOMP helper (raw_codec) yet"))
        else:
            run.append(name)
    return run, skipped, gpu


def bench(
    path: str | Path,
    *,
    device: str | None = None,
    codecs: list[str] | None = None,
    sample_bytes: int = DEFAULT_SAMPLE,
    storage_dir: str | Path | None = None,
    storage_gbps: float | None = None,
    threads: int | None = None,
    repeats: int = 3,
    cost: CostModel | None = None,
    reporter: Reporter | None = None,
) -> BenchResult:
    """Benchmark every available codec configuration on the checkpoint at ``path``.

    Args:
        path: a checkpoint file or folder (raw, not compressed).
        device: ``auto`` (CPU, plus the GPU if usable), ``cpu``, ``cuda`` or ``cuda:N``.
        codecs: configuration names to run (default: all of :data:`CONFIGS` that can run).
        sample_bytes: bytes sampled per component; smaller components are taken whole.
        storage_dir: a folder on the checkpoint storage, to measure its bandwidth.
        storage_gbps: the storage bandwidth (read and write), instead of measuring it.
        threads: CPU threads (default: all cores).
        repeats: timed repetitions per measurement, after a verified warm-up (at least 3).
        cost: the projection's assumptions.
        reporter: receives progress (any :class:`ckptz.api.Reporter`).

    Raises:
        UsageError: bad arguments (both or neither storage option, unknown codec, too few repeats).
        DeviceError: a GPU was asked for and cannot be used.
        MismatchError: a round trip was not byte-exact (a bug: please report it).
    """
    from ckptz.bench.storage import measure_storage

    start = time.perf_counter()
    if (storage_dir is None) == (storage_gbps is None):
        raise UsageError("give exactly one of --storage DIR and --storage-gbps X")
    if storage_gbps is not None and not 0 < storage_gbps < math.inf:  # nan fails both
        raise UsageError("--storage-gbps must be a positive number", hint=f"not {storage_gbps}")
    cost = cost or CostModel()
    for flag, figure in (
        ("--gpu-hour-usd", cost.gpu_hour_usd),
        ("--every-min", cost.every_min),
        ("--storage-usd-tb-month", cost.storage_usd_tb_month),
    ):
        if not math.isfinite(figure):
            raise UsageError(f"{flag} must be a finite number", hint=f"not {figure}")
    if repeats < 3:
        raise UsageError("repeats must be at least 3 (the median of fewer is noise)")
    reporter = reporter or SilentReporter()
    threads = max(1, threads or os.cpu_count() or 1)
    src = Path(path)
    files = _checkpoint_files(src)
    run, skipped, gpu = _choose(codecs, device)
    samples = sample_components(files, sample_bytes)
    if not samples:
        raise UsageError("nothing to measure: the checkpoint is empty", path=str(src))
    bounds = {s.name: entropy_bound(s.frames) for s in samples}
    contexts = {s.name: context_bound(s.frames) for s in samples}
    rows: list[BenchRow] = []
    reporter.start(sum(s.sample_bytes for s in samples) * len(run), "bench")
    for name in run:
        reporter.file(name)
        with Runner(name, gpu, threads, repeats) as runner:
            for s in samples:
                m = runner(s)
                b = bounds[s.name]
                rows.append(
                    BenchRow(
                        s.name,
                        name,
                        runner.device,
                        s.sample_bytes,
                        m.compressed_bytes,
                        m.compress_gbps,
                        m.decompress_gbps,
                        m.portable,
                        b.global_ratio,
                        b.chunk_ratio,
                        contexts[s.name],
                    )
                )
                reporter.advance(s.sample_bytes)
    if storage_gbps is not None:
        storage = StorageSpeed(storage_gbps, storage_gbps, "given (--storage-gbps), read = write")
    else:
        storage = measure_storage(storage_dir or ".")
    total = sum(s.bytes for s in samples)
    plans = tuple(plan_codec(t, storage, cost) for t in _totals(rows, samples, run))
    return BenchResult(
        str(src),
        tuple(rel for _, rel in files),
        total,
        tuple(SampleInfo(s.name, s.bytes, s.sample_bytes, s.total_frames, len(s.frames)) for s in samples),
        tuple(rows),
        tuple(skipped),
        storage,
        plans,
        recommend(plans, total, storage),
        cost,
        threads,
        repeats,
        time.perf_counter() - start,
    )


def _totals(rows: list[BenchRow], samples: list[ComponentSample], run: list[str]) -> list[CodecTotals]:
    """Extrapolate each configuration from the samples to the whole checkpoint."""
    sizes = {s.name: s.bytes for s in samples}
    out = []
    for name in run:
        mine = [r for r in rows if r.codec == name]
        if len(mine) != len(samples):
            continue
        out.append(
            CodecTotals(
                name,
                mine[0].device,
                CONFIGS[name][0],
                all(r.portable for r in mine),
                sum(sizes.values()),
                sum(sizes[r.component] / r.ratio for r in mine),
                sum(sizes[r.component] / (r.compress_gbps * 1e9) for r in mine),
                sum(sizes[r.component] / (r.decompress_gbps * 1e9) for r in mine),
            )
        )
    return out
