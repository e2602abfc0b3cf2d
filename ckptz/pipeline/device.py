"""Decoding a container straight into GPU memory, without writing the file anywhere.

The pipeline's one restore loop (:func:`ckptz.pipeline.restore`) runs with a sink that
copies every checked frame into one uint8 tensor on the device, so every check FORMAT.md
promises runs here too. The result is the original file's bytes, ready for
``safetensors``-style parsing or for slicing tensors out with ``.view(dtype)``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ckptz.container import read_index
from ckptz.engines.gpu.engine import GpuEngine
from ckptz.pipeline import Frame, restore


class _DeviceSink:
    """Copies each frame's pieces to their places in a device tensor."""

    def __init__(self, out: torch.Tensor) -> None:
        self.out = out

    def put(self, frame: Frame, data: np.ndarray) -> None:
        src = torch.from_numpy(data)
        for at, within, n in frame.pieces:
            self.out[at : at + n].copy_(src[within : within + n])

    def finish(self) -> None:
        torch.cuda.synchronize(self.out.device)


def restore_to_device(
    container: str | Path, device: str = "cuda", *, memory: int | None = None
) -> torch.Tensor:
    """Decode one ``.ckptz`` container into a uint8 tensor on ``device`` holding the original bytes.

    Raises:
        ContainerError: the container is unreadable.
        CorruptionError: some bytes fail their checksum.
    """
    path = str(container)
    dev = torch.device(device)
    index_no = dev.index if dev.index is not None else torch.cuda.current_device()
    with open(container, "rb") as f, GpuEngine(index_no, memory=memory) as engine:
        index = read_index(f, path)
        out = torch.empty(index.source_size, dtype=torch.uint8, device=f"cuda:{index_no}")
        restore(f, path, engine, _DeviceSink(out), index=index)
        return out


__all__ = ["restore_to_device"]
