"""Keeping two ckptz runs off the same files: advisory locks on the folders a run works in.

A run takes an exclusive ``flock`` on every folder (or single file) it writes in and a shared
one on every source it only reads, and a shared one on every folder above each of them, all
without waiting: a second run on the same files, or on a tree inside or around them, fails
at once with :class:`~ckptz.errors.BusyError` instead of racing the first. (A run in place
on ``a`` holds ``a`` exclusively; one on ``a/sub`` holds ``a`` shared: whichever comes
second fails, in either order.) Paths are resolved through the descriptors opened on them,
so a symlink or a bind mount to a folder locks that folder's inode. The locks are held on
open descriptors, so they leave no file behind and vanish with the process, even after
``kill -9``. Temp files carry their own lock too (:mod:`ckptz.safeio`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ckptz.errors import BusyError
from ckptz.safeio import try_lock

_OPEN = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | os.O_NONBLOCK


@contextmanager
def hold(exclusive: Iterable[Path], shared: Iterable[Path] = ()) -> Iterator[None]:
    """Lock existing paths (folders or files) for the block, and every folder above them
    shared; missing ones are skipped.

    A path in both sets is locked exclusively.

    Raises:
        BusyError: another ckptz run holds a conflicting lock on one of them (or, exclusively,
            on a folder above one of them).
    """
    # (device, inode) -> (descriptor, exclusive, the path the user named that it covers)
    locks: dict[tuple[int, int], tuple[int, bool, Path]] = {}
    try:
        named = [(p, True) for p in exclusive] + [(p, False) for p in shared]
        for path, excl in named:
            fd = _open(path)
            if fd < 0:
                continue  # unreadable or gone: the run itself will say so
            _keep(locks, fd, excl, path)
            for above in _folders_above(fd, path):
                _keep(locks, above, False, path)
        for key in sorted(locks):
            fd, excl, path = locks[key]
            if not try_lock(fd, exclusive=excl):
                raise BusyError(
                    "another ckptz run is working on this",
                    path=str(path),
                    hint="wait for it to finish, or stop it, then run again",
                )
        yield
    finally:
        for fd, _, _ in locks.values():
            os.close(fd)


def _open(path: Path | str) -> int:
    try:
        return os.open(path, _OPEN)
    except OSError:
        return -1


def _keep(locks: dict[tuple[int, int], tuple[int, bool, Path]], fd: int, exclusive: bool, path: Path) -> None:
    """Add ``fd``'s inode to ``locks`` (one descriptor an inode, exclusive if any asks for it:
    two descriptors of one process conflict with each other too)."""
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino)
    held = locks.get(key)
    if held is None:
        locks[key] = (fd, exclusive, path)
        return
    os.close(fd)
    if exclusive and not held[1]:
        locks[key] = (held[0], True, path)


def _folders_above(fd: int, path: Path) -> list[int]:
    """Descriptors of the folders above the file or folder open as ``fd`` (from ``path``), by
    where it really is (symlinks resolved), up to ``/``; those that cannot be opened are
    left out."""
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc: where its path leads now
        real = os.path.realpath(path)
    if not real.startswith("/") or real.endswith(" (deleted)"):
        return []
    out = []
    for folder in Path(real).parents:
        above = _open(folder)
        if above >= 0:
            out.append(above)
    return out
