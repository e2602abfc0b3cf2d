"""Restoring one container: read → check → decode → check → place, every stage in parallel.

This is ckptz's one restore loop: decompressing to a file, comparing with an original,
verifying, streaming to stdout and decoding into GPU memory all run it, on either engine,
and differ only in their :class:`Sink`. Every check FORMAT.md promises runs on every path:

- a reader thread ``pread``\\ s a frame's payloads with their padding (on a GPU engine, a
  whole run of frames at once, into one pinned buffer), checks that the padding is zero and
  every payload's checksum, and hands the frame (or run) to the engine;
- the engine decodes it;
- a writer thread (on a CPU engine, the reader that decoded the frame, which spares a
  hand-over per frame) checks the decoded frame's length and checksum (as a GPU engine took
  it where it decoded the frame: the whole-file digest covers the copy back) and gives it to
  the sink, which puts its pieces where they belong (``pwrite`` at file offsets, compare,
  copy);
- that thread also hashes the leaves of the whole-file digest lying whole inside the
  frame (or the engine did, with those straddling its run's frames), and those straddling
  frames that it completes (:class:`~ckptz.pipeline.workers.FileDigest`; an ``xxh3_128``
  digest is walked in file order); the digest is compared once every frame is in
  (:mod:`ckptz.digest`).

Where the bytes are wanted on a GPU (a :class:`DeviceSink` that holds the whole file there,
``ckptz.load(map_location="cuda")``) and the engine decodes on that GPU, the checks run
there too (:class:`~ckptz.engines.base.DeviceChecks`): each frame is placed where it
belongs and its checksum taken on the GPU, with no copy back to the host, and once every
frame is in, the digest's leaves are hashed from the sink's bytes where they lie. (On a GPU
engine, a run's payloads are checked there too, once copied, before decoding.) The same
checks, of the same bytes (the decoded frames, then the restored file): only where they run
differs.

Memory stays at :func:`~ckptz.pipeline.workers.slots_needed` decoded frames.
"""

from __future__ import annotations

import fcntl
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, wait
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, cast, runtime_checkable

import numpy as np

from ckptz import safeio, trace
from ckptz.codecs.table import ANS
from ckptz.container import Index, checksum, read_index
from ckptz.digest import Digest, Piecewise
from ckptz.engines.base import DecodedSpan, DeviceChecks, Engine, OnDevice, Place, Ranges
from ckptz.engines.cpu import CpuEngine
from ckptz.engines.hybrid import HybridEngine
from ckptz.errors import CorruptionError, MismatchError
from ckptz.pipeline import native_restore
from ckptz.pipeline.decoder import FrameDecoder
from ckptz.pipeline.plan import Frame
from ckptz.pipeline.workers import Failures, FileDigest, Workers, slots_needed

if TYPE_CHECKING:
    from ckptz.engines.gpu.engine import GpuEngine

Progress = Callable[[int], None]


def _no_progress(_: int) -> None:
    pass


#: Bytes of a decoded run that one writer task checks and puts. A GPU engine decodes runs
#: of 20-40 frames at once; put by one thread each, a run would hold its frames' room for
#: long while most writers sat idle, so a run is put in shares of this size.
PUT_BYTES = 16 << 20


class Sink(Protocol):
    """Where restored frames go. :meth:`put` is called from many threads at once, once per
    frame, with the frame's checked bytes; :meth:`finish` once at the end."""

    def put(self, frame: Frame, data: np.ndarray) -> None: ...

    def finish(self) -> None: ...


