"""Deciding what ``compress`` and ``decompress`` do with each file, before touching any.

A plan maps every entry of every source (:mod:`ckptz.runs.tree`) to one job: convert it, carry it
over (copy a file, recreate a symlink, hard-link a second name of an inode), finish what a
killed in-place run left, or skip it with a note. All refusals (an output that exists, is an
input, or is claimed twice; a stale container in the way; a file the run needs that cannot
be read, unless asked to skip those) happen here, so a run either starts with a consistent
plan or does nothing.

Where outputs go (``-o``): one folder source, ``-o D`` names the mirror of the folder; one
file source, ``-o F`` names the output file, unless ``F`` ends in ``/`` or is a folder. With
several sources, or a trailing ``/``, ``-o D/`` is a folder that receives one output per
source. Without ``-o``, a folder ``P`` maps to ``P.ckptz`` (and back) beside it, and a file's
output goes beside it. ``--in-place`` writes beside each file and removes the input after
checking the output.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from ckptz.container import SUFFIX
from ckptz.errors import ContainerError, NothingToDoError, UnreadableError, UnsafePathError, UsageError
from ckptz.runs.jobs import Job, JobKind
from ckptz.runs.resume import already_done, stale_outputs
from ckptz.runs.tree import UNREADABLE, Entry, Kind, Selection, Tree
from ckptz.safeio import is_device


@dataclass(frozen=True, slots=True)
class Action:
    """One thing a command did, or with ``dry_run`` would do.

    Attributes:
        kind: ``compress``, ``decompress``, ``copy``, ``symlink``, ``link`` (a hard link to an
            output already made), ``finish`` (an interrupted in-place file), ``remove-temp``
            or ``skip``.
        path: the input.
        target: the output, if any.
        note: why, for skips and finishes.
    """

    kind: str
    path: str
    target: str | None = None
    note: str | None = None


@dataclass(slots=True)
class Plan:
    """Everything a run will do, in the order it does it."""

    finishes: list[Job] = field(default_factory=list)
    converts: list[Job] = field(default_factory=list)
    links: list[Job] = field(default_factory=list)
    carries: list[Job] = field(default_factory=list)
    temps: list[Job] = field(default_factory=list)
    #: (source folder, output folder) pairs to mirror, parents first
    dirs: list[tuple[Path, Path]] = field(default_factory=list)
    skipped: list[Action] = field(default_factory=list)
    #: files the run needs that cannot be read (skipped where asked to, else refused)
    unreadable: list[Action] = field(default_factory=list)
    #: folders (or files) the run writes in, and sources it only reads
    writes: list[Path] = field(default_factory=list)
    reads: list[Path] = field(default_factory=list)
    #: with ``--force``, outputs whose sources are gone (:func:`ckptz.runs.resume.stale_outputs`)
    stale: list[Path] = field(default_factory=list)

    @property
    def converted_bytes(self) -> int:
        """The bytes of the files the run converts (or finishes converting)."""
        return sum(j.entry.size for j in self.converts + self.finishes)

    def actions(self, compress: bool) -> tuple[Action, ...]:
        verb = "compress" if compress else "decompress"
        names = {"convert": verb, "finish": "finish", "link": "link", "copy": "copy", "symlink": "symlink"}
        out = [
            Action(names[j.kind], str(j.entry.path), str(j.target), _why(j, compress))
            for j in self.finishes + self.converts + self.links + self.carries
        ]
        out += [Action("remove-temp", str(j.entry.path)) for j in self.temps]
        out += [Action("remove-stale", str(path), note="removed: its source is gone") for path in self.stale]
        return tuple(out + self.skipped)


def _why(job: Job, compress: bool) -> str | None:
    if job.kind == "copy" and compress and job.entry.kind == "container":
        return "already compressed: copied as it is"
    if job.kind == "finish":
        return "both forms present after an interrupted run: compare, then remove the redundant one"
    if job.kind == "link":
        return "another name of a file already " + ("compressed" if compress else "restored")
    return None


@dataclass(frozen=True, slots=True)
class Output:
    """Where a command writes (see the module docstring).

    Attributes:
        path: ``-o``, if given.
        folder: ``-o`` names a folder receiving one output per source.
        in_place: ``--in-place``.
    """

    path: Path | None = None
    folder: bool = False
    in_place: bool = False

    @classmethod
    def parse(cls, dst: str | Path | None, in_place: bool, sources: int, first_is_dir: bool) -> Output:
        if in_place and dst is not None:
            raise UsageError("--in-place and -o/--output exclude each other")
        if dst is None:
            return cls(in_place=in_place)
        text = str(dst)
        path = Path(text)
        folder = sources > 1 or text.endswith(("/", os.sep)) or (path.is_dir() and not first_is_dir)
        return cls(path, folder and not (sources == 1 and first_is_dir), in_place)


def plan(
    trees: list[Tree],
    out: Output,
    *,
    compress: bool,
    selection: Selection,
    force: bool,
    skip_unreadable: bool = False,
) -> Plan:
    """The jobs for ``trees``; see the module docstring for where outputs go.

    A file the run would convert or copy that cannot be read is refused, or with
    ``skip_unreadable`` left as it is and listed among the skipped (as ``cannot be read``).

    Raises:
        UsageError: outputs that exist (without ``force``), overwrite an input, or collide.
        UnreadableError: files the run needs cannot be read (without ``skip_unreadable``).
        NothingToDoError: nothing to convert, or an ``--include`` pattern matched nothing.
        ContainerError: ``decompress`` of a file that is not a container.
        UnsafePathError: a symlink in an output path.
    """
    p = Plan()
    unmatched = selection.unmatched(trees)
    if unmatched:
        raise NothingToDoError(f"--include {unmatched[0]!r} matches no file", hint="check the pattern")
    several = len(trees) > 1
    done_already = 0
    wanted: Kind = "checkpoint" if compress else "container"
    for t in trees:
        try:
            root = _out_root(t, out, compress)
        except UsageError:
            if any(selection.converts(e, wanted) for e in t.entries):
                raise
            continue  # nothing to convert here: say that rather than ask for -o
        prefix = (t.root.name or str(t.root)) + "/" if several and t.is_dir else ""
        beside = out.in_place or (out.path is None and not t.is_dir)
        (p.writes if beside else p.reads).append(t.root)
        if root is not None:
            p.writes.append(root)
            if t.is_dir:
                _check_not_inside(t.root, root)
                p.dirs.append((t.root, root))
                p.dirs.extend((t.root / d, root / d) for d in t.dirs)
        for e in t.entries:
            done_already += _place(p, t, e, root, out, compress, selection, prefix, force)
    if p.unreadable and not skip_unreadable:
        raise UnreadableError(tuple((a.path, a.note or "") for a in p.unreadable))
    p.skipped += p.unreadable
    _drop_repeats(p)
    _pair_hard_links(p, out)
    done_already += _refuse(p, trees, out, force, compress)
    if force and not out.in_place:
        targets = {j.target for j in p.converts + p.links + p.carries}
        for t in trees:
            root = _out_root(t, out, compress) if t.is_dir else None
            if root is not None:
                p.stale += stale_outputs(root, targets, compress)
    if not (p.converts or p.finishes or p.links):
        where = ", ".join(str(t.root) for t in trees)
        if done_already or p.unreadable:
            return p
        if out.in_place and not compress and all(t.is_dir for t in trees):
            # A rerun after everything was restored (a kill just before the exit) is done.
            p.skipped.append(Action("skip", where, note="no .ckptz containers: nothing to decompress"))
            return p
        links = [t.root for t in trees if not t.is_dir and t.entries and t.entries[0].kind == "symlink"]
        if links:
            raise NothingToDoError(
                "is a symlink, and ckptz does not follow symlinks",
                path=str(links[0]),
                hint=f"name the file it points to: ckptz {'compress' if compress else 'decompress'} "
                f'"$(readlink -f {links[0]})"',
            )
        if compress:
            raise NothingToDoError(
                "no checkpoint files here (recognised by content: torch zip, pickle, safetensors)",
                path=where,
                hint="choose files with --include PATTERN",
            )
        raise NothingToDoError("no .ckptz containers here", path=where, hint="nothing to decompress")
    return p


def _out_root(t: Tree, out: Output, compress: bool) -> Path | None:
    """The folder mirroring a folder source; None for a file source or in place."""
    if out.in_place or not t.is_dir:
        return None
    if out.path is None:
        name = t.root.name + SUFFIX if compress else t.root.name.removesuffix(SUFFIX)
        if name == t.root.name or not t.root.name:
            raise UsageError("cannot choose an output name", path=str(t.root), hint="give -o DST")
        return t.root.with_name(name)
    if out.folder:
        return out.path / (t.root.name if compress else t.root.name.removesuffix(SUFFIX))
    return out.path


def _target(t: Tree, e: Entry, root: Path | None, out: Output, name: str) -> Path:
    if out.in_place:
        return e.path.with_name(name)
    if root is not None:
        return root / Path(e.rel).parent / name
    if out.path is None:
        return e.path.with_name(name)
    if out.folder:
        return out.path / name
    return out.path


def _place(
    p: Plan,
    t: Tree,
    e: Entry,
    root: Path | None,
    out: Output,
    compress: bool,
    selection: Selection,
    prefix: str,
    force: bool,
) -> int:
    """Add ``e``'s job to the plan; return 1 if it is already in the converted form."""
    label = prefix + e.rel
    explicit = not t.is_dir
    wanted: Kind = "checkpoint" if compress else "container"
    if e.kind == "special":
        p.skipped.append(Action("skip", str(e.path), note="not a regular file, folder or symlink"))
        return 0
    if e.kind == "unreadable":
        # Its content is unknown: any file but one excluded from converting may be a
        # checkpoint (a container), and -o copies every file.
        if explicit or not out.in_place or selection.converts(replace(e, kind=wanted), wanted):
            p.unreadable.append(Action("skip", str(e.path), note=e.error or UNREADABLE))
        return 0
    if e.kind == "temp":
        if out.in_place:
            p.temps.append(Job("temp", e, e.path, label))
        return 0
    if e.kind == "symlink":
        if explicit:
            p.skipped.append(
                Action(
                    "skip",
                    str(e.path),
                    note="a symlink, which ckptz does not follow; name the file it points to (readlink -f)",
                )
            )
        elif not out.in_place:
            p.carries.append(Job("symlink", e, _target(t, e, root, out, e.path.name), label))
        return 0
    converts = selection.converts(e, wanted) or (explicit and compress and e.kind == "other")
    if converts:
        name = e.path.name + SUFFIX if compress else e.path.name.removesuffix(SUFFIX)
        if not compress and name == e.path.name and out.path is None:
            if explicit:
                raise UsageError("cannot choose an output name", path=str(e.path), hint="give -o FILE")
            # Lightning's CompressedCheckpointIO keeps the checkpoint's own name, and a user may
            # rename a container: in a folder it is left as it is, not a reason to refuse the folder.
            p.skipped.append(Action("skip", str(e.path), note=_SAME_NAME))
            return 0
        target = _target(t, e, root, out, name)
        _check_target(target, root or target.parent)
        # In place, both forms present means a run was interrupted: finish it (or, with
        # --force, convert again over the stale output).
        present = out.in_place and not force and (target.exists() or target.is_symlink())
        kind: JobKind = "finish" if present else "convert"
        (p.finishes if kind == "finish" else p.converts).append(Job(kind, e, target, label))
        return 0
    if explicit and not compress:
        raise ContainerError("not a ckptz container; nothing to decompress", path=str(e.path))
    already = (e.kind == "container") == compress
    if explicit and compress and e.kind == "container":
        p.skipped.append(Action("skip", str(e.path), note="already a ckptz container"))
        return 1
    if out.in_place:
        if already and compress:
            p.skipped.append(Action("skip", str(e.path), note="already compressed"))
        return int(already and compress)
    p.carries.append(Job("copy", e, _target(t, e, root, out, e.path.name), label))
    return int(already and compress)


