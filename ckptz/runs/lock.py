"""Keeping two ckptz runs off the same files: advisory locks on the folders a run works in.

A run takes an exclusive ``flock`` on every folder (or single file) it writes in and a shared
one on every source it only reads, all without waiting: a second run on the same files
fails at once with :class:`~ckptz.errors.BusyError` instead of racing the first. The locks
are held on open descriptors, so they leave no file behind and vanish with the process, even
after ``kill -9``. Temp files carry their own lock too (:mod:`ckptz.safeio`), which covers
runs on nested folders.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ckptz.errors import BusyError
from ckptz.safeio import try_lock


@contextmanager
def hold(exclusive: Iterable[Path], shared: Iterable[Path] = ()) -> Iterator[None]:
    """Lock existing paths (folders or files) for the block; missing ones are skipped.

    A path in both sets is locked exclusively.

    Raises:
        BusyError: another ckptz run holds a conflicting lock on one of them.
    """
    fds: list[int] = []
    mine = {_key(p): (p, True) for p in exclusive if _key(p) is not None}
    for p in shared:
        k = _key(p)
        if k is not None and k not in mine:
            mine[k] = (p, False)
    try:
        for path, excl in sorted(mine.values(), key=lambda v: str(v[0])):
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | os.O_NONBLOCK)
            except OSError:
                continue  # unreadable or gone: the run itself will say so
            fds.append(fd)
            if not try_lock(fd, exclusive=excl):
                raise BusyError(
                    "another ckptz run is working on this",
                    path=str(path),
                    hint="wait for it to finish, or stop it, then run again",
                )
        yield
    finally:
        for fd in fds:
            os.close(fd)


def _key(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino
