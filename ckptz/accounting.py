"""Per-component accounting: what each component of a checkpoint costs and saves.

Every byte of a container is charged somewhere: chunk payloads to their stream's component,
and the container's own overhead (header, alignment, index, footer) to
:attr:`FileStats.overhead_bytes`, reported on a line of its own, so component totals plus
overhead equal the files' sizes on disk. (Charging the index to ``metadata`` made that
component look as if it grew.)
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import numpy.ma  # np.unique's lazy import of it can recurse when threads race it: import once

from ckptz.codecs import PORTABLE, codec_name
from ckptz.components import COMPONENTS
from ckptz.container import Index
from ckptz.formats.layout import FileLayout


@dataclass(frozen=True, slots=True)
class ComponentStats:
    """One component's bytes, in one file or summed over many.

    Attributes:
        name: component name (``weights``, ``optimizer.exp_avg``, ...).
        tensors: number of tensor storages charged to it.
        bytes: original bytes.
        compressed_bytes: bytes in containers, or None for a raw checkpoint.
        dtypes: original bytes per dtype.
        codecs: compressed bytes per codec name.
        delta_bytes: original bytes coded as their XOR with a newer checkpoint's (a series
            delta, ``compress --series``); 0 in a self-contained container or a raw file.
    """

    name: str
    tensors: int
    bytes: int
    compressed_bytes: int | None
    dtypes: dict[str, int] = field(default_factory=dict)
    codecs: dict[str, int] = field(default_factory=dict)
    delta_bytes: int = 0

    @property
    def ratio(self) -> float | None:
        if self.compressed_bytes is None:
            return None
        return self.bytes / self.compressed_bytes if self.compressed_bytes else float("inf")


@dataclass(frozen=True, slots=True)
class FileStats:
    """One checkpoint file (raw) or container (compressed).

    Attributes:
        path: path relative to the inspected root, of the *original* file.
        format: source format (``torch-zip``, ``safetensors``, ...).
        bytes: original size.
        compressed_bytes: container size, or None for a raw file.
        components: per-component stats, in report order.
        device: where the container was written (``cpu``, ``cuda:0``), None for raw files.
        portable: True if every chunk decodes on a CPU-only machine.
        overhead_bytes: the container's own bytes (header, index, footer, alignment).
        reference: for a series delta, the container it is coded against, as its header
            names it (relative to the container's folder); None otherwise.
        keyframe: a series member coded self-contained on purpose (``--keyframe-every``,
            ``detach``).
        error: why a container in an inspected folder could not be read (it is damaged);
            None for every file that was read.
    """

    path: str
    format: str
    bytes: int
    compressed_bytes: int | None
    components: tuple[ComponentStats, ...]
    device: str | None = None
    portable: bool = True
    overhead_bytes: int = 0
    reference: str | None = None
    keyframe: bool = False
    error: str | None = None

    @property
    def ratio(self) -> float | None:
        if self.compressed_bytes is None:
            return None
        return self.bytes / self.compressed_bytes if self.compressed_bytes else float("inf")

    @property
    def codecs(self) -> dict[str, int]:
        return merge_counts(c.codecs for c in self.components)


def merge_counts(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for c in counts:
        total.update(c)
    return dict(total)


def _ordered(names: Iterable[str]) -> list[str]:
    rank = {n: i for i, n in enumerate(COMPONENTS)}
    return sorted(set(names), key=lambda n: (rank.get(n, len(rank)), n))


def layout_stats(path: str, layout: FileLayout) -> FileStats:
    """Stats of a raw checkpoint file from its segments."""
    tensors: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    dtypes: dict[str, Counter[str]] = defaultdict(Counter)
    for seg in layout.segments:
        sizes[seg.component] += seg.length
        tensors[seg.component] += seg.kind == "tensor"
        dtypes[seg.component][seg.dtype if seg.kind == "tensor" else "bytes"] += seg.length
    comps = tuple(ComponentStats(n, tensors[n], sizes[n], None, dict(dtypes[n])) for n in _ordered(sizes))
    return FileStats(path, layout.format, layout.size, None, comps)


def index_stats(path: str, index: Index, container_size: int) -> FileStats:
    """Stats of a container from its index alone (nothing is decoded)."""
    frames, chunks = index.frames, index.chunks
    chunk_stream = (
        np.repeat(frames["stream"], frames["chunks"].astype(np.int64)) if len(frames) else frames["stream"]
    )
    sizes: Counter[str] = Counter()
    packed: Counter[str] = Counter()
    tensors: Counter[str] = Counter()
    dtypes: dict[str, Counter[str]] = defaultdict(Counter)
    codecs: dict[str, Counter[str]] = defaultdict(Counter)
    for s in index.streams:
        sizes[s.component] += s.length
        tensors[s.component] += s.tensors
        dtypes[s.component][s.dtype if s.tensors else "bytes"] += s.length
        mine = chunks[chunk_stream == s.id]
        for cid in np.unique(mine["codec"]).tolist():
            nbytes = int(mine["size"][mine["codec"] == cid].sum())
            codecs[s.component][codec_name(cid)] += nbytes
            packed[s.component] += nbytes
    overhead = container_size - int(chunks["size"].sum()) if len(chunks) else container_size
    reference, delta = _delta_bytes(index)
    comps = tuple(
        ComponentStats(n, tensors[n], sizes[n], packed[n], dict(dtypes[n]), dict(codecs[n]), delta[n])
        for n in _ordered(sizes)
    )
    series = index.header.get("series")
    portable = all(int(c) in PORTABLE for c in np.unique(chunks["codec"]).tolist())
    return FileStats(
        path,
        str(index.header["source"].get("format", "?")),
        index.source_size,
        container_size,
        comps,
        device=str(index.header.get("device", "?")),
        portable=portable,
        overhead_bytes=overhead,
        reference=reference,
        keyframe=isinstance(series, dict) and bool(series.get("keyframe")),
    )


def _delta_bytes(index: Index) -> tuple[str | None, Counter[str]]:
    """A series delta's reference path and its delta-coded bytes per component (FORMAT.md 1.2).

    Read leniently: a malformed ``reference`` counts nothing here; restoring the container
    is what checks it.
    """
    out: Counter[str] = Counter()
    raw = index.header.get("reference")
    if not isinstance(raw, dict):
        return None, out
    lengths = index.segments["length"]
    streams = index.segments["stream"]
    components = {s.id: s.component for s in index.streams}
    try:
        for pair in raw.get("pairs", []):
            i = int(pair[0])
            if 0 <= i < len(lengths):
                out[components.get(int(streams[i]), "?")] += int(lengths[i])
    except (TypeError, ValueError):
        out.clear()
    return str(raw.get("path", "?")), out


def total_components(files: Iterable[FileStats]) -> tuple[ComponentStats, ...]:
    """Sum per-component stats over files (compressed bytes only if every file has them)."""
    acc: dict[str, list[ComponentStats]] = defaultdict(list)
    for f in files:
        for c in f.components:
            acc[c.name].append(c)
    out = []
    for name in _ordered(acc):
        parts = acc[name]
        packed = (
            None
            if any(p.compressed_bytes is None for p in parts)
            else sum(p.compressed_bytes or 0 for p in parts)
        )
        out.append(
            ComponentStats(
                name,
                sum(p.tensors for p in parts),
                sum(p.bytes for p in parts),
                packed,
                merge_counts(p.dtypes for p in parts),
                merge_counts(p.codecs for p in parts),
                sum(p.delta_bytes for p in parts),
            )
        )
    return tuple(out)
