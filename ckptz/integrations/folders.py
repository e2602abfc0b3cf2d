"""Converting a trainer's checkpoint folder in place, as a unit the trainer can rely on.

``ckptz compress --in-place`` (:func:`ckptz.api.compress`) converts a folder file by file,
each file atomically and kill-safely: a container is written to a temporary name, proved
against the original, renamed to ``X.ckptz``, and only then is ``X`` removed. So at every
moment each checkpoint file of the folder is whole in one form or the other (both, between
that rename and that unlink, if the process dies there; the next run of either direction
finishes the file). Two things are added here for trainers:

- The folder keeps its modification time. Hugging Face's Trainer deletes old checkpoints by
  the folders' mtimes (``rotate_checkpoints(use_mtime=True)``); renaming files inside a folder
  would make it look newer than the checkpoints saved after it.
- A compression that fails restores the files it had already converted, so a failure leaves
  the folder with the files the trainer wrote, as it wrote them, and raises.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ckptz import api
from ckptz.errors import BusyError, CkptzError, StoppedError
from ckptz.runs.results import Summary

log = logging.getLogger(__name__)


def compress_folder(
    folder: Path,
    *,
    device: str | None,
    codec: str = "auto",
    level: int = 3,
    threads: int | None = None,
    memory: int | None = None,
) -> Summary:
    """Compress every checkpoint file under ``folder`` in place; other files stay as they are.

    A container that already sits beside a file of the same name is stale (the trainer has
    just written the file again), so it is replaced.

    Raises:
        CkptzError: the compression failed; every file converted before the failure has been
            restored. ``BusyError`` (another run holds the folder) and ``StoppedError`` (Ctrl-C,
            SIGTERM) leave each file whole in one form, for a rerun to finish.
    """
    with _keeping_mtime(folder):
        try:
            return api.compress(
                folder,
                in_place=True,
                force=True,
                device=device,
                codec=codec,
                level=level,
                threads=threads,
                memory=memory,
            )
        except (BusyError, StoppedError):
            # Another run owns the folder, or a stop asks for a prompt exit (a rerun finishes).
            raise
        except Exception as exc:
            _undo(folder, exc, threads)
            raise


def _undo(folder: Path, exc: Exception, threads: int | None) -> None:
    """Restore what a failed compression of ``folder`` converted; note on ``exc`` if that fails."""
    if not folder.is_dir():
        return
    try:
        api.decompress(folder, in_place=True, device="cpu", threads=threads)
    except CkptzError as undo:
        log.error("ckptz: could not restore %s after a failed compression: %s", folder, undo)
        exc.add_note(
            f"ckptz could not restore {folder} after that ({undo}); run `ckptz decompress --in-place` on it"
        )


@contextmanager
def _keeping_mtime(folder: Path) -> Iterator[None]:
    before = os.stat(folder)
    try:
        yield
    finally:
        if folder.is_dir():
            os.utime(folder, ns=(before.st_atime_ns, before.st_mtime_ns))


__all__ = ["compress_folder"]
