"""``ckptz.save``: ``torch.save`` into a compressed container.

``torch.save`` writes the original bytes (:mod:`ckptz.library.writing` says where and why
there), and the pipeline compresses them, so the container decompresses to exactly the
bytes ``torch.save(obj, f)`` writes to the same ``f``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

from ckptz.library.sources import Source, source_name
from ckptz.library.writing import compress_to_path, compress_to_stream


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
    file keeps its old content. Tensors on a GPU are copied to the host by ``torch.save``
    (coding them on the GPU before the copy is not implemented yet).

    Args:
        obj: what to save (anything ``torch.save`` takes).
        f: a path (the container is written under exactly this name; ``.ckptz`` is the
            usual suffix) or a binary file object, written from its current position.
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
    import torch

    def write_path(raw: Path) -> None:
        torch.save(obj, raw, **torch_save_args)

    def write_file(raw: Path) -> None:
        # A file object, as the caller's: torch.save names the zip archive "archive" then.
        with open(raw, "wb") as out:
            torch.save(obj, out, **torch_save_args)

    options: dict[str, Any] = {"device": device, "codec": codec, "level": level, "verify": verify}
    if isinstance(f, str | os.PathLike):
        compress_to_path(Path(f), write_path, **options)
    else:
        compress_to_stream(_writable(f), source_name(f), write_file, **options)


def _writable(f: IO[bytes]) -> IO[bytes]:
    if not callable(getattr(f, "write", None)):
        raise TypeError(f"expected a path or a binary file object, not {type(f).__name__}")
    return f


__all__ = ["save"]
