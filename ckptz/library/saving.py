"""``ckptz.save``: ``torch.save`` into a compressed container.

The original bytes, exactly those ``torch.save(obj, f)`` writes to the same ``f``, are made
by :mod:`ckptz.library.torch_image` (``torch.save``'s own archive with the storages copied
in on many threads), in memory when they fit (:mod:`ckptz.library.writing` says where
otherwise), and the pipeline compresses them. Where that builder does not apply (an old
torch, the legacy format, an archive it does not know), ``torch.save`` itself writes them.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import IO, Any, cast

from ckptz.library import torch_image
from ckptz.library.sources import Source, source_name
from ckptz.library.torch_image import Skeleton
from ckptz.library.writing import compress_to_path, compress_to_stream, fits_in_memory


def save(
    obj: object,
    f: Source,
    *,
    device: str | None = None,
    codec: str = "auto",
    level: int = 3,
    verify: bool = False,
    **torch_save_args: Any,
) -> None:
    """Save ``obj`` as ``torch.save`` does, compressed into a ``.ckptz`` container.

    ``ckptz.load`` (or ``ckptz decompress``) gives back exactly the bytes ``torch.save(obj,
    f)`` writes. A path is written atomically: until the container is complete, an existing
    file keeps its old content. Tensors on a GPU are copied to the host, on several threads,
    before they are coded (coding them on the GPU before the copy is not implemented yet).

    Args:
        obj: what to save (anything ``torch.save`` takes).
        f: a path (the container is written under exactly this name; ``.ckptz`` is the
            usual suffix) or a binary file object, written from its current position.
            ``torch.save`` names the archive inside after the path's file name, or
            ``archive`` for a file object; so does this.
        device: where to compress: ``auto`` (a GPU if nvCOMP can use one), ``cpu``,
            ``cuda[:N]``; default ``$CKPTZ_DEVICE`` or ``auto``.
        codec: ``auto``, ``zstd`` or a GPU codec such as ``ans`` (decodes only on a GPU).
        level: zstd level of the coded planes.
        verify: decode every frame back before finishing, and read a written file back.
        torch_save_args: passed on to ``torch.save`` (``pickle_protocol``, ...).

    Raises:
        UsageError: unknown device or codec.
        DeviceError: the device asked for cannot be used.
        WriteError: the target cannot be written (``OutOfSpaceError``: the disk is full).
    """
    options: dict[str, Any] = {"device": device, "codec": codec, "level": level, "verify": verify}
    stream = None if isinstance(f, str | os.PathLike) else _writable(f)
    name = "archive" if stream is not None else Path(cast(str, f)).name
    with _image(obj, name, torch_save_args) as skel:
        if skel is not None:
            write, memory = partial(_fill, skel), fits_in_memory(skel.size)
        else:
            write, memory = partial(_torch_save, obj, torch_save_args, stream is not None), False
        if stream is None:
            compress_to_path(Path(cast(str, f)), write, memory=memory, **options)
        else:
            compress_to_stream(stream, source_name(f), write, memory=memory, **options)


@contextmanager
def _image(obj: object, name: str, save_args: dict[str, Any]) -> Iterator[Skeleton | None]:
    """``obj``'s skeleton archive for the block, or None where ``torch.save`` must write it."""
    with tempfile.TemporaryDirectory(prefix=".ckptz-save-") as folder:
        try:
            skel = torch_image.skeleton(obj, Path(folder), name, save_args)
        except torch_image.Unsupported:
            skel = None
        yield skel


def _fill(skel: Skeleton, raw: Path) -> None:
    # Created as torch.save creates its file: 0666 less the umask.
    fd = os.open(raw, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        torch_image.fill(skel, fd)
    finally:
        os.close(fd)


def _torch_save(obj: object, save_args: dict[str, Any], as_stream: bool, raw: Path) -> None:
    import torch

    if as_stream:
        # A file object, as the caller's: torch.save names the zip archive "archive" then.
        with open(raw, "wb") as out:
            torch.save(obj, out, **save_args)
    else:
        torch.save(obj, raw, **save_args)


def _writable(f: IO[bytes]) -> IO[bytes]:
    if not callable(getattr(f, "write", None)):
        raise TypeError(f"expected a path or a binary file object, not {type(f).__name__}")
    return f


__all__ = ["save"]
