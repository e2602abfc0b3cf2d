"""CUDA kernels for the GPU coder: split, merge and chunk gathering, one pass each.

Each job is one pass over the data (torch's operators took six to split a batch: four for
the rotation, one permuting copy, two for the constant check, and a launch per chunk to
gather payloads):

* :func:`split_rows` reads each word once, rotates it in registers, writes its bytes to
  their planes, and folds every plane row's minimum and maximum byte (a row is constant
  exactly when the two agree) and a sampled byte histogram (is the row noise?) into a
  small table, so the coder's two decisions cost no extra pass;
* :func:`merge_rows` reads each plane row from wherever it lies (a stored payload, a
  decoded plane, or a constant) and writes whole words, rotated back;
* :func:`gather` copies any number of byte ranges of one buffer to 16-byte-aligned places
  of another, zero-filling each up to its padded size: the container's data area for a
  whole batch, in one launch;
* :meth:`CudaOps.xxh3` takes the xxh3_64 of any number of ranges of device memory
  (:mod:`ckptz.engines.gpu.hash_source`): the checks of decoded bytes that stay on the GPU;
* ``literals_hist`` and ``literals_encode`` write the portable ``zstd`` bitstream
  (:mod:`ckptz.engines.gpu.literals`).

Every kernel produces exactly the bytes of the CPU transform (:mod:`ckptz.codecs.planes`);
the GPU tests compare them.

**Compiled once per machine.** The kernels' ``.cu`` files (:mod:`ckptz.engines.gpu.cuda_src`)
are compiled by NVRTC (the runtime compiler that ships with torch's CUDA libraries, or the
``nvidia-cuda-nvrtc-cu12`` wheel) for the device's architecture, and the cubin kept
in ``$XDG_CACHE_HOME/ckptz/kernels`` under a hash of the source, compiler and
architecture. A later process loads it straight into the CUDA context
(:class:`ckptz.engines.gpu.cuda.Module`): no Python JIT, no compiler in the process.
A JIT compiler in the process (Triton, which these kernels replace) cost every process's
first GPU use most of a second before its first kernel ran. Where NVRTC cannot be found or fails, :func:`available`
says why, and the GPU engine does not start.

:class:`CudaOps` is the coder's device (:class:`ckptz.engines.gpu.coder.Ops`) on one GPU and
one stream: these kernels, the worker's scratch memory, and copies of small tables.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import importlib.util
import os
import tempfile
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ckptz import cuda
from ckptz.cache import cache_folder
from ckptz.engines.gpu import cuda_src, hash_source, literals, pinned
from ckptz.engines.gpu.memory import Buf, DeviceScratch
from ckptz.engines.gpu.transform import DECODED, SAMPLE_BLOCK, SAMPLE_EVERY, STATS, STORED

#: Words per block of threads (a block's plane rows are one histogram sample block).
_BLOCK = SAMPLE_BLOCK
_THREADS = 256
#: CUDA's limit on a grid's second dimension (frames or chunks per launch).
_MAX_Y = 65535
#: Whole 1024-byte blocks each warp of ``xxh3_blocks`` sums.
_BLOCKS_PER_WARP = 8
#: Whole blocks whose sums one pair of hashing launches keeps (64 bytes each: 64 MiB of
#: scratch for a GiB of input); more inputs are hashed in several pairs.
_HASH_BLOCKS = 1 << 20
_WORDS = (1, 2, 4, 8)

_DEFINES = f"""
#define BLOCK {_BLOCK}
#define THREADS {_THREADS}
#define BLOCKS_PER_WARP {_BLOCKS_PER_WARP}
#define NSTATS {STATS}
#define SAMPLE_EVERY {SAMPLE_EVERY}
#define STORED ({STORED})
#define DECODED ({DECODED})
"""

#: (word, rotate) of every split and merge kernel compiled: rotation only for words > 1.
_SHAPES = tuple((w, r) for w in _WORDS for r in (0, 1) if w > 1 or r == 0)
NAMES = (
    *(f"{k}_{w}_{r}" for k in ("split", "merge") for w, r in _SHAPES),
    "gather",
    *hash_source.NAMES,
    *literals.NAMES,
)

#: The one program every kernel is compiled in: the shared constants, then each kernel file.
SOURCE = _DEFINES + "".join(cuda_src.read(name) for name in cuda_src.FILES)


#: The GPU architectures CI compiles the kernels for, where no GPU is at hand.
ARCHITECTURES = ("sm_80", "sm_90", "sm_100")

_MODULES: dict[int, cuda.Module | str] = {}
#: The cubin each device's module was loaded from (the native planes load it too).
_IMAGES: dict[int, bytes] = {}
_LOCK = threading.Lock()


class Nvrtc:
    """NVRTC, loaded from ``path`` (:func:`nvrtc_path`)."""

    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path)

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"{what}: {self.lib.nvrtcGetErrorString(result).decode()}")

    def compile(self, source: str, arch: str) -> bytes:
        """``source`` compiled for ``arch`` (``sm_90``): a cubin."""
        cubin, log = self.build(source, arch)
        if cubin is None:
            raise RuntimeError(f"NVRTC could not compile ckptz's kernels: {log[-400:]}")
        return cubin

    def build(self, source: str, arch: str) -> tuple[bytes | None, str]:
        """``source`` compiled for ``arch``: the cubin (None where it does not compile) and
        NVRTC's whole log."""
        prog = ctypes.c_void_p()
        self._check(
            self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"ckptz.cu", 0, None, None),
            "nvrtcCreateProgram",
        )
        try:
            opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17", b"--extra-device-vectorization"]
            result = self.lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
            size = ctypes.c_size_t()
            self._check(self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
            log = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
            if result != 0:
                return None, log.value.decode(errors="replace")
            self._check(self.lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
            cubin = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
            return cubin.raw, log.value.decode(errors="replace")
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


def nvrtc_path() -> str:
    """NVRTC where torch's CUDA wheels put it (``nvidia/cu13/lib`` for CUDA 13,
    ``nvidia/cuda_nvrtc/lib`` for CUDA 12), else the name for the loader's path."""
    spec = importlib.util.find_spec("nvidia")
    found: list[tuple[int, str]] = []
    for root in list(spec.submodule_search_locations or []) if spec is not None else []:
        for path in glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so.*")):
            suffix = path.rsplit(".so.", 1)[1]
            if suffix.isdigit():  # not the builtins or .alt libraries
                found.append((int(suffix), path))
    return max(found)[1] if found else "libnvrtc.so"


def _image(arch: str) -> bytes:
    """The kernels' cubin for ``arch``: from the cache, else compiled (and cached when the
    cache folder is writable)."""
    nvrtc = nvrtc_path()
    key = hashlib.sha256(f"{SOURCE}\0{arch}\0{_file_key(nvrtc)}".encode()).hexdigest()[:32]
    path = os.path.join(cache_folder("kernels"), f"{key}-{arch}.cubin")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        pass
    cubin = Nvrtc(nvrtc).compile(SOURCE, arch)
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: compiled again by the next process
    return cubin


def _file_key(path: str) -> str:
    """What the cached cubin depends on besides source and architecture: the NVRTC file
    (its name carries its version), without loading it."""
    try:
        st = os.stat(path)
        return f"{os.path.realpath(path)}:{st.st_size}"
    except OSError:
        return path


def _module(index: int) -> cuda.Module:
    """The kernels loaded on device ``index`` (compiled on first use per machine)."""
    with _LOCK:
        found = _MODULES.get(index)
        if found is None:
            try:
                cuda.use_device(index)
                major, minor = cuda.capability(index)
                _IMAGES[index] = _image(f"sm_{major}{minor}")
                found = cuda.Module(_IMAGES[index], NAMES)
            except (OSError, RuntimeError) as exc:
                found = f"{type(exc).__name__}: {exc}"
            _MODULES[index] = found
    if isinstance(found, str):
        raise RuntimeError(found)
    return found


def image(index: int) -> bytes:
    """The kernels' cubin for device ``index``, as loaded there (compiled on first use per
    machine).

    Raises:
        RuntimeError: the kernels cannot run there (:func:`available` says why).
    """
    _module(index)
    return _IMAGES[index]


def available(index: int) -> str | None:
    """Why the kernels cannot run on device ``index`` (NVRTC missing, compilation failed),
    or None once they are loaded there."""
    try:
        _module(index)
    except RuntimeError as exc:
        return str(exc)
    return None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _Stage:
    """Pinned host memory for a device's small copies (tables of a few KiB), taken in turn
    and given back all at once when its stream has done every copy queued from it.

    A copy from pinned memory is queued with the GIL held (:func:`cuda.copy_to_device`),
    where one from pageable memory gives the GIL up while the driver stages it: each time,
    the worker then waited for the GIL again among the pipeline's threads.
    """

    #: Bytes staged between two waits for the stream, at most.
    SIZE = 1 << 20

    def __init__(self) -> None:
        self._memory: np.ndarray | None = None
        self._used = 0

    def take(self, size: int) -> np.ndarray | None:
        """``size`` bytes (16-byte aligned), or None when they do not fit before a reset."""
        if size > self.SIZE - self._used:
            return None
        if self._memory is None:
            self._memory = pinned.pool().take(self.SIZE)
        at = self._used
        self._used += -(-size // 16) * 16
        return self._memory[at : at + size]

    def reset(self) -> None:
        self._used = 0


class CudaOps:
    """The coder's device on GPU ``index``: kernels and copies queued on ``stream`` (a
    ``CUstream`` handle), buffers from ``scratch``. The calling thread must have the
    device's context current (:func:`ckptz.engines.gpu.cuda.use_device`)."""

    def __init__(self, index: int, stream: int, scratch: DeviceScratch) -> None:
        self.index = index
        self.stream = stream
        self._scratch = scratch
        self._module = _module(index)
        self._stage = _Stage()

    def scratch(self, name: str, size: int) -> Buf:
        return self._scratch.get(name, size).at(0, size)

    def upload(self, name: str, arr: np.ndarray) -> Buf:
        """``arr`` (contiguous) copied into scratch buffer ``name``; ``arr`` may change once
        this returns.

        A small array goes through this device's pinned staging memory (:class:`_Stage`), so
        the copy is queued without giving up the GIL; a large one the driver stages."""
        buf = self.scratch(name, arr.nbytes)
        room = self._stage.take(arr.nbytes)
        if room is None:
            cuda.copy_to_device(buf.ptr, arr.ctypes.data, arr.nbytes, self.stream, pinned=False)
        else:
            room[:] = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            cuda.copy_to_device(buf.ptr, room.ctypes.data, arr.nbytes, self.stream)
        return buf

    def download(self, buf: Buf, dtype: type | np.dtype) -> np.ndarray:
        """``buf``'s bytes as a host array of ``dtype``, once the work queued before is done."""
        out = np.empty(buf.size // np.dtype(dtype).itemsize, dtype=dtype)
        if not out.nbytes:  # nothing queued to wait for (an empty buffer has no address)
            return out
        cuda.copy_to_host(out.ctypes.data, buf.ptr, out.nbytes, self.stream, pinned=False)
        self._stage.reset()  # the stream has done everything queued: staged copies included
        return out

    def synchronize(self) -> None:
        """Wait for everything queued on the stream (staged copies included: their memory is
        free again)."""
        cuda.synchronize(self.stream)
        self._stage.reset()

    def queue_download(self, buf: Buf, dtype: type | np.dtype) -> np.ndarray:
        """``buf``'s bytes as a host array of ``dtype`` that the stream fills once the work
        queued before is done, with no wait of its own: the caller waits for the stream
        (:meth:`synchronize`) and reads it before its next copy. Too large to stage: a
        :meth:`download`, which waits now."""
        count = buf.size // np.dtype(dtype).itemsize
        room = self._stage.take(count * np.dtype(dtype).itemsize) if count else None
        if room is None:
            return self.download(buf, dtype)
        cuda.copy_to_host(room.ctypes.data, buf.ptr, room.size, self.stream)
        return room.view(dtype)

    def init_stats(self, stats: Buf, rows: int) -> None:
        """Statistics rows for :meth:`split_rows`: zero but for column 0 (255)."""
        cuda.fill32(stats.ptr, 0, rows * STATS, self.stream)
        cuda.fill32(stats.ptr, 255, 1, self.stream, every=STATS, rows=rows)

    def launch(self, name: str, grid: tuple[int, int], args: Sequence[Any]) -> None:
        """Queue kernel ``name`` on the stream: ``grid`` blocks of :data:`_THREADS` threads."""
        self._module.launch(name, grid, _THREADS, args, self.stream)

    def split_rows(
        self, raw: Buf, planes: Buf, stats: Buf, k: int, stride: int, word: int, rotate: bool
    ) -> None:
        """Split ``k`` equal frames into planes, gathering each row's statistics on the way.

        Args:
            raw: ``k * n`` bytes, 16-byte aligned.
            planes: ``k * word`` rows of ``stride`` bytes; the first ``n // word`` bytes of
                each row are written.
            stats: int32 rows of :data:`STATS` from :meth:`init_stats`, one per plane row:
                its minimum and maximum byte are folded into columns 0 and 1, and a byte
                histogram of a sample of its full blocks (1 in 8) added to columns 2..257.
            word: bytes per word (1, 2, 4 or 8).
            rotate: rotate float words left by one bit first.
        """
        m = raw.size // max(k, 1) // word
        if k == 0 or m == 0:
            return
        name = f"split_{word}_{int(rotate and word > 1)}"
        for f0 in range(0, k, _MAX_Y):
            f1 = min(k, f0 + _MAX_Y)
            args = [
                cuda.pointer(raw.ptr + f0 * m * word),
                cuda.pointer(planes.ptr + f0 * word * stride),
                cuda.pointer(stats.ptr + f0 * word * STATS * 4),
                ctypes.c_int64(m),
                ctypes.c_int64(stride),
            ]
            self.launch(name, (_cdiv(m, _BLOCK), f1 - f0), args)

    def merge_rows(
        self, stored: Buf, decoded: Buf, offsets: Buf, sources: Buf, raw: Buf, k: int, word: int, rotate: bool
    ) -> None:
        """Interleave ``k`` frames' plane rows, found in either of two buffers, into ``raw``.

        Args:
            stored: rows stored raw (the payloads).
            decoded: rows an nvCOMP codec decoded.
            offsets: int64 ``[k * word]``: where row ``f * word + p`` starts in its buffer,
                in units of 16 bytes.
            sources: int64 ``[k * word]``: ``STORED``, ``DECODED`` or the row's byte (>= 0)
                when it is constant.
            raw: ``k * n`` bytes (16-byte aligned) to write.
            word: bytes per word.
            rotate: undo the left rotation of float words.
        """
        m = raw.size // max(k, 1) // word
        name = f"merge_{word}_{int(rotate and word > 1)}"
        for f0 in range(0, k if m else 0, _MAX_Y):
            f1 = min(k, f0 + _MAX_Y)
            args = [
                cuda.pointer(stored.ptr),
                cuda.pointer(decoded.ptr),
                cuda.pointer(offsets.ptr + f0 * word * 8),
                cuda.pointer(sources.ptr + f0 * word * 8),
                cuda.pointer(raw.ptr + f0 * m * word),
                ctypes.c_int64(m),
            ]
            self.launch(name, (_cdiv(m, _BLOCK), f1 - f0), args)

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
        """Copy ``sizes[c]`` bytes from ``src`` to ``dst``, zero-filled up to ``padded[c]``
        bytes, for ``count`` ranges (int64 tables; offsets in units of 16 bytes, every range
        starting aligned; ``longest`` the largest padded size)."""
        for c0 in range(0, count if longest else 0, _MAX_Y):
            c1 = min(count, c0 + _MAX_Y)
            args = [
                cuda.pointer(src.ptr),
                cuda.pointer(src_offsets.ptr + c0 * 8),
                cuda.pointer(sizes.ptr + c0 * 8),
                cuda.pointer(dst.ptr),
                cuda.pointer(dst_offsets.ptr + c0 * 8),
                cuda.pointer(padded.ptr + c0 * 8),
            ]
            self.launch("gather", (_cdiv(longest // 4, _BLOCK), c1 - c0), args)

    def xxh3(self, ptrs: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The xxh3_64 (seed 0) of ``lengths[i]`` bytes at device address ``ptrs[i]`` for each
        ``i``, once the work queued before on the stream is done (uint64, on the host)."""
        return self.download(self.queue_xxh3(ptrs, lengths), np.uint64)

    def queue_xxh3(self, ptrs: np.ndarray, lengths: np.ndarray, name: str = "hash") -> Buf:
        """:meth:`xxh3`, queued on the stream without waiting: the hashes land in scratch
        buffer ``name`` (uint64 each) for :meth:`download` once wanted (a batch's frames,
        hashed while the rest of its work is queued behind).

        Two launches per group of inputs (:mod:`~ckptz.engines.gpu.hash_source`): every
        whole block's sums at once, then one warp per input chaining them."""
        n = len(ptrs)
        if not n:
            return Buf(0, 0)
        sizes = np.asarray(lengths, np.int64)
        blocks = np.where(sizes > 240, (sizes - 1) // 1024, 0)
        before = np.concatenate([[0], np.cumsum(blocks)])
        out = self.scratch(f"{name}_out", 8 * n)
        lo = 0
        while lo < n:  # inputs whose sums fit the scratch (at least one)
            hi = max(lo + 1, int(np.searchsorted(before, before[lo] + _HASH_BLOCKS, "right")) - 1)
            hi = min(hi, n)
            starts = before[lo : hi + 1] - before[lo]
            total = int(starts[-1])
            table = self.upload(
                f"{name}_in",
                np.concatenate([np.asarray(a, np.uint64) for a in (ptrs[lo:hi], lengths[lo:hi], starts)]),
            )
            count = hi - lo
            at_lengths, at_starts = table.ptr + 8 * count, table.ptr + 16 * count
            sums = self.scratch(f"{name}_sums", max(64 * total, 8))
            if total:
                args = [
                    cuda.pointer(table.ptr),
                    cuda.pointer(at_starts),
                    ctypes.c_int64(count),
                    ctypes.c_int64(total),
                ]
                per = (_THREADS // 32) * _BLOCKS_PER_WARP
                self.launch("xxh3_blocks", (_cdiv(total, per), 1), [*args, cuda.pointer(sums.ptr)])
            args = [
                cuda.pointer(table.ptr),
                cuda.pointer(at_lengths),
                cuda.pointer(at_starts),
                cuda.pointer(sums.ptr),
            ]
            out_at = cuda.pointer(out.ptr + 8 * lo)
            self.launch(
                "xxh3_many", (_cdiv(count, _THREADS // 32), 1), [*args, out_at, ctypes.c_int64(count)]
            )
            lo = hi
        return out

    def copy_ranges(self, src: np.ndarray, dst: np.ndarray, lengths: np.ndarray) -> None:
        """Queue copies of ``lengths[i]`` bytes from device address ``src[i]`` to ``dst[i]``."""
        n = len(src)
        longest = int(lengths.max(initial=0))
        if not n or not longest:
            return
        table = self.upload("copy_in", np.concatenate([src, dst, lengths]).astype(np.uint64))
        blocks = min(_cdiv(longest, _THREADS * 4), 1024)
        for c0 in range(0, n, _MAX_Y):
            c1 = min(n, c0 + _MAX_Y)
            args = [
                cuda.pointer(table.ptr + 8 * c0),
                cuda.pointer(table.ptr + 8 * (n + c0)),
                cuda.pointer(table.ptr + 8 * (2 * n + c0)),
            ]
            self.launch("copy_ranges", (blocks, c1 - c0), args)


__all__ = ["CudaOps", "available"]
