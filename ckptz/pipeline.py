"""One file through the codec: source → segments → streams → frames → container, and back.

Compression reads the source once, sequentially, straight into per-stream frame buffers,
hashing as it goes; frames are coded by an engine while reading continues, and written in
submission order. Restoring walks the segment table, decoding frames in the order they are
first needed with a bounded look-ahead, and hashes what it writes. Memory stays bounded by
(streams + frames in flight) × frame size, whatever the file size.
"""

from __future__ import annotations

import bisect
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import xxhash

import ckptz
from ckptz.container import (
    ContainerWriter,
    Index,
    StreamInfo,
    frame_chunk_starts,
    make_tables,
    padded_size,
    read_index,
    stream_frame_lists,
)
from ckptz.dtypes import DType, lookup
from ckptz.engines.base import EncodedFrame, Engine, StoredChunk
from ckptz.errors import CodecError, CorruptionError, FormatError, MismatchError
from ckptz.formats import read_layout
from ckptz.formats.layout import FileLayout, Segment
from ckptz.safeio import background_writes

#: Bytes of original data per frame. Frames are the unit of parallelism and of checksums.
FRAME_SIZE = 1 << 20
#: Meta bytes (pickles, zip headers) are few and compress well together: bigger frames.
META_FRAME_SIZE = 4 << 20
READ_BLOCK = 8 << 20

Progress = Callable[[int], None]


def _no_progress(_: int) -> None:
    pass


@dataclass(frozen=True, slots=True)
class _Plan:
    streams: tuple[StreamInfo, ...]
    segment_streams: tuple[int, ...]


def plan_streams(layout: FileLayout, frame_size: int = FRAME_SIZE, source: Path | None = None) -> _Plan:
    """Group segments into streams of one (component, dtype), numbered by first appearance.

    Tensor streams are cut into ``frame_size`` frames (an engine may prefer larger ones:
    the container records each stream's, so any reader decodes any size). Given the
    ``source`` file, float tensors are also sorted by :func:`value_class` of a small
    sample, so that fp32 tensors holding bf16 values do not share frames with true fp32
    ones: a few KB of full mantissas in a frame cost its low planes their constant and
    bit-packed codes.
    """
    ids: dict[tuple[str, str, int, bool, int], int] = {}
    keys: list[tuple[str, str, int, bool, int]] = []
    lengths: list[int] = []
    tensors: list[int] = []
    seg_streams: list[int] = []
    with open(source, "rb", buffering=0) if source is not None else nullcontext() as f:
        for seg in layout.segments:
            key = _stream_key(seg, f)
            sid = ids.setdefault(key, len(keys))
            if sid == len(keys):
                keys.append(key)
                lengths.append(0)
                tensors.append(0)
            lengths[sid] += seg.length
            tensors[sid] += seg.kind == "tensor"
            seg_streams.append(sid)
    streams = []
    for sid, (component, dtype, word, rotate, _) in enumerate(keys):
        frame = META_FRAME_SIZE if word == 1 and component in ("metadata", "other") else frame_size
        streams.append(StreamInfo(sid, component, dtype, word, rotate, frame, lengths[sid], tensors[sid]))
    return _Plan(tuple(streams), tuple(seg_streams))


