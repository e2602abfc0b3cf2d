"""Compressing one file: read → code → write, every stage in parallel.

On the CPU, a file (read from itself or from host memory, into a file, a pipe or nowhere)
is coded in one native call instead (:mod:`ckptz.pipeline.native_compress`), to the same
bytes, with its series delta if it has one; what follows is the pipeline every other file
takes (a GPU, a delta against a reference the plane cannot read).

Frames (:func:`ckptz.pipeline.plan.frame_map`) flow through three stages that run at once,
a run of consecutive frames at a time (:func:`~ckptz.pipeline.plan.frame_runs`: up to the
engine's ``span_bytes``, a frame at a time where that is 0):

- **read**: a reader thread takes a free run buffer, ``pread``\\ s the run's pieces into it,
  takes every frame's checksum in one call while the bytes are in cache, and hands the run
  to the engine (:meth:`~ckptz.engines.base.Engine.encode_span`: on a GPU, one copy to the
  device);
- **code**: the engine (CPU threads or GPU batches) codes the frames;
- **write**: this thread gives each coded frame its place in the container, in frame order,
  and a writer thread takes the run's payload checksums and ``pwritev``\\ s them there (the
  GPU's block, the run's data area as written, in one call).

Per-frame Python in every stage was what held a GPU compression back (the GIL, not the
GPU); runs take it to one call per run.

The whole-file digest (``xxh3_tree``, :mod:`ckptz.digest`) is taken where the bytes are: the
engine (or the reader) hashes the leaves that lie whole inside the run's frames, and those
that straddle its frames; the reader that completes a leaf straddling runs hashes it from
its parts (:class:`~ckptz.pipeline.workers.FileDigest`). A run's buffer goes back to the
pool once no leaf needs its frames and they are coded, so memory stays at :func:`~ckptz.pipeline.workers.slots_needed` runs per file (the
engine's look-ahead in bytes), plus the coded runs waiting for a writer (about
:data:`WRITE_DEPTH` frames' worth per writer).

With ``verify``, every coded frame is also decoded again from the very payloads that are
written, and must give back the frame's checksum; each run's payloads are read back as soon
as they are written, and the index once it is, and compared with what was written
(RELIABILITY.md says why this proves what decoding the file again would).
"""

from __future__ import annotations

import fcntl
import os
import stat
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import BinaryIO, Protocol

import numpy as np

from ckptz import indices, safeio, trace
from ckptz._version import __version__
from ckptz.checksums import xxh3_64_each, xxh3_64_ranges
from ckptz.codecs.native import native
from ckptz.container import (
    ALIGN,
    PREFIX,
    Index,
    index_bytes,
    make_tables,
    padded_size,
    read_index,
)
from ckptz.digest import TREE, Digest, Kind, Piecewise
from ckptz.engines.base import (
    NO_BUFFER,
    DecodedSpan,
    EncodedSpan,
    Engine,
    FrameToCode,
    Ranges,
    StoredSpan,
)
from ckptz.engines.cpu import CpuEngine
from ckptz.engines.hybrid import HybridEngine
from ckptz.errors import CorruptionError, FormatError
from ckptz.formats import read_layout
from ckptz.formats.layout import FileLayout
from ckptz.pipeline import native_compress, native_restore
from ckptz.pipeline.plan import Frame, StreamPlan, frame_map, frame_runs, plan_streams
from ckptz.pipeline.transform import FrameTransform
from ckptz.pipeline.workers import Failures, FileDigest, FrameSlots, Stopped, Workers, slots_needed

Progress = Callable[[int], None]
#: Coded frames queued per writer thread before the pipeline waits for the storage.
WRITE_DEPTH = 8
#: Runs of frames a file keeps in flight at least (the engine's look-ahead in bytes is cut
#: into this many runs): reading, coding and placing each hold some, and a run's buffer
#: comes back only once every stage is done with it. With fewer, larger runs the pipeline
#: ran dry between them, its readers and GPU both half idle.
RUNS_AHEAD = 24
_ZEROS = bytes(ALIGN)
#: Buffers one ``preadv`` may fill (the system's limit, usually 1024).
_IOV_MAX = max(16, os.sysconf("SC_IOV_MAX")) if hasattr(os, "sysconf") else 1024


def _no_progress(_: int) -> None:
    pass


#: Seconds a file's pipeline waits at most for other files' layouts and plans
#: (:class:`_PlansFirst`).
PLANS_FIRST_S = 1.0


