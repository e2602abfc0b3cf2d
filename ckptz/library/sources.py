"""What a load function was given: a path or a file object, a container or a plain file.

Containers are told apart by their bytes first, so a container saved under ``model.pt``
loads. A file is taken for a container where its first bytes are near the magic or its last
are the footer's, or it is named ``x.ckptz`` (:func:`~ckptz.container.judged_container`):
a damaged container then raises :class:`~ckptz.errors.CorruptionError` instead of being
handed to ``torch.load`` as the plain file it is not.
"""

from __future__ import annotations

import builtins
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, BinaryIO, cast

from ckptz.container import END_MAGIC, MAGIC, judged_container
from ckptz.runs.streams import spooled

Source = str | os.PathLike[str] | IO[bytes]


@dataclass(frozen=True, slots=True)
class Opened:
    """A resolved source.

    Attributes:
        name: the source's name in messages.
        container: the container, open as a real file (``fileno`` and ``pread`` work), or
            None for a plain file.
        plain: what to read a plain file from (the caller's path or file object, or a
            spooled copy of a stream), or None for a container.
    """

    name: str
    container: BinaryIO | None
    plain: Source | None


@contextmanager
def opened(f: Source) -> Iterator[Opened]:
    """Resolve ``f`` for the block; whatever this opens or spools is closed and removed after.

    A file object is read from its current position. One that cannot seek, or a container
    that is not a real file read from its start (``io.BytesIO``, a pipe), is spooled to a
    private temporary file first: containers are read with ``pread``.

    Raises:
        OSError: ``f`` cannot be read.
    """
    if isinstance(f, str | os.PathLike):
        name = os.fspath(f)
        with builtins.open(f, "rb") as file:
            if looks_like_container(file, name):
                yield Opened(name, cast(BinaryIO, file), None)
                return
        yield Opened(name, None, f)
        return
    name = source_name(f)
    if not _seekable(f):
        with spooled(cast(BinaryIO, f)) as copy, opened(copy) as inner:
            yield Opened(name, inner.container, inner.plain)
        return
    if not looks_like_container(f, name):
        yield Opened(name, None, f)
    elif f.tell() == 0 and _regular(f):
        yield Opened(name, cast(BinaryIO, f), None)
    else:
        with spooled(cast(BinaryIO, f)) as copy, builtins.open(copy, "rb") as file:
            yield Opened(name, cast(BinaryIO, file), None)


def looks_like_container(f: IO[bytes], name: str = "") -> bool:
    """Whether the seekable ``f``, from its position, is to be read as a container
    (:func:`~ckptz.container.judged_container`); its position is left where it was."""
    pos = f.tell()
    try:
        head = f.read(len(MAGIC))
        end = f.seek(0, os.SEEK_END)
        tail = b""
        if end - pos >= len(MAGIC) + len(END_MAGIC):
            f.seek(end - len(END_MAGIC))
            tail = f.read(len(END_MAGIC))
    finally:
        f.seek(pos)
    return judged_container(head, tail, name)


def _seekable(f: IO[bytes]) -> bool:
    try:
        return bool(f.seekable())
    except (AttributeError, ValueError, OSError):
        return False


def _regular(f: IO[bytes]) -> bool:
    try:
        return stat.S_ISREG(os.fstat(f.fileno()).st_mode)
    except (AttributeError, ValueError, OSError):
        return False


def source_name(f: Source) -> str:
    """The name a source goes by: its path, or a file object's ``name``."""
    if isinstance(f, str | os.PathLike):
        return os.fspath(f)
    name = getattr(f, "name", None)
    return name if isinstance(name, str) else "<stream>"


__all__ = ["Opened", "Source", "looks_like_container", "opened", "source_name"]
