"""Buffers of the GPU coder: address ranges, and the scratch memory a worker reuses.

A :class:`Buf` is a range of bytes at an address: device memory on a GPU
(:class:`DeviceScratch`), host memory where the coder runs on the host
(:class:`ckptz.engines.gpu.transform.HostOps`, for tests and as the reference). The coder
slices buffers and hands their addresses to kernels and nvCOMP; nothing here owns memory
but the scratch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from ckptz import cuda


@dataclass(frozen=True, slots=True)
class Buf:
    """``size`` bytes at address ``ptr``."""

    ptr: int
    size: int

    def at(self, offset: int, size: int | None = None) -> Buf:
        """The ``size`` bytes (default: the rest) from ``offset``."""
        n = self.size - offset if size is None else size
        if offset < 0 or n < 0 or offset + n > self.size:
            raise ValueError(f"[{offset}, +{n}) is outside a buffer of {self.size} bytes")
        return Buf(self.ptr + offset, n)


@dataclass(frozen=True, slots=True)
class DeviceBytes:
    """Bytes on a GPU, handed to a :data:`~ckptz.engines.base.Place` callback: ``buf`` on
    device ``index`` (-1: host memory, the coder's host device), valid until work queued on
    ``stream`` after the callback."""

    buf: Buf
    index: int
    stream: int


class _Sized(Protocol):
    @property
    def size(self) -> int: ...


_T = TypeVar("_T", bound=_Sized)


class Reused(Generic[_T]):
    """Buffers by name, kept from batch to batch and grown on demand (with headroom: batches
    vary a little in size).

    A buffer replaced while a batch runs may still be in use by work queued before: it is
    released at the next :meth:`reset`, which the owner calls once that batch is over.

    Args:
        make: a new buffer of at least the size asked.
        release: gives a buffer back (default: drop it).
    """

    def __init__(self, make: Callable[[int], _T], release: Callable[[_T], None] | None = None) -> None:
        self._make = make
        self._release = release or (lambda _: None)
        self._buffers: dict[str, _T] = {}
        self._retired: list[_T] = []

    def get(self, name: str, size: int) -> _T:
        """Buffer ``name``, at least ``size`` bytes (contents undefined)."""
        buf = self._buffers.get(name)
        if buf is None or buf.size < size:
            if buf is not None:
                self._retired.append(buf)
            self._buffers[name] = buf = self._make(size + size // 4)
        return buf

    def reset(self) -> None:
        """A batch is over: release the buffers it replaced."""
        for buf in self._retired:
            self._release(buf)
        self._retired.clear()

    def close(self) -> None:
        """Release everything (nothing may still use it)."""
        self.reset()
        for buf in self._buffers.values():
            self._release(buf)
        self._buffers.clear()


def _device_alloc(size: int) -> Buf:
    return Buf(cuda.alloc(size), size)


def _device_free(buf: Buf) -> None:
    cuda.free(buf.ptr, buf.size)


class DeviceScratch(Reused[Buf]):
    """A worker's device buffers (freed at :meth:`reset` once replaced, which the worker
    calls when its stream has finished the batch)."""

    def __init__(self) -> None:
        super().__init__(_device_alloc, _device_free)


__all__ = ["Buf", "DeviceBytes", "DeviceScratch", "Reused"]
