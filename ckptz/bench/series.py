"""``ckptz bench RUN_DIR --series``: what coding a run's checkpoints as series deltas would gain.

For every file that ``compress --series`` would code against the next newer checkpoint's
(every member of a track but its newest; keyframes aside), the file is planned exactly as
that run plans it: the tensors :func:`ckptz.series.delta.choose_pairs` pairs on its sample
get streams of their own, and their frames are coded against the counterpart bytes by the same
:class:`~ckptz.series.delta.XorDelta` that compression uses. Evenly spaced frames of each
component are then coded twice by the CPU engine (``--codec auto``), as they are and through
the delta, and the order-0 bound of their byte planes is computed for both. Nothing is
written, and only the sample is read in full.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np

from ckptz.api import Reporter, SilentReporter
from ckptz.bench.measure import Runner
from ckptz.container import SUFFIX, StreamInfo
from ckptz.digest import TREE, Digest
from ckptz.errors import UsageError
from ckptz.formats import read_layout
from ckptz.formats.layout import FileLayout
from ckptz.pipeline.plan import Frame, frame_map, plan_streams
from ckptz.pipeline.sampling import ComponentSample, EntropyBound, entropy_bound
from ckptz.pipeline.sampling import Frame as SampleFrame
from ckptz.runs.tree import scan
from ckptz.series.delta import XorDelta, delta_for, layout_tensors
from ckptz.series.detect import detect, tracks
from ckptz.series.reference import PlainReference, RefSpec

#: The codec configuration whose ratios are reported (the portable CPU coder).
CODEC = "ckptz-auto"


@dataclass(frozen=True, slots=True)
class SeriesRow:
    """One component of a run, plain and as series deltas.

    Attributes:
        component: component name.
        bytes: its bytes in every checkpoint of the run.
        delta_bytes: its bytes in the files coded against a newer checkpoint.
        paired_bytes: of those, the bytes of tensors paired with their counterpart (delta-coded).
        sample_bytes: bytes of the sample coded.
        plain_ratio: the codec's ratio on the sample as it is.
        series_ratio: the codec's ratio on the sample through the delta.
        plain_bound: order-0 bound of the sample's byte planes (one histogram per plane).
        series_bound: the same through the delta.
        plain_chunk_bound: the bound with one histogram per 256 KiB of each plane.
        series_chunk_bound: the same through the delta.
    """

    component: str
    bytes: int
    delta_bytes: int
    paired_bytes: int
    sample_bytes: int
    plain_ratio: float
    series_ratio: float
    plain_bound: float
    series_bound: float
    plain_chunk_bound: float
    series_chunk_bound: float

    @property
    def gain(self) -> float:
        """How much smaller the delta codes than plain (series ratio / plain ratio)."""
        return self.series_ratio / self.plain_ratio if self.plain_ratio else float("inf")


@dataclass(frozen=True, slots=True)
class SeriesBenchResult:
    """What ``bench --series`` estimated for a run folder.

    Attributes:
        root: the run folder.
        checkpoints: its checkpoints, oldest first.
        tracks: files per checkpoint (paths within a checkpoint) followed across the run.
        deltas: files that would be coded against a newer checkpoint.
        bytes: all checkpoint files' bytes.
        rows: per component.
        codec: the configuration that coded the samples.
        threads: CPU threads.
        seconds: wall time.
    """

    root: str
    checkpoints: tuple[str, ...]
    tracks: int
    deltas: int
    bytes: int
    rows: tuple[SeriesRow, ...]
    codec: str
    threads: int
    seconds: float

    def _packed(self, series: bool) -> tuple[int, float]:
        total = 0.0
        for r in self.rows:
            rest = r.bytes - r.delta_bytes if series else r.bytes
            total += rest / r.plain_ratio
            if series:
                total += r.delta_bytes / r.series_ratio
        return sum(r.bytes for r in self.rows), total

    @property
    def plain_ratio(self) -> float:
        """The run's estimated ratio with each checkpoint compressed alone."""
        nbytes, packed = self._packed(False)
        return nbytes / packed if packed else float("inf")

    @property
    def series_ratio(self) -> float:
        """The run's estimated ratio with ``--series`` (newest files plain, the rest deltas;
        components that only the newest files hold left out)."""
        nbytes, packed = self._packed(True)
        return nbytes / packed if packed else float("inf")


@dataclass(slots=True)
class _Pair:
    """A file to code against its counterpart in the next newer checkpoint."""

    path: Path
    layout: FileLayout
    delta: XorDelta | None
    frames: list[Frame]
    streams: list[str]  # component of each stream
    infos: list[StreamInfo]


def _open_pair(old: Path, rel: str, new: Path, new_rel: str) -> _Pair:
    layout = read_layout(old, rel)
    new_layout = read_layout(new, new_rel)
    ref = PlainReference(new)
    spec = RefSpec(new.name + SUFFIX, new_layout.size, Digest(TREE, ""))  # only read through, never written
    delta = delta_for(layout, old, spec, ref, layout_tensors(new_layout))
    plan = plan_streams(layout, source=old, apart=delta.apart if delta else frozenset())
    segments = [(sid, s.length) for s, sid in zip(layout.segments, plan.segment_streams, strict=True)]
    frames = frame_map(segments, [s.frame_size for s in plan.streams])
    return _Pair(old, layout, delta, frames, [s.component for s in plan.streams], list(plan.streams))


