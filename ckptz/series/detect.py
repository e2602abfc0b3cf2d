"""Finding the checkpoints of a run folder, and each file's history across them.

A run folder holds checkpoints named by their step: folders (``checkpoint-500/``,
``global_step1000/``, ``iter_0002000/``) or files (``epoch=3-step=1200.ckpt``,
``step_400.pt``). :func:`detect` finds them among the folder's children and sorts them by
step; :func:`tracks` groups their files by their path within the checkpoint, so that each
file can be paired with the same file of the next newer checkpoint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ckptz.container import SUFFIX
from ckptz.errors import UsageError
from ckptz.formats import CHECKPOINT_SUFFIXES
from ckptz.runs.tree import Entry, Tree

_NAMES = (
    re.compile(
        r"(?:checkpoint|ckpt|step|iter|iteration|global_step|global-step|epoch)[-_=]?(?P<step>\d+)", re.I
    ),
    re.compile(r"epoch=\d+-step=(?P<step>\d+)", re.I),
    re.compile(r"epoch[-_]\d+[-_]step[-_](?P<step>\d+)", re.I),
)


def step_of(name: str) -> int | None:
    """The step a checkpoint folder's or file's name gives (None: not a checkpoint name).

    A file's checkpoint suffix (``.pt``, ``.ckpt``, ...) and ``.ckptz`` are ignored.
    """
    name = name.removesuffix(SUFFIX)
    for suffix in CHECKPOINT_SUFFIXES:
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
            break
    for pattern in _NAMES:
        m = pattern.fullmatch(name)
        if m is not None:
            return int(m["step"])
    return None


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One checkpoint of a run: its step and its name in the run folder (without ``.ckptz``)."""

    step: int
    name: str
    is_dir: bool


@dataclass(frozen=True, slots=True)
class Member:
    """One file of one checkpoint, as found (plain or already a container).

    Attributes:
        step: the checkpoint's step.
        entry: the file found (a checkpoint file or a container).
        plain_rel: the run-relative path of the plain file (without ``.ckptz``).
    """

    step: int
    entry: Entry
    plain_rel: str


def detect(tree: Tree) -> list[Checkpoint]:
    """The checkpoints directly under a run folder, oldest (smallest step) first.

    Raises:
        UsageError: the folder holds no checkpoint named by its step, or two with one step.
    """
    found: dict[str, Checkpoint] = {}
    for e in tree.entries:
        top, _, rest = e.rel.partition("/")
        if e.kind not in ("checkpoint", "container") and not rest:
            continue
        step = step_of(top)
        if step is not None:
            name = top if rest else top.removesuffix(SUFFIX)
            found.setdefault(name, Checkpoint(step, name, bool(rest)))
    steps: dict[int, str] = {}
    for c in found.values():
        if c.step in steps:
            raise UsageError(
                f"two checkpoints of step {c.step}: {steps[c.step]} and {c.name}",
                path=str(tree.root),
                hint="keep one per step in the run folder",
            )
        steps[c.step] = c.name
    if not found:
        raise UsageError(
            "no checkpoints named by their step (checkpoint-N, step_N, iter_N, global_stepN, ...)",
            path=str(tree.root),
            hint="name the run folder that holds them",
        )
    return sorted(found.values(), key=lambda c: c.step)


def tracks(tree: Tree, checkpoints: list[Checkpoint]) -> dict[str, list[Member]]:
    """For each file path within a checkpoint, its members in step order (oldest first).

    A file checkpoint's track is ``.``. When a file is present both plain and as a container
    (an interrupted in-place run), the container counts.
    """
    by_name = {c.name: c for c in checkpoints}
    out: dict[str, dict[int, Member]] = {}
    for e in tree.entries:
        if e.kind not in ("checkpoint", "container"):
            continue
        top, _, rest = e.rel.partition("/")
        ck = by_name.get(top if rest else top.removesuffix(SUFFIX))
        if ck is None or ck.is_dir != bool(rest):
            continue
        within = rest.removesuffix(SUFFIX) if rest else "."
        plain_rel = e.rel.removesuffix(SUFFIX) if e.kind == "container" else e.rel
        members = out.setdefault(within, {})
        if ck.step not in members or e.kind == "container":
            members[ck.step] = Member(ck.step, e, plain_rel)
    return {k: [v[s] for s in sorted(v)] for k, v in sorted(out.items())}


__all__ = ["Checkpoint", "Member", "detect", "step_of", "tracks"]
