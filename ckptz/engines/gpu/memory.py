"""Buffers of the GPU coder: address ranges, and the scratch memory a worker reuses.

A :class:`Buf` is a range of bytes at an address: device memory on a GPU
(:class:`DeviceScratch`), host memory where the coder runs on the host
(:class:`ckptz.engines.gpu.transform.HostOps`, for tests and as the reference). The coder
slices buffers and hands their addresses to kernels and nvCOMP; nothing here owns memory
but the scratch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptz.engines.gpu import driver


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


class DeviceScratch:
    """A worker's device buffers by name, kept from batch to batch and grown on demand.

    A buffer replaced while a batch runs may still be read by work queued before: it is
    freed at the next :meth:`reset`, which the worker calls once that batch is over.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, tuple[int, int]] = {}
        self._retired: list[tuple[int, int]] = []

    def get(self, name: str, size: int) -> Buf:
        """At least ``size`` bytes (contents undefined), as a :class:`Buf` of ``size``."""
        ptr, cap = self._buffers.get(name, (0, 0))
        if cap < size:
            if cap:
                self._retired.append((ptr, cap))
            cap = size + size // 4  # batches vary a little in size
            self._buffers[name] = ptr, cap = driver.alloc(cap), cap
        return Buf(ptr, size)

    def reset(self) -> None:
        """A batch is over (its stream synchronised): free the buffers it replaced."""
        for ptr, cap in self._retired:
            driver.free(ptr, cap)
        self._retired.clear()

    def close(self) -> None:
        """Free everything (no work may be queued on it)."""
        self.reset()
        for ptr, cap in self._buffers.values():
            driver.free(ptr, cap)
        self._buffers.clear()


__all__ = ["Buf", "DeviceBytes", "DeviceScratch"]
