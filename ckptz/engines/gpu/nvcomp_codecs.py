"""nvCOMP's batched codecs, through its C API: the only module that calls nvCOMP.

Every call codes a whole batch of chunks that lie in one device buffer at 16-byte-aligned
offsets, on one CUDA stream. Two bitstreams:

* ``zstd`` (id 2): nvCOMP Zstd with ``bitstream_kind=RAW``: standard zstd frames, so the
  CPU codec of the same id decodes them and nvCOMP decodes the CPU's.
* ``ans`` (id 3): nvCOMP ANS on bytes; no CPU decoder exists, and 6.0 streams are not
  readable by older nvCOMP, so containers record :func:`nvcomp_version`.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ckptz import cuda
from ckptz.codecs.table import TABLE
from ckptz.engines.gpu.memory import Buf
from ckptz.errors import CodecError

if TYPE_CHECKING:
    from ckptz.engines.gpu.coder import Ops

#: nvCOMP's algorithm for each bitstream it codes, by id.
_ALGORITHM: dict[int, str] = {b.id: alg for b in TABLE if (alg := b.nvcomp) is not None}
#: Name of each of those bitstreams, by id.
NAMES: dict[int, str] = {b.id: b.name for b in TABLE if b.id in _ALGORITHM}


class _Properties(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("cudart_version", ctypes.c_uint32)]


def nvcomp_version() -> str:
    """The nvCOMP library version, e.g. ``6.0.0`` (recorded in containers with ANS chunks;
    the Python binding's ``__version__`` says the same)."""
    props = _Properties()
    if _library().nvcompGetProperties(ctypes.byref(props)) != 0:
        return "unknown"
    v = int(props.version)
    return f"{v // 1000}.{v % 1000 // 100}.{v % 100}"


def _pow2_at_least(n: int) -> int:
    return 1 << max(16, (max(n, 1) - 1).bit_length())


def _size_classes(sizes: Sequence[int]) -> dict[int, list[int]]:
    """Indices of ``sizes`` grouped by power-of-two size class."""
    classes: dict[int, list[int]] = {}
    for i, n in enumerate(sizes):
        classes.setdefault(_pow2_at_least(n), []).append(i)
    return classes


class _AnsCompressOpts(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),  # nvcomp_rANS
        ("data_type", ctypes.c_int),
        ("max_sub_chunk_count", ctypes.c_uint8),
        ("states_per_lane", ctypes.c_uint8),
        ("histogram_reduction_log2", ctypes.c_uint8),
        ("reserved", ctypes.c_char * 53),
    ]


class _AnsDecompressOpts(ctypes.Structure):
    _fields_ = [
        ("backend", ctypes.c_int),
        ("data_type", ctypes.c_int),
        ("max_sub_chunk_count", ctypes.c_uint8),
        ("states_per_lane", ctypes.c_uint8),
        ("skip_validate", ctypes.c_uint8),
        ("reserved", ctypes.c_char * 53),
    ]


class _ZstdCompressOpts(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]


class _ZstdDecompressOpts(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_int), ("reserved", ctypes.c_char * 60)]


#: ``NVCOMP_TYPE_UCHAR``: ANS on bytes (what the Python binding's ``data_type="|u1"`` asks for).
_UCHAR = 1
#: ``NVCOMP_TYPE_BITS``: decoding reads the data type from the bitstream (any ANS stream decodes).
_ANY_TYPE = 0xFF


@dataclass(frozen=True, slots=True)
class _Api:
    """One algorithm's batched C functions and the options ckptz codes it with."""

    name: str
    compress_opts: ctypes.Structure
    decompress_opts: ctypes.Structure

    def fn(self, lib: ctypes.CDLL, what: str) -> Any:
        return getattr(lib, f"nvcompBatched{self.name}{what}")


_APIS: dict[str, _Api] = {
    "ANS": _Api("ANS", _AnsCompressOpts(0, _UCHAR), _AnsDecompressOpts(0, _ANY_TYPE)),
    "Zstd": _Api("Zstd", _ZstdCompressOpts(), _ZstdDecompressOpts(0)),
}

