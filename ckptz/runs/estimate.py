"""What ``compress --dry-run`` expects to save: each component coded on a sample.

Each component's frames are sampled as ``ckptz bench`` samples them
(:func:`ckptz.pipeline.sampling.sample_components`: whole if small, evenly spaced frames if large),
coded once by the engine that would run, and the component's ratio on its sample scales its
bytes in every file. Container overhead is not estimated (it is a few KB per file).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ckptz.accounting import ComponentStats, FileStats, layout_stats
from ckptz.container import checksum
from ckptz.engines.base import Engine, run_all
from ckptz.formats import read_layout
from ckptz.pipeline.sampling import sample_components


def estimate(files: list[tuple[Path, str]], engine: Engine, sample_bytes: int) -> list[FileStats]:
    """Per file, its components with ``compressed_bytes`` estimated from a coded sample."""
    if not files:
        return []
    ratios: dict[str, float] = {}
    for sample in sample_components(files, sample_bytes):
        coded = run_all(
            engine, [partial(engine.encode, f.stream, f.data, checksum(f.data)) for f in sample.frames]
        )
        packed = sum(len(c.payload) for frame in coded for c in frame.chunks)
        ratios[sample.name] = sample.sample_bytes / packed if packed else 1.0
    out = []
    for path, label in files:
        raw = layout_stats(label, read_layout(path, label))
        comps = tuple(
            ComponentStats(c.name, c.tensors, c.bytes, round(c.bytes / ratios.get(c.name, 1.0)), c.dtypes, {})
            for c in raw.components
        )
        packed = sum(c.compressed_bytes or 0 for c in comps)
        out.append(FileStats(label, raw.format, raw.bytes, packed, comps, device=engine.device))
    return out
