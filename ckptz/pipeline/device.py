"""Decoding a container straight into GPU memory, without writing the file anywhere.

The pipeline's one restore loop (:func:`ckptz.pipeline.restore`) runs with a
:class:`DeviceRanges` sink: each checked frame's bytes go to the buffers that hold their
file offsets, GPU tensors or host arrays. On a GPU engine a frame's bytes are still on the
device where the engine decoded them, so they reach a GPU tensor with a device-to-device
copy; the host copy the engine also makes is what the restore loop checks (frame checksums,
the whole-file digest), so every check FORMAT.md promises runs here too.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ckptz.container import read_index
from ckptz.pipeline.plan import Frame
from ckptz.pipeline.restore import restore
from ckptz.pipeline.whole import RangeSink


class DeviceRanges(RangeSink):
    """A :class:`~ckptz.pipeline.whole.RangeSink` whose targets may be uint8 GPU tensors.

    Bytes decoded on the CPU reach a GPU target with a host-to-device copy; bytes an engine
    left on the device, with a device-to-device copy; both on a stream of the calling
    thread's own.
    """

    def __init__(self, targets: Sequence[tuple[int, Any]]) -> None:
        super().__init__(targets)
        self._devices = {t.device for _, t in targets if isinstance(t, torch.Tensor) and t.is_cuda}
        self._local = threading.local()

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        """This thread's copy stream on ``device``. Not the default stream: that one waits for
        (and holds up) the engine's streams, so every copy would stall the decoding."""
        streams = self._local.__dict__.setdefault("streams", {})
        stream = streams.get(device)
        if stream is None:
            stream = streams[device] = torch.cuda.Stream(device)
        return stream

    def put(self, frame: Frame, data: np.ndarray) -> None:
        self._copy(frame, data, None)

    def put_device(self, frame: Frame, data: np.ndarray, device: torch.Tensor) -> None:
        self._copy(frame, data, device)

    def _copy(self, frame: Frame, data: np.ndarray, device: torch.Tensor | None) -> None:
        stream = None
        for buf, dst, src in self.overlaps(frame):
            if not isinstance(buf, torch.Tensor):
                buf[dst] = data[src]
                continue
            if stream is None:
                stream = self._stream(buf.device)
            with torch.cuda.stream(stream):
                if device is not None and buf.device == device.device:
                    buf[dst].copy_(device[src], non_blocking=True)
                else:
                    buf[dst].copy_(torch.from_numpy(data[src]))
        if stream is not None:
            # The engine's worker made the device bytes on its own stream, which may reuse
            # their memory once the frame is dropped: the copies must be over by then.
            stream.synchronize()

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
