"""File metadata that ckptz keeps: permission bits, modification time, and owner (as root).

A container records its source's metadata in the JSON header's ``source`` object (format 1.1,
see docs/FORMAT.md), and a restored file gets it back. Outputs are created with at most
their source's permission bits from the start, so no file is ever readable, even briefly, by
anyone who could not read its source.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Permission bits a container may take from its source: never execute, setuid or sticky.
CONTAINER_BITS = 0o666


@dataclass(frozen=True, slots=True)
class FileMeta:
    """What ckptz restores of a file besides its bytes.

    Attributes:
        mode: permission bits (``st_mode & 0o7777``).
        mtime_ns: modification time in nanoseconds.
        uid: owner, applied only when running as root.
        gid: group, applied only when running as root.
    """

    mode: int
    mtime_ns: int
    uid: int
    gid: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileMeta:
        """The metadata of a ``stat`` result."""
        return cls(stat.S_IMODE(st.st_mode), st.st_mtime_ns, st.st_uid, st.st_gid)

    def to_json(self) -> dict[str, int]:
        return {"mode": self.mode, "mtime_ns": self.mtime_ns, "uid": self.uid, "gid": self.gid}

    @classmethod
    def from_json(cls, source: Any) -> FileMeta | None:
        """The metadata a container's ``source`` object records; None for 1.0 containers.

        Values out of range are ignored rather than trusted: metadata never fails a restore.
        """
        if not isinstance(source, dict):
            return None
        try:
            mode, mtime, uid, gid = (source[k] for k in ("mode", "mtime_ns", "uid", "gid"))
        except KeyError:
            return None
        if not all(type(v) is int for v in (mode, mtime, uid, gid)):
            return None
        if not (
            0 <= mode <= 0o7777
            and -(1 << 63) <= mtime < (1 << 63)
            and 0 <= uid < 1 << 32
            and 0 <= gid < 1 << 32
        ):
            return None
        return cls(mode, mtime, uid, gid)

    def container(self) -> FileMeta:
        """The metadata a container of this file gets: no more permissions than the source's."""
        return FileMeta(self.mode & CONTAINER_BITS, self.mtime_ns, self.uid, self.gid)


def create_mode(meta: FileMeta | None) -> int:
    """The mode to create an output with: the final bits, plus owner read/write while writing.

    The owner is whoever runs ckptz, so adding ``0o600`` never lets anyone else read the file.
    """
    return 0o666 if meta is None else (meta.mode & 0o666) | 0o600


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def apply_fd(fd: int, meta: FileMeta) -> None:
    """Give an open file its owner (as root), permission bits and mtime, in that order.

    ``chown`` clears setuid bits, so it goes first; the mtime goes last, after every write.
    """
    if is_root():
        os.fchown(fd, meta.uid, meta.gid)
    os.fchmod(fd, meta.mode)
    os.utime(fd, ns=(meta.mtime_ns, meta.mtime_ns))


def apply_path(path: Path, meta: FileMeta) -> None:
    """Like :func:`apply_fd` for a folder (never following a symlink)."""
    if is_root():
        os.chown(path, meta.uid, meta.gid, follow_symlinks=False)
    os.chmod(path, meta.mode)
    os.utime(path, ns=(meta.mtime_ns, meta.mtime_ns))


def apply_link(path: Path, meta: FileMeta) -> None:
    """Give a recreated symlink its owner (as root) and mtime; its own bits mean nothing on Linux."""
    if is_root():
        os.chown(path, meta.uid, meta.gid, follow_symlinks=False)
    if os.utime in os.supports_follow_symlinks:
        os.utime(path, ns=(meta.mtime_ns, meta.mtime_ns), follow_symlinks=False)