def _stream_key(seg: Segment, source: BinaryIO | None) -> tuple[str, str, int, bool, int]:
    dt = lookup(seg.dtype) if seg.kind == "tensor" else lookup("uint8")
    if seg.length % dt.word:
        dt = lookup("uint8")
    cls = 0
    if source is not None:
        fd = source.fileno()
        cls = sampled_class(lambda at, n: os.pread(fd, n, seg.offset + at), seg.length, dt)
    return (seg.component, dt.name, dt.word, dt.is_float, cls)


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
    if not dt.is_float or dt.word == 1:
        return 0
    parts = [read(at, n) for at, n in _sample_spans(length, dt.word)]
    # A short read (the file shrank since its layout was read) samples less: the
    # sequential read that follows reports it.
    data = b"".join(p[: len(p) // dt.word * dt.word] for p in parts)
    return value_class(np.frombuffer(data, np.uint8), dt.word)


@dataclass(frozen=True, slots=True)
class WrittenContainer:
    """What compressing one file produced."""

    layout: FileLayout
    index: Index
    size: int


def compress_file(
    src: Path,
    relpath: str,
    out: BinaryIO,
    engine: Engine,
    *,
    progress: Progress = _no_progress,
    max_in_flight: int | None = None,
) -> WrittenContainer:
    """Compress ``src`` into the open file ``out`` with ``engine``.

    Raises:
        FormatError: the source changed size while being read.
        OSError: reading or writing failed.
    """
    layout = read_layout(src, relpath)
    plan = plan_streams(layout, int(getattr(engine, "frame_size", FRAME_SIZE)), src)
    # Writes run on their own thread: this one reads, hashes and feeds the engine meanwhile.
    with background_writes(out) as background:
        return _compress_into(
            src, relpath, layout, plan, ContainerWriter(background), engine, progress, max_in_flight
        )


def _compress_into(
    src: Path,
    relpath: str,
    layout: FileLayout,
    plan: _Plan,
    writer: ContainerWriter,
    engine: Engine,
    progress: Progress,
    max_in_flight: int | None,
) -> WrittenContainer:
    frames: list[tuple[int, int, int, int]] = []
    chunks: list[tuple[int, int, int, int, int, int]] = []
    in_flight: deque[tuple[int, int, Future[EncodedFrame]]] = deque()
    limit = max_in_flight or look_ahead(engine)
    codecs_used: set[int] = set()

    def drain(keep: int) -> None:
        while len(in_flight) > keep:
            sid, length, fut = in_flight.popleft()
            frame = fut.result()
            for plane, ch in enumerate(frame.chunks):
                offset = writer.add_payload(ch.payload)
                chunks.append((offset, len(ch.payload), ch.raw_size, _checksum(ch.payload), ch.codec, plane))
                codecs_used.add(ch.codec)
            frames.append((sid, len(frame.chunks), length, frame.checksum))

    def submit(stream: StreamInfo, data: np.ndarray) -> None:
        in_flight.append((stream.id, data.size, engine.encode(stream, data)))
        drain(limit)

    buffers: dict[int, tuple[np.ndarray, int]] = {}
    hasher = xxhash.xxh3_128()
    with open(src, "rb", buffering=0) as f:
        for seg, sid in zip(layout.segments, plan.segment_streams, strict=True):
            stream = plan.streams[sid]
            remaining = seg.length
            while remaining:
                buf, fill = buffers.get(sid) or (np.empty(stream.frame_size, np.uint8), 0)
                want = min(remaining, stream.frame_size - fill, READ_BLOCK)
                view = buf.data[fill : fill + want]
                got = _read_exact(f, view)
                if got != want:
                    raise FormatError("file changed or was truncated while being read", path=relpath)
                hasher.update(view)
                progress(got)
                fill += got
                remaining -= got
                if fill == stream.frame_size:
                    submit(stream, buf)
                    buffers.pop(sid, None)
                else:
                    buffers[sid] = (buf, fill)
        if f.read(1):
            raise FormatError("file grew while being read", path=relpath)
    for sid in sorted(buffers):
        buf, fill = buffers[sid]
        submit(plan.streams[sid], buf[:fill])
    drain(0)

    seg_rows = [(sid, seg.length) for seg, sid in zip(layout.segments, plan.segment_streams, strict=True)]
    header = {
        "source": {
            "name": Path(relpath).name,
            "size": layout.size,
            "xxh3_128": hasher.hexdigest(),
            "format": layout.format,
            "notes": list(layout.notes),
        },
        "created_by": f"ckptz {ckptz.__version__}",
        "device": engine.device,
        "codecs": {
            str(c): engine.codec_config().get(_codec_name(c), {"name": _codec_name(c)})
            for c in sorted(codecs_used)
        },
        "tensor_keys": [list(seg.keys) for seg in layout.segments],
    }
    header.update(getattr(engine, "container_extras", dict)())
    index = Index(header, plan.streams, *make_tables(seg_rows, frames, chunks))
    size = writer.finish(index)
    return WrittenContainer(layout, index, size)


def look_ahead(engine: Engine) -> int:
    """Frames to keep in flight: an engine may ask for more (a GPU batches many at once)."""
    return int(getattr(engine, "look_ahead", 4 * engine.threads + 4))


def _codec_name(codec_id: int) -> str:
    from ckptz.codecs import codec_name

    return codec_name(codec_id)


def _checksum(data: bytes) -> int:
    return xxhash.xxh3_64_intdigest(data)


def _read_exact(f: BinaryIO, view: memoryview) -> int:
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])  # type: ignore[attr-defined]
        if not n:
            break
        got += n
    return got


def _need_order(index: Index) -> Iterator[tuple[int, int]]:
    """(stream, frame number) in the order restore first needs each frame."""
    streams = index.streams
    scheduled_end = [0] * len(streams)
    next_frame = [0] * len(streams)
    pos = [0] * len(streams)
    for sid, length in zip(index.segments["stream"].tolist(), index.segments["length"].tolist(), strict=True):
        pos[sid] += length
        while scheduled_end[sid] < pos[sid]:
            yield sid, next_frame[sid]
            scheduled_end[sid] += streams[sid].frame_size
            next_frame[sid] += 1


