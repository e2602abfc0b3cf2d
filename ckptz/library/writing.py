"""Compressing a file that another library writes (``torch.save``, safetensors) as it is saved.

The writer writes the original file into a private temporary folder (beside the target, so
on the same file system and in the page cache when it is read back); the pipeline
(:func:`ckptz.pipeline.compress_file`) compresses it into the target, atomically for a path
(:func:`ckptz.safeio.atomic_output`: a crash leaves the old file or the new one, never a
half-written one), in order for a file object; then the temporary folder goes.

:func:`compress_into_path` and :func:`compress_into_stream` compress bytes that are already
somewhere (``ckptz.save``'s :class:`~ckptz.library.torch_image.Image` serves them straight
from the tensors).

The original keeps the target's own file name inside that folder, because the name is part
of what some writers write: ``torch.save`` names its zip archive after the file.

With ``memory=True`` the original is written into an anonymous file in memory instead
(``memfd_create``; Linux), so no uncompressed byte reaches a disk: for writers that write
through a file object (where the path's name does not matter), and callers that already
hold that much memory free (Lightning's ``TorchCheckpointIO`` buffers the whole checkpoint
in memory too). Elsewhere it falls back to the folder.
"""

from __future__ import annotations

import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO, cast

from ckptz.engines import open_engine
from ckptz.engines.base import Engine
from ckptz.errors import WriteError
from ckptz.meta import FileMeta
from ckptz.pipeline import compress_file
from ckptz.pipeline.compress import Source
from ckptz.safeio import atomic_output, os_error, temp_stem

#: Writes the original file at the path it is given.
Writer = Callable[[Path], None]


@dataclass(frozen=True, slots=True)
class Options:
    """How the library compresses: ``ckptz.save``'s and ``save_file``'s keyword arguments."""

    device: str | None
    codec: str
    level: int
    verify: bool


#: The library's containers are made to be loaded by ``ckptz.load``, which decodes a CPU
#: engine's frames on CPU threads while the GPU decodes the rest, and smaller frames spread
#: that work over more threads, so they keep the engine's smallest frames.
def _frame_limit(engine: Engine) -> int:
    return engine.frame_size


@contextmanager
def _engine(options: Options) -> Iterator[Engine]:
    engine, _notice = open_engine(
        options.device, codec=options.codec, level=options.level, writes=True
    )  # the library never prints
    try:
        yield engine
    finally:
        engine.close()


@contextmanager
def _original(folder: Path | None, name: str) -> Iterator[Path]:
    """A path named ``name`` in a new private folder (in ``folder``, else ``$TMPDIR``), removed after."""
    try:
        # The name, cut as temporary names are, tells a user whose leftover this is.
        tmp = tempfile.TemporaryDirectory(dir=folder, prefix=f".{temp_stem(name)}.ckptz-save-")
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


def compress_to_path(
    target: Path, write: Writer, options: Options, *, memory: bool = False, keep: bool = False
) -> None:
    """Have ``write`` write the original, then compress it into ``target`` atomically.

    The container gets the permission bits and mtime the original got (so the umask applies
    as it does to ``torch.save``), and records them for ``ckptz decompress``. With
    ``memory``, the original is kept in memory; it gets the bits a new file gets. With
    ``keep``, a file already at ``target`` keeps its bits and owner (:func:`kept_meta`).

    Raises:
        WriteError: the target's folder is not writable.
        OutOfSpaceError: the disk filled up (nothing is left behind).
    """
    _check_folder(_through_link(target))
    kept = kept_meta(target) if keep else None
    if memory and hasattr(os, "memfd_create"):
        with _in_memory(target.name) as raw:
            write(raw)
            compress_into_path(target, raw, options, kept)
        return
    with _original(target.parent, original_name(target)) as raw:
        write(raw)
        compress_into_path(target, raw, options, kept or FileMeta.of(raw.stat()))


