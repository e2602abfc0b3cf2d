"""The portable bitstream on a GPU machine: CPU threads first, the GPU when it pays.

On a many-core machine the CPU coder writes the portable bitstream several times faster than
nvCOMP Zstd codes the same planes end to end, and bringing a GPU up (the CUDA context,
nvCOMP's library and the cached kernels) takes a fraction of a second that a small job
never repays.

A GPU named (``--device cuda``) opens the GPU engine, which writes and decodes the portable
bitstream itself (:func:`ckptz.engines.engine_kind`). Runs with ``--device auto``, where
nvCOMP is installed, open :class:`HybridEngine`: it codes on the CPU threads
from the first frame, and starts bringing the GPU up in the background only once a job has
coded :data:`GPU_JOIN_BYTES` (a job long enough to repay the bring-up). Once up, each
direction (:class:`Lane`) gives the GPU a first window of frames, and keeps giving it
frames only if it coded them faster than the CPU threads do. Each chunk records its own
bitstream, so frames from either coder sit side by side in one container, and any machine
decodes it. ANS chunks, which only a GPU decodes, bring the GPU up at once and wait for it.

A job that ends while the GPU is coming up does not wait for it: :meth:`HybridEngine.close`
leaves the bring-up to finish in the background (an exit handler waits for it, so the
interpreter never stops in the middle of an import; the CLI leaves at once through
:func:`bring_up_pending`).
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from ckptz.codecs import codec_name
from ckptz.codecs.table import by_id
from ckptz.container import StreamInfo
from ckptz.engines.base import (
    DecodedSpan,
    EncodedFrame,
    EncodedSpan,
    Engine,
    FrameToCode,
    Place,
    Ranges,
    StoredChunk,
    StoredSpan,
    decode_each,
    encode_each,
)
from ckptz.engines.cpu import CpuEngine
from ckptz.errors import CkptzError, CodecUnavailableError, DeviceError

#: Bytes a job codes on the CPU before the GPU is brought up: seconds of the CPU coder on
#: many cores, so the bring-up is a small fraction of the job it may speed up.
GPU_JOIN_BYTES = 32 << 30


_pending: list[threading.Thread] = []
#: What each direction on each GPU measured in this process: later engines start from it
#: rather than measuring again (the GPU brought up only to lose the race would cost its
#: start-up and first window on every call).
_verdicts: dict[tuple[str, str], bool] = {}
_T = TypeVar("_T")


@dataclass(slots=True)
class Lane:
    """How one direction (``encode`` or ``decode``) shares frames, measured as it runs.

    The GPU gets a first window of frames; when they are done, its rate over that window is
    held against the CPU threads' combined rate, and the GPU keeps getting frames only if it
    is the faster of the two. A coder slower than the CPU only holds frames the in-order
    writer then waits for (as nvCOMP Zstd is, on this bitstream, against many CPU cores).
    """

    name: str
    cpu_bytes: int = 0
    cpu_seconds: float = 0.0
    gpu_done: int = 0
    gpu_start: float = 0.0
    gpu_end: float = 0.0
    gpu_on: bool = True
    gpu_rate: float | None = None
    cpu_rate: float | None = None


def bring_up_pending() -> bool:
    """Whether a GPU bring-up is still running (the CLI then exits without waiting)."""
    return any(t.is_alive() for t in _pending)


@atexit.register
def _wait_for_bring_up() -> None:
    for t in _pending:
        t.join()


class HybridEngine:
    """CPU threads and one GPU coding the portable bitstream together (module docstring).

    Args:
        cpu: the CPU engine; frames are coded in the caller's thread when the GPU is not
            up or is busy.
        start_gpu: opens the GPU engine (runs in a background thread).
        required: the GPU was asked for explicitly: if it cannot start, coding fails with
            its :class:`~ckptz.errors.DeviceError` rather than going on without it.
    """

    inline = True
    span_bytes = 0
    #: Most frames are coded on the CPU threads, whose readers hash a run at once.
    hashes = False
    checks = False

    def __init__(self, cpu: CpuEngine, start_gpu: Callable[[], Engine], *, required: bool) -> None:
        self.cpu = cpu
        self.threads = cpu.threads
        self.frame_size = cpu.frame_size
        self.largest_frame = cpu.largest_frame
        self.look_ahead = cpu.look_ahead
        self.required = required
        self._gpu: Engine | None = None
        self._gpu_name = "cuda"
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._queued = 0  # bytes queued on the GPU
        self._limit = 0
        self.lanes = {name: Lane(name) for name in ("encode", "decode")}
        self._closed = False
        self.frames = {"cpu": 0, "gpu": 0}
        self._up = threading.Event()
        self._start_gpu: Callable[[], Engine] | None = start_gpu
        self._seen = 0  # bytes coded so far, until the bring-up starts
        self.join_after = GPU_JOIN_BYTES

    @property
    def restore_ahead(self) -> int:
        """The CPU threads' (which decode the portable bitstream)."""
        return self.cpu.restore_ahead

    def _start(self) -> None:
        """Start bringing the GPU up (once)."""
        with self._lock:
            start, self._start_gpu = self._start_gpu, None
        if start is None:
            return
        thread = threading.Thread(target=self._bring_up, args=(start,), name="ckptz-gpu-up", daemon=True)
        _pending.append(thread)
        thread.start()

    def _count(self, nbytes: int) -> None:
        """Count a frame's bytes; start the bring-up once a job has coded :attr:`join_after`."""
        if self._start_gpu is not None:
            with self._lock:
                self._seen += nbytes
                start = self._seen >= self.join_after
            if start:
                self._start()

    @property
    def device(self) -> str:
        """Where frames were coded so far: ``cpu``, or e.g. ``cuda:0+cpu``."""
        return f"{self._gpu_name}+cpu" if self.frames["gpu"] else "cpu"

    def _bring_up(self, start_gpu: Callable[[], Engine]) -> None:
        try:
            gpu = start_gpu()
        except BaseException as exc:
            self._error = exc
            self._up.set()
            return
        with self._lock:
            if self._closed:  # the job ended first
                gpu.close()
                self._up.set()
                return
            self._gpu, self._gpu_name = gpu, gpu.device
            for lane in self.lanes.values():
                lane.gpu_on = _verdicts.get((gpu.device, lane.name), True)
            # Bytes queued on the GPU before frames go to the CPU instead: what the GPU's own
            # look-ahead asks for to keep its workers fed, but at most a quarter of the
            # frames in flight, so that a slow GPU never holds frames the CPU would finish first.
            self._limit = min(gpu.look_ahead * gpu.frame_size, self.look_ahead * self.frame_size // 4)
        self._up.set()

    def cpu_alone(self, nbytes: int) -> CpuEngine | None:
        """The CPU engine, where a whole file of ``nbytes`` may be coded on the CPU threads
        alone (in the native plane): the GPU is not up. The file's bytes count towards
        bringing the GPU up for the files after it, as frames coded here do."""
        if self.required or self._gpu is not None:
            return None
        self._count(nbytes)
        return self.cpu

    @property
    def gpu(self) -> Engine | None:
        """The GPU engine, once it is up."""
        return self._gpu

    def wait_for_gpu(self, timeout: float | None = None) -> bool:
        """Bring the GPU up now if it is not coming up yet, and wait until it is up or has
        failed to start; whether it is up.

        Raises:
            DeviceError: it failed to start and was asked for explicitly.
        """
        self._start()
        self._up.wait(timeout)
        if self._error is not None and self.required:
            raise _device_error(self._error)
        return self._gpu is not None

    def _take_gpu(self, lane: Lane, nbytes: int) -> Engine | None:
        """The GPU if it is up, still worth using, and has room for ``nbytes`` more."""
        if self._error is not None and self.required:
            raise _device_error(self._error)
        with self._lock:
            gpu = self._gpu
            if gpu is None or not lane.gpu_on or self._queued + nbytes > self._limit:
                return None
            self._queued += nbytes
            if not lane.gpu_start:
                lane.gpu_start = time.perf_counter()
        return gpu

    def _on_gpu(self, lane: Lane, nbytes: int, fut: Future[_T]) -> Future[_T]:
        with self._lock:
            self.frames["gpu"] += 1

        def done(_: Future[Any]) -> None:
            with self._lock:
                self._queued -= nbytes
                lane.gpu_done += nbytes
                lane.gpu_end = time.perf_counter()
                if lane.gpu_rate is None and lane.gpu_done >= self._limit and lane.cpu_seconds:
                    lane.gpu_rate = lane.gpu_done / max(lane.gpu_end - lane.gpu_start, 1e-9)
                    lane.cpu_rate = lane.cpu_bytes / lane.cpu_seconds * self.threads
                    lane.gpu_on = lane.gpu_rate > lane.cpu_rate
                    _verdicts[(self._gpu_name, lane.name)] = lane.gpu_on

        fut.add_done_callback(done)
        return fut

    def _on_cpu(self, lane: Lane, nbytes: int, call: Callable[[], Future[_T]]) -> Future[_T]:
        t = time.perf_counter()
        fut = call()  # the CPU engine codes in this thread: the future is done
        seconds = time.perf_counter() - t
        with self._lock:
            self.frames["cpu"] += 1
            lane.cpu_bytes += nbytes
            lane.cpu_seconds += seconds
        return fut

    # -- Engine protocol ------------------------------------------------------------------

    def host_buffer(self, size: int) -> np.ndarray:
        return self.cpu.host_buffer(size)

    def free_buffer(self, buf: np.ndarray) -> None:
        self.cpu.free_buffer(buf)

    def encode(self, stream: StreamInfo, data: np.ndarray, checksum: int) -> Future[EncodedFrame]:
        lane = self.lanes["encode"]
        self._count(data.size)
        gpu = self._take_gpu(lane, data.size)
        if gpu is None:
            return self._on_cpu(lane, data.size, lambda: self.cpu.encode(stream, data, checksum))
        return self._on_gpu(lane, data.size, gpu.encode(stream, data, checksum))

    def decode(
        self, stream: StreamInfo, chunks: list[StoredChunk], length: int, where: str
    ) -> Future[np.ndarray]:
        if any(not _decodes(c.codec, "cpu") for c in chunks):
            # A GPU-only bitstream (ANS): only the GPU decodes it, so wait for it.
            self._start()
            self._up.wait()
            if self._gpu is None:
                raise _no_gpu_decoder(chunks, self._error)
            with self._lock:
                self.frames["gpu"] += 1
            return self._gpu.decode(stream, chunks, length, where)
        lane = self.lanes["decode"]
        self._count(length)
        gpu = self._take_gpu(lane, length) if all(_decodes(c.codec, "gpu") for c in chunks) else None
        if gpu is None:
            return self._on_cpu(lane, length, lambda: self.cpu.decode(stream, chunks, length, where))
        return self._on_gpu(lane, length, gpu.decode(stream, chunks, length, where))

    def encode_span(
        self, frames: list[FrameToCode], buffer: np.ndarray | None, leaves: Ranges | None = None
    ) -> Future[EncodedSpan]:
        return encode_each(self, frames, leaves)

    def flush(self) -> None:
        gpu = self._gpu
        if gpu is not None:
            gpu.flush()

    def decode_span(
        self,
        span: StoredSpan,
        place: Place | None = None,
        keep: bool = False,
        check: bool = False,
        leaves: Ranges | None = None,
    ) -> Future[DecodedSpan]:
        # Nothing is decoded on a GPU: ``place`` is not called, every frame comes back as bytes.
        return decode_each(self, span, check, leaves)

    def codec_config(self) -> dict[str, dict[str, object]]:
        config = dict(self.cpu.codec_config())
        gpu = self._gpu
        if gpu is not None and self.frames["gpu"]:
            for name, value in gpu.codec_config().items():
                config[name] = {**value, "also": config[name]} if name in config else value
        return config

    def container_extras(self) -> dict[str, object]:
        gpu = self._gpu
        return gpu.container_extras() if gpu is not None and self.frames["gpu"] else {}

    def close(self) -> None:
        """Close the GPU engine if it is up; a bring-up still running is left to finish
        (and close what it opened) in the background."""
        with self._lock:
            self._closed = True
            gpu, self._gpu = self._gpu, None
        if gpu is not None:
            gpu.close()
        self.cpu.close()


def _decodes(codec: int, where: str) -> bool:
    """Whether ``where`` (``cpu`` or ``gpu``) has a decoder for bitstream ``codec``."""
    bitstream = by_id(codec)
    return bitstream is not None and getattr(bitstream, where) is not None


def _no_gpu_decoder(chunks: list[StoredChunk], error: BaseException | None) -> CodecUnavailableError:
    """A GPU-only bitstream that cannot be decoded here because no GPU came up: the
    container may be sound, so this is never reported as damage."""
    codec = next(c.codec for c in chunks if not _decodes(c.codec, "cpu"))
    reason = error.message if isinstance(error, CkptzError) else str(error or "the GPU engine did not start")
    return CodecUnavailableError(
        f"this bitstream has no CPU decoder; {reason}",
        codec=codec_name(codec),
        hint="decode it on a machine with a GPU and `pip install ckptz[gpu]`",
    )


def _device_error(exc: BaseException) -> CkptzError:
    if isinstance(exc, CkptzError):
        return exc
    return DeviceError(f"cannot use the GPU: {exc}", hint="use --device cpu")


__all__ = ["GPU_JOIN_BYTES", "HybridEngine", "Lane", "bring_up_pending"]
