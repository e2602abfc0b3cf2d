"""The CUDA driver API through ctypes: the context, modules and kernel launches.

Two jobs that torch cannot do for ckptz, or not early enough:

* :func:`warm` creates a device's primary context on a thread of its own, beside
  ``import torch`` (which holds the GIL for 1.5-4 s; the driver call does not need it).
  torch then finds the context made (measured alone on the H100 host: ``import torch``
  then a first CUDA call, 4.1-5.1 s without, 3.6-4.0 s with; whole ``ckptz`` commands
  showed no difference beyond their noise, BENCHMARKS.md, session 18).
* :class:`Module` loads compiled kernels (a cubin or PTX image, see
  :mod:`ckptz.engines.gpu.kernels`) into the current context and launches them on a torch
  stream, with no JIT compiler in the process.

Importing this module imports neither torch nor CUDA; the first call loads ``libcuda``.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Sequence
from typing import Any

_LIB: ctypes.CDLL | None = None
_LOCK = threading.Lock()
_WARMING: dict[int, threading.Thread] = {}


class DriverError(RuntimeError):
    """A CUDA driver call failed."""


def _lib() -> ctypes.CDLL:
    global _LIB
    with _LOCK:
        if _LIB is None:
            _LIB = ctypes.CDLL("libcuda.so.1")
        return _LIB


def check(result: int, what: str) -> None:
    """Raise :class:`DriverError` for a failed driver call (``CUresult`` other than 0)."""
    if result != 0:
        text = ctypes.c_char_p()
        _lib().cuGetErrorString(result, ctypes.byref(text))
        name = text.value.decode() if text.value else f"error {result}"
        raise DriverError(f"{what}: {name}")


def _retain(index: int) -> None:
    lib = _lib()
    check(lib.cuInit(0), "cuInit")
    device = ctypes.c_int()
    check(lib.cuDeviceGet(ctypes.byref(device), index), "cuDeviceGet")
    context = ctypes.c_void_p()
    check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")


def warm(index: int) -> None:
    """Start creating device ``index``'s primary context on a thread (once per device).

    Failures are left for the caller's own CUDA calls to report. The thread is not a daemon:
    the interpreter waits for it at exit rather than tearing CUDA down under it.
    """

    def run() -> None:
        with contextlib.suppress(OSError, DriverError, AttributeError):
            _retain(index)

    with _LOCK:
        if index in _WARMING:
            return
        _WARMING[index] = thread = threading.Thread(target=run, name=f"ckptz-cuda{index}-warm")
    thread.start()


class Module:
    """A compiled image loaded into the calling thread's current context (torch's primary
    context of the device), and its kernels by name.

    Args:
        image: a cubin, or NUL-terminated PTX.
        names: the kernels to look up.
    """

    def __init__(self, image: bytes, names: Sequence[str]) -> None:
        lib = _lib()
        self._module = ctypes.c_void_p()
        check(lib.cuModuleLoadData(ctypes.byref(self._module), image), "cuModuleLoadData")
        self.functions: dict[str, ctypes.c_void_p] = {}
        for name in names:
            fn = ctypes.c_void_p()
            check(lib.cuModuleGetFunction(ctypes.byref(fn), self._module, name.encode()), name)
            self.functions[name] = fn

    def launch(
        self,
        name: str,
        grid: tuple[int, int],
        threads: int,
        args: Sequence[Any],
        stream: int,
    ) -> None:
        """Queue kernel ``name`` on ``stream`` (a ``CUstream`` handle, e.g. a torch stream's
        ``cuda_stream``) with a ``grid`` of blocks of ``threads`` threads."""
        params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        check(
            _lib().cuLaunchKernel(
                self.functions[name],
                ctypes.c_uint(grid[0]),
                ctypes.c_uint(grid[1]),
                ctypes.c_uint(1),
                ctypes.c_uint(threads),
                ctypes.c_uint(1),
                ctypes.c_uint(1),
                ctypes.c_uint(0),
                ctypes.c_void_p(stream),
                params,
                None,
            ),
            name,
        )


__all__ = ["DriverError", "Module", "check", "warm"]
