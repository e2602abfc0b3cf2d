"""Compressing a file that another library writes (``torch.save``, safetensors) as it is saved.

The writer writes the original file into a private temporary folder (beside the target, so
on the same file system and in the page cache when it is read back); the pipeline
(:func:`ckptz.pipeline.compress_file`) compresses it into the target, atomically for a path
(:func:`ckptz.safeio.atomic_output`: a crash leaves the old file or the new one, never a
half-written one), in order for a file object; then the temporary folder goes.

The original keeps the target's own file name inside that folder, because the name is part
of what some writers write: ``torch.save`` names its zip archive after the file.

With ``memory=True`` the original is written into an anonymous file in memory instead
(``memfd_create``; Linux), so no uncompressed byte reaches a disk: for writers that do not
take the file's name from the path they are given (a file object; ``ckptz.save``'s image
builder, which names its archive itself), and callers that have that much memory free
(:func:`fits_in_memory`; Lightning's ``TorchCheckpointIO`` buffers the whole checkpoint in
memory too). Elsewhere it falls back to the folder.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, BinaryIO, cast

from ckptz.engines import open_engine
from ckptz.engines.base import Engine
from ckptz.meta import FileMeta
from ckptz.pipeline import compress_file
from ckptz.safeio import atomic_output, os_error

#: Writes the original file at the path it is given.
Writer = Callable[[Path], None]


@contextmanager
def _engine(device: str | None, codec: str, level: int) -> Iterator[Engine]:
    engine, _notice = open_engine(device, codec=codec, level=level)  # the library never prints
    try:
        yield engine
    finally:
        engine.close()


@contextmanager
def _original(folder: Path | None, name: str) -> Iterator[Path]:
    """A path named ``name`` in a new private folder (in ``folder``, else ``$TMPDIR``), removed after."""
    try:
        tmp = tempfile.TemporaryDirectory(dir=folder, prefix=f".{name}.ckptz-save-")
    except OSError as exc:
        raise os_error(exc, (folder or Path(tempfile.gettempdir())) / name) from None
    with tmp as d:
        yield Path(d) / name


@contextmanager
def _in_memory(name: str) -> Iterator[Path]:
    """A path to a new anonymous file in memory, gone when the block ends."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        yield Path(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


@contextmanager
def _scratch(folder: Path | None, name: str, memory: bool) -> Iterator[Path]:
    """Where the original is written: in memory if asked and possible, else a private folder."""
    if memory and hasattr(os, "memfd_create"):
        with _in_memory(name) as raw:
            yield raw
    else:
        with _original(folder, name) as raw:
            yield raw


def fits_in_memory(size: int) -> bool:
    """Whether ``size`` bytes of scratch take at most half the memory the kernel says is free
    (``MemAvailable``); False where that is unknown."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return size <= int(line.split()[1]) * 1024 // 2
    except (OSError, ValueError, IndexError):
        pass
    return False


def compress_to_path(
    target: Path,
    write: Writer,
    *,
    device: str | None,
    codec: str,
    level: int,
    verify: bool,
    memory: bool = False,
) -> None:
    """Have ``write`` write the original, then compress it into ``target`` atomically.

    The container gets the permission bits and mtime the original got (so the umask applies
    as it does to ``torch.save``), and records them for ``ckptz decompress``. With
    ``memory``, the original is kept in memory; it gets the bits a new file gets.

    Raises:
        WriteError: the target's folder is not writable.
        OutOfSpaceError: the disk filled up (nothing is left behind).
    """
    if memory and hasattr(os, "memfd_create"):
        with _in_memory(target.name) as raw:
            write(raw)
            with _engine(device, codec, level) as engine, atomic_output(target) as (out, _tmp):
                # Created as the original would have been: the umask's bits, now, this user.
                meta = FileMeta.of(os.fstat(out.fileno()))
                compress_file(
                    raw, _relpath(target.name), out, engine, verify=verify, source_fields=meta.to_json()
                )
        return
    with _original(target.parent, target.name) as raw:
        write(raw)
        meta = FileMeta.of(raw.stat())
        with _engine(device, codec, level) as engine, atomic_output(target, meta.container()) as (out, _tmp):
            compress_file(
                raw, _relpath(target.name), out, engine, verify=verify, source_fields=meta.to_json()
            )


def compress_to_stream(
    out: IO[bytes],
    name: str,
    write: Writer,
    *,
    device: str | None,
    codec: str,
    level: int,
    verify: bool,
    memory: bool = False,
) -> None:
    """Have ``write`` write the original (in ``$TMPDIR``, or in memory with ``memory``), then
    compress it into ``out`` from its current position, in order; ``name`` classifies it
    (``optimizer.pt``)."""
    with _scratch(None, _relpath(name), memory) as raw:
        write(raw)
        with _engine(device, codec, level) as engine:
            compress_file(raw, _relpath(name), cast(BinaryIO, _InOrder(out)), engine, verify=verify)


class _InOrder:
    """Hides a file object's ``fileno``: the pipeline then writes to it in order, from its
    position, as ``torch.save`` does, instead of at offsets counted from its start."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f

    def write(self, data: bytes | memoryview) -> int:
        return self._f.write(data)


def _relpath(name: str) -> str:
    """The name a checkpoint's tensors are classified by (``optimizer.pt``), without ``.ckptz``."""
    return Path(name).name.removesuffix(".ckptz") or "checkpoint"


__all__ = ["Writer", "compress_to_path", "compress_to_stream", "fits_in_memory"]
