"""Planning a file's streams and frames: which bytes of the file each frame holds.

Compression groups a file's segments into streams (:func:`plan_streams`) and cuts each
stream into frames; restoring reads the same grouping from a container's index. Either way,
:func:`frame_map` says where every frame's bytes lie in the original file, so readers,
coders and writers can work on frames in any order and in parallel.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, cast

import numpy as np

from ckptz import safeio
from ckptz.container import StreamInfo
from ckptz.dtypes import DType, lookup
from ckptz.engines.base import FRAME_SIZE
from ckptz.formats.layout import FileLayout, Segment

#: Meta bytes (pickles, zip headers) are few and compress well together: bigger frames.
META_FRAME_SIZE = 4 << 20
#: A tensor stream's frames grow past the engine's ``frame_size`` (up to its
#: ``largest_frame``) only while the stream still has this many of them, so that one file's
#: frames still spread over every thread and random access reads little more than it asks.
MIN_FRAMES = 32


def frame_size_for(length: int, frame_size: int, largest: int) -> int:
    """The frame size of a ``length``-byte tensor stream: ``frame_size``, doubled while
    the stream keeps :data:`MIN_FRAMES` frames and the size stays within ``largest``.

    Every frame costs the pipeline the same Python (futures, checks, calls) whatever its
    size, and its threads share one GIL, so larger frames of large streams code and restore
    faster on many cores at the same ratio.
    """
    size = frame_size
    while size * 2 <= largest and length >= MIN_FRAMES * size * 2:
        size *= 2
    return size


@dataclass(frozen=True, slots=True)
class StreamPlan:
    streams: tuple[StreamInfo, ...]
    segment_streams: tuple[int, ...]


#: Reads ``n`` bytes at an offset of the file being planned.
ReadAt = Callable[[int, int], bytes]


def plan_streams(
    layout: FileLayout,
    frame_size: int = FRAME_SIZE,
    source: Path | int | ReadAt | None = None,
    apart: frozenset[int] = frozenset(),
    largest_frame: int = 0,
) -> StreamPlan:
    """Group segments into streams of one (component, dtype), numbered by first appearance.

    Tensor streams are cut into ``frame_size`` frames, larger ones in a large stream up to
    ``largest_frame`` (:func:`frame_size_for`; the container records each stream's, so any
    reader decodes any size). Given the ``source`` file (its path, an open descriptor, or a
    function that reads it: the bytes may not be in ``layout``'s file,
    :mod:`ckptz.library.torch_image`), float tensors are also sorted by :func:`value_class`
    of a small sample, so that fp32 tensors holding bf16 values do not share frames with
    true fp32 ones: a few KB of full mantissas in a frame cost its low planes their
    constant and bit-packed codes. Segments whose index is in ``apart`` (those a series delta codes as
    an XOR, :mod:`ckptz.series`) get streams of their own.
    """
    types = [_dtype(seg) for seg in layout.segments]
    with open(source, "rb", buffering=0) if isinstance(source, Path) else nullcontext() as f:
        if f is not None:
            classes = _classes(layout.segments, types, _read_many(f.fileno()))
        elif isinstance(source, int):
            classes = _classes(layout.segments, types, _read_many(source))
        elif source is not None:
            read = cast(ReadAt, source)
            classes = _classes(layout.segments, types, lambda spans: [read(at, n) for at, n in spans])
        else:
            classes = [0] * len(types)
    keys, lengths, tensors, seg_streams = _number(
        layout.segments,
        [
            (seg.component, dt.name, dt.word, dt.is_float, cls, i in apart)
            for i, (seg, dt, cls) in enumerate(zip(layout.segments, types, classes, strict=True))
        ],
    )
    streams = []
    for sid, (component, dtype, word, rotate, _, _) in enumerate(keys):
        if word == 1 and component in ("metadata", "other"):
            frame = META_FRAME_SIZE
        else:
            frame = frame_size_for(lengths[sid], frame_size, largest_frame)
        streams.append(StreamInfo(sid, component, dtype, word, rotate, frame, lengths[sid], tensors[sid]))
    return StreamPlan(tuple(streams), tuple(seg_streams))


K = TypeVar("K", bound=Hashable)


def _number(
    segments: Sequence[Segment], keys: Sequence[K]
) -> tuple[list[K], list[int], list[int], list[int]]:
    """Streams numbered by the first appearance of their segments' ``keys``: each stream's
    key, bytes and tensors, and each segment's stream."""
    ids: dict[K, int] = {}
    firsts: list[K] = []
    lengths: list[int] = []
    tensors: list[int] = []
    seg_streams: list[int] = []
    for seg, key in zip(segments, keys, strict=True):
        sid = ids.setdefault(key, len(firsts))
        if sid == len(firsts):
            firsts.append(key)
            lengths.append(0)
            tensors.append(0)
        lengths[sid] += seg.length
        tensors[sid] += seg.kind == "tensor"
        seg_streams.append(sid)
    return firsts, lengths, tensors, seg_streams


