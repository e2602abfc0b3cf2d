"""Decoding the frames of a container, each with every check FORMAT.md promises.

:func:`ckptz.pipeline.restore` decodes every frame of a container through it, and random
access (:class:`~ckptz.library.reader.ContainerReader`) the frames that hold a byte range.
For each frame it reads the payloads with their padding, checks that the padding is zero and
every payload's checksum *before* decoding (an engine that decodes on a GPU checks a run's
payloads there, once copied, before decoding them), has the engine decode the frame, and
checks the decoded bytes against the frame's checksum (taken on the GPU for a frame kept
there). Only the whole-file digest is left to the reader, since it needs every byte.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from itertools import accumulate
from typing import cast

import numpy as np

from ckptz import indices, trace
from ckptz.checksums import xxh3_64_each, xxh3_64_ranges
from ckptz.container import ALIGN, Index, checksum, frame_chunk_starts, padded_size, stream_frame_lists
from ckptz.engines.base import (
    DecodedSpan,
    Engine,
    OnDevice,
    Place,
    Ranges,
    SpanFrame,
    StoredChunk,
    StoredSpan,
)
from ckptz.errors import CodecError, CorruptionError
from ckptz.pipeline.plan import Frame, frame_map
from ckptz.pipeline.transform import transform_for


class FrameDecoder:
    """The frames of one open container, decoded one at a time on ``engine``.

    Args:
        fd: the container, open for reading (read with ``pread``; its offset is never moved).
        path: the container's name in error messages.
        index: its index (:func:`ckptz.container.read_index`).
        engine: decodes the frames; it stays the caller's to close.

    Attributes:
        frames: every frame, ordered by the file offset of its first byte.
        frames_decoded: frames decoded so far (a counter for callers that measure).
        stored_bytes_read: container bytes read so far (payloads and their padding).
    """

    def __init__(self, fd: int, path: str, index: Index, engine: Engine) -> None:
        self.fd, self.path, self.index, self.engine = fd, path, index, engine
        segments = list(
            zip(index.segments["stream"].tolist(), index.segments["length"].tolist(), strict=True)
        )
        self.frames: list[Frame] = frame_map(segments, [s.frame_size for s in index.streams])
        self._rows = stream_frame_lists(index)
        self._chunk_starts = frame_chunk_starts(index.frames)
        self._frame_tables()
        # Chunks by container offset: a span's are a slice, its padding checked in one go.
        self._by_offset = np.argsort(index.chunks["offset"], kind="stable")
        self._offsets = index.chunks["offset"][self._by_offset].astype(np.int64)
        # Every run of a frame's bytes, by file offset: together they tile the file.
        self._pieces = sorted(
            (at, i, within, n) for i, frame in enumerate(self.frames) for at, within, n in frame.pieces
        )
        self._piece_starts = [p[0] for p in self._pieces]
        self._segment_starts = [0, *accumulate(length for _, length in segments)]
        keys = index.header.get("tensor_keys", [])
        self._keys = keys if isinstance(keys, list) else []
        self._count_lock = threading.Lock()
        # Payloads of spans are checked by the engine where it decodes them (on its GPU).
        self._engine_checks = engine.checks
        # A series delta's reference is found (and checked) before any frame is decoded.
        self.transform = transform_for(index, fd, path)
        self.frames_decoded = 0
        self.stored_bytes_read = 0

    def frames_over(self, lo: int, hi: int) -> list[int]:
        """The frames holding bytes ``[lo, hi)`` of the original file, in file order."""
        out: dict[int, None] = {}
        for _, i, _, _ in self._pieces_over(lo, hi):
            out[i] = None
        return list(out)

    def _pieces_over(self, lo: int, hi: int) -> Iterator[tuple[int, int, int, int]]:
        j = max(0, bisect.bisect_right(self._piece_starts, lo) - 1)
        while j < len(self._pieces) and self._pieces[j][0] < hi:
            if self._pieces[j][0] + self._pieces[j][3] > lo:
                yield self._pieces[j]
            j += 1

    def _frame_tables(self) -> None:
        """Each frame's row in the frame table (-1: its stream has fewer frames than its
        segments need), its first chunk and chunk count, its length, and where its payloads
        start and end (with padding) in the container where they lie back to back."""
        n = len(self.frames)
        stream = np.array([f.stream for f in self.frames], np.int64)
        number = np.array([f.number for f in self.frames], np.int64)
        row = np.full(n, -1, np.int64)
        for s, rows in enumerate(self._rows):
            mine = np.flatnonzero(stream == s)
            ok = mine[number[mine] < rows.size]
            row[ok] = rows[number[ok]]
        known = np.flatnonzero(row >= 0)
        first, count = np.zeros(n, np.int64), np.zeros(n, np.int64)
        first[known] = self._chunk_starts[row[known]]
        count[known] = self.index.frames["chunks"][row[known]]
        self._row, self._first, self._count = row, first, count
        self._lengths = np.array([f.length for f in self.frames], np.int64)
        chunks = self.index.chunks
        offsets, sizes = chunks["offset"].astype(np.int64), chunks["size"].astype(np.int64)
        ends = offsets + sizes + (-sizes % ALIGN)
        gaps = np.concatenate([[0], np.cumsum(offsets[1:] != ends[:-1])])
        lo, hi, lying = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, bool)
        has = np.flatnonzero((count > 0) & (first + count <= len(chunks)))
        a, b = first[has], first[has] + count[has] - 1
        lying[has] = gaps[b] == gaps[a]
        lo[has], hi[has] = offsets[a], ends[b]
        self._back_to_back, self._lo, self._hi = lying.tolist(), lo.tolist(), hi.tolist()

    def layout(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per frame (int64 arrays): its row in the frame table (-1: its stream has fewer
        frames than its segments need), its first chunk, its chunk count and its length."""
        return self._row, self._first, self._count, self._lengths

    def spans(self, limit: int) -> list[range]:
        """Every frame, in runs of consecutive frames whose payloads lie back to back in the
        container, of at most ``limit`` original bytes each (a lone frame may exceed it);
        ``limit`` 0 gives one frame per run."""
        out: list[range] = []
        lo, size, end = 0, 0, -1
        lying, starts, ends = self._back_to_back, self._lo, self._hi
        for i, length in enumerate(self._lengths.tolist()):
            joins = limit and lying[i] and starts[i] == end and size + length <= limit
            if not joins and i > lo:
                out.append(range(lo, i))
                lo, size = i, 0
            size += length
            end = ends[i] if limit and lying[i] else -1
        if self.frames:
            out.append(range(lo, len(self.frames)))
        return out

    def _extent(self, i: int) -> tuple[int, int] | None:
        """Where frame ``i``'s payloads start and end (with padding) in the container, if
        they lie back to back; None if they do not, or the index is inconsistent."""
        return (self._lo[i], self._hi[i]) if self._back_to_back[i] else None

    def start_span(
        self,
        frames: range,
        place: Place | None = None,
        keep: bool = False,
        leaves: Ranges | None = None,
    ) -> tuple[Future[DecodedSpan], np.ndarray | None]:
        """Read the payloads of ``frames`` (a run from :meth:`spans`) with one ``pread``
        into a buffer of the engine's, check every payload, and queue the run's decoding
        (``place`` and ``keep`` as in :meth:`~ckptz.engines.base.Engine.decode_span`; never
        with a series transform, which changes the decoded bytes after; ``leaves``: each
        ranges of the frames for the engine to hash, :attr:`~ckptz.engines.base.DecodedSpan.leaves`).
        Return the future and the buffer, for the caller to give back to the engine once
        the future is done (None: the run was read frame by frame). :meth:`finish_span`
        checks each frame's result.

        Raises:
            CorruptionError: the payloads are truncated, badly padded or fail their checksum.
        """
        place = place if self.transform is None else None
        first = self._extent(frames[0]) if self.engine.span_bytes else None
        last = self._extent(frames[-1]) if first is not None else None
        if first is None or last is None:  # frame by frame (a run of one, from spans())
            span = StoredSpan.of([self._stored(i) for i in frames])
            return self.engine.decode_span(span, place, keep, leaves=leaves), None
        lo, hi = first[0], last[1]
        buffer = self.engine.host_buffer(_buffer_size(max(hi - lo, self.engine.span_bytes)))
        try:
            with trace.span("read"):
                got = os.preadv(self.fd, [memoryview(buffer)[: hi - lo]], lo)  # type: ignore[arg-type]
            with self._count_lock:
                self.stored_bytes_read += got
            if got != hi - lo:
                raise CorruptionError(
                    "container ends inside a chunk (truncated?)",
                    path=self.path,
                    chunk=int(self._first[frames[0]]),
                )
            with trace.span("check payloads"):
                self._check_padding(buffer, lo, hi, frames)
                span = self._table(frames, buffer, lo)
        except BaseException:
            self.engine.free_buffer(buffer)
            raise
        return self.engine.decode_span(span, place, keep, check=self._engine_checks, leaves=leaves), buffer

    def finish_span(
        self,
        i: int,
        decoded: Future[DecodedSpan],
        k: int,
        hash_frame: Callable[[np.ndarray], int] = checksum,
    ) -> np.ndarray | OnDevice:
        """Frame ``i`` (the ``k``-th of its run) from :meth:`start_span`'s future, checked as
        :meth:`finish` checks it (a frame kept on the GPU by its checksum taken there;
        ``hash_frame`` takes that of host bytes, and may hash what else wants them)."""

        def result() -> tuple[np.ndarray | OnDevice, int, int]:
            span = decoded.result()
            return span.frame(k), *span.measure(k, hash_frame)

        return self._checked(i, result)

    def _chunks(self, i: int) -> tuple[int, int, np.ndarray] | None:
        """Frame ``i``'s row in the frame table, the index of its first chunk, and its chunk
        rows; None where its stream has fewer frames than its segments need."""
        frame = self.frames[i]
        rows = self._rows[frame.stream]
        if frame.number >= len(rows):
            return None
        row = int(rows[frame.number])
        first = int(self._chunk_starts[row])
        return row, first, self.index.chunks[first : first + int(self.index.frames[row]["chunks"])]

    def _stored(self, i: int) -> SpanFrame:
        """Frame ``i``'s payloads, read now and checked."""
        frame = self.frames[i]
        found = self._chunks(i)
        if found is None:
            raise CorruptionError("a stream has fewer frames than its segments need", path=self.path)
        _, first, chunks = found
        tensor = self.tensor_at(frame.start)
        with trace.span("read"):
            payloads = self._payloads(chunks, first, tensor)
        stored = [
            StoredChunk(first + j, int(c["codec"]), int(c["raw_size"]), payload, int(c["checksum"]))
            for j, (c, payload) in enumerate(zip(chunks, payloads, strict=True))
        ]
        with trace.span("check payloads"):
            for c, got in zip(stored, xxh3_64_each([c.payload for c in stored]), strict=True):
                if got != c.checksum:
                    raise CorruptionError(
                        self._damage(frame.start, frame.stream),
                        path=self.path,
                        chunk=c.index,
                        tensor=tensor,
                    )
        with self._count_lock:
            self.frames_decoded += 1
        return SpanFrame(self.index.streams[frame.stream], stored, frame.length, self._where(i), ())

    def check_stored(self, stop: Callable[[], None] | None = None) -> None:
        """Read every frame's payloads and check them (padding and checksums) without
        decoding any: what a machine that cannot decode some bitstream can still check
        (``stop`` is called between frames).

        Raises:
            CorruptionError: a payload is truncated, badly padded or fails its checksum.
        """
        for i in range(len(self.frames)):
            if stop is not None:
                stop()
            self._stored(i)

    def _table(self, frames: range, buffer: np.ndarray, base: int) -> StoredSpan:
        """The run ``frames`` as one table, its payloads in ``buffer`` (the container from
        offset ``base``), checked here unless the engine checks them where it decodes them
        (on its GPU: :meth:`start_span` asks it to)."""
        rows = self._row[frames.start : frames.stop]
        if (rows < 0).any():
            raise CorruptionError("a stream has fewer frames than its segments need", path=self.path)
        counts = self._count[frames.start : frames.stop]
        bounds = np.concatenate([[0], np.cumsum(counts)])
        index = indices.runs(self._first[frames.start : frames.stop], counts)
        chunks = self.index.chunks[index]
        size = chunks["size"].astype(np.int64)
        at = chunks["offset"].astype(np.int64) - base
        stored = chunks["checksum"]
        if not self._engine_checks:
            bad = np.flatnonzero(xxh3_64_ranges(buffer, at, size) != stored)
            if bad.size:
                k = int(np.searchsorted(bounds, bad[0], side="right")) - 1
                frame = self.frames[frames[k]]
                raise CorruptionError(
                    self._damage(frame.start, frame.stream),
                    path=self.path,
                    chunk=int(index[bad[0]]),
                    tensor=self.tensor_at(frame.start),
                )
        with self._count_lock:
            self.frames_decoded += len(frames)
        streams = self.index.streams
        return StoredSpan(
            buffer,
            [streams[self.frames[i].stream] for i in frames],
            self._lengths[frames.start : frames.stop],
            bounds,
            index,
            chunks["codec"].astype(np.int64),
            chunks["raw_size"].astype(np.int64),
            size,
            stored,
            at,
            None,
            lambda k: self._where(frames[k]),
        )

    def _check_padding(self, buffer: np.ndarray, lo: int, hi: int, frames: range) -> None:
        """The padding after every chunk of ``frames``, read into ``buffer`` (container bytes
        ``[lo, hi)``), must be zero: checked for all of them at once."""
        a, b = np.searchsorted(self._offsets, [lo, hi])
        rows = self._by_offset[a:b]
        ends = self.index.chunks["offset"][rows].astype(np.int64) + self.index.chunks["size"][rows].astype(
            np.int64
        )
        pad = -(ends - lo) % ALIGN
        total = int(pad.sum())
        if not total:
            return
        at = indices.runs(ends - lo, pad)
        if buffer[at].any():
            m = int(np.repeat(rows, pad)[np.flatnonzero(buffer[at])[0]])
            owner = next((i for i in frames if (c := self._chunks(i)) and c[1] <= m < c[1] + len(c[2])), None)
            tensor = None if owner is None else self.tensor_at(self.frames[owner].start)
            raise CorruptionError("padding after a chunk is not zero", path=self.path, chunk=m, tensor=tensor)

    def start(self, i: int) -> Future[np.ndarray]:
        """Read and check frame ``i``'s payloads and queue its decoding; :meth:`finish` the result.

        Raises:
            CorruptionError: the payloads are truncated, badly padded or fail their checksum.
        """
        f = self._stored(i)
        return self.engine.decode(f.stream, f.chunks, f.length, f.where)

    def finish(self, i: int, decoded: Future[np.ndarray]) -> np.ndarray:
        """The bytes of frame ``i`` from :meth:`start`'s future, checked against the frame's checksum.

        Raises:
            CorruptionError: a payload does not decode, or the result fails its checksum.
            CodecUnavailableError: a bitstream cannot be decoded here.
        """

        def result() -> tuple[np.ndarray, int, int]:
            data = decoded.result()
            return data, data.size, checksum(data)

        return cast(np.ndarray, self._checked(i, result))  # host bytes: never kept

    def _checked(
        self, i: int, result: Callable[[], tuple[np.ndarray | OnDevice, int, int]]
    ) -> np.ndarray | OnDevice:
        frame = self.frames[i]
        row = int(self._rows[frame.stream][frame.number])
        first = int(self._chunk_starts[row])
        tensor = self.tensor_at(frame.start)
        try:
            data, length, got = result()
        except CorruptionError as exc:
            chunk = first if exc.chunk is None else exc.chunk
            raise CorruptionError(
                exc.reason, path=self.path, chunk=chunk, tensor=exc.tensor or tensor
            ) from None
        except CodecError as exc:
            if exc.path is not None:
                raise
            raise type(exc)(
                exc.message.removeprefix(f"codec {exc.codec}: "),
                codec=exc.codec,
                path=self.path,
                hint=exc.hint,
            ) from None
        if length != frame.length or got != int(self.index.frames[row]["checksum"]):
            raise CorruptionError(
                f"decoded bytes of {self._where(i)} fail their checksum",
                path=self.path,
                chunk=first,
                tensor=tensor,
            )
        if self.transform is None or isinstance(data, OnDevice):  # never kept with a transform
            return data
        return self.transform.backward(frame, data)

    def decode(self, i: int) -> np.ndarray:
        """Frame ``i``'s original bytes, checked (:meth:`start` then :meth:`finish`)."""
        return self.finish(i, self.start(i))

    def tensor_at(self, offset: int) -> str | None:
        """A key path of the tensor holding byte ``offset`` of the original file (None for meta)."""
        seg = bisect.bisect_right(self._segment_starts, offset) - 1
        keys = self._keys[seg] if 0 <= seg < len(self._keys) else None
        return str(keys[0]) if isinstance(keys, list) and keys else None

    def _damage(self, offset: int, stream: int) -> str:
        """What a failed payload checksum spoils, in the original file's terms (as every engine
        words it)."""
        return f"stored bytes of {self._place(offset, stream)} fail their checksum"

    def _where(self, i: int) -> str:
        frame = self.frames[i]
        return self._place(frame.start, frame.stream)

    def _place(self, offset: int, stream: int) -> str:
        return f"{self.index.streams[stream].component} data at offset {offset:,} of the original"

    def _payloads(self, chunks: np.ndarray, first: int, tensor: str | None) -> list[memoryview]:
        """Each chunk's payload. The pad after each is read with it and must be zero, as a full
        restore checks it; adjacent chunks (a frame's planes are written together) are read in
        one call."""
        offsets, sizes = chunks["offset"].tolist(), chunks["size"].tolist()
        out: list[memoryview] = []
        j = 0
        while j < len(offsets):
            k = j + 1
            while k < len(offsets) and offsets[k] == offsets[k - 1] + padded_size(sizes[k - 1]):
                k += 1
            span = offsets[k - 1] + padded_size(sizes[k - 1]) - offsets[j]
            block = memoryview(os.pread(self.fd, span, offsets[j]))
            with self._count_lock:
                self.stored_bytes_read += len(block)
            if len(block) != span:
                raise CorruptionError(
                    "container ends inside a chunk (truncated?)", path=self.path, chunk=first + j
                )
            for m in range(j, k):
                at = offsets[m] - offsets[j]
                end = at + padded_size(sizes[m])
                if any(block[at + sizes[m] : end]):
                    raise CorruptionError(
                        "padding after a chunk is not zero", path=self.path, chunk=first + m, tensor=tensor
                    )
                out.append(block[at : at + sizes[m]])
            j = k
        return out


def _buffer_size(n: int) -> int:
    """Span buffers come in one size (the engine's span, in whole MiB), so a pool of them
    is reused from span to span."""
    return -(-n // (1 << 20)) << 20


__all__ = ["FrameDecoder"]
