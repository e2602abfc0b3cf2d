"""What a load function was given: a path or a file object, a container or a plain file.

Containers are told apart by their bytes first, so a container saved under ``model.pt``
loads. A file is taken for a container where its first bytes are near the magic or its last
are the footer's, or it is named ``x.ckptz`` (:func:`~ckptz.container.judged_container`):
a damaged container then raises :class:`~ckptz.errors.CorruptionError` instead of being
handed to ``torch.load`` as the plain file it is not.

A container read from a file object takes exactly its own bytes from the object's position
and leaves the position just past them, as ``torch.load`` does for a legacy pickle, so
several objects written one after another into one stream read back in order.
"""

from __future__ import annotations

import builtins
import io
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO, cast

from ckptz.container import END_MAGIC, FOOTER, HEADER, MAGIC, checksum, judged_container
from ckptz.runs.streams import spooled
from ckptz.safeio import os_error

Source = str | os.PathLike[str] | IO[bytes]

#: Bytes copied at a time while looking for a container's end in a stream.
_BLOCK = 8 << 20


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

    A file object is read from its current position. A container in a file object is read
    in place only where the object is a real file (``io.FileIO``, or a buffered reader over
    one) that the container fills from its start; otherwise its own bytes are copied to a
    private temporary file first (containers are read with ``pread``, and a ``fileno`` of a
    ``gzip`` or ``bz2`` file is the compressed file's). A stream that cannot seek is
    spooled whole first.

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
        with spooled(cast(BinaryIO, f)) as copy, builtins.open(copy, "rb") as file, opened(file) as inner:
            yield Opened(name, inner.container, copy if inner.plain is not None else None)
        return
    pos = f.tell()
    if not looks_like_container(f, name):
        yield Opened(name, None, f)
        return
    end = _real_file_end(f, pos)
    if pos == 0 and end is not None and _container_ends_at(f, 0, end):
        yield Opened(name, cast(BinaryIO, f), None)
        f.seek(end)
        return
    with _one_container(f, pos, end) as (copy, length), builtins.open(copy, "rb") as file:
        yield Opened(name, cast(BinaryIO, file), None)
    f.seek(pos + length)


#: First bytes of the files ``torch.save`` and ``pickle.dump`` write (a zip, a pickle).
PLAIN_STARTS = (b"PK\x03\x04", b"\x80")


def looks_like_container(f: IO[bytes], name: str = "") -> bool:
    """Whether the seekable ``f``, from its position, is to be read as a container
    (:func:`~ckptz.container.judged_container`); its position is left where it was."""
    pos = f.tell()
    try:
        head = f.read(len(MAGIC))
        end = f.seek(0, os.SEEK_END)
        tail = b""
        # A plain pickle or zip that other objects follow in one stream says so by its first
        # bytes; only a file that does not may be judged by the footer at its end.
        if end - pos >= len(MAGIC) + len(END_MAGIC) and not head.startswith(PLAIN_STARTS):
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


def _real_file_end(f: IO[bytes], pos: int) -> int | None:
    """The size of ``f`` where its ``fileno`` is the file it reads, else None.

    That is an ``io.FileIO`` or a buffered reader over one (by type: a wrapper such as
    ``gzip.GzipFile`` passes on the ``fileno`` of the file it decodes) whose size is the one
    ``f`` sees. ``f`` is left at ``pos``.
    """
    raw = f.raw if type(f) in (io.BufferedReader, io.BufferedRandom) else f  # type: ignore[attr-defined]
    if type(raw) is not io.FileIO:
        return None
    try:
        end = f.seek(0, os.SEEK_END)
        f.seek(pos)
        return end if os.fstat(raw.fileno()).st_size == end else None
    except (ValueError, OSError):
        return None


def _read_at(f: IO[bytes], at: int, n: int) -> bytes:
    f.seek(at)
    return f.read(n)


def _footer_fits(footer: bytes, head: bytes, length: int) -> bool:
    """Whether ``footer`` (the last bytes of a ``length``-byte span whose first bytes are
    ``head``) ends a container that fills exactly that span."""
    if len(footer) != FOOTER.size or len(head) != HEADER.size:
        return False
    magic, major, minor, flags = HEADER.unpack(head)
    off, isize, _raw, _sum, fmajor, fminor, fflags, end = FOOTER.unpack(footer)
    return (
        magic == MAGIC
        and end == END_MAGIC
        and (major, minor, flags) == (fmajor, fminor, fflags)
        and HEADER.size <= off
        and off + isize == length - FOOTER.size
    )


def _container_ends_at(f: IO[bytes], pos: int, end: int) -> bool:
    """Whether the container at ``pos`` in ``f`` ends where ``f`` does (the usual case)."""
    if end - pos < HEADER.size + FOOTER.size:
        return False
    fits = _footer_fits(_read_at(f, end - FOOTER.size, FOOTER.size), _read_at(f, pos, HEADER.size), end - pos)
    f.seek(pos)
    return fits


@contextmanager
def _one_container(f: IO[bytes], pos: int, end: int | None) -> Iterator[tuple[Path, int]]:
    """The container at ``pos`` in ``f``, copied to a private temporary file (removed after):
    its path and its length.

    In a real file of ``end`` bytes, a container that ends where the file does is copied
    whole. Otherwise its end is found in one pass as it is copied (a ``gzip`` file is not
    decoded twice): the first ``CKPTZEND`` whose footer points back to the container's
    start and whose index passes its checksum. Where none does, everything to the end is
    copied (and the reader then says the container is damaged).
    """
    try:
        fd, name = tempfile.mkstemp(prefix=".ckptz-load-")
    except OSError as exc:
        raise os_error(exc, Path(tempfile.gettempdir())) from None
    path = Path(name)
    try:
        with os.fdopen(fd, "w+b") as out:
            whole = end is not None and _container_ends_at(f, pos, end)
            f.seek(pos)
            if end is not None and whole:
                shutil.copyfileobj(f, out, _BLOCK)
                length = end - pos
            else:
                length = _copy_to_footer(f, out)
        yield path, length
    finally:
        path.unlink(missing_ok=True)


def _copy_to_footer(f: IO[bytes], out: BinaryIO) -> int:
    """Copy ``f`` from its position into ``out`` up to the end of the first container
    footer that fits (see :func:`_one_container`); the bytes copied."""
    head = b""
    copied = 0
    tail = b""  # the last bytes copied, so a footer split between two blocks is seen
    while block := f.read(_BLOCK):
        out.write(block)
        if len(head) < HEADER.size:
            head = (head + block)[: HEADER.size]
        window = tail + block
        base = copied - len(tail)
        copied += len(block)
        at = window.find(END_MAGIC)
        while at >= 0:
            length = base + at + len(END_MAGIC)
            footer = window[at + len(END_MAGIC) - FOOTER.size : at + len(END_MAGIC)]
            if length >= HEADER.size + FOOTER.size and _index_checks(out, footer, head, length):
                out.truncate(length)
                return length
            at = window.find(END_MAGIC, at + 1)
        tail = window[-(FOOTER.size - 1) :]
    return copied


def _index_checks(out: BinaryIO, footer: bytes, head: bytes, length: int) -> bool:
    """Whether ``footer`` ends a container of ``length`` bytes copied into ``out`` whose
    index passes its checksum (a stray ``CKPTZEND`` in a payload does not)."""
    if not _footer_fits(footer, head, length):
        return False
    off, isize, _raw, isum = FOOTER.unpack(footer)[:4]
    out.flush()
    blob = os.pread(out.fileno(), isize, off)
    return len(blob) == isize and checksum(blob) == isum


def source_name(f: Source) -> str:
    """The name a source goes by: its path, or a file object's ``name``."""
    if isinstance(f, str | os.PathLike):
        return os.fspath(f)
    name = getattr(f, "name", None)
    return name if isinstance(name, str) else "<stream>"


__all__ = ["Opened", "Source", "looks_like_container", "opened", "source_name"]
