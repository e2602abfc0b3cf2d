"""Representative samples of a checkpoint's components, and their entropy bound.

A component's bytes are cut into frames exactly as :func:`ckptz.pipeline.compress_file`
cuts them (per file, per (component, dtype) stream, ``frame_size`` bytes each). A component
no larger than the sample size is taken whole, so a codec's ratio on the sample is the ratio
``compress`` gets; a larger one is represented by evenly spaced frames.
"""

from __future__ import annotations

import bisect
import math
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ckptz.codecs.planes import split
from ckptz.container import StreamInfo
from ckptz.engines.base import stream_dtype
from ckptz.formats import read_layout
from ckptz.pipeline import plan_streams

#: Chunk size of the chunk-local entropy bound: the plane chunk of a 1 MiB fp32 frame.
BOUND_CHUNK = 256 << 10


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame of original bytes and the stream (component, dtype, transform) it belongs to."""

    stream: StreamInfo
    data: np.ndarray


@dataclass(frozen=True, slots=True)
class ComponentSample:
    """The frames that stand for one component.

    Attributes:
        name: component name.
        bytes: the component's bytes in the whole checkpoint.
        total_frames: its frames in the whole checkpoint.
        frames: the sampled frames (all of them if the component is small).
    """

    name: str
    bytes: int
    total_frames: int
    frames: tuple[Frame, ...]

    @property
    def sample_bytes(self) -> int:
        return sum(f.data.size for f in self.frames)

    @property
    def whole(self) -> bool:
        return len(self.frames) == self.total_frames


@dataclass(frozen=True, slots=True)
class _StreamRef:
    path: Path
    stream: StreamInfo
    starts: tuple[int, ...]  # stream offset where each of its segments starts
    offsets: tuple[int, ...]  # file offset of each of its segments
    lengths: tuple[int, ...]


def _stream_refs(path: Path, relpath: str) -> list[_StreamRef]:
    layout = read_layout(path, relpath)
    plan = plan_streams(layout, source=path)
    parts: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for seg, sid in zip(layout.segments, plan.segment_streams, strict=True):
        parts[sid].append((seg.offset, seg.length))
    refs = []
    for stream in plan.streams:
        offsets = tuple(o for o, _ in parts[stream.id])
        lengths = tuple(n for _, n in parts[stream.id])
        starts = tuple(sum(lengths[:i]) for i in range(len(lengths)))
        refs.append(_StreamRef(path, stream, starts, offsets, lengths))
    return refs


def _read(ref: _StreamRef, fd: int, begin: int, end: int) -> np.ndarray:
    """Bytes ``[begin, end)`` of a stream, gathered from its segments in the file."""
    out = np.empty(end - begin, np.uint8)
    at = bisect.bisect_right(ref.starts, begin) - 1
    pos = begin
    while pos < end:
        seg_start, seg_len = ref.starts[at], ref.lengths[at]
        take = min(end, seg_start + seg_len) - pos
        got = os.pread(fd, take, ref.offsets[at] + pos - seg_start)
        if len(got) != take:
            raise OSError(f"{ref.path}: file changed while being sampled")
        out[pos - begin : pos - begin + take] = np.frombuffer(got, np.uint8)
        pos += take
        at += 1
    return out


def sample_components(files: list[tuple[Path, str]], sample_bytes: int) -> list[ComponentSample]:
    """Sample each component of ``files`` ((path, relative path) pairs) up to ``sample_bytes``.

    Frames are picked evenly spaced over the component's frames in file order; a component
    of at most ``sample_bytes`` bytes is taken whole.
    """
    frames: dict[str, list[tuple[_StreamRef, int]]] = defaultdict(list)
    sizes: dict[str, int] = defaultdict(int)
    for path, rel in files:
        for ref in _stream_refs(path, rel):
            s = ref.stream
            sizes[s.component] += s.length
            frames[s.component].extend((ref, k) for k in range(math.ceil(s.length / s.frame_size)))
    out = []
    fds: dict[Path, int] = {}
    try:
        for name, all_frames in frames.items():
            if sizes[name] <= sample_bytes:
                picked = all_frames
            else:
                frame = max(r.stream.frame_size for r, _ in all_frames)
                k = min(len(all_frames), max(1, sample_bytes // frame))
                picked = [all_frames[(2 * i + 1) * len(all_frames) // (2 * k)] for i in range(k)]
            sampled = []
            for ref, k in picked:
                fd = fds.get(ref.path)
                if fd is None:
                    fd = fds[ref.path] = os.open(ref.path, os.O_RDONLY)
                begin = k * ref.stream.frame_size
                sampled.append(
                    Frame(
                        ref.stream,
                        _read(ref, fd, begin, min(begin + ref.stream.frame_size, ref.stream.length)),
                    )
                )
            out.append(ComponentSample(name, sizes[name], len(all_frames), tuple(sampled)))
    finally:
        for fd in fds.values():
            os.close(fd)
    return out


def _bits(counts: np.ndarray) -> float:
    """Order-0 code length in bits of data with these byte counts: n·log2 n − Σ c·log2 c."""
    c = counts[counts > 0].astype(np.float64)
    n = c.sum()
    return float(n * math.log2(n) - (c * np.log2(c)).sum()) if n else 0.0


@dataclass(frozen=True, slots=True)
class EntropyBound:
    """Order-0 entropy bounds of a sample's transformed byte planes, as ratios.

    Attributes:
        global_ratio: bytes / Σ over (dtype, plane) of the plane's Shannon entropy over the
            whole sample (one histogram per plane).
        chunk_ratio: the same with one histogram per 256 KiB of each plane (chunk-adaptive).
    """

    global_ratio: float
    chunk_ratio: float


def entropy_bound(frames: tuple[Frame, ...]) -> EntropyBound:
    """The order-0 bounds of ``frames`` after ckptz's byte-plane transform.

    Neither is a hard limit: runs and repeats (which zstd and constant chunks exploit) and
    context between bytes can go below an order-0 bound; it is the bar for per-byte coders.
    """
    hists: dict[tuple[str, int], np.ndarray] = {}
    chunk_bits = 0.0
    total = 0
    for f in frames:
        total += f.data.size
        for i, plane in enumerate(split(f.data, stream_dtype(f.stream))):
            key = (f.stream.dtype, i)
            acc = hists.setdefault(key, np.zeros(256, np.int64))
            for at in range(0, plane.size, BOUND_CHUNK):
                counts = np.bincount(plane[at : at + BOUND_CHUNK], minlength=256)
                acc += counts
                chunk_bits += _bits(counts)
    global_bits = sum(_bits(h) for h in hists.values())
    return EntropyBound(_ratio(total, global_bits), _ratio(total, chunk_bits))


def _ratio(nbytes: int, bits: float) -> float:
    return nbytes * 8 / bits if bits else float("inf")
