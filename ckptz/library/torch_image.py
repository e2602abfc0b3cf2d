"""The bytes ``torch.save`` writes, read straight from the tensors being saved.

``torch.save`` copies each storage to the host one at a time (pageable, for a GPU tensor),
checksums it on one thread and copies it once more into the file. An :class:`Image` serves
the same bytes on demand instead, to many readers at once:

- the archive's structure (pickle, headers, alignment, central directory) from the
  :mod:`skeleton <ckptz.library.torch_skeleton>` that ``torch.save`` wrote without its
  tensor bytes, kept in memory and patched with the CRC-32s and serialization id that the
  tensor bytes give;
- each record's bytes from its storage: ``memcpy`` for a host tensor, a device-to-host copy
  for a GPU one (at full speed into the pipeline's pinned buffers).

The CRC-32s are needed before any reader asks for the structure that holds them, so they
are taken first, in one pass over the storages on several threads (a GPU storage through a
small pinned buffer per thread). The tensors must not change until the image is read.
"""

from __future__ import annotations

import bisect
import os
import struct
import threading
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from ckptz.library.torch_skeleton import Skeleton, crc32_combine, serialization_id

if TYPE_CHECKING:
    import torch

#: Bytes of one storage checksummed as one piece of work.
CHUNK = 16 << 20


class Image:
    """The finished archive's bytes (see the module docstring); a pipeline ``Source``.

    Args:
        skel: the skeleton; its storages must stay unchanged while the image is read.
        threads: threads for the CRC-32 pass (default: the CPUs, at most 16).
        chunk: bytes per CRC-32 job.
    """

    def __init__(self, skel: Skeleton, *, threads: int | None = None, chunk: int = CHUNK) -> None:
        import torch

        self.size = skel.size
        self._tensors = {name: _bytes_of(s) for name, s in skel.storages.items()}
        self._local = threading.local()
        # The caller's streams may still be writing its GPU tensors (a pageable upload, the
        # last optimizer step): every copy this image makes waits for them, as torch.save's
        # own copies (on the caller's stream) do.
        self._ready = {
            t.device: torch.cuda.current_stream(t.device).record_event()
            for t in self._tensors.values()
            if t.device.type == "cuda"
        }
        crcs = self._crcs(skel, threads or min(16, os.cpu_count() or 1), chunk)
        # The regions partition the file: structure bytes (in memory) and storage records.
        regions: list[tuple[int, int, bytearray | torch.Tensor]] = []
        holes = sorted(
            (r.entry.data, r.entry.end, r.entry.name) for r in skel.records if r.entry.name in crcs
        )
        with open(skel.path, "rb") as f:
            pos = 0
            for start, end, name in [*holes, (skel.size, skel.size, "")]:
                if start > pos:
                    regions.append((pos, start, bytearray(os.pread(f.fileno(), start - pos, pos))))
                if end > start:
                    regions.append((start, end, self._tensors[name]))
                pos = end
        self._regions = regions
        self._starts = [r[0] for r in regions]
        sid, rec = serialization_id(skel, crcs), skel.id_record
        self._patch(rec.entry.data, sid)
        crcs[rec.entry.name] = zlib.crc32(sid) if skel.compute_crc else 0
        for r in skel.records:
            if r.entry.name in crcs:
                for at in r.crc_at:
                    self._patch(at, struct.pack("<I", crcs[r.entry.name]))
        self._torch = torch

    def _crcs(self, skel: Skeleton, threads: int, chunk: int) -> dict[str, int]:
        """Every data record's CRC-32 (0 where torch does not compute them)."""
        if not skel.compute_crc:
            return dict.fromkeys(skel.storages, 0)
        jobs = [
            (name, start, min(chunk, t.numel() - start))
            for name, t in self._tensors.items()
            for start in range(0, t.numel(), chunk)
        ]

        def one(job: tuple[str, int, int]) -> int:
            name, start, length = job
            t = self._tensors[name][start : start + length]
            if t.device.type != "cpu":
                staging = self._staging(chunk)[:length]
                self._copy(staging, t)
                t = staging
            return zlib.crc32(t.numpy().data)

        with ThreadPoolExecutor(threads, thread_name_prefix="ckptz-crc") as pool:
            parts = list(pool.map(one, jobs))
        crcs = dict.fromkeys(skel.storages, 0)
        for (name, start, length), crc in zip(jobs, parts, strict=True):
            crcs[name] = crc32_combine(crcs[name], crc, length) if start else crc
        return crcs

    def _staging(self, size: int) -> torch.Tensor:
        import torch

        buf = getattr(self._local, "staging", None)
        if buf is None or buf.numel() < size:
            buf = self._local.staging = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        return buf

    def _copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``dst.copy_(src)``, a device's copy on this thread's own stream (threads overlap)."""
        if src.device.type != "cuda":
            dst.copy_(src)
            return
        import torch

        stream = getattr(self._local, "stream", None)
        if stream is None or stream.device != src.device:
            stream = self._local.stream = torch.cuda.Stream(src.device)
            stream.wait_event(self._ready[src.device])
        with torch.cuda.stream(stream):
            dst.copy_(src)  # to host memory: returns once the bytes are there

    def _patch(self, at: int, data: bytes) -> None:
        i = bisect.bisect_right(self._starts, at) - 1
        start, end, part = self._regions[i]
        if not isinstance(part, bytearray) or at + len(data) > end:
            raise AssertionError("a CRC-32 or the serialization id lies outside the structure")
        part[at - start : at - start + len(data)] = data

    def host_regions(self) -> list[tuple[int, np.ndarray]] | None:
        """The image as arrays over its structure and its host tensors' bytes, each with its
        offset (the native plane copies from them); None where a tensor is on a GPU."""
        if any(not isinstance(part, bytearray) and part.device.type != "cpu" for _, _, part in self._regions):
            return None
        return [
            (
                start,
                (np.frombuffer(part, np.uint8) if isinstance(part, bytearray) else part.numpy())[
                    : end - start
                ],
            )
            for start, end, part in self._regions
        ]

    def read_at(self, offset: int, n: int) -> bytes:
        """Up to ``n`` of the image's bytes from ``offset``."""
        buf = bytearray(n)
        return bytes(buf[: self.readinto([memoryview(buf)], offset)])

    def readinto(self, views: Sequence[memoryview], offset: int) -> int:
        """Fill ``views``, one after another, with the image's bytes from ``offset``; how
        many (fewer past the end)."""
        done = 0
        for view in views:
            got = self._fill(view, offset + done)
            done += got
            if got < len(view):
                break
        return done

    def _fill(self, view: memoryview, offset: int) -> int:
        done, n = 0, len(view)
        i = bisect.bisect_right(self._starts, offset) - 1
        while done < n and offset + done < self.size:
            start, end, part = self._regions[i]
            at = offset + done
            k = min(end - at, n - done)
            if isinstance(part, bytearray):
                view[done : done + k] = part[at - start : at - start + k]
            else:
                dst = self._torch.frombuffer(view[done : done + k], dtype=self._torch.uint8)
                self._copy(dst, part[at - start : at - start + k])
            done += k
            i += 1
        return done


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    import torch

    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


__all__ = ["CHUNK", "Image"]
