"""``ckptz.save``: ``torch.save`` into a compressed container.

The pipeline compresses exactly the bytes ``torch.save(obj, f)`` writes to the same ``f``,
read straight from the tensors (:mod:`ckptz.library.torch_image`: ``torch.save``'s own
archive, written without its tensor bytes, with them served from the storages), so no
uncompressed copy is written anywhere. Where that does not apply (an old torch, the legacy
format, tensors that cannot skip their data, an archive it does not know), ``torch.save``
itself writes the original into a private folder (:mod:`ckptz.library.writing`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import IO, Any, cast

from ckptz.library.sources import Source, source_name
from ckptz.library.torch_image import Image
from ckptz.library.torch_skeleton import Unsupported, skeleton
from ckptz.library.writing import (
    Options,
    compress_into_path,
    compress_into_stream,
    compress_to_path,
    compress_to_stream,
    kept_meta,
    original_name,
)


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
    file keeps its old content. The tensors must not change until the call returns. Tensors
    on a GPU are read twice by device-to-host copies (for their CRC-32s, then for coding);
    coding them on the GPU without the copies is not implemented yet.

    Args:
        obj: what to save (anything ``torch.save`` takes).
        f: a path (the container is written under exactly this name; ``.ckptz`` is the
            usual suffix) or a binary file object, written from its current position.
            ``torch.save`` names the archive inside after the path's file name, or
            ``archive`` for a file object; so does this, with the name less ``.ckptz``
            (``opt.pt.ckptz`` holds what ``torch.save(obj, "opt.pt")`` writes).
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
    options = Options(device, codec, level, verify)
    stream = None if isinstance(f, str | os.PathLike) else _writable(f)
    target = Path(cast(str, f)) if stream is None else None
    with tempfile.TemporaryDirectory(prefix=".ckptz-save-") as folder:
        try:
            skel = skeleton(
                obj, Path(folder), original_name(target) if target else "archive", torch_save_args
            )
        except Unsupported:
            _fallback(obj, f, options, torch_save_args)
            return
        image = Image(skel)
        if target is not None:
            compress_into_path(target, skel.path, options, kept_meta(target), source=image)
        else:
            compress_into_stream(cast(IO[bytes], stream), source_name(f), skel.path, options, source=image)


def _fallback(obj: object, f: Source, options: Options, save_args: dict[str, Any]) -> None:
    """``torch.save`` writes the original into a private folder, and it is compressed from there."""
    import torch

    def write_path(raw: Path) -> None:
        torch.save(obj, raw, **save_args)

    def write_file(raw: Path) -> None:
        # A file object, as the caller's: torch.save names the zip archive "archive" then.
        with open(raw, "wb") as out:
            torch.save(obj, out, **save_args)

    if isinstance(f, str | os.PathLike):
        compress_to_path(Path(f), write_path, options, keep=True)
    else:
        compress_to_stream(_writable(f), source_name(f), write_file, options)


def _writable(f: IO[bytes]) -> IO[bytes]:
    if not callable(getattr(f, "write", None)):
        raise TypeError(f"expected a path or a binary file object, not {type(f).__name__}")
    return f


__all__ = ["save"]
