"""Rerunning a command that wrote to ``-o``: which outputs an earlier run already finished,
and which outputs ``--force`` removes because their sources are gone.

Every output is written under a temporary name and renamed only once complete, so an output
that exists was finished by some run; it is this run's to skip only if it is what this run
would write. For a container: its index reads back, it records the source's name, size
and mtime, and its digest of the original is the source's. For a restored file: its size and mtime are the container's record of the
original, and so is its digest. For a copy: the source's size, mtime and bytes; for a symlink: its
target text; for a hard link: the inode it must share.
"""

from __future__ import annotations

import filecmp
import os
import stat
from pathlib import Path

from ckptz.container import read_index
from ckptz.errors import CkptzError
from ckptz.runs.jobs import Job
from ckptz.runs.tree import Kind, scan


def already_done(job: Job, compress: bool) -> bool:
    """Whether ``job``'s output exists and is what ``job`` would write (module docstring)."""
    try:
        out = job.target.lstat()
        src = job.entry.path.lstat()
        if job.kind == "symlink":
            return stat.S_ISLNK(out.st_mode) and os.readlink(job.target) == os.readlink(job.entry.path)
        if not stat.S_ISREG(out.st_mode):
            return False
        if job.kind == "link":
            assert job.primary is not None
            head = job.primary.lstat()
            return (out.st_dev, out.st_ino) == (head.st_dev, head.st_ino)
        if job.kind == "copy":
            # Its bytes too: a source rewritten with its size and mtime kept is another file.
            same = (out.st_size, out.st_mtime_ns) == (src.st_size, src.st_mtime_ns)
            return same and filecmp.cmp(job.entry.path, job.target, shallow=False)
        if job.kind != "convert":
            return False
        return _container_of(job, src) if compress else _restored_from(job, out)
    except (CkptzError, OSError, KeyError, TypeError, ValueError):
        return False


def _container_of(job: Job, src: os.stat_result) -> bool:
    from ckptz import digest

    with open(job.target, "rb") as f:
        index = read_index(f, str(job.target))
    source = index.header["source"]
    if (source["name"], source["size"], source["mtime_ns"]) != (
        job.entry.path.name,
        src.st_size,
        src.st_mtime_ns,
    ):
        return False
    # A source rewritten with the same size, its mtime set back (os.utime, cp -p of another
    # save of the same shape), must not pass for the one the container holds.
    recorded = index.source_digest
    return digest.of_file(job.entry.path, recorded.kind) == recorded


def _restored_from(job: Job, out: os.stat_result) -> bool:
    from ckptz import digest

    with open(job.entry.path, "rb") as f:
        index = read_index(f, job.label)
    source = index.header["source"]
    if (out.st_size, out.st_mtime_ns) != (source["size"], source["mtime_ns"]):
        return False
    recorded = index.source_digest
    return digest.of_file(job.target, recorded.kind) == recorded


def stale_outputs(root: Path, targets: set[Path], compress: bool) -> list[Path]:
    """Outputs under the output folder ``root`` whose sources are gone: the containers
    (``compress``) or checkpoints (``decompress``) that no job of this run writes. Other
    files are left alone: ckptz cannot tell its copies from a user's own files."""
    if not root.is_dir() or root.is_symlink():
        return []
    kind: Kind = "container" if compress else "checkpoint"
    return [e.path for e in scan(root).entries if e.kind == kind and e.path not in targets]


def remove_stale(paths: list[Path], keep: set[Path]) -> None:
    """Remove the stale outputs ``paths``, then their folders left empty, up to the folders
    of this run's output (``keep``)."""
    from ckptz.safeio import os_error, remove

    for path in paths:
        try:
            remove(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise os_error(exc, path) from None
        folder = path.parent
        while folder not in keep and folder != folder.parent:
            try:
                folder.rmdir()
            except OSError:
                break
            folder = folder.parent