class _PlansFirst:
    """Files of a run being laid out and planned go before the pipelines of the others.

    A file's layout (a ``torch.save`` pickle walked in Python) and stream plan hold the GIL
    most of the time, and a pipeline running beside them holds it too, which made planning
    several times slower. So a pipeline starts once no file is being planned, or after :data:`PLANS_FIRST_S` (a huge pickle does not hold everything up for long).
    """

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._planning = 0

    def __enter__(self) -> None:
        with self._cv:
            self._planning += 1

    def __exit__(self, *exc: object) -> None:
        with self._cv:
            self._planning -= 1
            if not self._planning:
                self._cv.notify_all()

    def wait(self) -> None:
        """Wait until no file is being planned (:data:`PLANS_FIRST_S` at most)."""
        with self._cv, trace.span("wait plans"):
            self._cv.wait_for(lambda: not self._planning, PLANS_FIRST_S)


_plans_first = _PlansFirst()


class Source(Protocol):
    """Where a file's bytes are read from, if not from the file itself."""

    def readinto(self, views: Sequence[memoryview], offset: int) -> int:
        """Fill ``views``, one after another, from ``offset`` (a scatter read); how many
        bytes there were (fewer past the end). Called from several threads at once."""
        ...

    def read_at(self, offset: int, n: int) -> bytes:
        """Up to ``n`` bytes from ``offset`` (the stream plan's samples)."""
        ...

    def host_regions(self) -> list[tuple[int, np.ndarray]] | None:
        """The bytes as uint8 arrays in host memory that tile them in order, each with its
        offset (the native plane reads them there); None where some are elsewhere (a GPU)."""
        ...


class _FileSource:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def readinto(self, views: Sequence[memoryview], offset: int) -> int:
        return os.preadv(self.fd, views, offset)

    def read_at(self, offset: int, n: int) -> bytes:
        return os.pread(self.fd, n, offset)

    def host_regions(self) -> list[tuple[int, np.ndarray]] | None:
        return None


class _Places:
    """A file's data area handed out run after run."""

    def __init__(self) -> None:
        self.end = len(PREFIX)

    def take(self, n: int) -> int:
        """The offset of the next ``n`` bytes of the data area (a run's payloads, padded)."""
        at, self.end = self.end, self.end + n
        return at


@dataclass(frozen=True, slots=True)
class WrittenContainer:
    """What compressing one file produced."""

    layout: FileLayout
    index: Index
    size: int


def compress_file(
    src: Path,
    relpath: str,
    out: BinaryIO | None,
    engine: Engine | Callable[[], Engine],
    *,
    workers: Workers | None = None,
    progress: Progress = _no_progress,
    verify: bool = False,
    source_fields: Mapping[str, object] | None = None,
    transform: Callable[[FileLayout], FrameTransform | None] | None = None,
    digest: Kind = TREE,
    source: Source | None = None,
    largest_frame: int | None = None,
) -> WrittenContainer:
    """Compress ``src`` into the open, empty file ``out`` (``None``: code everything and
    write nothing, to measure the pipeline without storage).

    A regular file is written at known offsets by many threads; anything else (a pipe) is
    written in order by one.

    Args:
        engine: the engine, or what gives it once open (the file is laid out meanwhile).
        workers: the run's reader and writer threads (default: a set for this file only).
        verify: decode every coded frame back before returning, and read the written
            container back (see the module docstring); needs a regular file.
        source_fields: more fields for the header's ``source`` object (e.g. metadata).
        transform: makes, from the file's layout, the transform its frames are coded
            through (:mod:`ckptz.pipeline.transform`; a series delta).
        digest: the kind of whole-file digest to record (re-coding a container keeps its
            own, so the containers coded against it still match it).
        source: where the bytes are read from; ``src`` then only gives the layout, so it
            may be a file of the same structure whose tensor bytes are holes
            (:mod:`ckptz.library.torch_image`).
        largest_frame: how large the frames of large streams may grow (default: the
            engine's ``largest_frame``; :func:`~ckptz.pipeline.plan.frame_size_for`).

    Raises:
        FormatError: the source changed while being read.
        CorruptionError: ``verify`` found a frame or payload that does not match.
        OSError: reading or writing failed.
    """
    fd = -1
    try:
        with _plans_first:
            with trace.span("layout"):
                layout = read_layout(src, relpath)
            if callable(engine):  # still opening
                engine = engine()
            change = transform(layout) if transform is not None else None
            fd = os.open(src, os.O_RDONLY) if source is None else -1
            reader = source if source is not None else _FileSource(fd)
            # Streams are planned on samples of the bytes that are coded, wherever they are.
            with trace.span("plan"):
                plan = plan_streams(
                    layout,
                    engine.frame_size,
                    fd if source is None else reader.read_at,
                    change.apart if change else frozenset(),
                    engine.largest_frame if largest_frame is None else largest_frame,
                )
            regions = None if source is None else source.host_regions()
            # A hybrid engine whose GPU has not joined codes a whole file on its CPU threads.
            coder = engine.cpu if isinstance(engine, HybridEngine) else engine
            # A series delta is applied in the plane on the CPU, where it can read the reference.
            delta = native_restore.for_plane(change) if change is None or type(coder) is CpuEngine else None
            plain = delta is not None and (source is None or regions is not None)
            natively = native_compress.suits(coder, plan.streams, layout.size, digest, plain=plain)
            if natively and isinstance(engine, HybridEngine):
                natively = engine.cpu_alone(layout.size) is not None
        _plans_first.wait()
        if natively:
            assert delta is not None  # suits() took only a plain file
            return _compress_natively(
                fd,
                reader,
                regions,
                relpath,
                layout,
                plan,
                out,
                coder,
                progress,
                verify,
                digest,
                source_fields or {},
                change,
                delta.argument,
            )
        pools = workers or Workers.shared(engine.threads if engine.inline else 0)
        run = _Compression(
            reader, relpath, layout, plan, out, engine, pools, progress, verify, change, digest
        )
        return run.run(source_fields or {})
    finally:
        if fd >= 0:
            os.close(fd)


