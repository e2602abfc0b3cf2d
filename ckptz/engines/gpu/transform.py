"""The GPU coder's layout constants, and its device on the host (:class:`HostOps`).

The coder (:mod:`ckptz.engines.gpu.coder`) runs on an :class:`~ckptz.engines.gpu.coder.Ops`:
on a GPU, :class:`ckptz.engines.gpu.kernels.CudaOps`; on the host, :class:`HostOps`, whose
split and merge are the CPU transform's (:mod:`ckptz.codecs.planes`) and whose statistics
take the same sample as the CUDA kernel. The host device is what the CPU test suite runs the
coder's batching on, and the reference the GPU tests compare the kernels with.

Frames of one shape are transformed together: ``k`` frames of ``n`` bytes become ``k * word``
plane rows ``stride`` bytes apart, row ``f * word + p`` holding plane ``p`` of frame ``f``
(plane 0 = lowest byte). ``stride`` is ``n // word`` rounded up to 16 bytes, because
nvCOMP's ANS wants every chunk 16-byte aligned.
"""

from __future__ import annotations

import ctypes
from dataclasses import replace

import numpy as np

from ckptz.checksums import xxh3_64
from ckptz.codecs.planes import merge, split
from ckptz.dtypes import DType, lookup
from ckptz.engines.gpu.memory import Buf, Reused

ALIGN = 16
#: Where ``merge_rows`` finds a plane row: among the stored payloads, among the decoded
#: planes, or (any value >= 0) nowhere, the row being that byte repeated.
STORED = -1
DECODED = -2
#: int32 columns per plane row of ``split_rows``' statistics: min, max, 256 byte counts.
STATS = 258
#: The byte histogram in a row's statistics counts every ``SAMPLE_EVERY``-th full block of
#: ``SAMPLE_BLOCK`` bytes (1/8 of the row), the same sample on either implementation, so
#: the coder decides alike (and writes the same container) whichever ran.
SAMPLE_BLOCK = 4096
SAMPLE_EVERY = 8


def aligned(n: int) -> int:
    """``n`` rounded up to a multiple of :data:`ALIGN`."""
    return n + (-n % ALIGN)


def _dtype(word: int, rotate: bool) -> DType:
    """The CPU transform that splits ``word``-byte words (rotated or not)."""
    return replace(
        lookup({1: "uint8", 2: "int16", 4: "int32", 8: "int64"}[word]), is_float=rotate and word > 1
    )


class HostOps:
    """The coder's device in host memory: every buffer a numpy array, every call done when
    it returns (``stream`` 0)."""

    stream = 0

    def __init__(self) -> None:
        # Never reset: replaced buffers stay valid, as they do on a device until the batch ends.
        self._buffers: Reused[np.ndarray] = Reused(lambda n: np.empty(max(n, 1), np.uint8))

    def scratch(self, name: str, size: int) -> Buf:
        return Buf(self._buffers.get(name, size).ctypes.data, size)

    @staticmethod
    def view(buf: Buf) -> np.ndarray:
        """``buf``'s bytes as a writable uint8 array (no copy)."""
        if buf.size == 0:
            return np.empty(0, np.uint8)
        return np.ctypeslib.as_array((ctypes.c_uint8 * buf.size).from_address(buf.ptr))

    def upload(self, name: str, arr: np.ndarray) -> Buf:
        buf = self.scratch(name, arr.nbytes)
        self.view(buf)[:] = np.ascontiguousarray(arr).view(np.uint8).reshape(-1)
        return buf

    def download(self, buf: Buf, dtype: type | np.dtype) -> np.ndarray:
        return self.view(buf).view(dtype).copy()

    def init_stats(self, stats: Buf, rows: int) -> None:
        table = self.view(stats).view(np.int32).reshape(rows, STATS)
        table[:] = 0
        table[:, 0] = 255

    def split_rows(
        self, raw: Buf, planes: Buf, stats: Buf, k: int, stride: int, word: int, rotate: bool
    ) -> None:
        """As :meth:`ckptz.engines.gpu.kernels.CudaOps.split_rows`."""
        m = raw.size // max(k, 1) // word
        if k == 0 or m == 0:
            return
        src = self.view(raw).reshape(k, m * word)
        rows = self.view(planes).reshape(k * word, stride)
        table = self.view(stats).view(np.int32).reshape(k * word, STATS)
        full = m // SAMPLE_BLOCK
        for f in range(k):
            for p, plane in enumerate(split(src[f], _dtype(word, rotate))):
                r = f * word + p
                rows[r, :m] = plane
                table[r, 0] = min(int(table[r, 0]), int(plane.min()))
                table[r, 1] = max(int(table[r, 1]), int(plane.max()))
                sample = plane[: full * SAMPLE_BLOCK].reshape(full, SAMPLE_BLOCK)[::SAMPLE_EVERY]
                table[r, 2:] += np.bincount(sample.reshape(-1), minlength=256).astype(np.int32)

    def merge_rows(
        self, stored: Buf, decoded: Buf, offsets: Buf, sources: Buf, raw: Buf, k: int, word: int, rotate: bool
    ) -> None:
        """As :meth:`ckptz.engines.gpu.kernels.CudaOps.merge_rows`."""
        m = raw.size // max(k, 1) // word
        if k == 0 or m == 0:
            return
        at = self.view(offsets).view(np.int64)
        src = self.view(sources).view(np.int64)
        out = self.view(raw).reshape(k, m * word)
        buffers = {STORED: self.view(stored), DECODED: self.view(decoded)}
        for f in range(k):
            rows: list[np.ndarray | int] = []
            for r in range(f * word, (f + 1) * word):
                s = int(src[r])
                rows.append(s if s >= 0 else buffers[s][int(at[r]) * ALIGN : int(at[r]) * ALIGN + m])
            merge(rows, _dtype(word, rotate), out[f])

    def gather(
        self,
        src: Buf,
        src_offsets: Buf,
        sizes: Buf,
        dst: Buf,
        dst_offsets: Buf,
        padded: Buf,
        count: int,
        longest: int,
    ) -> None:
        """As :meth:`ckptz.engines.gpu.kernels.CudaOps.gather`."""
        s, d = self.view(src), self.view(dst)
        columns = (
            self.view(b).view(np.int64)[:count].tolist() for b in (src_offsets, sizes, dst_offsets, padded)
        )
        for so, n, do, pad in zip(*columns, strict=True):
            so, do = so * ALIGN, do * ALIGN
            d[do : do + n] = s[so : so + n]
            d[do + n : do + pad] = 0

    def xxh3(self, ptrs: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """As :meth:`ckptz.engines.gpu.kernels.CudaOps.xxh3` (host addresses)."""
        pairs = zip(np.asarray(ptrs).tolist(), np.asarray(lengths).tolist(), strict=True)
        return np.array([xxh3_64(self.view(Buf(p, n))) for p, n in pairs], np.uint64)

    def copy_ranges(self, src: np.ndarray, dst: np.ndarray, lengths: np.ndarray) -> None:
        """As :meth:`ckptz.engines.gpu.kernels.CudaOps.copy_ranges` (host addresses)."""
        for s, d, n in zip(src.tolist(), dst.tolist(), lengths.tolist(), strict=True):
            ctypes.memmove(d, s, n)


__all__ = ["ALIGN", "DECODED", "SAMPLE_BLOCK", "SAMPLE_EVERY", "STATS", "STORED", "HostOps", "aligned"]
