"""Who does what when ``torchrun`` starts several ckptz ranks: the world, the split, the team.

Under ``torchrun -m ckptz compress|decompress|verify ...`` every rank scans and plans the same
tree (:mod:`ckptz.runs.plan`), so each computes the same assignment without sending any plan
around: the files to convert are balanced by bytes (:func:`balance`: largest first onto the
least-loaded rank, ties to the lower rank). A file is never split across ranks; one larger
than a rank's fair share makes that rank the last to finish. Rank 0 alone keeps the folder
work: locks, temp files of killed runs, copies, symlinks, hard links, folder metadata.

The library takes a :class:`Team`; :data:`SOLO`, the default, is the one process of a plain
run. The team of several ranks is :class:`ckptz.runs.distributed.Ranks`. Nothing here
imports :mod:`torch.distributed`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from ckptz import settings
from ckptz.errors import DistributedError
from ckptz.runs.jobs import Stop
from ckptz.runs.plan import Job, Plan

T = TypeVar("T")


# Where this process stands ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class World:
    """This process's place among the ranks ``torchrun`` started.

    Attributes:
        rank: this rank (``RANK``).
        size: ranks in all (``WORLD_SIZE``).
        local_rank: this rank on its node (``LOCAL_RANK``): its GPU.
        local_size: ranks on this node (``LOCAL_WORLD_SIZE``): they share its cores.
    """

    rank: int
    size: int
    local_rank: int = 0
    local_size: int = 1

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> World | None:
        """The world ``torchrun`` describes, or None for a single process.

        ``CKPTZ_DISTRIBUTED=0`` ignores ``torchrun``'s variables, ``=1`` trusts them. Otherwise
        they count only if this process is ``torchrun``'s own worker: a process that merely
        inherited them (``ckptz`` called from inside a training run) stays single.
        """
        choice = settings.value("distributed", env)
        if choice is False or not all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
            return None
        try:
            world = cls(
                int(env["RANK"]),
                int(env["WORLD_SIZE"]),
                int(env.get("LOCAL_RANK", "0")),
                int(env.get("LOCAL_WORLD_SIZE", "1")),
            )
        except ValueError:
            raise DistributedError(
                "RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE must be integers",
                hint="start ckptz with torchrun, or unset them",
            ) from None
        if world.size <= 1 or (choice is not True and not _launched_by_torchrun()):
            return None
        if not 0 <= world.rank < world.size or world.local_size < 1:
            raise DistributedError(
                f"RANK {world.rank} is outside WORLD_SIZE {world.size}", hint="start ckptz with torchrun"
            )
        return world

    def device(self, device: str | None) -> str | None:
        """``cuda`` (or ``auto`` where a GPU can code) as this rank's ``LOCAL_RANK`` GPU."""
        from ckptz.engines import gpu_unavailable_reason, requested_device

        want = requested_device(device)
        if want not in ("cuda", "auto") or (want == "auto" and gpu_unavailable_reason() is not None):
            return device
        import torch

        count = torch.cuda.device_count()
        return f"cuda:{self.local_rank % count}" if count else device

    def threads(self, threads: int | None) -> int:
        """``threads``, else this rank's share of the node's cores."""
        if threads is not None:
            return threads
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return max(1, cores // self.local_size)


def _launched_by_torchrun() -> bool:
    """Whether the parent process is a ``torchrun`` agent (True where /proc cannot tell)."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ")
    except OSError:
        return True
    return any(
        name in cmdline for name in (b"torchrun", b"torch.distributed.run", b"torch.distributed.launch")
    )


# Who does what -----------------------------------------------------------------------------


def balance(sizes: Sequence[int], ranks: int) -> list[int]:
    """The rank of each item: largest first onto the least-loaded rank (ties: lower index, rank).

    Deterministic, so every rank computes the same assignment from the same sizes.
    """
    load = [0] * ranks
    owner = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(ranks), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += sizes[i]
    return owner


def plan_digest(p: Plan) -> str:
    """What the ranks must agree on: every file to convert, with its size and target."""
    h = hashlib.sha256()
    for j in p.finishes + p.converts + p.links + p.carries:
        h.update(f"{j.kind}\0{j.label}\0{j.entry.size}\0{j.target}\n".encode())
    return h.hexdigest()


class Team(Protocol):
    """The ranks a library call runs on; :data:`SOLO` is the one process of a plain run."""

    @property
    def leader(self) -> bool: ...

    def mine(self, items: Sequence[T], size: Callable[[T], int]) -> list[T]:
        """This rank's share of ``items``."""
        ...

    def share(self, p: Plan) -> Plan:
        """This rank's part of a plan (rank 0 also keeps the folders and what is carried)."""
        ...

    def watch(self, stop: Stop) -> None:
        """Set ``stop`` as soon as another rank fails."""
        ...

    def ready(self, p: Plan) -> None:
        """Wait until the folders are prepared and every rank planned ``p``."""
        ...

    def converted(self) -> None:
        """Wait until every rank converted its files."""
        ...


class Solo:
    """One process: everything is its own, and there is nobody to wait for."""

    leader = True

    def mine(self, items: Sequence[T], size: Callable[[T], int]) -> list[T]:
        return list(items)

    def share(self, p: Plan) -> Plan:
        return p

    def watch(self, stop: Stop) -> None:
        pass

    def ready(self, p: Plan) -> None:
        pass

    def converted(self) -> None:
        pass


SOLO = Solo()


def share_plan(p: Plan, rank: int, ranks: int) -> Plan:
    """Rank ``rank``'s part of ``p``: its files by :func:`balance`; the rest on rank 0."""

    def mine(jobs: list[Job]) -> list[Job]:
        owner = balance([j.entry.size for j in jobs], ranks)
        return [j for j, r in zip(jobs, owner, strict=True) if r == rank]

    if rank == 0:
        return replace(p, finishes=mine(p.finishes), converts=mine(p.converts))
    return Plan(finishes=mine(p.finishes), converts=mine(p.converts))
