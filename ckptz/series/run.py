"""``compress --series``: which file is coded against which, re-coding, and ``detach``.

**Reverse deltas.** In each track (one file path across a run's checkpoints, see
:mod:`.detect`) the newest file is self-contained and each older one is coded against the
next newer one, so deleting the oldest checkpoints never breaks a newer one, and restoring
any checkpoint needs only itself and newer ones.

**Keyframes.** Walking a track from its oldest file, ``depth`` counts the files below in the
current chain. A file links to the next newer one only while ``depth <= K - 2``; otherwise
it is coded self-contained and marked a *keyframe*. So a restore decodes at most ``K``
containers, and only the end of a chain is ever self-contained without the mark: that is the
previous newest file, which a later run re-codes against the new newest when its chain has
room (one file re-coded per new checkpoint and track, never more). Existing deltas and
keyframes are never touched again; deleting old checkpoints only shortens chains.

**Re-coding** (and ``detach``) is safe at every instant: the container is restored to a
temporary file beside it (its digest checked), coded again into a temporary container,
checked, renamed over the old one, and the temporary file removed. Its original bytes, hence
its digest, do not change (it keeps its digest's kind, even an ``xxh3_128`` of format 1.3), so
the older files coded against it still restore.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ckptz.container import SUFFIX, Index, read_index
from ckptz.digest import Digest
from ckptz.engines.base import Engine
from ckptz.errors import CorruptionError
from ckptz.formats.layout import FileLayout
from ckptz.meta import FileMeta
from ckptz.pipeline import FileSink, compress_file, restore
from ckptz.pipeline.transform import FrameTransform
from ckptz.runs.plan import Job, Plan
from ckptz.runs.tree import Tree
from ckptz.safeio import FileIdentity, atomic_output, os_error, temp_path, try_lock
from ckptz.series.delta import Keyframe, Tensor, delta_for, index_tensors, layout_tensors
from ckptz.series.detect import Member, detect, tracks
from ckptz.series.reference import ContainerReference, PlainReference, ReferenceBytes, RefSpec

#: Default ``--keyframe-every``: a restore decodes at most this many containers.
KEYFRAME_EVERY = 8

Progress = Callable[[int], None]


def _no_progress(_: int) -> None:
    pass


@dataclass(frozen=True, slots=True)
class Node:
    """One member of a track as the run sees it.

    Attributes:
        member: the file found.
        target: where its container is once the run is done.
        plain: it is compressed by this run (else it is a container already).
        reference: an existing container's reference path, as its header names it.
        keyframe: an existing container marked a keyframe (or detached).
    """

    member: Member
    target: Path
    plain: bool
    reference: str | None = None
    keyframe: bool = False

    @property
    def source(self) -> Path:
        return self.member.entry.path

    @property
    def source_container(self) -> Path:
        """Its container's path in the source tree (in place: where it is or will be)."""
        return self.source if not self.plain else Path(str(self.source) + SUFFIX)


@dataclass(slots=True)
class SeriesPlan:
    """What ``--series`` adds to a compress plan.

    Attributes:
        against: plain file (source path) → the node it is coded against.
        keyframes: plain files (source paths) coded self-contained as keyframes.
        recodes: existing containers (as nodes) to code again against a node.
        chains: per track, the nodes from oldest to newest (for reports and tests).
    """

    keyframe_every: int
    against: dict[Path, Node] = field(default_factory=dict)
    keyframes: set[Path] = field(default_factory=set)
    recodes: list[tuple[Node, Node]] = field(default_factory=list)

    def transform(self, job: Job) -> Callable[[FileLayout], FrameTransform | None] | None:
        """How ``job``'s frames are coded: against a reference, as a keyframe, or (None) plainly."""
        ref = self.against.get(job.entry.path)
        if ref is not None:
            where = [ref.source, ref.target, ref.source_container]
            return lambda layout: _delta(layout, job.entry.path, job.target, ref.target, where)
        if job.entry.path in self.keyframes:
            return lambda layout: Keyframe()
        return None


def plan_series(tree: Tree, p: Plan, keyframe_every: int = KEYFRAME_EVERY) -> SeriesPlan:
    """Decide, for every file of the run's checkpoints, what it is coded against (module docstring).

    Raises:
        UsageError: the folder holds no checkpoint named by its step, or two of one step.
        ContainerError: an existing container of the run is unreadable.
    """
    sp = SeriesPlan(keyframe_every)
    converts = {j.entry.path: j for j in p.converts}
    copies = {j.entry.path: j.target for j in p.carries if j.kind == "copy"}
    for members in tracks(tree, detect(tree)).values():
        nodes = [n for m in members if (n := _node(m, converts, copies)) is not None]
        depth = 0
        for i, node in enumerate(nodes):
            newer = nodes[i + 1] if i + 1 < len(nodes) else None
            links = False
            if newer is None:
                pass  # the newest: self-contained (a container already stays as it is)
            elif node.reference is not None:
                links = _resolves(node, newer)
            elif node.keyframe:
                pass
            elif depth <= keyframe_every - 2:
                links = True
                if node.plain:
                    sp.against[node.source] = newer
                else:
                    sp.recodes.append((node, newer))
            elif node.plain:
                sp.keyframes.add(node.source)
            depth = depth + 1 if links else 0
    return sp