@runtime_checkable
class DeviceSink(Sink, Protocol):
    """A sink that also takes frames where an engine decodes them, on its GPU.

    :meth:`place` is called from the engine's thread, on its CUDA stream, with a frame's
    decoded bytes there (a uint8 tensor), *before* the frame is checked; :meth:`put` follows
    for every frame once it is checked, as for any sink, and does what :meth:`place` did
    not. A check that fails still fails the whole restore, so unchecked bytes never reach
    the caller; placing early spares a wait per frame."""

    def place(self, frame: Frame, device: Any) -> None: ...

    def holds_on(self, index: int, size: int) -> bool:
        """Whether :meth:`place` puts every byte of a ``size``-byte file where it belongs
        when frames are decoded on GPU ``index``, and :meth:`segments` can then give the
        whole file there: the restore loop then checks on that GPU."""
        ...

    def segments(self) -> list[tuple[int, int, int]]:
        """After :meth:`finish`: the restored file on the GPU of :meth:`holds_on`, as (file
        offset, device address, bytes) tiling it in order."""
        ...


class FileSink:
    """Writes each frame's pieces at their offsets in an open file (of ``size`` bytes once
    restored, where known: :func:`ckptz.safeio.expect_size`).

    With ``read_back`` (a restore in place, whose container goes away next), each frame's
    pieces are read back from the file as soon as they are written and must equal the
    checked bytes that were written. A frame's pieces are its own bytes of the file (the
    segment table cuts the file into frames, each byte into one), so no later write of the
    restore changes bytes already read back: once every frame is in and the file has the
    original's size, the file holds what the digest was checked on (RELIABILITY.md).
    """

    def __init__(
        self, f: BinaryIO, size: int | None = None, *, read_back: bool = False, path: str = ""
    ) -> None:
        self.fd, self.size, self.read_back, self.path = f.fileno(), size, read_back, path
        if read_back and fcntl.fcntl(self.fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:
            raise ValueError("reading back what is written needs the file open for reading too")
        if size is not None:
            safeio.expect_size(self.fd, size)

    def put(self, frame: Frame, data: np.ndarray) -> None:
        for at, within, n in frame.pieces:
            safeio.pwrite_all(self.fd, [data.data[within : within + n]], at)
        if self.read_back:
            with trace.span("read back"):
                wrong = safeio.first_difference(self.fd, data, frame.pieces)
            if wrong is not None:
                raise CorruptionError(
                    f"restored file read back differs from what was written, at byte {wrong}",
                    path=self.path or None,
                )

    def finish(self) -> None:
        pass


class DiscardSink:
    """Keeps nothing (verification, and measuring the pipeline without storage)."""

    def put(self, frame: Frame, data: np.ndarray) -> None:
        pass

    def finish(self) -> None:
        pass


class Comparer:
    """Compares each restored frame with the same bytes of the original file, in place.

    Raises:
        MismatchError: names the first differing byte found, or a size difference.
    """

    def __init__(self, original: BinaryIO, path: str) -> None:
        self.fd = original.fileno()
        self._path = path
        self.size = 0

    def put(self, frame: Frame, data: np.ndarray) -> None:
        first = safeio.first_difference(self.fd, data, frame.pieces)
        if first is not None:
            raise MismatchError(f"differs from the original at byte {first}", path=self._path)

    def expect_size(self, size: int) -> None:
        """Record the restored size, checked against the original's by :meth:`finish`."""
        self.size = size

    def finish(self) -> None:
        original = os.fstat(self.fd).st_size
        if original != self.size:
            raise MismatchError(
                f"original is {original} bytes, the restored file {self.size}", path=self._path
            )


class _Ordered:
    """A sink that takes the restored bytes in file order, one piece at a time (stdout)."""

    def __init__(self, write: Callable[[memoryview], object]) -> None:
        self.write = write

    def put(self, frame: Frame, data: np.ndarray) -> None:
        pass

    def finish(self) -> None:
        pass


def restore(
    container: BinaryIO,
    path: str,
    engine: Engine,
    sink: Sink | Callable[[memoryview], object],
    *,
    index: Index | None = None,
    workers: Workers | None = None,
    progress: Progress = _no_progress,
) -> Index:
    """Decode a container and give the original file's bytes to ``sink``.

    ``sink`` is a :class:`Sink` (frames in any order, from many threads) or a callable that
    receives the bytes in file order. Every payload, every frame and the whole file are
    checked against their checksums.

    Raises:
        ContainerError: the container is unreadable.
        CorruptionError: some bytes fail their checksum (names the chunk and tensor).
        CodecUnavailableError: a chunk's bitstream cannot be decoded here.
        MismatchError: a :class:`Comparer` sink found a difference.
    """
    index = index or read_index(container, path)
    target = cast(Sink, sink) if hasattr(sink, "put") else _Ordered(sink)
    if isinstance(target, Comparer):
        target.expect_size(index.source_size)
    # The CPU engine itself (an engine derived from it codes or hashes its own way: the loop),
    # a hybrid engine whose GPU has not joined, or the GPU engine, whose nvCOMP bitstreams
    # the native plane decodes on its GPU.
    gpu = _native_gpu(engine, index)
    coder = engine
    if type(engine) is HybridEngine and gpu is None and native_restore.suits(index):
        coder = engine.cpu_alone(index.source_size) or engine
    decoder = None
    if type(coder) is CpuEngine or gpu is not None:
        digest, decoder = _restore_natively(container, path, index, coder, target, progress, gpu)
        if digest is not None:
            conclude(digest, index, path, target)
            return index
    # The loop takes the decoder the plane was planned with, on the same engine: a series
    # delta's reference is then found and checked once.
    run = _plan(
        container, path, index, engine, target, workers, progress, decoder if coder is engine else None
    )
    # A sink checked on the device was finished before its bytes were hashed.
    conclude(run.run(), index, path, None if run.on_device else target)
    return index


def _native_target(sink: Sink, size: int) -> native_restore.Target | None:
    """Where the native plane puts the bytes for ``sink``; None for a sink it cannot serve
    (parts of a file in memory, a GPU), which the Python loop serves."""
    if type(sink) is DiscardSink:
        return native_restore.Target()
    if type(sink) is _Ordered:
        return native_restore.Target(stream=sink.write)
    whole = getattr(sink, "host_file", None)
    if whole is not None:
        memory = whole(size)
        return None if memory is None else native_restore.Target(memory=memory)
    if type(sink) is Comparer:
        where = sink._path
        return native_restore.Target(
            checked=sink.fd,
            differs=lambda at: MismatchError(f"differs from the original at byte {at}", path=where),
        )
    if type(sink) is FileSink:
        name = sink.path or None
        return native_restore.Target(
            output=sink.fd,
            checked=sink.fd if sink.read_back else -1,
            differs=lambda at: CorruptionError(
                f"restored file read back differs from what was written, at byte {at}", path=name
            ),
        )
    return None


#: Whether the GPU engine's restores to host sinks run in the native plane (else the loop),
#: and whether the portable bitstream's chunks go to its GPU there (else to its CPU threads).
NATIVE_GPU = True
NATIVE_GPU_ZSTD = True


def _native_gpu(engine: Engine, index: Index) -> native_restore.Gpu | None:
    """The GPU on which the native plane decodes for ``engine`` where it is the GPU engine
    (which has checked that CUDA and nvCOMP work there), or a CPU engine that brings one up
    for a bitstream only a GPU decodes; else None."""
    if not NATIVE_GPU:
        return None
    if type(engine) is HybridEngine and (index.chunks["codec"] == ANS.id).any() and engine.wait_for_gpu():
        engine = cast(Engine, engine.gpu)
    module = sys.modules.get("ckptz.engines.gpu.engine")  # not loaded: no GPU engine exists
    if module is None or type(engine) is not module.GpuEngine:
        return None
    from ckptz.engines.gpu.nvcomp_codecs import library_path

    gpu = cast("GpuEngine", engine)
    return native_restore.Gpu(gpu.index, library_path() or "", gpu.batch_bytes, zstd=NATIVE_GPU_ZSTD)


def _restore_natively(
    container: BinaryIO,
    path: str,
    index: Index,
    engine: Engine,
    sink: Sink,
    progress: Progress,
    gpu: native_restore.Gpu | None = None,
) -> tuple[Digest | None, FrameDecoder | None]:
    """Restore the whole file in one native call (decoding nvCOMP's bitstreams on ``gpu``)
    where the container and sink allow it; the digest of what was restored, or None where
    the Python loop must restore it, and the decoder it planned with (if it made one)."""
    target = _native_target(sink, index.source_size)
    if target is None or not native_restore.suits(index, gpu is not None):
        return None, None
    fd = container.fileno()
    with trace.span("plan"):
        decoder = FrameDecoder(fd, path, index, engine)
        tables = native_restore.plan(decoder, gpu is not None)
    if tables is None:
        return None, decoder
    with trace.span("native restore"):
        return native_restore.run(fd, path, decoder, tables, target, engine.threads, progress, gpu), decoder


def conclude(digest: Digest, index: Index, path: str, sink: Sink | None) -> None:
    """Once every frame of a file is in: the digest of what was
    restored must be the original's; then ``sink`` is finished.

    Raises:
        CorruptionError: the digests differ.
    """
    if digest != index.source_digest:
        raise CorruptionError("restored file does not match the original's digest", path=path)
    if sink is not None:
        sink.finish()


def _plan(
    container: BinaryIO,
    path: str,
    index: Index,
    engine: Engine,
    sink: Sink,
    workers: Workers | None,
    progress: Progress,
    decoder: FrameDecoder | None = None,
) -> _Restore:
    pools = workers or Workers.shared(engine.threads if engine.inline else 0)
    with trace.span("plan"):
        return _Restore(container.fileno(), path, index, engine, sink, pools, progress, decoder)


class _Restore:
    def __init__(
        self,
        fd: int,
        path: str,
        index: Index,
        engine: Engine,
        sink: Sink,
        workers: Workers,
        progress: Progress,
        decoder: FrameDecoder | None = None,
    ) -> None:
        self.fd, self.path, self.index, self.engine, self.sink = fd, path, index, engine, sink
        self.workers, self.progress = workers, progress
        self.decoder = decoder or FrameDecoder(fd, path, index, engine)
        self.frames = self.decoder.frames
        # Runs of frames read and decoded together (one frame each on a CPU engine).
        self.spans = self.decoder.spans(engine.span_bytes)
        self.data: list[Future[np.ndarray]] = [Future() for _ in self.frames]
        self.digest = Piecewise(index.source_digest.kind, index.source_size)
        # Once: a runtime protocol check walks the protocol's members on every call.
        self.places = isinstance(sink, DeviceSink)
        # Checks on the GPU where the sink keeps the whole file there (module docstring).
        self.on_device = (
            isinstance(engine, DeviceChecks)
            and self.places
            and index.source_digest.kind.tree
            and self.decoder.transform is None
            and cast(DeviceSink, sink).holds_on(engine.index, index.source_size)
        )
        # The engine hashes the digest's leaves inside each frame where it decodes it (on its
        # GPU), unless a transform changes the bytes after decoding.
        engine_leaves = (
            engine.hashes and not self.on_device and self.digest.kind.tree and self.decoder.transform is None
        )
        ordered = sink.write if isinstance(sink, _Ordered) else None
        runs = self.spans if engine_leaves else None
        self.file_digest = (
            None
            if self.on_device
            else FileDigest(self.digest, self.frames, self.data, self._release, runs, ordered)
        )
        self.leaf_table = self.file_digest.table if self.file_digest is not None and engine_leaves else None
        # Whether the digest reads the frames from ``data`` (else nothing does after the put).
        self.walked = self.file_digest is not None and self.file_digest.walks
        # Each decoded frame's users: the sink and the digest (the sink only when the digest
        # is taken on the GPU, from the sink's bytes).
        self.users = [1 if self.on_device else 2] * len(self.frames)
        self.lock = threading.Lock()
        room = slots_needed(len(self.frames), len(index.streams), engine.restore_ahead)
        self.room = threading.Semaphore(max([room, *(2 * len(s) for s in self.spans)]))
        self.failures = Failures()
        self.stopped = False
        # Every task queued on the shared threads for this file, all over before returning
        # (a late write could otherwise hit a descriptor number reused by another file).
        self.tasks: list[Future[None]] = []

    def run(self) -> Digest:
        """Restore every frame; return the digest of what the sink was given."""
        feeder = threading.Thread(target=self._feed, name="ckptz-feed", daemon=True)
        feeder.start()
        try:
            digest = self._device_digest() if self.file_digest is None else self.file_digest.result()
        except BaseException as exc:
            self._fail(exc)
            raise self.failures.first() from None
        finally:
            feeder.join()
            self._drain()
            if self.file_digest is not None:
                self.file_digest.close()  # the run freed as soon as it is dropped
        if self.failures:
            raise self.failures.first()
        return digest

    def _device_digest(self) -> Digest:
        """Once every frame is in the sink: the whole-file digest of the sink's bytes, its
        leaves hashed on the GPU where they lie."""
        for i in range(len(self.frames)):
            self.data[i].result()  # set once put (raises once another stage has failed)
        if self.failures:
            raise self.failures.first()
        sink, engine = cast(DeviceSink, self.sink), cast(DeviceChecks, self.engine)
        sink.finish()  # every copy into the sink is over
        with trace.span("digest leaves"):
            hashes = engine.leaf_hashes(sink.segments(), self.index.source_size, self.digest.kind.leaf)
        self.digest.hashes.set_many(np.arange(hashes.size, dtype=np.int64), hashes)
        return self.digest.digest()

    def _drain(self) -> None:
        """Wait for every queued task; a put is queued by a decode's callback, so repeat."""
        while True:
            with self.lock:
                pending = [t for t in self.tasks if not t.done()]
            if not pending:
                return
            wait(pending)

    def _fail(self, exc: BaseException) -> None:
        with self.lock:
            self.stopped = True
        self.failures.add(exc, self.data)
        if self.file_digest is not None:
            self.file_digest.fail(exc)
        self.room.release()  # wake the feeder, which then sees ``stopped``

    def _release(self, i: int) -> None:
        with self.lock:
            self.users[i] -= 1
            free = self.users[i] == 0
        if free:
            self.data[i] = _SPENT  # drop the decoded frame: memory stays at the frames in flight
            self.room.release()

    def _feed(self) -> None:
        for span in self.spans:
            for _ in span:  # room for every frame of the run
                with trace.span("wait room"):
                    self.room.acquire()
                if self.stopped:
                    return
            self.tasks.append(self.workers.read.submit(self._read, span))

    def _placer(self, span: range) -> Place | None:
        """For a sink that takes frames where a GPU decodes them: the run's ``k``-th frame to
        the sink's :meth:`~DeviceSink.place`."""
        if not self.places:
            return None
        sink = cast(DeviceSink, self.sink)
        return lambda k, device: sink.place(self.frames[span[k]], device)

    def _read(self, span: range) -> None:
        """Read and check a run of frames' payloads, and queue its decoding."""
        try:
            leaves = None
            if self.leaf_table is not None:
                _, frame, start, size, parts = self.leaf_table.span(span.start, span.stop)
                leaves = Ranges(frame, start, size, parts) if frame.size else None
            fut, buffer = self.decoder.start_span(span, self._placer(span), self.on_device, leaves)
            if fut.done():  # decoded in this thread (a CPU engine): checked and put from here too
                self._queue_puts(span, fut, buffer, here=True)
            else:
                fut.add_done_callback(lambda f: self._queue_puts(span, f, buffer))
        except BaseException as exc:
            self._fail(exc)

    def _queue_puts(
        self, span: range, fut: Future[DecodedSpan], buffer: np.ndarray | None, here: bool = False
    ) -> None:
        """Once a run is decoded: its checks and puts, in this thread (``here``: a reader,
        which spares a hand-over per frame) or writers' (:meth:`_shares`)."""
        if buffer is not None:  # decoded: the stored bytes are no longer needed
            self.engine.free_buffer(buffer)
        if here:
            if not self.stopped:
                self._put_run(span, fut, range(len(span)))
            return
        try:
            with self.lock:
                if self.stopped:  # a decode that ends after a failure: nothing to write
                    return
                for share in self._shares(span):
                    self.tasks.append(self.workers.write.submit(self._put_run, span, fut, share))
        except RuntimeError as exc:  # the pools were shut down: the run already failed
            self._fail(exc)

    def _take_leaves(self, span: range, fut: Future[DecodedSpan]) -> bool:
        """The digest's leaves the engine hashed inside the run; False once the run has
        failed. Taken by the task of the run's first share before it gives any of its frames,
        so the digest, which ends once every frame is given, has them by then."""
        if self.leaf_table is not None and fut.exception() is None:  # else each _put fails
            try:
                self.leaf_table.take(span, fut.result().leaves)
            except BaseException as exc:
                self._fail(exc)
                return False
        return True

    def _shares(self, span: range) -> list[range]:
        """A decoded run's frames (positions in the run) in shares of :data:`PUT_BYTES`, a
        writer task each; a sink that keeps nothing gets one task per run."""
        if isinstance(self.sink, DiscardSink):
            return [range(len(span))]
        out, start, size = [], 0, 0
        for k, i in enumerate(span):
            size += self.frames[i].length
            if size >= PUT_BYTES:
                out.append(range(start, k + 1))
                start, size = k + 1, 0
        if start < len(span):
            out.append(range(start, len(span)))
        return out

    def _put_run(self, span: range, fut: Future[DecodedSpan], share: range) -> None:
        """Check and put the run's frames at ``share``'s positions, then give them to the
        digest (at once: one call hashes their joins)."""
        if share.start == 0 and not self._take_leaves(span, fut):
            return
        given: list[tuple[int, np.ndarray]] = []
        for k in share:
            if not self._put(span[k], fut, k, given):
                return
        if self.file_digest is not None:
            try:
                self.file_digest.give(given)
            except BaseException as exc:
                self._fail(exc)

    def _put(self, i: int, fut: Future[DecodedSpan], k: int, given: list[tuple[int, np.ndarray]]) -> bool:
        """Check decoded frame ``i`` and hand it to the sink, and to ``given`` for the
        digest; False once the run has failed."""
        try:
            frame = self.frames[i]
            # The leaves are of the bytes the sink gets: the decoded ones, where no transform
            # changes them, hashed with the frame's checksum in one pass over them.
            fused = not self.on_device and self.leaf_table is None and self.decoder.transform is None
            hashed: list[bool] = []

            def hash_frame(data: np.ndarray) -> int:
                if data.size != frame.length:  # fails its check: no leaves of it
                    return checksum(data)
                hashed.append(True)
                return int(self.digest.hash_frames(frame.pieces, data, _WHOLE, np.array([data.size]))[0])

            with trace.span("check frame"):
                data = self.decoder.finish_span(i, fut, k, hash_frame if fused else checksum)
            if isinstance(data, OnDevice):  # checked on the GPU and placed there: nothing to put
                data = _SPENT.result()
            else:
                if not self.on_device and self.leaf_table is None and not hashed:  # else hashed already
                    with trace.span("digest leaves"):
                        self.digest.hash_whole(frame.pieces, data)  # the bytes the sink gets
                # The sink first: the digest, which ends the run, then waits for every frame's put.
                with trace.span("put"):
                    self.sink.put(frame, data)
            # The bytes only where the digest walks them: a frame it still waits on (a leaf
            # straddles it and a frame not decoded yet) would otherwise hold its decoded
            # span's whole buffer through ``data``, past the memory budget.
            self.data[i].set_result(data if self.walked else _SPENT.result())
            self.progress(self.frames[i].length)
            given.append((i, data))
            self._release(i)
        except BaseException as exc:
            self._fail(exc)
            return False
        return True


#: Where a frame's checksum starts in its bytes (:meth:`_Restore._put`).
_WHOLE = np.zeros(1, np.int64)
_SPENT: Future[np.ndarray] = Future()
_SPENT.set_result(np.zeros(0, np.uint8))


__all__ = [
    "Comparer",
    "DeviceSink",
    "DiscardSink",
    "FileSink",
    "Sink",
    "restore",
]
