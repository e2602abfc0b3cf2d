"""The CUDA driver API through ctypes: everything the GPU engine asks of CUDA, without torch.

The engine needs little of CUDA: a device's primary context, streams, device memory,
copies between host and device, page-locked host memory, and its kernels
(:mod:`ckptz.engines.gpu.kernels`, compiled by NVRTC and loaded here as a :class:`Module`).
torch would bring all of that at the price of ``import torch``, which takes seconds even
with its bytecode cached, more than the rest of a small command together. The driver library is already loaded by any
process that uses CUDA, so calling it directly costs nothing to import.

Calls are made two ways. Those that return at once (queueing a copy from page-locked
memory or a kernel, setting a context) keep the GIL (:data:`_QUICK`): releasing and
retaking it costs more than the call when other threads want it, and the GPU workers'
GIL waits were their main cost. Those that may block
(synchronising, allocating, pinning, copying pageable memory) release it (:data:`_SLOW`).

The primary context is the one torch and nvCOMP use too, so memory, streams and pointers
pass freely between them in one process. :func:`warm` creates it on a thread of its own
while the rest of the process starts.

Importing this module loads nothing (no numpy, nothing else of ckptz), so the CLI can start
a context before the rest of ckptz loads (:func:`ckptz.devices.warm_named_gpu`); the first
call loads ``libcuda``.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Sequence
from typing import Any

_LOCK = threading.Lock()
_WARMING: dict[int, threading.Thread] = {}
_CONTEXTS: dict[int, int] = {}
_LIBS: tuple[ctypes.CDLL, ctypes.CDLL] | None = None
_local = threading.local()

_P = ctypes.c_void_p
_U64 = ctypes.c_uint64
_SIZE = ctypes.c_size_t
_INT = ctypes.c_int
_UINT = ctypes.c_uint
_REF = ctypes.POINTER

#: Argument types of every driver function used (``CUdeviceptr`` is a 64-bit integer,
#: handles are pointers), so ctypes never truncates an address or a size.
_SIGNATURES: dict[str, list[Any]] = {
    "cuInit": [_UINT],
    "cuGetErrorString": [_INT, _REF(ctypes.c_char_p)],
    "cuDeviceGetCount": [_REF(_INT)],
    "cuDeviceGet": [_REF(_INT), _INT],
    "cuDeviceGetAttribute": [_REF(_INT), _INT, _INT],
    "cuDeviceGetName": [ctypes.c_char_p, _INT, _INT],
    "cuDriverGetVersion": [_REF(_INT)],
    "cuDevicePrimaryCtxRetain": [_REF(_P), _INT],
    "cuCtxSetCurrent": [_P],
    "cuCtxGetCurrent": [_REF(_P)],
    "cuStreamCreate": [_REF(_P), _UINT],
    "cuStreamDestroy_v2": [_P],
    "cuStreamSynchronize": [_P],
    "cuMemAlloc_v2": [_REF(_U64), _SIZE],
    "cuMemFree_v2": [_U64],
    "cuMemGetInfo_v2": [_REF(_SIZE), _REF(_SIZE)],
    "cuMemcpyHtoDAsync_v2": [_U64, _P, _SIZE, _P],
    "cuMemcpyDtoHAsync_v2": [_P, _U64, _SIZE, _P],
    "cuMemcpyDtoDAsync_v2": [_U64, _U64, _SIZE, _P],
    "cuMemsetD8Async": [_U64, ctypes.c_ubyte, _SIZE, _P],
    "cuMemsetD32Async": [_U64, _UINT, _SIZE, _P],
    "cuMemsetD2D32Async": [_U64, _SIZE, _UINT, _SIZE, _SIZE, _P],
    "cuMemHostRegister_v2": [_P, _SIZE, _UINT],
    "cuMemHostUnregister": [_P],
    "cuMemHostAlloc": [_REF(_P), _SIZE, _UINT],
    "cuMemFreeHost": [_P],
    "cuModuleLoadData": [_REF(_P), ctypes.c_char_p],
    "cuModuleGetFunction": [_REF(_P), _P, ctypes.c_char_p],
    "cuLaunchKernel": [_P, _UINT, _UINT, _UINT, _UINT, _UINT, _UINT, _UINT, _P, _REF(_P), _P],
}

#: ``CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR`` / ``_MINOR``.
_CC_MAJOR, _CC_MINOR = 75, 76
#: ``CU_STREAM_NON_BLOCKING``: the stream does not wait for the legacy default stream.
_NON_BLOCKING = 1
#: ``CU_MEMHOSTREGISTER_PORTABLE`` / ``CU_MEMHOSTALLOC_PORTABLE``: pinned for every context.
_PORTABLE = 1


class DriverError(RuntimeError):
    """A CUDA driver call failed."""


def _libs() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """``libcuda`` twice: through :class:`ctypes.CDLL` (calls release the GIL) and
    :class:`ctypes.PyDLL` (calls keep it)."""
    global _LIBS
    with _LOCK:
        if _LIBS is None:
            slow, quick = ctypes.CDLL("libcuda.so.1"), ctypes.PyDLL("libcuda.so.1")
            for lib in (slow, quick):
                for name, argtypes in _SIGNATURES.items():
                    fn = getattr(lib, name)
                    fn.argtypes, fn.restype = argtypes, _INT
            _LIBS = (slow, quick)
        return _LIBS


def driver_installed() -> bool:
    """Whether the CUDA driver library loads here (without starting it)."""
    try:
        _libs()
    except OSError:
        return False
    return True


def _slow() -> Any:
    return _libs()[0]


def _quick() -> Any:
    return _libs()[1]


def check(result: int, what: str) -> None:
    """Raise :class:`DriverError` for a failed driver call (``CUresult`` other than 0)."""
    if result != 0:
        text = ctypes.c_char_p()
        _slow().cuGetErrorString(result, ctypes.byref(text))
        name = text.value.decode() if text.value else f"error {result}"
        raise DriverError(f"{what}: {name}")


def _init() -> Any:
    """The driver (GIL released), initialised."""
    lib = _slow()
    check(lib.cuInit(0), "cuInit")
    return lib


def device_count() -> int:
    """CUDA devices visible to this process (after ``CUDA_VISIBLE_DEVICES``).

    Raises:
        OSError: no CUDA driver on this machine.
        DriverError: the driver would not start.
    """
    lib = _init()
    n = _INT()
    check(lib.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
    return int(n.value)


def _primary(index: int) -> int:
    """Device ``index``'s primary context, retained once per process."""
    found = _CONTEXTS.get(index)
    if found is None:
        lib = _init()
        device = _INT()
        check(lib.cuDeviceGet(ctypes.byref(device), index), f"cuDeviceGet({index})")
        ctx = _P()
        check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device), "cuDevicePrimaryCtxRetain")
        with _LOCK:
            found = _CONTEXTS.setdefault(index, int(ctx.value or 0))
    return found