#: Reads many ``(offset, size)`` spans of the file being planned, in one call.
ReadMany = Callable[[Sequence[tuple[int, int]]], list[bytes]]


def _read_many(fd: int) -> ReadMany:
    return lambda spans: safeio.pread_spans(fd, spans)


def _dtype(seg: Segment) -> DType:
    """How a segment's words are coded: its dtype, or bytes where it is not a tensor or its
    length is not a whole number of words."""
    dt = lookup(seg.dtype) if seg.kind == "tensor" else lookup("uint8")
    return lookup("uint8") if seg.length % dt.word else dt


def _classes(segments: Sequence[Segment], types: Sequence[DType], read: ReadMany) -> list[int]:
    """Each segment's :func:`value_class`, judged on samples read all at once, and in a few
    array operations for all the segments of one word size (a large optimizer has
    thousands of float tensors)."""
    spans = [
        [(seg.offset + at, n) for at, n in _sample_spans(seg.length, dt.word)] if _sampled(dt) else []
        for seg, dt in zip(segments, types, strict=True)
    ]
    parts = read([span for mine in spans for span in mine])
    counts = [len(mine) for mine in spans]
    firsts = np.cumsum(counts) - counts
    by_word: dict[int, list[int]] = {}
    for i, (dt, mine) in enumerate(zip(types, spans, strict=True)):
        if mine:
            by_word.setdefault(dt.word, []).append(i)
    classes = [0] * len(segments)
    for word, which in by_word.items():
        # A short read (the file shrank since its layout was read) samples less: the
        # sequential read that follows reports it.
        samples = [
            [p[: len(p) // word * word] for p in parts[firsts[i] : firsts[i] + counts[i]]] for i in which
        ]
        rows = np.array([sum(len(p) for p in mine) // word for mine in samples], np.int64)
        data = np.frombuffer(b"".join(p for mine in samples for p in mine), np.uint8).reshape(-1, word)
        seen = np.zeros((len(which), word), np.uint8)
        some = rows > 0
        if some.any():
            seen[some] = np.bitwise_or.reduceat(data, (np.cumsum(rows) - rows)[some], axis=0)
        # value_class of each: its low bytes zero in every word, at most word - 1
        zero = np.where(seen.any(axis=1), (seen != 0).argmax(axis=1), word)
        for i, c in zip(which, np.minimum(zero, word - 1).tolist(), strict=True):
            classes[i] = c
    return classes


def value_class(data: np.ndarray, word: int) -> int:
    """How many low-order bytes are zero in every ``word``-byte little-endian word of
    ``data`` (a 1-D uint8 array of whole words), at most ``word - 1``.

    2 for fp32 tensors holding bf16 values, 3 for fp64 holding fp32 ones, 0 for trained
    fp32 (a full mantissa leaves its lowest byte zero once in 256 words).
    """
    seen = np.bitwise_or.reduce(data.reshape(-1, word), axis=0) if data.size else np.zeros(word, np.uint8)
    zero = 0
    while zero < word - 1 and not seen[zero]:
        zero += 1
    return zero


#: A float tensor's value class is judged on this many pieces of ``_PIECE`` bytes spread
#: over it (the whole tensor if smaller): a padding row of zeros at its start cannot pass
#: for low-precision values, and a 70B model's checkpoint (~3 K float tensors) needs ~12 K
#: small reads.
_PIECES = 4
_PIECE = 512


def _sample_spans(length: int, word: int) -> list[tuple[int, int]]:
    """(offset, size) of the pieces of a ``length``-byte tensor that :func:`value_class` judges."""
    if length <= _PIECES * _PIECE:
        return [(0, length)]
    step = (length - _PIECE) // (_PIECES - 1)
    return [(i * step // word * word, _PIECE) for i in range(_PIECES)]


def sampled_class(read: Callable[[int, int], bytes], length: int, dt: DType) -> int:
    """The :func:`value_class` of a ``length``-byte tensor of ``dt`` (0 unless it is a
    float of 2+ bytes), judged on a few pieces that ``read(offset, size)`` returns."""
    if not _sampled(dt):
        return 0
    return _class_of([read(at, n) for at, n in _sample_spans(length, dt.word)], dt)


def _sampled(dt: DType) -> bool:
    return dt.is_float and dt.word > 1


def _class_of(parts: Sequence[bytes], dt: DType) -> int:
    # A short read (the file shrank since its layout was read) samples less: the
    # sequential read that follows reports it.
    data = b"".join(p[: len(p) // dt.word * dt.word] for p in parts)
    return value_class(np.frombuffer(data, np.uint8), dt.word)


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame and where its bytes lie in the original file.

    Attributes:
        stream: the stream's id.
        number: the frame's place in its stream (0, 1, ...).
        length: bytes of original data.
        pieces: ``(file offset, offset in the frame, bytes)`` for each run of the frame's
            bytes, in file order; they tile the frame.
    """

    stream: int
    number: int
    length: int
    pieces: tuple[tuple[int, int, int], ...]

    @property
    def start(self) -> int:
        """File offset of the frame's first byte."""
        return self.pieces[0][0]


def frame_map(segments: Sequence[tuple[int, int]], frame_sizes: Sequence[int]) -> list[Frame]:
    """Every frame of a file, ordered by the file offset of its first byte.

    ``segments`` are ``(stream, length)`` in file order and ``frame_sizes`` each stream's
    frame size. This is the order a reader of the file in order first needs each frame, and
    within every stream it is the frames' own order.
    """
    stream_pos = [0] * len(frame_sizes)
    pieces: dict[tuple[int, int], list[tuple[int, int, int]]] = {}  # in order of first byte
    file_pos = 0
    for sid, length in segments:
        size = frame_sizes[sid]
        while length:
            k, within = divmod(stream_pos[sid], size)
            take = min(length, size - within)
            pieces.setdefault((sid, k), []).append((file_pos, within, take))
            stream_pos[sid] += take
            file_pos += take
            length -= take
    return [Frame(sid, k, sum(p[2] for p in runs), tuple(runs)) for (sid, k), runs in pieces.items()]


def frame_runs(frames: Sequence[Frame], limit: int) -> list[range]:
    """``frames`` cut into runs of consecutive frames of at most ``limit`` bytes (a frame
    longer than that is a run of its own; ``limit`` 0: a frame per run)."""
    runs, first, size = [], 0, 0
    for i, frame in enumerate(frames):
        if i > first and size + frame.length > limit:
            runs.append(range(first, i))
            first, size = i, 0
        size += frame.length
    if frames:
        runs.append(range(first, len(frames)))
    return runs
