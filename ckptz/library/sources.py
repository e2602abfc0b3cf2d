"""What a load function was given: a path or a file object, a container or a plain file.

Containers are told apart by their first bytes, never by their name, so a container saved
under ``model.pt`` loads, and so does a plain file named ``x.ckptz``.
"""

from __future__ import annotations

import builtins
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, BinaryIO, cast

from ckptz.container import MAGIC
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
            if file.read(len(MAGIC)) == MAGIC:
                yield Opened(name, cast(BinaryIO, file), None)
                return
        yield Opened(name, None, f)
        return
    name = source_name(f)
    if not _seekable(f):
        with spooled(cast(BinaryIO, f)) as copy, opened(copy) as inner:
            yield Opened(name, inner.container, inner.plain)
        return
    pos = f.tell()
    head = f.read(len(MAGIC))
    f.seek(pos)
    if head != MAGIC:
        yield Opened(name, None, f)
    elif pos == 0 and _regular(f):
        yield Opened(name, cast(BinaryIO, f), None)
    else:
        with spooled(cast(BinaryIO, f)) as copy, builtins.open(copy, "rb") as file:
            yield Opened(name, cast(BinaryIO, file), None)


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


__all__ = ["Opened", "Source", "opened", "source_name"]
