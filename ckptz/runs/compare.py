"""``verify``: does restoring a compressed tree give exactly the original tree?

With an original to compare against, the two trees are matched by name (``X.ckptz`` stands
for ``X``; other files, symlinks and folders for themselves) and every name gets a verdict:
present on both sides with equal bytes and permission bits (``ok``), or ``missing``,
``extra``, ``changed``, ``damaged``, ``undecodable``, ``missing reference`` (a series container
whose reference, a newer checkpoint, is missing or damaged) or ``changed reference`` (that
reference is there but is not the file it was coded against). Containers are decoded and compared
with the original in a stream, without writing anything; plain files are compared block by
block. Without an original, every container is decoded and its checksums checked, and every
other file is listed as ``unchecked``. A file that cannot be read is ``unreadable``, or
``skipped`` where the caller asked to leave those out.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

from ckptz.container import SUFFIX, read_index
from ckptz.engines.base import Engine
from ckptz.errors import (
    BusyError,
    CkptzError,
    CodecUnavailableError,
    CorruptionError,
    DeviceError,
    MismatchError,
    NothingToDoError,
    ReferenceChangedError,
    ReferenceDamagedError,
    ReferenceMissingError,
    StoppedError,
    UsageError,
)
from ckptz.meta import FileMeta
from ckptz.pipeline import Comparer, DiscardSink, restore
from ckptz.runs.jobs import Stop, run_jobs
from ckptz.runs.share import SOLO, Team
from ckptz.runs.tree import Entry, Tree

if TYPE_CHECKING:
    from ckptz.runs.results import Reporter

CheckStatus = Literal[
    "ok",
    "unchecked",
    "skipped",
    "changed",
    "missing",
    "extra",
    "damaged",
    "undecodable",
    "missing reference",
    "changed reference",
    "unreadable",
]
#: Verdicts that make ``verify`` fail: every one but these three.
FAILING: frozenset[str] = frozenset(get_args(CheckStatus)) - {"ok", "unchecked", "skipped"}
_BLOCK = 8 << 20


@dataclass(frozen=True, slots=True)
class FileCheck:
    """The verdict on one name.

    Attributes:
        path: the name in the checked tree (``X.ckptz`` for a container), or in the original
            for a ``missing`` one; folders end in ``/``.
        status: see :data:`CheckStatus`.
        bytes: original bytes compared or checked.
        error: what is wrong, or why it was not checked.
    """

    path: str
    status: CheckStatus
    bytes: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status not in FAILING


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """The result of verify: ``ok`` only if no name failed (see :data:`FAILING`)."""

    root: str
    files: tuple[FileCheck, ...]
    against: str | None = None
    device: str | None = None
    seconds: float = 0.0
    notices: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return bool(self.files) and all(f.ok for f in self.files)

    @property
    def counts(self) -> dict[str, int]:
        """How many names got each verdict."""
        return dict(Counter(f.status for f in self.files))


@dataclass(frozen=True, slots=True)
class _Pair:
    label: str
    mine: Entry
    theirs: Entry | None


def verify_trees(
    trees: list[Tree],
    base: Tree | None,
    engine: Engine,
    reporter: Reporter,
    stop: Stop,
    team: Team = SOLO,
    skip_unreadable: bool = False,
) -> list[FileCheck]:
    """Verdicts for every name of ``trees`` (and, with ``base``, of the original).

    With several ranks (``team``), each decodes its share of the containers by bytes, and
    rank 0 alone gives the verdicts that need no decoding. A file that cannot be read, on
    either side, is ``unreadable``, or ``skipped`` with ``skip_unreadable``.

    Raises:
        UsageError: several trees with an original, or a folder against a file.
        NothingToDoError: nothing to check (no container and no original).
    """
    verdicts: list[FileCheck] = []
    pairs: list[_Pair] = []
    if base is None:
        several = len(trees) > 1
        for t in trees:
            prefix = (t.root.name or str(t.root)) + "/" if several and t.is_dir else ""
            for e in t.entries:
                if e.kind == "container":
                    pairs.append(_Pair(prefix + e.rel, e, None))
                elif e.kind == "unreadable":
                    verdicts.append(_unreadable(prefix + e.rel, e, skip_unreadable))
                elif e.kind != "temp":
                    why = "a symlink" if e.kind == "symlink" else "not a container"
                    verdicts.append(
                        FileCheck(prefix + e.rel, "unchecked", 0, f"{why}; give --against to compare it")
                    )
        if not pairs and not verdicts_of(verdicts, "unreadable", "skipped"):
            where = ", ".join(str(t.root) for t in trees)
            raise NothingToDoError(
                "no .ckptz containers here", path=where, hint="give --against SRC to compare plain files"
            )
    else:
        if len(trees) != 1:
            raise UsageError("--against compares one tree", hint="verify one folder (or file) at a time")
        verdicts, pairs = _match(trees[0], base)
        compared = []
        for p in pairs:  # nothing to compare where either side cannot be read
            unread = next((e for e in (p.mine, p.theirs) if e is not None and e.kind == "unreadable"), None)
            if unread is None:
                compared.append(p)
            else:
                verdicts.append(_unreadable(p.label, unread, skip_unreadable))
        pairs = compared
    pairs = team.mine(pairs, lambda p: p.mine.size)
    verdicts = verdicts if team.leader else []
    reporter.start(sum(p.mine.size for p in pairs), "verify")

    def check(p: _Pair) -> FileCheck:
        reporter.file(p.label)
        verdict = _check(p, engine, reporter, stop)
        reporter.file_done(p.label)
        return verdict

    verdicts += run_jobs(check, pairs, stop, name=lambda p: p.label)
    return sorted(verdicts, key=lambda v: v.path)


def verdicts_of(checks: list[FileCheck], *statuses: str) -> list[FileCheck]:
    return [c for c in checks if c.status in statuses]


def _unreadable(label: str, e: Entry, skip: bool) -> FileCheck:
    return FileCheck(label, "skipped" if skip else "unreadable", 0, f"{e.path}: {e.error}")


def _original_name(e: Entry) -> str:
    named = e.kind in ("container", "unreadable") and e.rel.endswith(SUFFIX)
    return e.rel.removesuffix(SUFFIX) if named else e.rel


def _match(tree: Tree, base: Tree) -> tuple[list[FileCheck], list[_Pair]]:
    """Pair each name of ``tree`` with the original's; verdicts for the unpaired."""
    verdicts: list[FileCheck] = []
    pairs: list[_Pair] = []
    if not tree.is_dir:
        (mine,) = tree.entries
        name = _original_name(mine).rsplit("/", 1)[-1]
        theirs = (
            base.entries[0] if not base.is_dir else next((e for e in base.entries if e.rel == name), None)
        )
        if theirs is None:
            return [FileCheck(mine.rel, "extra", 0, f"no {name} in {base.root}")], []
        return [], [_Pair(mine.rel, mine, theirs)]
    if not base.is_dir:
        raise UsageError("cannot compare a folder with a file", path=str(base.root))
    originals = {e.rel: e for e in base.entries if e.kind != "temp"}
    seen: dict[str, str] = {}
    for e in tree.entries:
        if e.kind == "temp":
            continue
        name = _original_name(e)
        if name in seen:
            verdicts.append(
                FileCheck(
                    e.rel,
                    "extra",
                    0,
                    f"{seen[name]} and {e.rel} would both restore to {name}; remove the stale one",
                )
            )
            continue
        seen[name] = e.rel
        theirs = originals.get(name)
        if theirs is None:
            verdicts.append(FileCheck(e.rel, "extra", 0, f"no {name} in {base.root}"))
        else:
            pairs.append(_Pair(e.rel, e, theirs))
    for name, e in originals.items():
        if name not in seen and e.kind == "special":
            # compress -o leaves fifos, sockets and devices out: nothing to restore, nothing lost.
            verdicts.append(FileCheck(name, "unchecked", 0, "not a regular file"))
        elif name not in seen:
            hint = (
                f"neither {name} nor {name}{SUFFIX} is here"
                if e.kind != "symlink"
                else "the symlink is not here"
            )
            verdicts.append(FileCheck(name, "missing", e.size if e.kind != "symlink" else 0, hint))
    mine_dirs, their_dirs = set(tree.dirs), set(base.dirs)
    verdicts += [
        FileCheck(d + "/", "extra", 0, f"folder not in {base.root}") for d in sorted(mine_dirs - their_dirs)
    ]
    verdicts += [FileCheck(d + "/", "missing", 0, "folder not here") for d in sorted(their_dirs - mine_dirs)]
    return verdicts, pairs