def _compress_natively(
    fd: int,
    reader: Source,
    regions: list[tuple[int, np.ndarray]] | None,
    relpath: str,
    layout: FileLayout,
    plan: StreamPlan,
    out: BinaryIO | None,
    engine: Engine,
    progress: Progress,
    verify: bool,
    digest: Kind,
    source_fields: Mapping[str, object],
    change: FrameTransform | None = None,
    delta: tuple[object, ...] | None = None,
) -> WrittenContainer:
    """Compress the file open as ``fd`` (-1: the host memory ``regions``) in one native call
    (:mod:`ckptz.pipeline.native_compress`), its frames coded through ``change`` (which the
    plane applies as ``delta``, :func:`~ckptz.pipeline.native_restore.for_plane`); with
    ``verify``, the plane decodes every frame back and reads every payload back, and the
    index is read back here (not from a pipe)."""
    segments = [(sid, seg.length) for seg, sid in zip(layout.segments, plan.segment_streams, strict=True)]
    coder, gpu = native_compress.coders(engine)
    frames = frame_map(segments, [s.frame_size for s in plan.streams])
    memory = native_compress.memory_table(regions or [])
    explain = None if change is None else _explain(change, frames, reader)
    if out is not None and not _regular(out):  # a pipe, or a file object written in order
        out.write(PREFIX)
        with _InOrderOutput(out) as out_fd:
            coded = native_compress.code(
                fd, out_fd, relpath, frames, plan.streams, layout.size, digest, coder, progress, verify,
                memory=memory, in_order=True, gpu=gpu, threads=engine.threads, delta=delta, explain=explain,
            )  # fmt: skip
        if reader.read_at(layout.size, 1):
            raise FormatError("file grew while being read", path=relpath)
        index, tail = _make_index(
            relpath, layout, plan, segments, engine, change, coded.digest, coded.frames, coded.chunks, coded.end,
            source_fields,
        )  # fmt: skip
        out.write(tail)
        return WrittenContainer(layout, index, coded.end + len(tail))
    out_fd = -1 if out is None else out.fileno()
    written = _reopen(out_fd, getattr(out, "name", None)) if verify and out is not None else -1
    try:
        with trace.span("native compress"):
            coded = native_compress.code(
                fd,
                out_fd,
                relpath,
                frames,
                plan.streams,
                layout.size,
                digest,
                coder,
                progress,
                verify,
                written,
                memory=memory,
                gpu=gpu,
                threads=engine.threads,
                delta=delta,
                explain=explain,
            )
        if reader.read_at(layout.size, 1):
            raise FormatError("file grew while being read", path=relpath)
        with trace.span("index"):
            index, tail = _make_index(
                relpath, layout, plan, segments, engine, change, coded.digest, coded.frames, coded.chunks, coded.end,
                source_fields,
            )  # fmt: skip
        if out_fd >= 0:
            # An output written through mappings keeps its own record of its size: told the
            # plane's, or its next write would cut the file back to that record.
            safeio.grow(out_fd, coded.end)
            safeio.pwrite_all(out_fd, [PREFIX], 0)
            safeio.pwrite_all(out_fd, [tail], coded.end)
            if written >= 0:
                _check_index(written, relpath, index, tail, coded.end)
        return WrittenContainer(layout, index, coded.end + len(tail))
    finally:
        if written >= 0:
            os.close(written)


def _explain(change: FrameTransform, frames: Sequence[Frame], reader: Source) -> Callable[[int], object]:
    """What applies ``change`` in Python to frame ``i``'s bytes (read again), to raise the
    error the Python pipeline raises where the native plane's delta failed."""

    def explain(i: int) -> object:
        frame = frames[i]
        data = np.zeros(frame.length, np.uint8)
        for at, within, n in frame.pieces:
            part = np.frombuffer(reader.read_at(at, n), np.uint8)
            data[within : within + part.size] = part
        return change.forward(frame, data)

    return explain