#: Why a container whose name lacks ``.ckptz`` is left alone in a folder decompressed in place.
_SAME_NAME = (
    "a container whose name does not end in .ckptz (as Lightning's CompressedCheckpointIO"
    " writes it, or renamed): left as it is (ckptz decompress FILE -o OUT restores it)"
)


def _drop_repeats(p: Plan) -> None:
    """Keep one job per file and target: a file named twice (``a.pt ./a.pt``, or a folder and
    a file in it) is one job, not a collision with itself."""
    seen: set[tuple[Path, tuple[int, int]]] = set()
    for group in (p.converts, p.finishes, p.carries, p.temps):
        kept = []
        for j in group:
            key = (j.target, j.entry.inode)
            if key not in seen:
                seen.add(key)
                kept.append(j)
        group[:] = kept


def _pair_hard_links(p: Plan, out: Output) -> None:
    """Second and later names of one inode become links to the first one's output."""
    first: dict[tuple[int, int], Job] = {}
    for group in (p.converts, p.carries):
        kept = []
        for j in group:
            if j.kind in ("convert", "copy") and j.entry.links > 1:
                head = first.get(j.entry.inode)
                if head is not None and head.kind == j.kind:
                    p.links.append(Job("link", j.entry, j.target, j.label, head.target))
                    continue
                first[j.entry.inode] = j
            kept.append(j)
        group[:] = kept


