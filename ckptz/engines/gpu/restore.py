"""Decoding a container straight into GPU memory, without writing the file anywhere.

The decoded frames never leave the device except for a host copy that checks their
checksums. This is the path a later ``load onto the GPU`` API builds on: the result is the
original file's bytes in one uint8 CUDA tensor, ready for ``safetensors``-style parsing or
for slicing tensors out with ``.view(dtype)``.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future
from pathlib import Path

import torch

from ckptz.container import frame_chunk_starts, read_index, stream_frame_lists
from ckptz.engines.base import StoredChunk
from ckptz.engines.gpu.engine import GpuEngine
from ckptz.errors import CorruptionError
from ckptz.pipeline import look_ahead


def restore_to_device(
    container: str | Path, device: str = "cuda", *, memory: int | None = None
) -> torch.Tensor:
    """Decode one ``.ckptz`` container into a uint8 tensor on ``device`` holding the original bytes.

    Every payload checksum is verified before decoding and every frame checksum after.

    Raises:
        ContainerError: the container is unreadable.
        CorruptionError: some bytes fail their checksum.
    """
    path = str(container)
    dev = torch.device(device)
    index_no = dev.index if dev.index is not None else torch.cuda.current_device()
    with open(container, "rb") as f, GpuEngine(index_no, memory=memory) as engine:
        index = read_index(f, path)
        fd = f.fileno()
        out = torch.empty(index.source_size, dtype=torch.uint8, device=f"cuda:{index_no}")
        per_stream = stream_frame_lists(index)
        starts = frame_chunk_starts(index.frames)
        futures: dict[tuple[int, int], Future[torch.Tensor]] = {}
        order = deque(_need_order(index))
        limit = look_ahead(engine)

        def schedule(until: tuple[int, int]) -> None:
            while order and (until not in futures or len(futures) < limit):
                sid, k = order.popleft()
                rows = per_stream[sid]
                if k >= len(rows):
                    raise CorruptionError("a stream has fewer frames than its segments need", path=path)
                row = int(rows[k])
                fr = index.frames[row]
                first = int(starts[row])
                stored = []
                for ci in range(first, first + int(fr["chunks"])):
                    c = index.chunks[ci]
                    payload = os.pread(fd, int(c["size"]), int(c["offset"]))
                    stored.append(
                        StoredChunk(ci, int(c["codec"]), int(c["raw_size"]), payload, int(c["checksum"]))
                    )
                where = f"frame {row} of stream {sid} ({path})"
                futures[(sid, k)] = engine.decode_to_device(
                    index.streams[sid], stored, int(fr["length"]), int(fr["checksum"]), where
                )

        stream_pos = [0] * len(index.streams)
        file_pos = 0
        current = torch.cuda.current_stream(index_no)
        for sid, length in zip(
            index.segments["stream"].tolist(), index.segments["length"].tolist(), strict=True
        ):
            size = index.streams[sid].frame_size
            while length:
                k, within = divmod(stream_pos[sid], size)
                schedule((sid, k))
                if (sid, k) not in futures:
                    raise CorruptionError("a stream ends before its segments", path=path)
                frame = futures[(sid, k)].result()
                # The frame was made on a worker's stream; tell the allocator it is used here too.
                frame.record_stream(current)
                take = min(length, frame.numel() - within)
                out[file_pos : file_pos + take].copy_(frame[within : within + take])
                if within + take == frame.numel():
                    del futures[(sid, k)]
                stream_pos[sid] += take
                file_pos += take
                length -= take
        current.synchronize()
        return out


def _need_order(index: object) -> list[tuple[int, int]]:
    from ckptz.pipeline import _need_order as need  # one definition of the restore order

    return list(need(index))  # type: ignore[arg-type]


__all__ = ["restore_to_device"]