class _InOrderOutput:
    """A descriptor the native plane writes a stream's payloads to in order: the stream's
    own (flushed first) where it has one, else a pipe whose bytes a thread hands to its
    ``write`` (a file object of the caller's, written from where it stands)."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._relay: threading.Thread | None = None
        self._pipe = (-1, -1)
        self._failure: list[BaseException] = []

    def __enter__(self) -> int:
        try:
            fd = self._out.fileno()
        except (AttributeError, OSError, ValueError):
            fd = -1
        if fd >= 0:
            self._out.flush()
            return fd
        self._pipe = os.pipe()
        self._relay = threading.Thread(target=self._copy, name="ckptz-relay", daemon=True)
        self._relay.start()
        return self._pipe[1]

    def _copy(self) -> None:
        read = self._pipe[0]
        try:
            while chunk := memoryview(os.read(read, 1 << 20)):
                while chunk:  # a file object may take part of it (a pipe whose reader went away)
                    took = self._out.write(chunk)
                    chunk = chunk[took if isinstance(took, int) and took > 0 else len(chunk) :]
        except BaseException as exc:
            self._failure.append(exc)
        finally:
            os.close(read)  # the plane's next write fails (EPIPE) where this one did

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        if self._relay is None:
            return
        os.close(self._pipe[1])
        self._relay.join()
        if self._failure:  # what the caller's write raised, not the plane's broken pipe
            raise self._failure[0]


class _Compression:
    """One file's run through the stages (see the module docstring)."""

    def __init__(
        self,
        source: Source,
        relpath: str,
        layout: FileLayout,
        plan: StreamPlan,
        out: BinaryIO | None,
        engine: Engine,
        workers: Workers,
        progress: Progress,
        verify: bool,
        change: FrameTransform | None = None,
        digest: Kind = TREE,
    ) -> None:
        self.change = change
        self.digest = Piecewise(digest, layout.size)
        self.source, self.relpath, self.layout, self.plan = source, relpath, layout, plan
        self.stream = out if out is not None and not _regular(out) else None
        self.out = out.fileno() if out is not None and self.stream is None else None
        self.out_path = getattr(out, "name", None)
        if self.stream is not None:
            self.stream.write(PREFIX)
        self.engine, self.workers, self.progress, self.verify = engine, workers, progress, verify
        segments = [(sid, seg.length) for seg, sid in zip(layout.segments, plan.segment_streams, strict=True)]
        self.segments = segments
        self.frames = frame_map(segments, [s.frame_size for s in plan.streams])
        self.places = _Places()
        # Runs of consecutive frames are read into one buffer and coded as one unit (one
        # copy to a GPU, one write), so the per-frame Python of each stage runs per run. A
        # run is at most the engine's span, and small enough that RUNS_AHEAD of them, and
        # every stream's open frame holding one while a digest leaf straddling it waits for
        # the next stream's bytes (``slots_needed``), fit the engine's look-ahead.
        budget = engine.look_ahead * max(engine.frame_size, 1)
        runs_ahead = max(len(plan.streams) + 2, RUNS_AHEAD)
        limit = min(engine.span_bytes, budget // runs_ahead) if engine.span_bytes else 0
        self.runs = frame_runs(self.frames, limit)
        self.run_of = [r for r, run in enumerate(self.runs) for _ in run]
        self.at = [a for run in self.runs for a in _run_offsets([self.frames[i].length for i in run])]
        self.read: list[Future[np.ndarray]] = [Future() for _ in self.frames]
        self.coded: list[Future[EncodedSpan] | None] = [None] * len(self.runs)
        self.sums = [0] * len(self.frames)
        # The engine hashes each frame where it holds its bytes, and the digest's leaves
        # inside the frames (not with a transform, whose coded bytes are not the file's).
        hashes = engine.hashes and change is None
        self.file_digest = FileDigest(
            self.digest, self.frames, self.read, self._release, self.runs if hashes else None
        )
        self.leaf_table = self.file_digest.table if hashes else None
        self.buffers: list[np.ndarray | None] = [None] * len(self.runs)
        # Each frame has three users of its run's buffer: the digest, the writer stage, verification.
        self.users = [3 * len(run) for run in self.runs]
        self.lock = threading.Lock()
        self.queued = 0  # runs given to the engine
        size = max((_run_bytes([self.frames[i].length for i in run]) for run in self.runs), default=1)
        ahead = max(1, budget // size) if limit else engine.look_ahead
        count = slots_needed(len(self.runs), len(plan.streams), ahead)
        self.slots = FrameSlots(count, size, engine.host_buffer, engine.free_buffer)
        # Coded runs queued for the writers: WRITE_DEPTH frames' worth per writer, and at
        # least a run per writer.
        depth = max(workers.writers, WRITE_DEPTH * workers.writers * engine.frame_size // size)
        self.write_room = threading.Semaphore(depth)
        self.failures = Failures()
        # Every task queued on the shared threads for this file: all must be over before the
        # file's descriptors are closed, or a late one could use a number reused by another file.
        self.tasks: list[Future[None]] = []
        # With verify: the written container, opened for reading, and each run's read-back
        # (queued once the run is written), with the buffers they reuse.
        self.written = -1
        self.read_backs: list[Future[None]] = []
        self.spare: list[np.ndarray] = []

    # -- stages ---------------------------------------------------------------------------

    def run(self, source_fields: Mapping[str, object]) -> WrittenContainer:
        try:
            frames, rows = self.code()
            return self.finish(frames, rows, self.places.end, source_fields)
        finally:
            self.close()

    def close(self) -> None:
        if self.written >= 0:
            os.close(self.written)
            self.written = -1

    def code(self) -> tuple[list[tuple[int, int, int, int]], list[tuple[int, int, int, int, int, int]]]:
        """Read, code and write every frame (its runs' payloads read back, with verify):
        the frame and chunk rows, the leaves of the digest hashed."""
        if self.verify and self.out is not None and self.written < 0:
            self.written = self._reopen()
        feeder = threading.Thread(target=self._guard, args=(self._feed,), name="ckptz-feed", daemon=True)
        digest: Future[Digest] = Future()
        hasher = threading.Thread(target=self._hash, args=(digest,), name="ckptz-digest", daemon=True)
        feeder.start()
        hasher.start()
        try:
            frames, chunks, writes, checks = self._place()
            digest.result()  # walked; the leaves an engine hashed are in once placed
            for w in writes:
                w.result()  # also fills in the chunk rows' checksums
            for c in checks:
                c.result()
        except BaseException as exc:
            self._fail(exc)
            raise self.failures.first() from None
        finally:
            feeder.join()
            hasher.join()
            while pending := [t for t in self.tasks if not t.done()]:
                wait(pending)  # again: a write queues its run's read-back before it ends
            self.slots.close()
            self.file_digest.close()  # the run freed as soon as it is dropped
        if self.failures:  # a run's read-back, after the last run was placed
            raise self.failures.first()
        if self.source.read_at(self.layout.size, 1):
            raise FormatError("file grew while being read", path=self.relpath)
        return frames, [(r[0], r[1], r[2], r[3], r[4], r[5]) for r in chunks]  # checksums are in now

    def finish(
        self,
        frames: list[tuple[int, int, int, int]],
        rows: list[tuple[int, int, int, int, int, int]],
        end: int,
        source_fields: Mapping[str, object],
    ) -> WrittenContainer:
        """Write the index and footer after the data area (``end``), and read them back
        with verify."""
        with trace.span("index"):
            index, tail = _make_index(
                self.relpath,
                self.layout,
                self.plan,
                self.segments,
                self.engine,
                self.change,
                self.digest.digest(),
                frames,
                rows,
                end,
                source_fields,
            )
        if self.stream is not None:
            self.stream.write(tail)
        if self.out is not None:
            safeio.pwrite_all(self.out, [PREFIX], 0)
            safeio.pwrite_all(self.out, [tail], end)
            if self.verify:
                self._read_back(index, tail, end)
        return WrittenContainer(self.layout, index, end + len(tail))

    def _guard(self, stage: Callable[[], None]) -> None:
        try:
            stage()
        except Stopped:
            pass
        except BaseException as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """Stop every stage: waiting threads wake and leave, unread frames fail."""
        self.failures.add(exc, self.read)
        self.file_digest.fail(exc)
        self.slots.stop()

    def _feed(self) -> None:
        """Take a buffer for each run of frames in order, and queue its read."""
        for r in range(len(self.runs)):
            with trace.span("wait slot"):
                buf = self.slots.take()
            self.buffers[r] = buf
            self.tasks.append(self.workers.read.submit(self._read, r, buf))

    def _read(self, r: int, buf: np.ndarray) -> None:
        run = self.runs[r]
        try:
            pieces = sorted(
                (at, self.at[i] + within, n) for i in run for at, within, n in self.frames[i].pieces
            )
            with trace.span("read"):
                self._scatter_read(pieces, buf)
            views = [buf[self.at[i] : self.at[i] + self.frames[i].length] for i in run]
            if self.leaf_table is not None:  # the engine hashes where it holds the bytes (its GPU)
                _, frame, start, size, parts = self.leaf_table.span(run.start, run.stop)
                todo = [
                    FrameToCode(self.plan.streams[self.frames[i].stream], v, None)
                    for i, v in zip(run, views, strict=True)
                ]
                self.coded[r] = self.engine.encode_span(
                    todo, buf, Ranges(frame, start, size, parts) if frame.size else None
                )
                self._queued()
                self._read_done(run, views)
                return
            if self.change is None:
                coded = views
                lengths = np.array([v.size for v in views], np.int64)
                at = np.array([self.at[i] for i in run], np.int64)
                # The frames' checksums and the leaves inside them in one pass over the
                # bytes, while they are in cache from the read.
                with trace.span("checksums"):
                    sums = self.digest.hash_frames(pieces, buf, at, lengths).tolist()
            else:
                with trace.span("digest leaves"):
                    self.digest.hash_whole(pieces, buf)  # while the bytes are in cache
                coded = [self.change.forward(self.frames[i], v) for i, v in zip(run, views, strict=True)]
                sums = xxh3_64_each(coded)  # of the bytes coded; the digest is of the file's
            todo = []
            for i, data, crc in zip(run, coded, sums, strict=True):
                self.sums[i] = crc
                todo.append(FrameToCode(self.plan.streams[self.frames[i].stream], data, crc))
            self.coded[r] = self.engine.encode_span(todo, buf if self.change is None else None)
            self._queued()
            self._read_done(run, views)
        except BaseException as exc:
            self._fail(exc)

    def _queued(self) -> None:
        """A run was given to the engine: after the file's last, the engine need not wait
        for more to fill a batch (:meth:`~ckptz.engines.base.Engine.flush`)."""
        with self.lock:
            self.queued += 1
            last = self.queued == len(self.runs)
        if last:
            self.engine.flush()

    def _read_done(self, run: range, views: list[np.ndarray]) -> None:
        for i, view in zip(run, views, strict=True):
            self.read[i].set_result(view)
        self.file_digest.give(list(zip(run, views, strict=True)))
        self.progress(sum(v.size for v in views))

    def _scatter_read(self, pieces: list[tuple[int, int, int]], buf: np.ndarray) -> None:
        """Read ``pieces`` (file offset, offset in ``buf``, bytes; in file order): from a file,
        all in one native call (one wait for the GIL, where each ``preadv`` had one among the
        pipeline's threads); else one ``preadv`` for each stretch of the file they cover back
        to back."""
        if isinstance(self.source, _FileSource):
            table = np.array(pieces, np.int64).reshape(-1, 3).T.copy()
            if native.pread_into(self.source.fd, buf, table[0], table[1], table[2]) != int(table[2].sum()):
                raise FormatError("file changed or was truncated while being read", path=self.relpath)
            return
        whole = buf.data
        group: list[memoryview] = []
        first = end = 0
        for at, start, n in [*pieces, (-1, 0, 0)]:
            if group and (at != end or len(group) == _IOV_MAX):
                if self.source.readinto(group, first) != end - first:
                    raise FormatError("file changed or was truncated while being read", path=self.relpath)
                group = []
            if at < 0:
                break
            if not group:
                first = at
            group.append(whole[start : start + n])
            end = at + n

    def _hash(self, digest: Future[Digest]) -> None:
        try:
            digest.set_result(self.file_digest.result())
        except BaseException as exc:
            digest.set_exception(exc)

    def _release(self, i: int) -> None:
        """One user of frame ``i``'s bytes is done; the last of its run gives the buffer back."""
        r = self.run_of[i]
        with self.lock:
            self.users[r] -= 1
            free = self.users[r] == 0
        if free:
            buf, self.buffers[r] = self.buffers[r], None
            if buf is not None:
                self.slots.give(buf)

    def _place(
        self,
    ) -> tuple[list[tuple[int, int, int, int]], list[list[int]], list[Future[None]], list[Future[None]]]:
        """Give each coded frame, in order, its place in the container and queue its write
        (a run of frames at a time)."""
        frames: list[tuple[int, int, int, int]] = []
        chunks: list[list[int]] = []
        writes: list[Future[None]] = []
        checks: list[Future[None]] = []
        room = self.write_room  # a callback that holds ``self`` would hold the run in a cycle
        for r, run in enumerate(self.runs):
            with trace.span("wait coded"):
                self.read[run[0]].result()
                fut, self.coded[r] = self.coded[r], None  # a coded run lives until it is written
                assert fut is not None  # set before the reads resolve
                span = fut.result()
            need = sum(padded_size(len(ch.payload)) for coded in span.frames for ch in coded.chunks)
            start = pos = self.places.take(need)
            parts, payloads = list[bytes | memoryview](), list[bytes | memoryview]()
            rows: list[list[int]] = []
            firsts = []
            if self.leaf_table is not None:  # the engine took each frame's checksum and leaves
                for i, coded in zip(run, span.frames, strict=True):
                    self.sums[i] = coded.checksum
                self.leaf_table.take(run, span.leaves)
            for i, coded in zip(run, span.frames, strict=True):
                frame = self.frames[i]
                first = len(chunks) + len(rows)
                firsts.append(first)
                for plane, ch in enumerate(coded.chunks):
                    n = len(ch.payload)
                    rows.append([pos, n, ch.raw_size, 0, ch.codec, plane])
                    payloads.append(ch.payload)
                    parts.append(ch.payload)
                    if -n % ALIGN:
                        parts.append(_ZEROS[: -n % ALIGN])
                    pos += padded_size(n)
                frames.append((frame.stream, len(coded.chunks), frame.length, self.sums[i]))
                self._release(i)
                if not self.verify:
                    self._release(i)
            chunks.extend(rows)
            # The engine's block is the run's data area as it is written: one write of it.
            block = span.block if span.block is not None and span.block.size == pos - start else None
            if self.verify:
                checks.append(self._check(run, span, firsts, block))
            sums = span.sums if span.sums is not None and len(span.sums) == len(rows) else None
            if self.stream is not None:  # a pipe takes its bytes in order, from this thread
                self._store(rows, payloads, [], start, block, sums)
                for part in [block.data] if block is not None else parts:
                    self.stream.write(part)
                continue
            # Payload checksums and the write run on a writer thread: this one only places.
            with trace.span("wait writers"):
                self.write_room.acquire()
            w = self.workers.write.submit(self._store, rows, payloads, parts, start, block, sums)
            w.add_done_callback(lambda _: room.release())
            writes.append(w)
            self.tasks.append(w)
        return frames, chunks, writes, checks

    def _store(
        self,
        rows: list[list[int]],
        payloads: list[bytes | memoryview],
        parts: list[bytes | memoryview],
        at: int,
        block: np.ndarray | None = None,
        taken: np.ndarray | None = None,
    ) -> None:
        """Take each payload's checksum into its chunk row (``taken``: the engine's, where
        it took them), and write the payloads (from ``block``, the run's data area, where
        the engine gave one)."""
        if taken is not None:
            sums = taken.tolist()
        elif block is not None:
            where = np.array([row[0] - at for row in rows], np.int64)
            sizes = np.array([row[1] for row in rows], np.int64)
            with trace.span("checksums"):
                sums = xxh3_64_ranges(block, where, sizes).tolist()
        else:
            with trace.span("checksums"):
                sums = xxh3_64_each(payloads)
        if block is not None:
            parts = [block.data]
        for row, crc in zip(rows, sums, strict=True):
            row[3] = crc
        if self.out is not None and parts:
            with trace.span("write"):
                safeio.pwrite_all(self.out, parts, at)
            if self.written >= 0 and rows:  # read it back now, beside the writes still to come
                task = self.workers.read.submit(self._check_written, rows, at)
                self.read_backs.append(task)
                self.tasks.append(task)

    def _check(
        self, run: range, span: EncodedSpan, firsts: list[int], block: np.ndarray | None
    ) -> Future[None]:
        """Decode a run's frames again from the payloads that are written (one span: on a
        GPU, one copy of ``block``); each frame's checksum must come back."""
        # These payloads are the ones in memory, not yet stored: there is no stored checksum
        # to check (engines decode what they are given; the read-back checks the file).
        chunks = [c for coded in span.frames for c in coded.chunks]
        counts = [len(coded.chunks) for coded in span.frames]
        size = np.array([len(c.payload) for c in chunks], np.int64)
        padded = size + (-size % ALIGN)

        def name(k: int) -> str:
            return f"frame {run[k]} of {self.relpath}"

        stored = StoredSpan(
            NO_BUFFER if block is None else block,
            [self.plan.streams[self.frames[i].stream] for i in run],
            np.array([self.frames[i].length for i in run], np.int64),
            np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]),
            indices.runs(firsts, counts),
            np.array([c.codec for c in chunks], np.int64),
            np.array([c.raw_size for c in chunks], np.int64),
            size,
            np.zeros(len(chunks), np.uint64),
            np.cumsum(padded) - padded if block is not None else np.zeros(0, np.int64),
            [c.payload for c in chunks] if block is None else None,
            name,
        )
        done: Future[None] = Future()

        def compare(fut: Future[DecodedSpan]) -> None:
            try:
                got = fut.result()
                for k, i in enumerate(run):
                    # On a GPU, checked there: the decoded bytes are not needed on the host.
                    if got.measure(k) != (self.frames[i].length, self.sums[i]):
                        raise CorruptionError(
                            f"{name(k)} does not decode back to its original", path=self.relpath
                        )
            except BaseException as exc:
                done.set_exception(exc)
            else:
                done.set_result(None)
            finally:
                for i in run:
                    self._release(i)

        def decode() -> None:  # on a reader: an inline engine decodes in the caller's thread
            try:
                self.engine.decode_span(stored, keep=True).add_done_callback(compare)
            except BaseException as exc:
                for i in run:
                    self._release(i)
                done.set_exception(exc)

        self.tasks.append(self.workers.read.submit(decode))
        return done

    def _reopen(self) -> int:
        """The output, opened again for reading back."""
        assert self.out is not None
        return _reopen(self.out, self.out_path)

    def _check_written(self, rows: list[list[int]], at: int) -> None:
        """Read back a run's data area as written (``rows``: its chunks, from ``at``): every
        payload's checksum must be the one taken before it was written (and recorded)."""
        try:
            offsets = np.array([row[0] - at for row in rows], np.int64)
            sizes = np.array([row[1] for row in rows], np.int64)
            want = np.array([row[3] for row in rows], np.uint64)
            n = int(offsets[-1] + sizes[-1])
            # Buffers reused from run to run: a fresh one per read made the kernel fault in
            # and zero every page it copied into (2 GB/s a thread against 8.6).
            with self.lock:
                buf = self.spare.pop() if self.spare else np.empty(0, np.uint8)
            try:
                if buf.size < n:
                    buf = np.empty(n, np.uint8)
                with trace.span("read back"):
                    data = buf[: os.preadv(self.written, [buf.data[:n]], at)]
                    try:  # every payload of the run in one call, as the restore loop checks a run
                        sums = xxh3_64_ranges(data, offsets, sizes)
                    except ValueError:  # the read came back short: a payload is cut off
                        sums = None
            finally:
                with self.lock:
                    self.spare.append(buf)
            if sums is None or not np.array_equal(sums, want):
                raise CorruptionError("a written payload differs from the one checked", path=self.relpath)
        except BaseException as exc:
            self._fail(exc)
            raise

    def _read_back(self, index: Index, tail: bytes, end: int) -> None:
        """The written file must hold exactly the index and payloads that were checked: each
        run's payloads were read back as soon as they were written (:meth:`_check_written`;
        writes are confined to their own run's range, so no later one can change them), and
        now the index and header."""
        _check_index(self.written, self.relpath, index, tail, end)
        for task in self.read_backs:
            task.result()
        self.spare.clear()


def _make_index(
    relpath: str,
    layout: FileLayout,
    plan: StreamPlan,
    segments: list[tuple[int, int]],
    engine: Engine,
    change: FrameTransform | None,
    digest: Digest,
    frames: list[tuple[int, int, int, int]],
    rows: list[tuple[int, int, int, int, int, int]],
    end: int,
    source_fields: Mapping[str, object],
) -> tuple[Index, bytes]:
    """A coded file's index, and the bytes that follow its data area (ending at ``end``)."""
    from ckptz.codecs import codec_name

    used = sorted({c[4] for c in rows})
    config = engine.codec_config()
    header: dict[str, object] = {
        "source": {
            "name": Path(relpath).name,
            "size": layout.size,
            **digest.to_json(),
            "format": layout.format,
            "notes": list(layout.notes),
            **source_fields,
        },
        "created_by": f"ckptz {__version__}",
        "device": engine.device,
        "codecs": {str(c): config.get(codec_name(c), {"name": codec_name(c)}) for c in used},
        "tensor_keys": [list(seg.keys) for seg in layout.segments],
    }
    header.update(engine.container_extras())
    if change is not None:
        header.update(change.header())
    index = Index(header, plan.streams, *make_tables(segments, frames, rows))
    return index, index_bytes(index, end)


def _reopen(out: int, path: object) -> int:
    """The output ``out`` (whose name is ``path``), opened again for reading back."""
    flags = fcntl.fcntl(out, fcntl.F_GETFL) & os.O_ACCMODE
    if flags == os.O_RDWR:
        return os.dup(out)
    if isinstance(path, str | bytes | os.PathLike):
        return os.open(path, os.O_RDONLY)
    raise TypeError("verify needs an output file that can be read back")


def _check_index(written: int, relpath: str, index: Index, tail: bytes, end: int) -> None:
    """The container open as ``written`` must hold ``index`` and ``tail`` (the bytes after
    its data area, from ``end``) as made."""
    with open(written, "rb", closefd=False) as f:
        again = read_index(f, relpath)
    if os.pread(written, len(tail), end) != tail or not np.array_equal(again.chunks, index.chunks):
        raise CorruptionError("the written index differs from the one made", path=relpath)


def _run_offsets(lengths: list[int]) -> list[int]:
    """Where each frame of a run lies in its buffer: back to back, 16-byte aligned."""
    return list(accumulate(map(padded_size, lengths[:-1]), initial=0))


def _run_bytes(lengths: list[int]) -> int:
    return sum(map(padded_size, lengths)) or 1


def _regular(out: BinaryIO) -> bool:
    """Whether ``out`` is a regular file, which can be written at any offset."""
    try:
        return stat.S_ISREG(os.fstat(out.fileno()).st_mode)
    except (AttributeError, OSError, ValueError):
        return False


__all__ = [
    "Source",
    "WrittenContainer",
    "compress_file",
]