def restore(
    container: BinaryIO,
    path: str,
    engine: Engine,
    sink: Callable[[memoryview], object],
    *,
    index: Index | None = None,
    progress: Progress = _no_progress,
) -> Index:
    """Decode a container and pass the original file's bytes, in order, to ``sink``.

    Every payload, every frame and the whole file are checked against their checksums.

    Raises:
        ContainerError: the container is unreadable.
        CorruptionError: some bytes fail their checksum (names the chunk and tensor).
        CodecUnavailableError: a chunk's bitstream cannot be decoded here.
    """
    index = index or read_index(container, path)
    fd = container.fileno()
    per_stream = stream_frame_lists(index)
    starts = frame_chunk_starts(index.frames)
    keys = index.header.get("tensor_keys", [])
    limit = look_ahead(engine)
    pending: list[deque[tuple[Future[np.ndarray], int, str | None]]] = [deque() for _ in index.streams]
    order = _need_order(index)
    in_flight = 0
    tensor_at = _frame_tensors(index, keys if isinstance(keys, list) else [])

    def schedule_one() -> bool:
        nonlocal in_flight
        nxt = next(order, None)
        if nxt is None:
            return False
        sid, k = nxt
        rows = per_stream[sid]
        if k >= len(rows):
            raise CorruptionError("a stream has fewer frames than its segments need", path=path)
        row = int(rows[k])
        fr = index.frames[row]
        first = int(starts[row])
        tensor = tensor_at(sid, k)
        stored = []
        for ci in range(first, first + int(fr["chunks"])):
            c = index.chunks[ci]
            size = int(c["size"])
            # The pad after a payload is read with it and must be zero: no byte of the data
            # area is left unchecked (the payload's own checksum covers only the payload).
            padded = os.pread(fd, padded_size(size), int(c["offset"]))
            if len(padded) != padded_size(size):
                raise CorruptionError("container ends inside a chunk (truncated?)", path=path, chunk=ci)
            if padded.count(0, size) != len(padded) - size:
                raise CorruptionError("padding after a chunk is not zero", path=path, chunk=ci, tensor=tensor)
            payload = padded if len(padded) == size else memoryview(padded)[:size]
            stored.append(StoredChunk(ci, int(c["codec"]), int(c["raw_size"]), payload, int(c["checksum"])))
        where = f"frame {row} of stream {sid} ({index.streams[sid].component})"
        future = engine.decode(index.streams[sid], stored, int(fr["length"]), int(fr["checksum"]), where)
        pending[sid].append((future, first, tensor))
        in_flight += 1
        return True

    def result(sid: int) -> np.ndarray:
        future, first, tensor = pending[sid].popleft()
        try:
            return future.result()
        except CorruptionError as exc:
            # Engines know the chunk, not the file or the tensor: add them.
            chunk = first if exc.chunk is None else exc.chunk
            raise CorruptionError(exc.reason, path=path, chunk=chunk, tensor=exc.tensor or tensor) from None
        except CodecError as exc:
            if exc.path is not None:
                raise
            raise type(exc)(
                exc.message.removeprefix(f"codec {exc.codec}: "), codec=exc.codec, path=path, hint=exc.hint
            ) from None

    heads: list[tuple[np.ndarray, int] | None] = [None] * len(index.streams)
    hasher = xxhash.xxh3_128()
    segment_rows = zip(index.segments["stream"].tolist(), index.segments["length"].tolist(), strict=True)
    for sid, length in segment_rows:
        remaining = length
        while remaining:
            head = heads[sid]
            if head is None or head[1] == head[0].size:
                while not pending[sid]:
                    if not schedule_one():
                        raise CorruptionError("a stream ends before its segments", path=path)
                while in_flight < limit and schedule_one():
                    pass
                data = result(sid)
                in_flight -= 1
                head = (data, 0)
            data, used = head
            take = min(remaining, data.size - used)
            view = data.data[used : used + take]
            hasher.update(view)
            sink(view)
            progress(take)
            heads[sid] = (data, used + take)
            remaining -= take
    if hasher.hexdigest() != index.source_digest:
        raise CorruptionError("restored file does not match the original's digest", path=path)
    return index


def _frame_tensors(index: Index, keys: list[object]) -> Callable[[int, int], str | None]:
    """A function naming the first tensor in frame ``k`` of stream ``sid`` (None for metadata)."""
    starts: list[list[int]] = [[] for _ in index.streams]
    names: list[list[str | None]] = [[] for _ in index.streams]
    pos = [0] * len(index.streams)
    for i, (sid, length) in enumerate(
        zip(index.segments["stream"].tolist(), index.segments["length"].tolist(), strict=True)
    ):
        seg_keys = keys[i] if i < len(keys) else None
        starts[sid].append(pos[sid])
        names[sid].append(str(seg_keys[0]) if isinstance(seg_keys, list) and seg_keys else None)
        pos[sid] += length

    def tensor(sid: int, k: int) -> str | None:
        at = bisect.bisect_right(starts[sid], k * index.streams[sid].frame_size) - 1
        return names[sid][at] if at >= 0 else None

    return tensor


class Comparer:
    """A restore sink that compares the restored bytes with the original file."""

    def __init__(self, original: BinaryIO, path: str) -> None:
        self._f = original
        self._path = path
        self.offset = 0

    def __call__(self, view: memoryview) -> None:
        theirs = self._f.read(len(view))
        if theirs != view:
            at = self.offset + next(
                (i for i, (a, b) in enumerate(zip(theirs, view.tobytes(), strict=False)) if a != b),
                min(len(theirs), len(view)),
            )
            raise MismatchError(f"differs from the original at byte {at}", path=self._path)
        self.offset += len(view)

    def finish(self) -> None:
        if self._f.read(1):
            raise MismatchError(f"original is longer than the restored {self.offset} bytes", path=self._path)