def _check(p: _Pair, engine: Engine, reporter: Reporter, stop: Stop) -> FileCheck:
    mine, theirs = p.mine, p.theirs
    try:
        if theirs is None:
            return _decode(p.label, mine, engine, reporter, stop)
        if mine.kind == "symlink" or theirs.kind == "symlink":
            return _links(p.label, mine, theirs)
        if theirs.kind == "special" or mine.kind == "special":
            return FileCheck(p.label, "unchecked", 0, "not a regular file")
        # A container under its original's own name (Lightning's CompressedCheckpointIO)
        # restores to a plain file of that name: compared restored, as an X.ckptz is.
        if mine.kind == "container" and (mine.rel.endswith(SUFFIX) or theirs.kind != "container"):
            return _container(p.label, mine, theirs, engine, reporter, stop)
        return _files(p.label, mine, theirs, reporter, stop)
    except (StoppedError, BusyError):
        raise
    except (CodecUnavailableError, DeviceError) as exc:
        # What this machine cannot decode says nothing about the container's health, but
        # every payload's checksum it can check: a damaged one is damage, not a missing GPU.
        damage = _stored_damage(p.label, mine, engine, stop) if mine.kind == "container" else None
        if damage is not None:
            return FileCheck(p.label, "damaged", 0, _detail(damage))
        return FileCheck(p.label, "undecodable", 0, str(exc))
    except MismatchError as exc:
        return FileCheck(p.label, "changed", 0, str(exc))
    except ReferenceMissingError as exc:
        # A damaged reference is reported as missing (its own row says damaged); one that is
        # whole but another file is told apart, so the user puts the right one back.
        changed = isinstance(exc, ReferenceChangedError) and not isinstance(exc, ReferenceDamagedError)
        return FileCheck(p.label, "changed reference" if changed else "missing reference", 0, str(exc))
    except CkptzError as exc:
        return FileCheck(p.label, "damaged", 0, _detail(exc))
    except OSError as exc:
        return FileCheck(p.label, "damaged", 0, f"cannot read ({exc.strerror or exc})")