def kept_meta(target: Path) -> FileMeta | None:
    """What a save over the file at ``target`` keeps of it, as ``torch.save`` (which writes
    into the existing file) keeps them: its permission bits and owner, with the time now;
    None where no regular file is there. A private checkpoint must stay private.
    """
    try:
        st = _through_link(target).stat()
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return FileMeta(stat.S_IMODE(st.st_mode), time.time_ns(), st.st_uid, st.st_gid)


def _through_link(target: Path) -> Path:
    """The file a save to ``target`` writes: the one a symlink points to, as ``torch.save`` writes."""
    return Path(os.path.realpath(target)) if target.is_symlink() else target


def compress_into_path(
    target: Path, layout: Path, options: Options, meta: FileMeta | None = None, source: Source | None = None
) -> None:
    """Compress the file ``layout`` (or, with ``source``, the bytes it serves, laid out as
    ``layout`` is) into ``target`` atomically, with ``meta``'s bits and mtime, else those of
    a new file (the umask's bits, now, this user). A symlink ``target`` is written through,
    as ``torch.save`` writes: the file it points to is replaced, the link kept."""
    final = _through_link(target)
    _check_folder(final)
    with _engine(options) as engine, atomic_output(final, meta.container() if meta else None) as (out, _tmp):
        fields = (meta or FileMeta.of(os.fstat(out.fileno()))).to_json()
        compress_file(
            layout,
            _relpath(target.name),
            out,
            engine,
            verify=options.verify,
            source_fields=fields,
            source=source,
            largest_frame=_frame_limit(engine),
        )


def _check_folder(target: Path) -> None:
    """Refuse a target whose folder is missing, as ``torch.save`` and ``safetensors`` do: a
    mistyped path must not leave new folders behind.

    Raises:
        WriteError: the folder does not exist.
    """
    folder = target.parent
    if folder.exists() and not folder.is_dir():
        raise WriteError(f"{folder} is not a folder", path=str(target), hint="choose another path")
    if not folder.is_dir():
        raise WriteError(f"folder {folder} does not exist", path=str(target), hint="create it first")


def compress_to_stream(out: IO[bytes], name: str, write: Writer, options: Options) -> None:
    """Have ``write`` write the original (in ``$TMPDIR``), then compress it into ``out`` from
    its current position, in order; ``name`` classifies it (``optimizer.pt``)."""
    with _original(None, _relpath(name)) as raw:
        write(raw)
        compress_into_stream(out, name, raw, options)


def compress_into_stream(
    out: IO[bytes], name: str, layout: Path, options: Options, source: Source | None = None
) -> None:
    """Compress the file ``layout`` (or ``source``, see :func:`compress_into_path`) into
    ``out`` from its current position, in order."""
    with _engine(options) as engine:
        compress_file(
            layout,
            _relpath(name),
            cast(BinaryIO, _InOrder(out)),
            engine,
            verify=options.verify,
            source=source,
            largest_frame=_frame_limit(engine),
        )


class _InOrder:
    """Hides a file object's ``fileno``: the pipeline then writes to it in order, from its
    position, as ``torch.save`` does, instead of at offsets counted from its start."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f

    def write(self, data: bytes | memoryview) -> int:
        return self._f.write(data)


def original_name(target: Path) -> str:
    """The file name the original has inside a container saved as ``target`` (``opt.pt`` for
    ``opt.pt.ckptz``): ``torch.save`` names its archive after it, so the restored bytes are
    what ``torch.save`` writes to the name a user compares them with."""
    return _relpath(target.name)


def _relpath(name: str) -> str:
    """The name a checkpoint's tensors are classified by (``optimizer.pt``), without ``.ckptz``."""
    return Path(name).name.removesuffix(".ckptz") or "checkpoint"


__all__ = [
    "Options",
    "Writer",
    "compress_into_path",
    "compress_into_stream",
    "compress_to_path",
    "compress_to_stream",
    "kept_meta",
    "original_name",
]