_LIB: ctypes.CDLL | None = None
_LIB_LOCK = threading.Lock()


def library_path() -> str | None:
    """Where the ``nvidia-libnvcomp`` wheel put nvCOMP's C library (the Python binding loads
    the same file), or None."""
    spec = importlib.util.find_spec("nvidia.libnvcomp")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    return next((p for r in roots if os.path.exists(p := os.path.join(r, "lib64", "libnvcomp.so.6"))), None)


def _library() -> ctypes.CDLL:
    """nvCOMP's C library. Its calls keep the GIL (:class:`ctypes.PyDLL`): they only queue
    work on a stream or compute a size, and return at once."""
    global _LIB
    with _LIB_LOCK:
        if _LIB is None:
            _LIB = ctypes.PyDLL(library_path() or "libnvcomp.so.6")
        return _LIB


def _check(status: int, what: str, codec_id: int) -> None:
    if status != 0:
        raise CodecError(f"nvCOMP {what} failed (status {status})", codec=NAMES[codec_id])


class NvcompCodecs:
    """nvCOMP's batched codecs on one device, queued on the stream of the coder's ``ops``
    (one per worker thread).

    Calls nvCOMP's C API (``nvcompBatched*Async``) with the chunks' pointers and sizes as
    device tables, copied in one upload per call: its Python binding made a Python object per
    chunk (``nvcomp.as_arrays``, holding the GIL), a large share of the GPU workers' GIL
    time. The bitstreams are the binding's: ANS on bytes
    (``NVCOMP_TYPE_UCHAR``), Zstd frames, one stream per chunk. Chunks go in one call per
    power-of-two size class (usually one or two), and every class's sizes and statuses come
    back in one copy.

    Args:
        ops: the device (:class:`ckptz.engines.gpu.kernels.CudaOps`): stream and scratch.
    """

    def __init__(self, ops: Ops) -> None:
        self.ops = ops
        self._lib = _library()
        self._handle = ctypes.c_void_p(ops.stream)
        self._max_size: dict[tuple[int, int], int] = {}
        self._temp: dict[tuple[int, str, int, int, int], int] = {}

    def _api(self, codec_id: int) -> _Api:
        return _APIS[_ALGORITHM[codec_id]]

    def max_compressed_size(self, codec_id: int, size: int) -> int:
        """Room one chunk's payload needs in :meth:`encode`'s output (cached per size class).

        Chunks are coded by power-of-two size class, so the bound is that of the chunk's class.
        """
        cls = _pow2_at_least(size)
        key = (codec_id, cls)
        bound = self._max_size.get(key)
        if bound is None:
            api, out = self._api(codec_id), ctypes.c_size_t()
            status = api.fn(self._lib, "CompressGetMaxOutputChunkSize")(
                ctypes.c_size_t(cls), api.compress_opts, ctypes.byref(out)
            )
            _check(status, "sizing", codec_id)
            bound = self._max_size[key] = int(out.value)
        return bound

    def _temp_bytes(self, codec_id: int, what: str, count: int, largest: int, total: int) -> int:
        key = (codec_id, what, count, largest, total)
        size = self._temp.get(key)
        if size is None:
            api, out = self._api(codec_id), ctypes.c_size_t()
            opts = api.compress_opts if what == "Compress" else api.decompress_opts
            status = api.fn(self._lib, f"{what}GetTempSize")(
                ctypes.c_size_t(count),
                ctypes.c_size_t(largest),
                opts,
                ctypes.byref(out),
                ctypes.c_size_t(total),
                self._handle,
            )
            _check(status, "sizing", codec_id)
            if len(self._temp) > 256:
                self._temp.clear()
            size = self._temp[key] = int(out.value)
        return size

    def _calls(
        self, codec_id: int, what: str, raw_sizes: np.ndarray, columns: list[np.ndarray]
    ) -> tuple[list[tuple[int, int, int, list[Buf]]], Buf, Buf, np.ndarray]:
        """The chunks ordered by size class, their ``columns`` (int64) uploaded in one copy:
        per class (size class, first row, rows, its slice of each column); then the temporary
        memory every class's call can use (one after another on the stream), where nvCOMP
        writes the chunks' sizes (int64, in that order) followed by their statuses (int32),
        and the order."""
        order: list[int] = []
        classes = []
        temp = 0
        for cls, members in _size_classes(raw_sizes.tolist()).items():
            count = len(members)
            total = int(raw_sizes[members].sum())
            temp = max(temp, self._temp_bytes(codec_id, what, count, cls, total))
            classes.append((cls, len(order), count))
            order.extend(members)
        n = len(order)
        table = np.stack([c[order] for c in columns]).astype(np.int64, copy=False)
        uploaded = self.ops.upload("nvcomp-table", table)
        calls = [
            (cls, first, count, [uploaded.at((c * n + first) * 8, count * 8) for c in range(len(columns))])
            for cls, first, count in classes
        ]
        temp_buf = self.ops.scratch("nvcomp-temp", max(temp, 1))
        return calls, temp_buf, self.ops.scratch("nvcomp-out", n * 12), np.asarray(order, np.int64)

    def _results(self, out: Buf, order: np.ndarray) -> tuple[np.ndarray, bool]:
        """Every chunk's size written by nvCOMP, in the caller's order, and whether every
        chunk's status was success (waits for the GPU)."""
        n = order.size
        back = self.ops.download(out, np.uint8)
        sizes = np.empty(n, np.int64)
        sizes[order] = back[: n * 8].view(np.int64)
        return sizes, not back[n * 8 :].view(np.int32).any()

    def encode(
        self,
        codec_id: int,
        src: Buf,
        offsets: Sequence[int],
        sizes: Sequence[int],
        dst: Buf,
        dst_offsets: Sequence[int],
        capacities: Sequence[int],
    ) -> list[int]:
        """Encode chunks of ``src`` into ``dst``; return each payload's size (waits for the GPU).

        Args:
            codec_id: a bitstream with an nvCOMP algorithm (``zstd`` or ``ans``).
            src: device buffer holding the chunks.
            offsets: byte offset of each chunk in ``src`` (16-byte aligned).
            sizes: byte size of each chunk (> 0).
            dst: device buffer for the payloads.
            dst_offsets: where each payload goes in ``dst`` (16-byte aligned).
            capacities: room at each ``dst_offsets`` (at least :meth:`max_compressed_size`).
        """
        api = self._api(codec_id)
        size = np.asarray(sizes, np.int64)
        if (np.asarray(capacities, np.int64) < [self.max_compressed_size(codec_id, n) for n in sizes]).any():
            raise ValueError("an output chunk has less room than nvCOMP may write")
        at = src.ptr + np.asarray(offsets, np.int64)
        out_at = dst.ptr + np.asarray(dst_offsets, np.int64)
        # nvCOMP leaves some bytes of a payload unwritten (padding); zeroed first, they are
        # the same in every run, whatever the memory held before.
        if size.size:
            low = int(np.min(dst_offsets))
            high = int((np.asarray(dst_offsets, np.int64) + np.asarray(capacities, np.int64)).max())
            cuda.fill8(dst.ptr + low, 0, high - low, self.ops.stream)
        calls, temp, out, order = self._calls(codec_id, "Compress", size, [at, size, out_at])
        for cls, first, count, (ptrs, nbytes, out_ptrs) in calls:
            status = api.fn(self._lib, "CompressAsync")(
                ctypes.c_void_p(ptrs.ptr),
                ctypes.c_void_p(nbytes.ptr),
                ctypes.c_size_t(cls),
                ctypes.c_size_t(count),
                ctypes.c_void_p(temp.ptr),
                ctypes.c_size_t(temp.size),
                ctypes.c_void_p(out_ptrs.ptr),
                ctypes.c_void_p(out.ptr + first * 8),
                api.compress_opts,
                ctypes.c_void_p(out.ptr + size.size * 8 + first * 4),
                self._handle,
            )
            _check(status, "compression", codec_id)
        got, ok = self._results(out, order)
        if not ok:
            raise CodecError("nvCOMP could not code a batch (a chunk failed)", codec=NAMES[codec_id])
        return got.tolist()

    def bitstreams(self) -> None:
        """Every chunk of an :meth:`encode` gets the bitstream asked for."""
        return None

    def decode(
        self,
        codec_id: int,
        src: Buf,
        offsets: Sequence[int],
        sizes: Sequence[int],
        dst: Buf,
        dst_offsets: Sequence[int],
        raw_sizes: Sequence[int],
        host: np.ndarray | None = None,
    ) -> None:
        """Decode payloads of ``src`` into ``dst`` (waits for the GPU, to check nvCOMP's
        status and size of every chunk; ``host`` is not needed).

        The payloads must already have passed their checksums: nvCOMP decoders assume valid
        input. The caller checks the decoded frames too.

        Raises:
            CodecError: nvCOMP rejected a payload, or one decoded to the wrong size.
        """
        api = self._api(codec_id)
        raw = np.asarray(raw_sizes, np.int64)
        at = src.ptr + np.asarray(offsets, np.int64)
        out_at = dst.ptr + np.asarray(dst_offsets, np.int64)
        columns = [at, np.asarray(sizes, np.int64), raw, out_at]
        calls, temp, out, order = self._calls(codec_id, "Decompress", raw, columns)
        for _, first, count, (ptrs, nbytes, room, out_ptrs) in calls:
            status = api.fn(self._lib, "DecompressAsync")(
                ctypes.c_void_p(ptrs.ptr),
                ctypes.c_void_p(nbytes.ptr),
                ctypes.c_void_p(room.ptr),
                ctypes.c_void_p(out.ptr + first * 8),
                ctypes.c_size_t(count),
                ctypes.c_void_p(temp.ptr),
                ctypes.c_size_t(temp.size),
                ctypes.c_void_p(out_ptrs.ptr),
                api.decompress_opts,
                ctypes.c_void_p(out.ptr + raw.size * 8 + first * 4),
                self._handle,
            )
            _check(status, "decompression", codec_id)
        decoded, ok = self._results(out, order)
        if not ok or (decoded != raw).any():
            raise CodecError(
                "nvCOMP could not decode a batch (a payload is not a valid stream)", codec=NAMES[codec_id]
            )


