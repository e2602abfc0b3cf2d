"""Finding what a command works on: sources and globs, what each file is, and selection.

A source is a file or a folder. A folder is walked recursively without following any
symlink; every entry is classified by its content, not its name alone:

* ``container``: a ``.ckptz`` name or the container magic;
* ``checkpoint``: a checkpoint suffix or content that starts like one (:func:`ckptz.formats.sniff`);
* ``other``: any other regular file (copied unchanged);
* ``symlink``: kept as a link, never followed;
* ``temp``: a temporary file a killed ckptz run left;
* ``special``: FIFOs, sockets, devices (never opened, skipped with a note);
* ``unreadable``: a regular file this process cannot open for reading (its content, hence
  its kind, is unknown; a command refuses it, or skips it where asked to).

``--include``/``--exclude`` patterns (:class:`Selection`) choose which files a command
converts; the others are carried over unchanged.
"""

from __future__ import annotations

import glob
import os
import stat
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Literal

from ckptz.container import MAGIC, SUFFIX
from ckptz.errors import InputNotFoundError, NothingToDoError
from ckptz.formats import SNIFF_BYTES, is_checkpoint
from ckptz.safeio import is_temp

Kind = Literal["checkpoint", "container", "other", "symlink", "temp", "special", "unreadable"]

#: The source name that means standard input (and, as ``-o``, standard output).
STDIO = "-"
#: How a file that cannot be read is noted (the reason follows in brackets).
UNREADABLE = "cannot be read"


@dataclass(frozen=True, slots=True)
class Entry:
    """One thing found under a source.

    Attributes:
        path: where it is.
        rel: its path relative to the source folder (the file's name for a file source).
        kind: see the module docstring.
        size: bytes (of the link itself for a symlink).
        inode: ``(device, inode)``, to find hard links.
        links: its hard-link count.
        error: why it cannot be read (``unreadable`` only).
    """

    path: Path
    rel: str
    kind: Kind
    size: int
    inode: tuple[int, int]
    links: int
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Tree:
    """A source and what it holds.

    Attributes:
        root: the source path as given (after glob expansion).
        is_dir: whether it is a folder (entries are then below it).
        entries: files, links and leftovers, sorted by relative path.
        dirs: every folder below ``root``, parents before children (relative paths).
    """

    root: Path
    is_dir: bool
    entries: tuple[Entry, ...]
    dirs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Selection:
    """``--include``/``--exclude`` patterns (shell-style, matched against the relative path and
    the file name). With includes, only matching files are converted, whatever their content;
    excluded files are never converted."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def _match(self, rel: str, patterns: tuple[str, ...]) -> bool:
        name = rel.rsplit("/", 1)[-1]
        return any(fnmatchcase(rel, p) or fnmatchcase(name, p) for p in patterns)

    def converts(self, entry: Entry, wanted: Kind) -> bool:
        """Whether a command that converts ``wanted`` files should convert ``entry``."""
        if self._match(entry.rel, self.exclude):
            return False
        if self.include and wanted == "checkpoint":
            return entry.kind in ("checkpoint", "other") and self._match(entry.rel, self.include)
        if self.include and not self._match(entry.rel, self.include):
            return False
        return entry.kind == wanted

    def unmatched(self, trees: list[Tree]) -> list[str]:
        """Include patterns that match no file at all (probably a typo)."""
        rels = [e.rel for t in trees for e in t.entries]
        return [p for p in self.include if not any(self._match(r, (p,)) for r in rels)]


def expand(sources: list[str]) -> list[Path]:
    """Source arguments as paths: shell-style patterns that the shell left (quoted) are expanded.

    Raises:
        InputNotFoundError: a path does not exist, or a pattern matches nothing.
        NothingToDoError: no source was given.
    """
    if not sources:
        raise NothingToDoError("no source given", hint="name a checkpoint file or folder")
    out: list[Path] = []
    for s in sources:
        p = Path(s)
        if p.exists() or p.is_symlink():
            out.append(p)
        elif glob.has_magic(s):
            matches = sorted(glob.glob(s))
            if not matches:
                raise InputNotFoundError("pattern matches nothing", path=s)
            out.extend(Path(m) for m in matches)
        else:
            raise InputNotFoundError("no such file or folder", path=s)
    # A path named twice (``a.pt ./a.pt``, overlapping patterns) is one source.
    unique: dict[str, Path] = {}
    for p in out:
        unique.setdefault(os.path.abspath(p), p)
    return list(unique.values())


def scan(src: Path) -> Tree:
    """Walk ``src`` (a file, or a folder without following symlinks) and classify what it holds.

    A symlink named as a source is followed when it points to a folder (as ``find -H`` does);
    nothing below it is ever followed.

    Raises:
        InputNotFoundError: ``src`` does not exist.
    """
    try:
        st = src.lstat()
    except FileNotFoundError:
        raise InputNotFoundError("no such file or folder", path=str(src)) from None
    if stat.S_ISLNK(st.st_mode) and src.is_dir():
        st = src.stat()
    if not stat.S_ISDIR(st.st_mode):
        return Tree(src, False, (_entry(src, src.name, st),))
    entries: list[Entry] = []
    dirs: list[str] = []
    for folder, subdirs, files in os.walk(src, followlinks=False, onerror=_raise):
        subdirs.sort()
        base = Path(folder)
        links = [d for d in subdirs if (base / d).is_symlink()]
        subdirs[:] = [d for d in subdirs if d not in links]
        for d in subdirs:
            dirs.append((base / d).relative_to(src).as_posix())
        for name in sorted(files + links):
            path = base / name
            try:
                est = path.lstat()
            except FileNotFoundError:
                continue  # removed while walking
            entries.append(_entry(path, path.relative_to(src).as_posix(), est))
    entries.sort(key=lambda e: e.rel)
    return Tree(src, True, tuple(entries), tuple(dirs))


def _raise(exc: OSError) -> None:
    raise exc


def _entry(path: Path, rel: str, st: os.stat_result) -> Entry:
    try:
        kind = _kind(path, st)
    except OSError as exc:
        why = f"{UNREADABLE} ({exc.strerror or exc})"
        return Entry(path, rel, "unreadable", st.st_size, (st.st_dev, st.st_ino), st.st_nlink, why)
    return Entry(path, rel, kind, st.st_size, (st.st_dev, st.st_ino), st.st_nlink)


def _kind(path: Path, st: os.stat_result) -> Kind:
    """``path``'s kind, by its first bytes where its name does not say.

    Raises:
        OSError: it is a regular file that cannot be opened for reading.
    """
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if not stat.S_ISREG(st.st_mode):
        return "special"
    if is_temp(path):
        return "temp"
    with open(path, "rb") as f:
        head = b"" if path.name.endswith(SUFFIX) else f.read(SNIFF_BYTES)
    if path.name.endswith(SUFFIX) or head.startswith(MAGIC):
        return "container"
    return "checkpoint" if is_checkpoint(path, head) else "other"