def _run_files(root: Path) -> tuple[list[str], list[list[tuple[Path, str]]]]:
    """The run's checkpoints and, per track, its plain files (path, run-relative) oldest first."""
    tree = scan(root)
    if not tree.is_dir:
        raise UsageError("bench --series measures a run folder (checkpoint-N/, step_N, ...)", path=str(root))
    checkpoints = detect(tree)
    out = []
    for members in tracks(tree, checkpoints).values():
        if any(m.entry.kind == "container" for m in members):
            raise UsageError("bench measures raw checkpoints, not .ckptz containers", path=str(root))
        out.append([(m.entry.path, m.plain_rel) for m in members])
    return [c.name for c in checkpoints], out


def _pick(n: int, k: int) -> list[int]:
    """``k`` evenly spaced indices of ``n`` (all of them when ``k >= n``)."""
    if k >= n:
        return list(range(n))
    return [(2 * i + 1) * n // (2 * k) for i in range(k)]


def bench_series(
    path: str | Path,
    *,
    sample_bytes: int = 256 << 20,
    threads: int | None = None,
    reporter: Reporter | None = None,
) -> SeriesBenchResult:
    """Estimate, per component, the plain and the series-delta ratio of a run folder's checkpoints.

    Args:
        path: a run folder of raw checkpoints named by step (``checkpoint-N/``, ``step_N.pt``, ...).
        sample_bytes: bytes sampled per component (of the files that would be deltas).
        threads: CPU threads for the codec (default: all cores).
        reporter: receives progress.

    Raises:
        UsageError: not a run folder, fewer than two checkpoints, or containers in it.
    """
    start = time.perf_counter()
    reporter = reporter or SilentReporter()
    threads = max(1, threads or os.cpu_count() or 1)
    root = Path(path)
    names, files = _run_files(root)
    if len(names) < 2:
        raise UsageError("a series needs at least two checkpoints", path=str(root))
    sizes: dict[str, int] = defaultdict(int)
    delta_sizes: dict[str, int] = defaultdict(int)
    paired: dict[str, int] = defaultdict(int)
    pairs: list[_Pair] = []
    try:
        for members in files:
            for (old, rel), (new, new_rel) in pairwise(members):
                p = _open_pair(old, rel, new, new_rel)
                pairs.append(p)
                apart = p.delta.apart if p.delta else frozenset()
                for i, seg in enumerate(p.layout.segments):
                    delta_sizes[seg.component] += seg.length
                    paired[seg.component] += seg.length if i in apart else 0
            for seg in read_layout(*members[-1]).segments:
                sizes[seg.component] += seg.length
        for c, n in delta_sizes.items():
            sizes[c] += n
        candidates: dict[str, list[tuple[_Pair, Frame]]] = defaultdict(list)
        for p in pairs:
            for f in p.frames:
                candidates[p.streams[f.stream]].append((p, f))
        reporter.start(2 * sum(min(delta_sizes[c], sample_bytes) for c in candidates), "bench --series")
        rows = []
        with Runner(CODEC, None, threads, 1) as runner:
            for comp in sorted(candidates, key=lambda c: -delta_sizes[c]):
                found = candidates[comp]
                frame = max(f.length for _, f in found)
                k = len(found) if delta_sizes[comp] <= sample_bytes else max(1, sample_bytes // frame)
                plain, xor = _sample([found[i] for i in _pick(len(found), k)])
                rows.append(_row(comp, sizes[comp], delta_sizes[comp], paired[comp], plain, xor, runner))
                reporter.advance(2 * sum(f.data.size for f in plain))
    finally:
        for p in pairs:
            if p.delta is not None:
                p.delta.close()
    ordered = sorted(rows, key=lambda r: -r.bytes)
    return SeriesBenchResult(
        str(root),
        tuple(names),
        len(files),
        len(pairs),
        sum(sizes.values()),
        tuple(ordered),
        CODEC,
        threads,
        time.perf_counter() - start,
    )


def _sample(picked: Sequence[tuple[_Pair, Frame]]) -> tuple[list[SampleFrame], list[SampleFrame]]:
    """The picked frames' bytes as they are, and through their file's delta."""
    plain, xor = [], []
    fds: dict[Path, int] = {}
    try:
        for p, f in picked:
            fd = fds.get(p.path)
            if fd is None:
                fd = fds[p.path] = os.open(p.path, os.O_RDONLY)
            data = np.empty(f.length, np.uint8)
            for at, within, n in f.pieces:
                got = os.pread(fd, n, at)
                if len(got) != n:
                    raise OSError(f"{p.path}: file changed while being sampled")
                data[within : within + n] = np.frombuffer(got, np.uint8)
            info = p.infos[f.stream]
            plain.append(SampleFrame(info, data))
            xor.append(SampleFrame(info, p.delta.forward(f, data) if p.delta else data))
    finally:
        for fd in fds.values():
            os.close(fd)
    return plain, xor


def _row(
    comp: str,
    nbytes: int,
    delta_bytes: int,
    paired: int,
    plain: list[SampleFrame],
    xor: list[SampleFrame],
    runner: Runner,
) -> SeriesRow:
    n = sum(f.data.size for f in plain)

    def coded(frames: list[SampleFrame]) -> tuple[float, EntropyBound]:
        m = runner(ComponentSample(comp, n, len(frames), tuple(frames)))
        return (n / m.compressed_bytes if m.compressed_bytes else float("inf")), entropy_bound(tuple(frames))

    p_ratio, p_bound = coded(plain)
    x_ratio, x_bound = coded(xor)
    return SeriesRow(
        comp,
        nbytes,
        delta_bytes,
        paired,
        n,
        p_ratio,
        x_ratio,
        p_bound.global_ratio,
        x_bound.global_ratio,
        p_bound.chunk_ratio,
        x_bound.chunk_ratio,
    )


__all__ = ["SeriesBenchResult", "SeriesRow", "bench_series"]