class RawNvcomp:
    """The blog's recipe, for ``ckptz bench``'s reference rows: one nvCOMP codec straight on
    the raw bytes (nvCOMP's own chunked format, default chunk size), host memory in and out.

    Args:
        algorithm: ``zstd`` or ``ans``.
        device: a CUDA device (``cuda`` or ``cuda:N``).
    """

    def __init__(self, algorithm: str, device: str) -> None:
        import nvidia.nvcomp as nvc
        import torch

        dev = torch.device(device)
        self.device = torch.device(
            "cuda", dev.index if dev.index is not None else torch.cuda.current_device()
        )
        self._stream = torch.cuda.current_stream(self.device)
        name = {NAMES[i]: a for i, a in _ALGORITHM.items()}[algorithm]
        self._nvc = nvc
        self._codec = nvc.Codec(
            algorithm=name, device_id=self.device.index, cuda_stream=self._stream.cuda_stream
        )

    def encode(self, data: Any) -> bytes:
        """Compress host bytes (a uint8 ndarray) on the GPU; return the compressed bytes."""
        import torch

        src = torch.from_numpy(data).to(self.device)
        out = self._codec.encode(self._nvc.as_array(src, self._stream.cuda_stream))
        size = int(out.buffer_size)
        blob = torch.from_dlpack(out).view(torch.uint8).reshape(-1)[:size]
        return bytes(blob.cpu().numpy().tobytes())

    def decode(self, blob: bytes, size: int) -> Any:
        """Decompress what :meth:`encode` wrote; return the original bytes as a uint8 ndarray."""
        import torch

        src = torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(self.device)
        out = self._codec.decode(self._nvc.as_array(src, self._stream.cuda_stream))
        data = torch.from_dlpack(out).view(torch.uint8).reshape(-1)[:size]
        return data.cpu().numpy()


__all__ = ["NAMES", "NvcompCodecs", "RawNvcomp", "library_path", "nvcomp_version"]