def _stored_damage(label: str, mine: Entry, engine: Engine, stop: Stop) -> CkptzError | None:
    """The first payload of the container ``mine`` that fails its checks, read without
    decoding anything (:meth:`~ckptz.pipeline.decoder.FrameDecoder.check_stored`); None if
    every payload passes (or the file cannot be read: the decode already said why)."""
    from ckptz.pipeline.decoder import FrameDecoder

    try:
        with open(mine.path, "rb") as c:
            FrameDecoder(c.fileno(), label, read_index(c, label), engine).check_stored(stop.check)
    except (StoppedError, BusyError):
        raise
    except CorruptionError as exc:
        return exc
    except (CkptzError, OSError):
        return None
    return None


def _detail(exc: CkptzError) -> str:
    """``exc`` without the file's name, which the verdict's row already shows."""
    return f"{exc.message} ({exc.hint})" if exc.hint else exc.message


def _scaled(reporter: Reporter, stop: Stop, stored: int, original: int) -> Callable[[int], None]:
    """Progress in stored (container) bytes while the restore counts original bytes."""
    ratio = stored / max(original, 1)
    return stop.ticker(lambda n: reporter.advance(int(n * ratio)))


def _decode(label: str, mine: Entry, engine: Engine, reporter: Reporter, stop: Stop) -> FileCheck:
    with open(mine.path, "rb") as c:
        index = read_index(c, label)
        tick = _scaled(reporter, stop, mine.size, index.source_size)
        restore(c, label, engine, DiscardSink(), index=index, progress=tick)
    return FileCheck(label, "ok", index.source_size)


def _container(
    label: str, mine: Entry, theirs: Entry, engine: Engine, reporter: Reporter, stop: Stop
) -> FileCheck:
    with open(mine.path, "rb") as c, open(theirs.path, "rb") as o:
        index = read_index(c, label)
        if index.source_size != theirs.size:
            return FileCheck(
                label, "changed", 0, f"restores {index.source_size} bytes, original has {theirs.size}"
            )
        meta = FileMeta.from_json(index.header.get("source"))
        comparer = Comparer(o, label)
        tick = _scaled(reporter, stop, mine.size, index.source_size)
        restore(c, label, engine, comparer, index=index, progress=tick)
        comparer.finish()
    if meta is not None:
        differs = _mode_differs(meta.mode, theirs.path)
        if differs:
            return FileCheck(label, "changed", index.source_size, differs)
    return FileCheck(label, "ok", index.source_size)


def _files(label: str, mine: Entry, theirs: Entry, reporter: Reporter, stop: Stop) -> FileCheck:
    if mine.size != theirs.size:
        return FileCheck(label, "changed", 0, f"{mine.size} bytes, original has {theirs.size}")
    at = 0
    with open(mine.path, "rb") as a, open(theirs.path, "rb") as b:
        while block := a.read(_BLOCK):
            other = b.read(len(block))
            if block != other:
                first = next(
                    (i for i, (x, y) in enumerate(zip(block, other, strict=False)) if x != y), len(other)
                )
                return FileCheck(label, "changed", 0, f"differs from the original at byte {at + first}")
            at += len(block)
            stop.check()
            reporter.advance(len(block))
        if b.read(1):
            return FileCheck(label, "changed", 0, "original is longer")
    differs = _mode_differs(stat.S_IMODE(os.stat(mine.path).st_mode), theirs.path)
    if differs:
        return FileCheck(label, "changed", at, differs)
    return FileCheck(label, "ok", at)


def _mode_differs(mode: int, original: Path) -> str | None:
    theirs = stat.S_IMODE(os.stat(original).st_mode)
    if mode == theirs:
        return None
    return f"permissions {mode:04o}, original {theirs:04o}"


def _links(label: str, mine: Entry, theirs: Entry) -> FileCheck:
    if mine.kind != "symlink" or theirs.kind != "symlink":
        what = (
            "a symlink here, a file in the original"
            if mine.kind == "symlink"
            else "a file here, a symlink in the original"
        )
        return FileCheck(label, "changed", 0, what)
    a, b = os.readlink(mine.path), os.readlink(theirs.path)
    if a != b:
        return FileCheck(label, "changed", 0, f"links to {a}, original links to {b}")
    return FileCheck(label, "ok", 0)