def linked_elsewhere(p: Plan, compress: bool) -> list[str]:
    """In place, one line for each converted file that has hard links the run was not given:
    those names keep the old form's bytes, so replacing the run's names frees no space (as
    gzip warns of, where it refuses)."""
    names: dict[tuple[int, int], int] = {}
    for j in p.converts + p.finishes + p.links:
        names[j.entry.inode] = names.get(j.entry.inode, 0) + 1
    lines = []
    for j in p.converts + p.finishes:
        others = j.entry.links - names[j.entry.inode]
        if others > 0:
            kept = "original" if compress else "container's"
            links = "another hard link to it lies" if others == 1 else f"{others} more hard links to it lie"
            lines.append(
                f"{j.label}: {links} outside what this run was given;"
                f" {'it keeps' if others == 1 else 'they keep'} the {kept} bytes, so no space is freed"
            )
    return lines


def _refuse(p: Plan, trees: list[Tree], out: Output, force: bool, compress: bool) -> int:
    """Refuse outputs that collide, that are inputs, or (without ``force``) that exist,
    unless an earlier run of the same command finished them (then they are skipped); return
    how many conversions were skipped so."""
    inputs = {e.inode for t in trees for e in t.entries}
    claimed: dict[Path, Job] = {}
    jobs = p.converts + p.links + p.carries
    for j in jobs + p.finishes:
        other = claimed.get(j.target)
        if other is not None:
            a, b = sorted((other, j), key=lambda x: x.entry.kind == "container")
            stale = b if compress else a
            raise UsageError(
                f"{a.label} and {b.label} would both become {j.target}",
                path=str(stale.entry.path),
                hint="a stale copy from an earlier run? remove it, or --exclude it",
            )
        claimed[j.target] = j
    if out.in_place:
        return 0
    finished: set[int] = set()
    for j in jobs:
        ident = _identity(j.target)
        if ident is not None and ident in inputs:
            raise UsageError("output would overwrite an input", path=str(j.target), hint="choose another -o")
        if is_device(j.target):
            continue  # written into (-o /dev/null), never replaced
        if not force and (j.target.exists() or j.target.is_symlink()):
            if not already_done(j, compress):
                raise UsageError(
                    "output already exists and is not this run's",
                    path=str(j.target),
                    hint="remove it or pass --force",
                )
            finished.add(id(j))
            p.skipped.append(Action("skip", str(j.entry.path), str(j.target), note="done by an earlier run"))
    converted = len(p.converts)
    for group in (p.converts, p.links, p.carries):
        group[:] = [j for j in group if id(j) not in finished]
    return converted - len(p.converts)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.lstat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _check_not_inside(src: Path, root: Path) -> None:
    try:
        root.resolve().relative_to(src.resolve())
    except ValueError:
        return
    raise UsageError("the output folder must not be inside the source folder", path=str(root))


def _check_target(target: Path, root: Path) -> None:
    """Refuse an output whose folder (below ``root``) or own name is a symlink.

    Writing through such a link could put bytes outside the destination, or, in place, make
    ckptz remove an original whose container lives somewhere else.
    """
    try:
        rel = target.relative_to(root)
    except ValueError:
        rel = Path(target.name)
        root = target.parent
    here = root
    for part in rel.parts:
        here = here / part
        if here.is_symlink():
            raise UnsafePathError(
                "a symlink in the output path could redirect the write",
                path=str(here),
                hint="remove the link",
            )
