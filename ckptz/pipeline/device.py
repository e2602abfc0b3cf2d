"""Decoding a container straight into GPU memory, without writing the file anywhere.

The pipeline's one restore loop (:func:`ckptz.pipeline.restore`) runs with a
:class:`DeviceRanges` sink: each frame's bytes go to the buffers that hold their file
offsets, GPU tensors or host arrays. A frame a GPU engine decodes reaches a GPU tensor on
that device with a device-to-device copy that the engine's worker queues on its own stream
as soon as the frame is decoded (:meth:`DeviceRanges.place`: no wait of its own). Where the
targets hold the whole file on that GPU, the engine takes each frame's checksum there and
copies nothing back, and the whole-file digest is hashed from the targets once every frame
is in (:func:`ckptz.pipeline.restore`); otherwise the host copy the engine makes is what the
restore loop checks. Either way every check FORMAT.md promises runs, and a failed one fails
the load.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ckptz.container import read_index
from ckptz.engines.gpu.memory import DeviceBytes
from ckptz.pipeline.plan import Frame
from ckptz.pipeline.restore import restore
from ckptz.pipeline.whole import RangeSink


class DeviceRanges(RangeSink):
    """A :class:`~ckptz.pipeline.whole.RangeSink` whose targets may be uint8 GPU tensors.

    Frames an engine decodes on a GPU reach their targets from :meth:`place`, on the
    engine's stream (targets on that GPU device to device, host targets device to host);
    everything else (targets on another GPU, frames decoded on the CPU) from :meth:`put`,
    host-to-device copies on a stream of the calling thread's own. Where the targets tile
    the file and every GPU target is on the engine's GPU (:meth:`holds_on`), the restore
    loop checks the frames and the whole-file digest on that GPU, from these bytes.
    """

    def __init__(self, targets: Sequence[tuple[int, Any]]) -> None:
        super().__init__(targets)
        self._devices = {t.device for _, t in targets if isinstance(t, torch.Tensor) and t.is_cuda}
        self._local = threading.local()
        self._placed: dict[int, torch.device] = {}  # id(frame) -> the device it was placed on
        self._lock = threading.Lock()
        self._uploaded: torch.Tensor | None = None  # the host targets' bytes, for segments()

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        """This thread's copy stream on ``device``. Not the default stream: that one waits for
        (and holds up) the engine's streams, so every copy would stall the decoding."""
        streams = self._local.__dict__.setdefault("streams", {})
        stream = streams.get(device)
        if stream is None:
            stream = streams[device] = torch.cuda.Stream(device)
        return stream

    def holds_on(self, index: int, size: int) -> bool:
        gpu, at = torch.device("cuda", index), 0
        for start, buf in self._targets:
            if start != at or (isinstance(buf, torch.Tensor) and buf.device != gpu):
                return False
            at += len(buf)
        return at == size and self._devices == {gpu}

    def segments(self) -> list[tuple[int, int, int]]:
        host = [np.asarray(buf).reshape(-1) for _, buf in self._targets if not isinstance(buf, torch.Tensor)]
        if host:  # one copy of every host target's bytes to the GPU
            self._uploaded = torch.from_numpy(np.concatenate(host)).to(next(iter(self._devices)))
        out, k = [], 0
        for at, buf in self._targets:
            if isinstance(buf, torch.Tensor):
                out.append((at, buf.data_ptr(), buf.numel()))
            else:
                assert self._uploaded is not None
                out.append((at, self._uploaded.data_ptr() + k, len(buf)))
                k += len(buf)
        return out

    def place(self, frame: Frame, device: DeviceBytes) -> None:
        """Copy the frame's bytes to the targets on ``device``'s GPU and to host targets,
        queued on the engine's stream."""
        from ckptz import cuda

        where = torch.device("cuda", device.index) if device.index >= 0 else torch.device("cpu")
        home: list[tuple[Any, slice, slice]] = []
        for buf, dst, src in self.overlaps(frame):
            if not isinstance(buf, torch.Tensor):
                home.append((buf, dst, src))
            elif buf.device == where:
                to, at, n = buf.data_ptr() + dst.start, device.buf.ptr + src.start, dst.stop - dst.start
                if device.index >= 0:
                    cuda.copy_on_device(to, at, n, device.stream)
                else:
                    ctypes.memmove(to, at, n)
        if home:  # host targets: the bytes they take, in one copy back (waited for), then spread
            lo, hi = min(s.start for _, _, s in home), max(s.stop for _, _, s in home)
            staged = np.empty(hi - lo, np.uint8)
            if device.index >= 0:
                cuda.copy_to_host(
                    staged.ctypes.data, device.buf.ptr + lo, hi - lo, device.stream, pinned=False
                )
            else:
                ctypes.memmove(staged.ctypes.data, device.buf.ptr + lo, hi - lo)
            for buf, dst, src in home:
                buf[dst] = staged[src.start - lo : src.stop - lo]
        with self._lock:
            self._placed[id(frame)] = where

    def put(self, frame: Frame, data: np.ndarray) -> None:
        with self._lock:
            placed = self._placed.pop(id(frame), None)
        used: set[torch.cuda.Stream] = set()
        for buf, dst, src in self.overlaps(frame):
            if not isinstance(buf, torch.Tensor):
                if placed is None:
                    buf[dst] = data[src]
            elif buf.device != placed:
                stream = self._stream(buf.device)  # the target's own GPU's
                used.add(stream)
                with torch.cuda.stream(stream):
                    buf[dst].copy_(torch.from_numpy(data[src]), non_blocking=True)
        for stream in used:
            stream.synchronize()  # ``data`` is the restore loop's, and may go once this returns

    def finish(self) -> None:
        for device in self._devices:
            torch.cuda.synchronize(device)


def restore_to_device(
    container: str | Path, device: str = "cuda", *, memory: int | None = None
) -> torch.Tensor:
    """Decode one ``.ckptz`` container into a uint8 tensor on ``device`` holding the original bytes.

    Raises:
        ContainerError: the container is unreadable.
        CorruptionError: some bytes fail their checksum.
    """
    from ckptz.engines.gpu.engine import GpuEngine

    path = str(container)
    dev = torch.device(device)
    index_no = dev.index if dev.index is not None else torch.cuda.current_device()
    with open(container, "rb") as f, GpuEngine(index_no, memory=memory) as engine:
        index = read_index(f, path)
        out = torch.empty(index.source_size, dtype=torch.uint8, device=f"cuda:{index_no}")
        restore(f, path, engine, DeviceRanges([(0, out)]), index=index)
        return out


__all__ = ["DeviceRanges", "restore_to_device"]
