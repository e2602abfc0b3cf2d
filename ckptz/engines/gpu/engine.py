"""The GPU engine: the pipeline's frames, batched into nvCOMP calls on one GPU.

``encode_span``/``decode_span`` (and the one-frame ``encode``/``decode``) queue a job and
return a future at once. Worker threads (two by default, each with its own CUDA stream,
scratch memory and nvCOMP codecs) take whatever jobs are queued, up to a batch of
:attr:`GpuEngine.batch_bytes`, and run them as one batch: each frame copied from the
pinned buffer its reader filled straight to its place in the coder's layout (a frame from
anywhere else through the worker's pinned staging buffer), the coder
(:mod:`ckptz.engines.gpu.coder`: split kernel, batched nvCOMP, gather into the container's
layout), one device→host copy of that block, then resolve the futures. A span's result
carries its slice of the block: its data area, as the container stores it, which the
pipeline writes and checksums in one call each. While one worker waits on its GPU work the
other copies, so copies and compute overlap across streams. Payloads handed back are views
of a private host copy of the block, so the staging buffers can be reused at once while the
pipeline writes at its own pace.

A restore hands over whole spans too (:meth:`GpuEngine.decode_span`): frames whose
payloads its reader read with one ``pread`` into a pinned buffer, where they already lie
16-byte aligned as the coder wants them. Such a span is a batch of its own, with no packing:
one host→device copy, the coder, one device→host copy back into the span's own buffer
(its payloads are on the device by then, and it holds the span's original bytes by its
size), so a restore keeps one pinned region per span in flight, all of one size. A caller
that wants the decoded frames on the device (``ckptz.load``) gets them there first, on the
worker's stream (``place``), so their copies need no wait of their own.

CUDA is reached through its driver (:mod:`ckptz.cuda`), nvCOMP through its C
API: the engine imports no torch, which would cost a GPU command 1.5-2 s of start-up.

Memory: each worker holds at most one batch on the device (input, planes, payload bounds,
block: about 4.1 × the batch) and about 2.5 × the batch of pinned host memory, so
``memory`` is split as ``batch_bytes = memory / (12 × workers)``, leaving room for nvCOMP's
scratch memory. The pipeline's look-ahead (:attr:`GpuEngine.look_ahead` frames; a restore's,
:attr:`GpuEngine.restore_ahead`, a third of ``memory``) comes on top, per file in flight.
All host buffers are leases from the process's pinned pool (:mod:`ckptz.engines.gpu.pinned`),
which pins fast and keeps them for the next file.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from ckptz import cuda, indices, trace
from ckptz.checksums import xxh3_64
from ckptz.codecs import PORTABLE
from ckptz.codecs.frames import EncodedChunk
from ckptz.container import StreamInfo
from ckptz.engines.base import (
    FRAME_SIZE,
    HOST_COMPONENTS,
    DecodedSpan,
    EncodedFrame,
    EncodedSpan,
    FrameToCode,
    OnDevice,
    Place,
    Ranges,
    SpanFrame,
    StoredChunk,
    StoredSpan,
    hash_ranges,
    payload_error,
    when_all,
)
from ckptz.engines.cpu import CpuEngine, decode_chunks
from ckptz.engines.gpu import hashing, kernels, literals, pinned
from ckptz.engines.gpu.coder import (
    ANS_ID,
    CONST_ID,
    GPU_CODECS,
    RAW_ID,
    ZSTD_ID,
    BatchLayout,
    FrameShape,
    decode_batch,
    encode_batch,
    padded_sizes,
    plan_batch,
)
from ckptz.engines.gpu.memory import Buf, DeviceBytes, DeviceScratch, Reused
from ckptz.engines.gpu.nvcomp_codecs import NAMES, NvcompCodecs, nvcomp_version
from ckptz.errors import CkptzError, CorruptionError

DEFAULT_MEMORY = 2 << 30
ANS_FRAME_SIZE = 4 << 20
#: The largest frame of the zstd literal frames (:mod:`ckptz.engines.gpu.literals`).
LITERAL_FRAME_SIZE = 16 << 20
MIN_BATCH = 1 << 20
MAX_BATCH = 256 << 20
#: How long a worker waits for a batch to fill before running what is queued.
BATCH_WAIT_S = 0.02
#: One CPU thread for a compression's decode-backs of the portable bitstream per this many
#: of the engine's threads (:meth:`GpuEngine._check_on_cpu`).
CHECKERS_PER = 4


def _shape(stream: StreamInfo, length: int) -> FrameShape:
    word = max(stream.word, 1)
    return FrameShape(word, stream.rotate and word > 1, length)


@dataclass(slots=True)
class _EncodeJob:
    """Frames to code: a span whose frames all lie in one pinned ``buffer`` (one copy to
    the device), or frames whose bytes lie anywhere (``buffer`` None)."""

    frames: list[FrameToCode]
    buffer: np.ndarray | None
    length: int
    leaves: Ranges | None = None
    future: Future[EncodedSpan] = field(default_factory=Future)


@dataclass(slots=True)
class _DecodeJob:
    """Frames to decode, as one table: a span (``alone``: a batch of its own), whose payloads
    were read into one pinned buffer or lie anywhere (packed by the worker), or one frame
    from :meth:`GpuEngine.decode`, batched with others; ``place`` takes each frame's device
    bytes (:data:`~ckptz.engines.base.Place`)."""

    span: StoredSpan
    length: int
    alone: bool
    place: Place | None = None
    keep: bool = False
    check: bool = False
    leaves: Ranges | None = None
    future: Future[DecodedSpan] = field(default_factory=Future)


_Job = _EncodeJob | _DecodeJob


class GpuEngine:
    """Frame coding on one GPU with nvCOMP; implements :class:`ckptz.engines.cpu.Engine`.

    Args:
        device_index: the CUDA device.
        codec: ``zstd`` (portable) or ``ans`` (GPU-only, fastest).
        memory: budget in bytes for pinned host and device buffers.
        threads: CPU threads for frames with CPU-only codecs; also sizes the pipeline's
            look-ahead.
        workers: batches in flight at once (each with its own CUDA stream).
    """

    #: Each frame's checksum and its digest leaves are taken on the device, from the bytes
    #: copied there (coding) or decoded there (restoring): the host hashes none of them.
    hashes = True
    #: Payloads are checked, and decoded frames' checksums taken, on the device.
    checks = True

    def __init__(
        self,
        device_index: int,
        *,
        codec: str = "zstd",
        memory: int | None = None,
        threads: int | None = None,
        workers: int = 2,
        level: int = 3,
    ) -> None:
        self.index = device_index
        self.device = f"cuda:{device_index}"
        self.workers = workers
        self.inline = False
        self.codec_id = ANS_ID if codec == "ans" else ZSTD_ID
        self.memory = memory or DEFAULT_MEMORY
        self.batch_bytes = min(MAX_BATCH, max(MIN_BATCH, self.memory // (12 * workers)))
        #: ANS codes 4 MiB frames (1 MiB planes) at about twice the speed of 1 MiB ones, at
        #: the same ratio, where the budget holds several per batch; so do the zstd literal
        #: frames, whose blocks are coded in parallel whatever the frame.
        big = self.batch_bytes >= 4 * ANS_FRAME_SIZE
        self.frame_size = ANS_FRAME_SIZE if big else FRAME_SIZE
        #: ANS keeps one size, since larger ANS frames code a little faster but cost ratio. The
        #: literal frames' blocks have tables of their own, so large streams get the CPU
        #: coder's 16 MiB frames, which code and restore faster at the same ratio.
        self.largest_frame = self.frame_size if self.codec_id == ANS_ID else LITERAL_FRAME_SIZE
        self.threads = max(4, threads or os.cpu_count() or 4)
        #: A restore hands over spans of about a batch: one read, one copy to the device.
        self.span_bytes = self.batch_bytes
        #: Frames a compression keeps in flight: enough to fill every worker's batch twice
        #: over, so batches run full instead of with whatever a slow reader queued (three
        #: spans per worker, were a restore to keep this many).
        self.look_ahead = max(4 * self.threads + 4, 3 * workers * self.batch_bytes // self.frame_size)
        #: A restore holds a span until every frame of it is written, and on tmpfs its
        #: writers wait on page faults, so with the look-ahead above few writers are busy. A
        #: restore therefore keeps a third of the budget in flight where that is more: a third
        #: keeps the peak memory within the budget (each span's output pages stay mapped until
        #: all of it is written, so memory grows twice as fast as the look-ahead), while
        #: compressions with more frames in flight wrote to tmpfs more slowly, so theirs stays.
        self.restore_ahead = max(self.look_ahead, self.memory // 3 // self.frame_size)
        self._jobs: deque[_Job] = deque()
        self._cv = threading.Condition()
        self._closed = False
        #: A file's last frames are queued: workers take what is queued without waiting.
        self._flush = False
        self._cpu = ThreadPoolExecutor(self.threads, thread_name_prefix="ckptz-gpu-cpu")
        #: CPU threads that take a compression's decode-backs of the portable bitstream off
        #: the queue when they get to one before a GPU worker does (:meth:`_check_on_cpu`).
        self._checkers = ThreadPoolExecutor(
            max(1, self.threads // CHECKERS_PER), thread_name_prefix="ckptz-gpu-check"
        )
        #: The CPU coder of :data:`HOST_COMPONENTS`' frames.
        self.host_coder = CpuEngine(1, level, measured_contexts=False)
        self._pinned = pinned.pool()
        # Stream, scratch and kernels for :meth:`leaf_hashes` (made on first use).
        self._side: tuple[cuda.Stream, DeviceScratch, kernels.CudaOps] | None = None
        self._side_lock = threading.Lock()
        self._ready = threading.Barrier(workers + 1)
        self._errors: list[BaseException] = []
        self._workers = [
            threading.Thread(target=self._run, name=f"ckptz-gpu-{i}", daemon=True) for i in range(workers)
        ]
        for t in self._workers:
            t.start()
        self._ready.wait()
        if self._errors:
            self.close()
            raise self._errors[0]

    # -- Engine protocol ------------------------------------------------------------------

    def encode(self, stream: StreamInfo, data: np.ndarray, checksum: int) -> Future[EncodedFrame]:
        """Queue one frame for coding (on the CPU threads: :data:`HOST_COMPONENTS`)."""
        if stream.component in HOST_COMPONENTS:
            return self._cpu.submit(lambda: self.host_coder.encode(stream, data, checksum).result())
        job = _EncodeJob([FrameToCode(stream, data, checksum)], None, data.size)
        self._put(job)
        out: Future[EncodedFrame] = Future()

        def done(fut: Future[EncodedSpan]) -> None:
            try:
                out.set_result(fut.result().frames[0])
            except BaseException as exc:
                out.set_exception(exc)

        job.future.add_done_callback(done)
        return out

    def encode_span(
        self, frames: list[FrameToCode], buffer: np.ndarray | None, leaves: Ranges | None = None
    ) -> Future[EncodedSpan]:
        """Queue a span: with ``buffer`` (pinned, from :meth:`host_buffer`, holding every
        frame), one host-to-device copy; the result's ``block`` is the span's data area.
        Checksums (frames without one) and ``leaves`` are hashed from the frames' bytes on
        the device. Frames of :data:`HOST_COMPONENTS` are coded on the CPU threads meanwhile
        (the span's payloads then lie anywhere, its leaves hashed on the host)."""
        host = [f.stream.component in HOST_COMPONENTS for f in frames]
        if not any(host):
            job = _EncodeJob(frames, buffer, sum(f.data.size for f in frames), leaves)
            self._put(job)
            return job.future
        on_gpu = [f for f, h in zip(frames, host, strict=True) if not h]
        parts: list[Future[EncodedSpan]] = [self._cpu.submit(self._encode_on_host, frames, host, leaves)]
        if on_gpu:
            parts.append(self.encode_span(on_gpu, buffer))

        def merge(done: list[Future[EncodedSpan]]) -> EncodedSpan:
            mine = done[0].result()
            gpu = iter(done[1].result().frames if on_gpu else [])
            coded = iter(mine.frames)
            return EncodedSpan([next(coded) if h else next(gpu) for h in host], None, mine.leaves)

        return when_all(parts, merge, fail_whole=True)

    def _encode_on_host(
        self, frames: list[FrameToCode], host: list[bool], leaves: Ranges | None
    ) -> EncodedSpan:
        """The span's frames of :data:`HOST_COMPONENTS` coded here (the CPU coder), and the
        span's ``leaves`` hashed."""
        coded = [
            self.host_coder.encode(
                f.stream, f.data, xxh3_64(f.data) if f.checksum is None else f.checksum
            ).result()
            for f, h in zip(frames, host, strict=True)
            if h
        ]
        return EncodedSpan(
            coded, None, None if leaves is None else hash_ranges([f.data for f in frames], leaves)
        )

    def decode(
        self, stream: StreamInfo, chunks: list[StoredChunk], length: int, where: str
    ) -> Future[np.ndarray]:
        """Queue one frame for decoding into host memory."""
        if any(c.codec not in GPU_CODECS for c in chunks):
            # A bitstream this engine has no GPU coder for (e.g. a newer CPU codec).
            return self._cpu.submit(decode_chunks, stream, chunks, length, where)
        job = _DecodeJob(StoredSpan.of([SpanFrame(stream, chunks, length, where, ())]), length, False)
        self._put(job)
        out: Future[np.ndarray] = Future()

        def done(fut: Future[DecodedSpan]) -> None:
            try:
                out.set_result(cast(np.ndarray, fut.result().frame(0)))  # not kept
            except BaseException as exc:
                out.set_exception(exc)

        job.future.add_done_callback(done)
        return out

    def decode_span(
        self,
        span: StoredSpan,
        place: Place | None = None,
        keep: bool = False,
        check: bool = False,
        leaves: Ranges | None = None,
    ) -> Future[DecodedSpan]:
        """Queue a span, a batch of its own: one host-to-device copy of its buffer (pinned,
        from :meth:`host_buffer`), and each frame decoded here handed to ``place`` on the
        device before the copy back to the host; with ``keep``, no copy back: each frame
        decoded here gives its checksum, taken on the device, instead. With ``check``, the
        payloads are checked on the device once copied there, before any is decoded.
        ``leaves`` are hashed from the decoded bytes where they were decoded."""
        job = _DecodeJob(span, int(span.lengths.sum()), True, place, keep, check, leaves)
        self._put(job)
        if _kind(job) == _CHECK and _portable(span):
            self._checkers.submit(self._check_on_cpu, job)
        return job.future

    def _check_on_cpu(self, job: _DecodeJob) -> bool:
        """Decode a compression's decode-back of the portable bitstream on this CPU thread
        (libzstd, as a CPU-only machine will), unless a GPU worker has taken it already.

        Those decode-backs run through the GPU's literal kernel, a stream a thread: in an
        in-place GPU compression they kept the GPU workers busy beside the coding while the
        CPU threads, which restore the portable bitstream well, sat idle. Whoever comes first
        takes the job from the queue, so each side takes what it has room for. The check is
        the same: each frame decoded from the payloads that are written, its length and
        checksum then compared by the caller (:meth:`DecodedSpan.measure`). Whether this
        thread took it."""
        with self._cv:
            for k, queued in enumerate(self._jobs):
                if queued is job:
                    del self._jobs[k]
                    break
            else:
                return False  # a GPU worker took it
            if not self._jobs:
                self._flush = False  # as when a worker takes the last job
        with trace.span("check on cpu"):  # the CPU coder decodes in this thread, frame by frame
            decoded = self.host_coder.decode_span(job.span)
        try:
            job.future.set_result(decoded.result())
        except BaseException as exc:
            job.future.set_exception(exc)
        return True

    def leaf_hashes(self, segments: Sequence[tuple[int, int, int]], size: int, leaf: int) -> np.ndarray:
        """A whole-file digest's leaves from bytes on this GPU
        (:meth:`~ckptz.engines.base.DeviceChecks.leaf_hashes`), hashed in the calling thread
        on a stream of the engine's own."""
        with self._side_lock:
            cuda.use_device(self.index)
            if self._side is None:
                stream, scratch = cuda.Stream(), DeviceScratch()
                self._side = (stream, scratch, kernels.CudaOps(self.index, stream.handle, scratch))
            _, scratch, ops = self._side
            try:
                return hashing.tree_leaves(ops, segments, size, leaf)
            finally:
                scratch.reset()

    def host_buffer(self, size: int) -> np.ndarray:
        """A pinned host buffer: readers fill it and a worker copies it to the device as it is."""
        return self._pinned.take(size)

    def free_buffer(self, buf: np.ndarray) -> None:
        """Nothing to do: a buffer from :meth:`host_buffer` goes back to the process's pinned
        pool by itself once the last view of it is gone."""

    def codec_config(self) -> dict[str, dict[str, object]]:
        """What each bitstream was written with (recorded in the container; ``zstd`` also by
        the CPU coder, for :data:`HOST_COMPONENTS`)."""
        return {
            "zstd": {
                "implementation": "ckptz-gpu-literals",
                "block": literals.BLOCK,
                "also": self.host_coder.codec_config()["zstd"],
            },
            "ans": {"implementation": "nvcomp", "data_type": "|u1", "nvcomp": nvcomp_version()},
        }

    def container_extras(self) -> dict[str, object]:
        """Merged into the container header: the nvCOMP version that wrote it."""
        return {"nvcomp": {"version": nvcomp_version(), "codec": NAMES[self.codec_id]}}

    def close(self) -> None:
        """Finish queued jobs, stop the workers and release the codecs."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        for t in self._workers:
            t.join()
        self._checkers.shutdown(wait=True)
        self._cpu.shutdown(wait=True)
        with self._side_lock:
            if self._side is not None:
                stream, scratch, _ = self._side
                with contextlib.suppress(cuda.DriverError):
                    cuda.use_device(self.index)
                    stream.synchronize()
                    scratch.close()
                    stream.close()
                self._side = None

    def __enter__(self) -> GpuEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- workers --------------------------------------------------------------------------

    def flush(self) -> None:
        with self._cv:
            self._flush = True
            self._cv.notify_all()

    def _put(self, job: _Job) -> None:
        with self._cv:
            if self._closed:
                raise RuntimeError("engine is closed")
            self._jobs.append(job)
            self._cv.notify()

    def _take(self) -> list[_Job] | None:
        """Block for a job, then take queued jobs of the same kind (:func:`_kind`) up to a
        batch."""
        with self._cv:
            while True:
                while not self._jobs:
                    if self._closed:
                        return None
                    self._cv.wait()
                if _kind(self._jobs[0]) == _SPAN:  # a batch of its own, read into one pinned buffer
                    return [self._jobs.popleft()]
                # nvCOMP needs thousands of chunks in flight to fill the GPU: a batch of a few
                # frames runs nearly serially. So wait briefly for the pipeline to queue more
                # (it stops queueing when its look-ahead is full, hence the time limit), unless
                # a file's last frames are queued (flush: at a file's end nothing more will
                # come, so waiting would only lengthen every compression's tail).
                deadline = time.monotonic() + BATCH_WAIT_S
                while (
                    not self._closed
                    and not self._flush
                    and sum(map(_job_bytes, self._jobs)) < self.batch_bytes
                ):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cv.wait(left)
                if self._jobs:  # another worker may have taken them while this one waited
                    break
            first = self._jobs.popleft()
            batch: list[_Job] = [first]
            size, kind, later = _job_bytes(first), _kind(first), []
            # Jobs of the kind from anywhere in the queue: a compression's checks (spans it
            # decodes back) come between its runs to code.
            while self._jobs and size < self.batch_bytes:
                job = self._jobs.popleft()
                n = _job_bytes(job)
                if _kind(job) == kind and size + n <= self.batch_bytes:
                    batch.append(job)
                    size += n
                else:
                    later.append(job)
            self._jobs.extendleft(reversed(later))
            if not self._jobs:
                self._flush = False  # what was flushed is taken
            return batch

    def _run(self) -> None:
        try:
            with trace.span("gpu context"):
                cuda.use_device(self.index)
            with trace.span("gpu kernels"):
                reason = kernels.available(self.index)
                if reason is not None:
                    raise RuntimeError(f"ckptz's CUDA kernels cannot run: {reason}")
                stream, scratch = cuda.Stream(), DeviceScratch()
                ops = kernels.CudaOps(self.index, stream.handle, scratch)
            with trace.span("gpu nvcomp"):
                codecs = literals.LiteralCodecs(NvcompCodecs(ops), ops, self._cpu, max(1, self.threads // 4))
                w = _Worker(ops, codecs, stream, scratch, _Staging())
        except BaseException as exc:
            self._errors.append(exc)
            self._ready.wait()
            return
        self._ready.wait()
        try:
            while True:
                with trace.span("wait jobs"):
                    jobs = self._take()
                if jobs is None:
                    break
                # The last batch is over (its stream synchronised): its buffers are free.
                w.staging.reset()
                w.scratch.reset()
                try:
                    if isinstance(jobs[0], _EncodeJob):
                        self._encode(w, jobs)  # type: ignore[arg-type]
                    else:
                        self._decode(w, jobs)  # type: ignore[arg-type]
                except BaseException as exc:
                    for j in jobs:
                        if not j.future.done():
                            j.future.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
        finally:
            with contextlib.suppress(cuda.DriverError):
                w.stream.synchronize()
                w.scratch.close()
                w.stream.close()

    def _encode(self, w: _Worker, jobs: list[_EncodeJob]) -> None:
        frames = [f for j in jobs for f in j.frames]
        layout = plan_batch([_shape(f.stream, f.data.size) for f in frames])
        with trace.span("upload"):
            data = self._upload(w, frames, layout)
        # Checksums and leaves asked for, hashed from the frames as copied here, queued ahead
        # of the coding; read once the block is back (the stream is idle by then).
        firsts = np.cumsum([0, *(len(j.frames) for j in jobs)])
        asked = _Hashes(
            w.ops,
            data.ptr + np.array(layout.data_offsets, np.uint64),
            np.array([f.data.size for f in frames], np.uint64),
            np.array([f.checksum is None for f in frames]),
            [
                (int(first), j.leaves)
                for first, j in zip(firsts[:-1], jobs, strict=True)
                if j.leaves is not None
            ],
        )
        queued = w.ops.queue_xxh3(asked.ptrs, asked.lengths, "frame_hashes")
        batch = encode_batch(w.codecs, w.ops, self.codec_id, data, layout)
        # The payloads' checksums, of the very bytes coded, taken while they are here.
        payloads = w.ops.queue_xxh3(
            batch.block.ptr + batch.offset.astype(np.uint64), batch.size.astype(np.uint64), "payload_hashes"
        )
        hashes = w.ops.queue_download(queued, np.uint64)  # in by the end of the copy back
        payload_sums = w.ops.queue_download(payloads, np.uint64)
        # One copy back: the batch's payloads, already laid out as the container stores them.
        with trace.span("to host"):
            host = _to_host(batch.block, w.ops)
        sums, leaves = asked.split(hashes.copy())
        payload_sums = payload_sums.copy()
        by_job = iter(leaves)
        view = memoryview(host)  # type: ignore[arg-type]
        codec, size, offset = batch.codec.tolist(), batch.size.tolist(), batch.offset.tolist()
        end = (batch.offset + padded_sizes(batch.size)).tolist()
        raw = batch.table.raw_size.tolist()
        c = m = 0  # chunks in frame-then-plane order, and frames, jobs one after another
        for j in jobs:
            first, coded = c, []
            for x in j.frames:
                n = max(x.stream.word, 1)
                chunks = [
                    EncodedChunk(codec[k], raw[k], view[offset[k] : offset[k] + size[k]])  # type: ignore[arg-type]
                    for k in range(c, c + n)
                ]
                checksum = x.checksum if x.checksum is not None else sums[m]
                assert checksum is not None  # asked for where not given
                coded.append(EncodedFrame(checksum, chunks))
                c += n
                m += 1
            # A job's chunks lie back to back in the block: the container's data area for
            # its frames.
            block = host[offset[first] : end[c - 1]] if c > first else host[:0]
            j.future.set_result(
                EncodedSpan(
                    coded, block, next(by_job) if j.leaves is not None else None, payload_sums[first:c]
                )
            )

    def _upload(self, w: _Worker, frames: list[FrameToCode], layout: BatchLayout) -> Buf:
        """The batch's frames on the device, laid out as ``layout`` says: each copied from
        the pinned buffer its reader filled (or through the staging buffer, from anywhere
        else) straight to its place."""
        data = w.ops.scratch("frames", max(layout.data_bytes, 1))
        for x, at in zip(frames, layout.data_offsets, strict=True):
            src = x.data
            if not self._pinned.holds(src):  # not one of this engine's buffers: a pinned copy first
                src = w.staging.take(x.data.size)
                src[:] = x.data
            cuda.copy_to_device(data.ptr + at, src.ctypes.data, src.size, w.ops.stream)
        return data.at(0, layout.data_bytes)

    def _decode(self, w: _Worker, jobs: list[_DecodeJob]) -> None:
        t = _Table(jobs)
        # Each frame's result, job by job: host bytes or an error.
        results: list[list[np.ndarray | OnDevice | BaseException]] = [[_NOT_YET] * len(j.span) for j in jobs]
        taken: list[list[int | None]] = [[None] * len(j.span) for j in jobs]
        # Each job's leaves asked for, and which of them the GPU hashed.
        hashed = [np.zeros(0 if j.leaves is None else j.leaves.count, np.uint64) for j in jobs]
        done = [np.zeros(h.size, bool) for h in hashed]
        cpu: list[tuple[int, int, Future[np.ndarray]]] = []
        # Frames whose chunks do not fit them (nvCOMP assumes well-formed input) fail; those
        # with a bitstream that has no GPU coder (e.g. a newer CPU codec) the CPU threads
        # check and decode meanwhile.
        malformed = t.malformed()
        elsewhere = malformed | t.off_gpu()
        for f in np.flatnonzero(elsewhere).tolist():
            n, k = t.job_of[f], t.k_of[f]
            frame = jobs[n].span.frame(k)
            refused = _chunk_error(frame) if malformed[f] else payload_error(frame) if jobs[n].check else None
            if refused is not None:
                results[n][k] = refused
                continue
            cpu.append(
                (n, k, self._cpu.submit(decode_chunks, frame.stream, frame.chunks, frame.length, frame.where))
            )
        gpu = np.flatnonzero(~elsewhere)
        if gpu.size:
            try:
                self._decode_on_gpu(w, jobs, t, gpu, results, taken, (hashed, done), spare=not cpu)
            except CkptzError as exc:
                f = int(gpu[0])
                error = CorruptionError(f"{t.name(f)} does not decode ({exc.message})")
                for f in gpu.tolist():
                    results[t.job_of[f]][t.k_of[f]] = error
        for n, k, fut in cpu:
            failed = fut.exception()
            # A copy: the decoded bytes may be a view of a stored payload in the span's buffer,
            # which its reader reuses once the span is done.
            results[n][k] = failed if failed is not None else np.array(fut.result(), copy=True)
        for n, j in enumerate(jobs):
            leaves = None
            if j.leaves is not None:  # those with a part in a frame decoded on the CPU: here
                rest = np.flatnonzero(~done[n])
                if rest.size:
                    hashed[n][rest] = hash_ranges(results[n], j.leaves.pick(rest))
                leaves = hashed[n]
            j.future.set_result(DecodedSpan(results[n], taken[n], leaves))

    def _decode_on_gpu(
        self,
        w: _Worker,
        jobs: list[_DecodeJob],
        t: _Table,
        gpu: np.ndarray,
        results: list[list[np.ndarray | OnDevice | BaseException]],
        taken: list[list[int | None]],
        leaves: tuple[list[np.ndarray], list[np.ndarray]],
        spare: bool = False,
    ) -> None:
        """Decode frames ``gpu`` of the batch's table in one batch (``spare``: no CPU thread
        reads the span's buffer meanwhile, so the frames may come back into it), filling in
        each frame's result, its checksum, and the hashes of the leaves of the jobs taken
        here (``leaves``: each job's hashes, and which of them were taken)."""
        rows = t.rows(gpu)
        codec = t.codec[rows]
        const = codec == CONST_ID
        size = np.where(const, 0, t.size[rows])
        buffer = t.buffer if t.buffer is not None and self._pinned.holds(t.buffer) else None
        if buffer is not None:
            # A span: its payloads already lie 16-byte aligned in pinned memory, as the
            # container stores them. One copy moves them all.
            offset = t.at[rows]
            end = min(int((offset + padded_sizes(size)).max(initial=1)), buffer.size)
            host = buffer[:end]
        elif t.buffers:
            # Spans in buffers other than this engine's pinned ones, or several spans (a
            # compression's decode-backs, batched): the buffers laid end to end in pinned
            # staging, a copy each, then one copy moves them all.
            offset = t.at[rows]
            total = max(int(t.base[-1]) + t.buffers[-1].size, 1)
            host = w.staging.get("in", total)[:total]
            for b, at in zip(t.buffers, t.base.tolist(), strict=True):
                host[at : at + b.size] = b
        else:
            padded = padded_sizes(size)
            offset = np.cumsum(padded) - padded
            total = max(int(padded.sum()), 1)
            host = w.staging.get("in", total)[:total]
            for c, o, n in zip(rows.tolist(), offset.tolist(), size.tolist(), strict=True):
                if n:
                    host[o : o + n] = np.frombuffer(t.payload(c), dtype=np.uint8)
        const_value = np.zeros(rows.size, np.int64)
        if t.buffers:  # every payload at its offset: in the span's buffer, or packed
            # (``host`` ends at the last coded payload: a constant chunk's byte may lie after)
            const_value[const] = (host if buffer is None else buffer)[offset[const]]
        else:
            const_value[const] = [t.payload(c)[0] for c in rows[const].tolist()]
        payloads = w.ops.scratch("payloads", host.size)
        cuda.copy_to_device(payloads.ptr, host.ctypes.data, host.size, w.ops.stream)
        if any(j.check for j in jobs):  # before decoding: nvCOMP assumes well-formed input
            with trace.span("check payloads"):
                good = self._check_payloads(
                    w, jobs, t, gpu, rows, payloads.ptr + offset, const_value, results
                )
            if not good.all():
                keep = np.repeat(good, t.counts[gpu])
                gpu, rows = gpu[good], rows[keep]
                codec, size, offset, const_value = codec[keep], size[keep], offset[keep], const_value[keep]
                if not gpu.size:
                    return
        frames = gpu.tolist()
        job_of = [t.job_of[f] for f in frames]
        k_of = [t.k_of[f] for f in frames]
        lengths = t.lengths[gpu]
        layout = plan_batch([_shape(t.streams[f], n) for f, n in zip(frames, lengths.tolist(), strict=True)])
        data = decode_batch(w.codecs, w.ops, payloads, layout, codec, offset, size, const_value, host)
        with trace.span("place"):
            for n, k, off, length in zip(job_of, k_of, layout.data_offsets, lengths.tolist(), strict=True):
                place = jobs[n].place
                if place is not None:  # queued on this stream: over before the copy back
                    place(k, DeviceBytes(data.at(off, length), self.index, w.ops.stream))
        # Each frame's checksum, taken where it was decoded: for frames that stay on the
        # device, and for those of a restore (``check``), whose host copy the whole-file
        # digest then covers byte for byte; and the leaves of that digest asked for.
        stays = all(j.keep for j in jobs)
        whole = stays or any(j.check for j in jobs)
        # A job's leaves, by frame of the job, to frames of this batch.
        place_of = [np.full(len(j.span), -1, np.int64) for j in jobs]
        for m, (n, k) in enumerate(zip(job_of, k_of, strict=True)):
            place_of[n][k] = m
        picks, wanted = [], []
        for n, j in enumerate(jobs):
            if j.leaves is not None and not stays:  # those with every part decoded here
                pick = j.leaves.within(place_of[n] >= 0)
                picks.append((n, pick))
                wanted.append((0, j.leaves.pick(pick, place_of[n])))
        asked = _Hashes(
            w.ops,
            data.ptr + np.array(layout.data_offsets, np.uint64),
            lengths.astype(np.uint64),
            np.full(len(frames), whole),
            wanted,
        )
        if stays:  # the frames stay on the device: their checksums only
            with trace.span("checksums"):
                sums, _ = asked.split(w.ops.xxh3(asked.ptrs, asked.lengths))
            for n, k, length, checksum in zip(job_of, k_of, lengths.tolist(), sums, strict=True):
                assert checksum is not None
                results[n][k] = OnDevice(length, checksum)
            return
        hashes = w.ops.queue_download(w.ops.queue_xxh3(asked.ptrs, asked.lengths, "frame_hashes"), np.uint64)
        with trace.span("to host"):
            # A span's frames come back into its own pinned buffer, whose payloads are on the
            # device by now (copies on one stream run in order): it holds the span's original
            # bytes by its size, and one region per span keeps the pinned pool to one size.
            fits = spare and buffer is not None and int(data.size) <= buffer.size
            view = _to_host(data, w.ops, buffer if fits else None)
        sums, joined = asked.split(hashes.copy())
        for m, (n, k, off, length) in enumerate(
            zip(job_of, k_of, layout.data_offsets, lengths.tolist(), strict=True)
        ):
            results[n][k] = view[off : off + length]
            taken[n][k] = sums[m]
        hashed, done = leaves
        for (n, pick), got in zip(picks, joined, strict=True):
            hashed[n][pick] = got
            done[n][pick] = True

    @staticmethod
    def _check_payloads(
        w: _Worker,
        jobs: list[_DecodeJob],
        t: _Table,
        gpu: np.ndarray,
        rows: np.ndarray,
        addresses: np.ndarray,
        const_value: np.ndarray,
        results: list[list[np.ndarray | OnDevice | BaseException]],
    ) -> np.ndarray:
        """Check the payloads (chunks ``rows`` of frames ``gpu``) of the jobs that ask for
        it, on the device where they were copied (``addresses``; a constant chunk by its
        byte); a frame that fails gets its error in ``results``, naming its first chunk that
        does. Whether each frame passed."""
        codec = t.codec[rows]
        const = codec == CONST_ID
        lengths = np.where(const, 0, t.size[rows]).astype(np.uint64)
        sums = w.ops.xxh3(addresses.astype(np.uint64), lengths)
        sums[const] = _ONE_BYTE_SUMS[const_value[const]]
        asked = np.array([jobs[n].check for n in t.job_of], bool)[t.frame_of[rows]]
        bad = (sums != t.checksum[rows]) & asked
        if not bad.any():
            return np.ones(gpu.size, bool)
        place = np.repeat(np.arange(gpu.size), t.counts[gpu])
        failed = np.bincount(place[bad], minlength=gpu.size) > 0
        for m in np.flatnonzero(failed).tolist():
            f = int(gpu[m])
            first = int(rows[np.flatnonzero(bad & (place == m))[0]])
            results[t.job_of[f]][t.k_of[f]] = CorruptionError(
                f"stored bytes of {t.name(f)} fail their checksum", chunk=int(t.index[first])
            )
        return ~failed


class _Table:
    """The chunk tables of a batch's jobs (:class:`~ckptz.engines.base.StoredSpan`) as one:
    their frames one after another, and their chunks."""

    def __init__(self, jobs: list[_DecodeJob]) -> None:
        spans = [j.span for j in jobs]
        self._spans = spans
        counts = [len(s) for s in spans]
        self.frames = sum(counts)
        self.job_of = [n for n, c in enumerate(counts) for _ in range(c)]
        self.k_of = [k for c in counts for k in range(c)]
        self.streams = [x for s in spans for x in s.streams]
        self.lengths = _cat([s.lengths for s in spans], np.int64)
        self.counts = _cat([np.diff(s.bounds) for s in spans], np.int64)
        self.bounds = np.concatenate([[0], np.cumsum(self.counts)])
        #: The frame each chunk belongs to.
        self.frame_of = np.repeat(np.arange(self.frames), self.counts)
        chunks = [s.index.size for s in spans]
        self._chunk_job = np.repeat(np.arange(len(spans)), chunks)
        self._chunk_base = np.repeat(np.cumsum(chunks) - chunks, chunks)
        self.index = _cat([s.index for s in spans], np.int64)
        self.codec = _cat([s.codec for s in spans], np.int64)
        self.raw_size = _cat([s.raw_size for s in spans], np.int64)
        self.size = _cat([s.size for s in spans], np.int64)
        self.checksum = _cat([s.checksum for s in spans], np.uint64)
        # Spans whose payloads lie in buffers (one each): their places in those buffers laid
        # end to end, each from a 16-byte aligned start (``base``).
        buffered = bool(spans) and all(s.payloads is None for s in spans)
        self.buffers = [s.buffer for s in spans] if buffered else []
        room = padded_sizes(np.array([b.size for b in self.buffers], np.int64))
        self.base = np.cumsum(room) - room
        self.at = _cat(
            [s.at + b for s, b in zip(spans, self.base.tolist(), strict=True)] if buffered else [], np.int64
        )
        #: One span's buffer, where the batch is one span.
        self.buffer = self.buffers[0] if len(self.buffers) == 1 else None

    def rows(self, frames: np.ndarray) -> np.ndarray:
        """The chunks of ``frames`` (ascending), in order."""
        return indices.runs(self.bounds[frames], self.counts[frames])

    def malformed(self) -> np.ndarray:
        """By frame: whether its chunks do not fit it (:func:`_chunk_error` says how)."""
        words = np.array([max(s.word, 1) for s in self.streams], np.int64)
        of = self.frame_of
        bad = (
            (self.raw_size * self.counts[of] != self.lengths[of])
            | ((self.codec == CONST_ID) & (self.size != 1))
            | ((self.codec == RAW_ID) & (self.size != self.raw_size))
        )
        return (self.counts != words) | (np.bincount(of[bad], minlength=self.frames) > 0)

    def off_gpu(self) -> np.ndarray:
        """By frame: whether a chunk of it has a bitstream without a GPU coder."""
        off = ~np.isin(self.codec, list(GPU_CODECS))
        return np.bincount(self.frame_of[off], minlength=self.frames) > 0

    def payload(self, c: int) -> memoryview:
        """Chunk ``c``'s payload."""
        return self._spans[int(self._chunk_job[c])].payload(c - int(self._chunk_base[c]))

    def name(self, f: int) -> str:
        """How errors name frame ``f``."""
        return self._spans[self.job_of[f]].names(self.k_of[f])


def _cat(arrays: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)


#: The xxh3_64 of each one-byte payload (a constant chunk's), by its byte.
_ONE_BYTE_SUMS = np.array([xxh3_64(bytes([v])) for v in range(256)], np.uint64)


@dataclass(slots=True)
class _Worker:
    """What one worker thread codes with: its device (kernels, scratch memory, stream), the
    batched codecs on it (ckptz's zstd literal frames, nvCOMP for the rest), and its pinned
    staging buffers."""

    ops: kernels.CudaOps
    codecs: literals.LiteralCodecs
    stream: cuda.Stream
    scratch: DeviceScratch
    staging: _Staging


class _Staging:
    """A worker's pinned host buffers, kept between batches (pinning memory is slow: a fresh
    pinned buffer per batch cost more than the batch's coding)."""

    def __init__(self) -> None:
        # A buffer replaced mid-batch is kept until reset: bytes staged in it may still be on
        # their way to the device, so the pool must not hand it out again before then.
        self._buffers: Reused[np.ndarray] = Reused(pinned.pool().take)
        self._used = 0

    def get(self, name: str, size: int) -> np.ndarray:
        """A pinned uint8 array of at least ``size`` bytes (its contents are undefined)."""
        return self._buffers.get(name, size)

    def take(self, size: int) -> np.ndarray:
        """The next ``size`` bytes of the ``in`` buffer, until :meth:`reset` (a batch's
        frames staged one after another)."""
        buf = self.get("in", self._used + size)
        out = buf[self._used : self._used + size]
        self._used += size
        return out

    def reset(self) -> None:
        """Start a batch (the worker calls it once the last one is over, its copies done):
        buffers replaced during the last one go back to the pool."""
        self._used = 0
        self._buffers.reset()


def _to_host(data: Buf, ops: kernels.CudaOps, into: np.ndarray | None = None) -> np.ndarray:
    """Copy a batch's device bytes into a pinned lease (or the start of ``into``, pinned
    memory the batch may reuse) and wait for them (and for everything queued on the stream
    before).

    The frames handed out are views of it and outlive the batch (the pipeline writes them
    later): the pool takes the memory back once the last view is gone, so there is no
    second copy, and no pinning per batch once the pool holds what is in flight.
    """
    host = pinned.pool().take(data.size) if into is None else into[: data.size]
    cuda.copy_to_host(host.ctypes.data, data.ptr, data.size, ops.stream)
    ops.synchronize()
    return host


def _chunk_error(j: SpanFrame) -> CorruptionError:
    """The error of a frame whose chunks do not fit it (:meth:`_Table.malformed`), naming
    what is wrong first: their count or sizes, a constant chunk not of one byte, or a stored
    chunk not of its plane's size."""
    first = j.chunks[0].index if j.chunks else None
    if len(j.chunks) != max(j.stream.word, 1) or any(
        c.raw_size * len(j.chunks) != j.length for c in j.chunks
    ):
        return CorruptionError(f"{j.where} has malformed chunks", chunk=first)
    for c in j.chunks:
        if c.codec == CONST_ID and len(c.payload) != 1:
            return CorruptionError(f"{j.where}: constant chunk of {len(c.payload)} bytes", chunk=c.index)
        if c.codec == RAW_ID and len(c.payload) != c.raw_size:
            return CorruptionError(f"{j.where}: stored chunk of the wrong size", chunk=c.index)
    return CorruptionError(f"{j.where} has malformed chunks", chunk=first)


class _Hashes:
    """The ranges of a batch's frames hashed on the device, in one call: each frame whole
    where ``whole`` says, then each set of ``leaves`` ranges (:class:`~ckptz.engines.base.Ranges`,
    their frames counted from the given first frame of the batch). A range in parts is first
    joined in scratch memory (a copy queued on the stream now).

    Args:
        ops: the worker's device.
        addresses: each frame's device address (uint64).
        lengths: its bytes (uint64).
        whole: whether its checksum is wanted.
        leaves: (first frame, ranges) for each set of ranges wanted.
    """

    def __init__(
        self,
        ops: kernels.CudaOps,
        addresses: np.ndarray,
        lengths: np.ndarray,
        whole: np.ndarray,
        leaves: list[tuple[int, Ranges]],
    ) -> None:
        entire = np.flatnonzero(whole)
        self._slots = np.full(len(addresses), -1, np.int64)
        self._slots[entire] = np.arange(entire.size)
        ptrs, sizes, self._ends = [addresses[entire]], [lengths[entire]], [entire.size]
        for first, r in leaves:
            at = addresses[r.frame + first] + r.start.astype(np.uint64)
            size = r.size.astype(np.uint64)
            if r.parts is None or not (r.parts > 1).any():
                ptrs.append(at)
                sizes.append(size)
            else:  # joined: the range's hash is of its parts, copied one after another
                firsts = np.cumsum(r.parts) - r.parts
                ptrs.append(at[firsts])
                sizes.append(np.add.reduceat(size, firsts))
                self._join(ops, ptrs[-1], sizes[-1], r.parts, at, size)
            self._ends.append(self._ends[-1] + r.count)
        self.ptrs = np.concatenate(ptrs)
        self.lengths = np.concatenate(sizes)

    def _join(
        self,
        ops: kernels.CudaOps,
        ptrs: np.ndarray,
        sizes: np.ndarray,
        parts: np.ndarray,
        at: np.ndarray,
        size: np.ndarray,
    ) -> None:
        """Queue the copies that join each range of more than one part into scratch memory
        (``at``/``size``: every part), and point ``ptrs`` there."""
        multi = np.flatnonzero(parts > 1)
        slots = np.cumsum(sizes[multi]) - sizes[multi]
        room = ops.scratch(f"joined{len(self._ends)}", max(int(sizes[multi].sum()), 1))
        counts = parts[multi]
        firsts = (np.cumsum(parts) - parts)[multi]
        rows = indices.runs(firsts, counts)
        # Each part's place in its range's slot: the slot, plus the parts before it.
        before = np.cumsum(size[rows]) - size[rows]
        before -= np.repeat(before[np.cumsum(counts) - counts], counts)
        dst = np.uint64(room.ptr) + np.repeat(slots, counts) + before
        ops.copy_ranges(at[rows], dst, size[rows])
        ptrs[multi] = np.uint64(room.ptr) + slots

    def split(self, got: np.ndarray) -> tuple[list[int | None], list[np.ndarray]]:
        """The hashes of one call: each frame's checksum (None where not asked), and the
        hashes of each set of leaves."""
        sums = got[: self._ends[0]].tolist()
        return (
            [sums[slot] if slot >= 0 else None for slot in self._slots.tolist()],
            [got[a:b] for a, b in itertools.pairwise(self._ends)],
        )


def _job_bytes(job: _Job) -> int:
    return job.length


#: Kinds of job that share a batch (:func:`_kind`).
_ENCODE, _DECODE, _SPAN, _CHECK = range(4)


def _kind(job: _Job) -> int:
    """Which jobs a batch may hold together: runs to code; frames to decode; a span (read
    into its pinned buffer, restored with places, leaves or checks of its own) alone; spans
    of the portable bitstream decoded only for their checksums (a compression's decode-back,
    :meth:`GpuEngine.decode_span` with ``keep``), with each other. Its literal kernel decodes
    a stream a thread, and one frame has too few streams to fill the GPU, so batching them
    shortens an in-place compression. ``ans`` frames fill the GPU alone, and batching them,
    which copies each block once more on the host, made it longer."""
    if not isinstance(job, _DecodeJob):
        return _ENCODE
    if not job.alone:
        return _DECODE
    only_checked = job.keep and job.place is None and job.leaves is None and not job.check
    if only_checked and bool((job.span.codec == ZSTD_ID).any()):
        return _CHECK
    return _SPAN


def _portable(span: StoredSpan) -> bool:
    """Whether every chunk of ``span`` has a CPU decoder."""
    return bool(np.isin(span.codec, list(PORTABLE)).all())


_NOT_YET = np.zeros(0, np.uint8)


__all__ = ["DEFAULT_MEMORY", "BatchLayout", "GpuEngine"]
