"""Restoring a whole container at once: into one buffer, straight into many, or into a file.

:func:`restore_into` runs the pipeline's one restore loop (:func:`ckptz.pipeline.restore`:
parallel reads and decoding, every payload, frame and whole-file check) with a
:class:`RangeSink`, which copies each decoded frame's bytes to the buffers that hold their
file offsets. ``ckptz.load`` gives it one buffer for the whole file; ``ckptz.load_file``
gives it each tensor's own storage, so decoded bytes are copied once, into their tensors.
:func:`restore_to_file` writes a private copy (``ckptz.load(..., mmap=True)`` maps it).
:class:`MemoryFile` reads a buffer as a file, for ``torch.load``.
"""

from __future__ import annotations

import bisect
import io
import itertools
import operator
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from ckptz.container import Index, read_index
from ckptz.engines.base import Engine
from ckptz.engines.cpu import CpuEngine
from ckptz.errors import OutOfMemoryError
from ckptz.pipeline.plan import Frame
from ckptz.pipeline.restore import FileSink, restore
from ckptz.safeio import check_room, os_error

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer


class RangeSink:
    """Copies restored bytes into buffers that each hold one range of the original file.

    ``targets`` are ``(file offset, uint8 array)`` pairs whose ranges do not overlap (any
    sliceable buffer with a length: :mod:`ckptz.pipeline.device` adds GPU tensors); bytes of
    the file outside them are dropped (they are still checked). Called from many threads at
    once: frames are disjoint, so no two threads write the same byte.
    """

    def __init__(self, targets: Sequence[tuple[int, Any]]) -> None:
        self._targets = sorted(targets, key=lambda t: t[0])
        self._starts = [at for at, _ in self._targets]
        for (a, buf), (b, _) in itertools.pairwise(self._targets):
            if a + len(buf) > b:
                raise ValueError(f"target ranges overlap at byte {b}")

    def put(self, frame: Frame, data: np.ndarray) -> None:
        for buf, dst, src in self.overlaps(frame):
            # numpy copies without the GIL, so frames land in parallel.
            buf[dst] = data[src]

    def host_file(self, size: int) -> np.ndarray | None:
        """The one host array that receives a whole ``size``-byte file, where that is what
        this sink is (the native restore plane then writes into it); else None."""
        if type(self) is not RangeSink or len(self._targets) != 1:
            return None
        at, buf = self._targets[0]
        whole = isinstance(buf, np.ndarray) and buf.dtype == np.uint8 and buf.ndim == 1 and buf.size == size
        return buf if at == 0 and whole and buf.flags.c_contiguous and buf.flags.writeable else None

    def overlaps(self, frame: Frame) -> Iterator[tuple[Any, slice, slice]]:
        """Each target ``frame`` reaches, with the slice of it and of the frame's bytes that meet."""
        for at, within, n in frame.pieces:
            end = at + n
            k = max(0, bisect.bisect_right(self._starts, at) - 1)
            while k < len(self._targets) and self._starts[k] < end:
                t_at, buf = self._targets[k]
                s, e = max(at, t_at), min(end, t_at + len(buf))
                if s < e:
                    yield buf, slice(s - t_at, e - t_at), slice(within + s - at, within + e - at)
                k += 1

    def finish(self) -> None:
        pass


def restore_into(
    container: BinaryIO,
    path: str,
    targets: Sequence[tuple[int, np.ndarray]],
    *,
    index: Index | None = None,
    engine: Engine | None = None,
) -> Index:
    """Decode the container open as ``container`` (a real file) into ``targets``, with
    ``engine`` (default: the CPU's).

    Raises:
        ContainerError: the container is unreadable.
        CorruptionError: some bytes fail their checksum.
        CodecUnavailableError: a chunk's bitstream cannot be decoded by the engine.
    """
    index = index or read_index(container, path)
    if engine is not None:
        restore(container, path, engine, RangeSink(targets), index=index)
        return index
    with CpuEngine() as cpu:
        restore(container, path, cpu, RangeSink(targets), index=index)
    return index


def restore_to_memory(
    container: BinaryIO, path: str, engine: Engine | None = None, *, index: Index | None = None
) -> np.ndarray:
    """The original file's bytes, decoded into one new uint8 array."""
    index = index or read_index(container, path)
    buf = memory_for(index.source_size, path)
    restore_into(container, path, [(0, buf)], index=index, engine=engine)
    return buf


def restore_to_file(
    container: BinaryIO, path: str, out: BinaryIO, *, index: Index | None = None, engine: Engine | None = None
) -> None:
    """Decode the container into the empty file ``out`` (written at its offsets, in parallel),
    with ``engine`` (default: the CPU's)."""
    index = index or read_index(container, path)
    try:
        check_room(out.fileno(), index.source_size)  # a container may declare any size
    except OSError as exc:
        raise os_error(exc, Path(getattr(out, "name", path))) from None
    out.truncate(index.source_size)
    if engine is not None:
        restore(container, path, engine, FileSink(out), index=index)
        return
    with CpuEngine() as cpu:
        restore(container, path, cpu, FileSink(out), index=index)


def memory_for(size: int, path: str) -> np.ndarray:
    """An uninitialised buffer of ``size`` bytes for a restored file.

    Raises:
        OutOfMemoryError: the process cannot hold it (a container may declare any size).
    """
    try:
        return np.empty(size, np.uint8)
    except MemoryError:
        raise OutOfMemoryError(
            f"the restored file needs {size:,} bytes of memory, more than this process can have",
            path=path,
            hint="load it with mmap=True, or decompress it to a file",
        ) from None


def seek_position(pos: int, size: int, offset: int, whence: int) -> int:
    """Where ``seek(offset, whence)`` lands in a file of ``size`` bytes read at ``pos``.

    Raises:
        ValueError: an unknown ``whence``, or a position before the start.
        TypeError: ``offset`` is not an integer.
    """
    offset = operator.index(offset)  # a float is a TypeError, as for any Python file
    base = {os.SEEK_SET: 0, os.SEEK_CUR: pos, os.SEEK_END: size}.get(whence)
    if base is None:
        raise ValueError(f"invalid whence ({whence})")
    if base + offset < 0:
        raise ValueError(f"negative seek position {base + offset}")
    return base + offset


class MemoryFile(io.RawIOBase):
    """A read-only, seekable file over a uint8 array, without copying it (``io.BytesIO`` would)."""

    def __init__(self, data: np.ndarray, name: str = "<memory>") -> None:
        super().__init__()
        self._data = data
        self._pos = 0
        self.name = name

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._pos = seek_position(self._pos, self._data.size, offset, whence)
        return self._pos

    def readinto(self, buffer: WriteableBuffer) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        out = memoryview(buffer).cast("B")
        n = max(0, min(len(out), self._data.size - self._pos))
        out[:n] = self._data.data[self._pos : self._pos + n]
        self._pos += n
        return n


__all__ = ["MemoryFile", "RangeSink", "restore_into", "restore_to_file", "restore_to_memory", "seek_position"]