def use_device(index: int) -> None:
    """Make device ``index``'s primary context current on the calling thread."""
    ctx = _primary(index)
    if getattr(_local, "ctx", None) != ctx:
        check(_quick().cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        _local.ctx = ctx


def _any_context() -> None:
    """A context current on this thread for calls that need one but no device in particular
    (pinning host memory portably): the current one, else a device's already retained, else
    device 0's."""
    current = _P()
    check(_quick().cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
    if not current.value:
        use_device(next(iter(_CONTEXTS), 0))


def capability(index: int) -> tuple[int, int]:
    """Device ``index``'s compute capability, e.g. ``(9, 0)``."""
    lib = _init()
    out = []
    for attr in (_CC_MAJOR, _CC_MINOR):
        value = _INT()
        check(lib.cuDeviceGetAttribute(ctypes.byref(value), attr, index), "cuDeviceGetAttribute")
        out.append(int(value.value))
    return out[0], out[1]


def device_name(index: int) -> str:
    """Device ``index``'s name, e.g. ``NVIDIA H100 80GB HBM3``."""
    name = ctypes.create_string_buffer(256)
    check(_init().cuDeviceGetName(name, len(name), index), "cuDeviceGetName")
    return name.value.decode(errors="replace")


def driver_version() -> int:
    """The CUDA version the driver supports, as the driver gives it (e.g. 12040 for 12.4)."""
    value = _INT()
    check(_slow().cuDriverGetVersion(ctypes.byref(value)), "cuDriverGetVersion")
    return int(value.value)


def warm(index: int) -> None:
    """Start creating device ``index``'s primary context on a thread (once per device).

    Failures are left for the caller's own CUDA calls to report. The thread is not a daemon:
    the interpreter waits for it at exit rather than tearing CUDA down under it.
    """

    def run() -> None:
        with contextlib.suppress(OSError, DriverError, AttributeError):
            _primary(index)

    with _LOCK:
        if index in _WARMING:
            return
        _WARMING[index] = thread = threading.Thread(target=run, name=f"ckptz-cuda{index}-warm")
    thread.start()


def synchronize(stream: int) -> None:
    """Wait for everything queued on ``stream`` (the GIL given up meanwhile)."""
    check(_slow().cuStreamSynchronize(stream), "cuStreamSynchronize")


class Stream:
    """A CUDA stream of the calling thread's current context, not ordered after the
    legacy default stream (torch's and anyone else's work there does not hold it up)."""

    def __init__(self) -> None:
        handle = _P()
        check(_slow().cuStreamCreate(ctypes.byref(handle), _NON_BLOCKING), "cuStreamCreate")
        self.handle = int(handle.value or 0)

    def synchronize(self) -> None:
        """Wait for everything queued on the stream."""
        synchronize(self.handle)

    def close(self) -> None:
        if self.handle:
            _slow().cuStreamDestroy_v2(self.handle)
            self.handle = 0


# -- memory ---------------------------------------------------------------------------------

_held = 0
_peak = 0


def alloc(size: int) -> int:
    """``size`` bytes of device memory in the current context (counted for :func:`peak`)."""
    global _held, _peak
    ptr = _U64()
    check(_slow().cuMemAlloc_v2(ctypes.byref(ptr), max(size, 1)), f"cuMemAlloc({size})")
    with _LOCK:
        _held += size
        _peak = max(_peak, _held)
    return int(ptr.value)


def free(ptr: int, size: int) -> None:
    """Give back what :func:`alloc` returned (``size`` as asked then)."""
    global _held
    check(_slow().cuMemFree_v2(ptr), "cuMemFree")
    with _LOCK:
        _held -= size


def held() -> int:
    """Device memory ckptz holds now in this process (bytes): from Python and in the native
    plane's GPU engines."""
    from ckptz.codecs.native import native  # numpy: not before a GPU command warms its context

    with _LOCK:
        return _held + native.gpu_memory()[0]


def peak(reset: bool = False) -> int:
    """The most device memory ckptz held at once in this process (bytes; Python's peak and
    the native plane's, added, so never less than the true peak); ``reset`` starts counting
    again from what is held now."""
    from ckptz.codecs.native import native

    global _peak
    with _LOCK:
        out = _peak + native.gpu_memory(reset)[1]
        if reset:
            _peak = _held
        return out


def copy_to_device(dst: int, src: int, size: int, stream: int, *, pinned: bool = True) -> None:
    """Queue a copy of ``size`` host bytes at ``src`` to device address ``dst``. From pageable
    memory (``pinned=False``) the driver stages the bytes before it returns."""
    if size:
        lib = _quick() if pinned else _slow()
        check(lib.cuMemcpyHtoDAsync_v2(dst, src, size, stream), "cuMemcpyHtoDAsync")


def copy_to_host(dst: int, src: int, size: int, stream: int, *, pinned: bool = True) -> None:
    """Queue a copy of ``size`` device bytes at ``src`` to host address ``dst``; into
    pageable memory (``pinned=False``) it returns once the bytes are there."""
    if size:
        lib = _quick() if pinned else _slow()
        check(lib.cuMemcpyDtoHAsync_v2(dst, src, size, stream), "cuMemcpyDtoHAsync")


def copy_on_device(dst: int, src: int, size: int, stream: int) -> None:
    """Queue a device-to-device copy."""
    if size:
        check(_quick().cuMemcpyDtoDAsync_v2(dst, src, size, stream), "cuMemcpyDtoDAsync")


def fill8(dst: int, value: int, size: int, stream: int) -> None:
    """Queue setting ``size`` bytes at device address ``dst`` to ``value``."""
    if size:
        check(_quick().cuMemsetD8Async(dst, value, size, stream), "cuMemsetD8Async")


def fill32(dst: int, value: int, words: int, stream: int, *, every: int = 1, rows: int = 1) -> None:
    """Queue setting 32-bit words to ``value``: ``words`` of them, or with ``every`` > 1 the
    first ``words`` of each of ``rows`` rows ``every`` words apart."""
    if every == 1:
        check(_quick().cuMemsetD32Async(dst, value, words * rows, stream), "cuMemsetD32Async")
    elif rows:
        check(_quick().cuMemsetD2D32Async(dst, every * 4, value, words, rows, stream), "cuMemsetD2D32Async")


def host_register(ptr: int, size: int) -> None:
    """Page-lock ``size`` bytes of host memory at ``ptr`` for every context."""
    _any_context()
    check(_slow().cuMemHostRegister_v2(ptr, size, _PORTABLE), "cuMemHostRegister")


def host_unregister(ptr: int) -> bool:
    """Undo :func:`host_register`; False where the driver refused."""
    _any_context()
    return int(_slow().cuMemHostUnregister(ptr)) == 0


def host_alloc(size: int) -> int:
    """``size`` bytes of page-locked host memory for every context."""
    _any_context()
    ptr = _P()
    check(_slow().cuMemHostAlloc(ctypes.byref(ptr), size, _PORTABLE), f"cuMemHostAlloc({size})")
    return int(ptr.value or 0)


def host_free(ptr: int) -> None:
    """Give back what :func:`host_alloc` returned."""
    _slow().cuMemFreeHost(ptr)


# -- kernels --------------------------------------------------------------------------------


def pointer(address: int) -> ctypes.c_void_p:
    """A device (or pinned host) address as a kernel argument (:meth:`Module.launch`)."""
    return ctypes.c_void_p(address)


class Module:
    """A compiled image loaded into the calling thread's current context, and its kernels by
    name.

    Args:
        image: a cubin, or NUL-terminated PTX.
        names: the kernels to look up.
    """

    def __init__(self, image: bytes, names: Sequence[str]) -> None:
        lib = _slow()
        module = _P()
        check(lib.cuModuleLoadData(ctypes.byref(module), image), "cuModuleLoadData")
        self.functions: dict[str, int] = {}
        for name in names:
            fn = _P()
            check(lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()), name)
            self.functions[name] = int(fn.value or 0)

    def launch(
        self, name: str, grid: tuple[int, int], threads: int, args: Sequence[Any], stream: int
    ) -> None:
        """Queue kernel ``name`` on ``stream`` with a ``grid`` of blocks of ``threads`` threads;
        ``args`` are ctypes values."""
        params = (_P * len(args))(*[ctypes.addressof(a) for a in args])
        check(
            _quick().cuLaunchKernel(
                self.functions[name], grid[0], grid[1], 1, threads, 1, 1, 0, stream, params, None
            ),
            name,
        )


__all__ = [
    "DriverError",
    "Module",
    "Stream",
    "alloc",
    "capability",
    "check",
    "copy_on_device",
    "copy_to_device",
    "copy_to_host",
    "device_count",
    "fill32",
    "free",
    "held",
    "host_alloc",
    "host_free",
    "host_register",
    "host_unregister",
    "peak",
    "use_device",
    "warm",
]