def _node(m: Member, converts: dict[Path, Job], copies: dict[Path, Path]) -> Node | None:
    e = m.entry
    if e.kind == "checkpoint":
        job = converts.get(e.path)
        return None if job is None else Node(m, job.target, True)
    with open(e.path, "rb") as f:
        header = read_index(f, str(e.path)).header
    ref = header.get("reference")
    series = header.get("series")
    keyframe = isinstance(series, dict) and bool(series.get("keyframe"))
    path = str(ref["path"]) if isinstance(ref, dict) and "path" in ref else None
    return Node(m, copies.get(e.path, e.path), False, path, keyframe)


def _resolves(node: Node, newer: Node) -> bool:
    """Whether ``node``'s existing reference is ``newer`` (so its chain continues there)."""
    assert node.reference is not None
    named = os.path.normpath(node.source.parent / node.reference)
    return named == os.path.normpath(newer.source_container)


def _open_current(where: list[Path]) -> tuple[ReferenceBytes, list[Tensor], Digest, int]:
    """The reference's bytes from the first of ``where`` that exists: its plain source while
    that exists (faster to read), else its container (an in-place run may have just replaced
    it)."""
    for path in where:
        try:
            if path.name.endswith(SUFFIX):
                c = ContainerReference(path)
                idx = c.reader.index
                return c, index_tensors(idx), idx.source_digest, idx.source_size
            p = PlainReference(path)
        except FileNotFoundError:
            continue
        from ckptz.formats import read_layout

        layout = read_layout(path, path.name)
        return p, layout_tensors(layout), p.digest(), layout.size
    raise FileNotFoundError(f"reference {where[0]} vanished during the run")


def _delta(
    layout: FileLayout, src: Path, target: Path, ref: Path, where: list[Path]
) -> FrameTransform | None:
    """The delta of ``src`` (whose container goes to ``target``) against the file whose
    container is ``ref``, read from the first of ``where`` that exists."""
    source, theirs, digest, size = _open_current(where)
    spec = RefSpec(Path(os.path.relpath(ref, target.parent)).as_posix(), size, digest)
    return delta_for(layout, src, spec, source, theirs)


def recode(
    container: Path,
    label: str,
    engine: Engine,
    against: Path | None,
    progress: Progress = _no_progress,
) -> Index:
    """Code ``container`` again, in place: against the container ``against``, or (None)
    self-contained as a keyframe (``detach``). Safe at every instant (module docstring).

    Raises:
        ReferenceMissingError: ``container``'s own reference is missing (nothing is changed).
        CorruptionError: the new container does not hold the same original.
        SourceChangedError: ``container`` changed while it was re-coded (it is kept).
    """
    with open(container, "rb") as c:
        # Renamed over only while it is still the container read here.
        read = FileIdentity.of(container, label, os.fstat(c.fileno()))
        old = read_index(c, label)
        meta = FileMeta.from_json(old.header.get("source"))
        plain = container.with_name(container.name.removesuffix(SUFFIX))
        tmp = temp_path(plain)
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            raise os_error(exc, plain) from None
        try:
            try_lock(fd, exclusive=True)  # a concurrent run's cleanup leaves it alone
            try:
                with open(fd, "wb", closefd=False) as f:
                    restore(c, label, engine, FileSink(f, old.source_size), index=old)  # digest checked
            except OSError as exc:
                # The original is restored beside the container first: it needs that much room.
                raise os_error(exc, plain) from None
            make: Callable[[FileLayout], FrameTransform | None]
            if against is None:
                make = lambda layout: Keyframe()  # noqa: E731
            else:
                make = lambda layout: _delta(layout, tmp, container, against, [against])  # noqa: E731
            with atomic_output(container, meta.container() if meta else None, read) as (out, _tmp):
                written = compress_file(
                    tmp,
                    label.removesuffix(SUFFIX),
                    out,
                    engine,
                    progress=progress,
                    verify=True,
                    source_fields=meta.to_json() if meta else None,
                    transform=make,
                    digest=old.source_digest.kind,  # what the containers coded against it recorded
                )
                if written.index.source_digest != old.source_digest:
                    raise CorruptionError("re-coded container holds another file", path=label)
            return written.index
        finally:
            os.close(fd)
            tmp.unlink(missing_ok=True)


def chain(container: Path) -> list[Path]:
    """The containers restoring ``container`` reads, itself first, following each reference
    (only indexes are read).

    Raises:
        ReferenceMissingError: a reference along the chain is missing or changed.
    """
    from ckptz.series.reference import MAX_CHAIN, open_reference

    out = [container]
    while len(out) <= MAX_CHAIN:
        with open(out[-1], "rb") as f:
            index = read_index(f, str(out[-1]))
        raw = index.header.get("reference")
        if raw is None:
            return out
        spec = RefSpec.from_json(raw, str(out[-1]))
        source = open_reference(out[-1], spec, str(out[-1]))
        source.close()
        nxt = out[-1].parent / spec.path
        if not nxt.exists():
            return out  # a restored plain file ends the chain
        out.append(Path(os.path.normpath(nxt)))
    return out


__all__ = ["KEYFRAME_EVERY", "Node", "SeriesPlan", "chain", "plan_series", "recode"]
