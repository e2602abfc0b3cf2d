"""The ranks of a ``torchrun`` run meeting: a gloo group, a store, and agreeing on the end.

Which rank does which file is :mod:`ckptz.runs.share`'s; this module makes the ranks one run.
They meet at three points, in this order on every rank:

``ready``
    rank 0 has locked and prepared the folders, and every rank planned the same files
    (a digest of the plan is compared: a folder that is not shared shows up here);
``converted``
    every rank finished its files, so rank 0 may link to them and finish the folders;
``final``
    the per-rank results are gathered (gloo ``all_gather_object``) and merged.

A rank that fails says so at once through the c10d store, which stops the others within a
block (their :class:`~ckptz.runs.jobs.Stop` is set), then goes through the remaining meeting
points with its error; every rank then ends with the first failure's exit code, and rank 0
alone reports it. Waiting for the others happens in a Python loop (so Ctrl-C and SIGTERM
still work) that watches each rank's heartbeat: a rank that died is noticed within
``$CKPTZ_PEER_TIMEOUT`` seconds (default 60) even where no ``torchrun`` ends the others. A
gloo collective starts only once every rank reached it, so its timeout bounds the exchange,
never the time a rank spends on its files.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

from ckptz import _signals, settings
from ckptz.accounting import total_components
from ckptz.container import SUFFIX
from ckptz.errors import CkptzError, DistributedError, PeerFailedError, StoppedError
from ckptz.runs.compare import VerifyResult
from ckptz.runs.jobs import Stop
from ckptz.runs.plan import Plan
from ckptz.runs.results import Summary
from ckptz.runs.share import World, balance, plan_digest, share_plan

T = TypeVar("T")
R = TypeVar("R")

#: Where every rank meets, in order (see the module docstring).
POINTS = ("ready", "converted", "final")
_POLL = 0.02
_BEAT = 0.5


# Meeting -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Status:
    """What a rank brings to a meeting point.

    Attributes:
        failure: its error message, if it failed or stopped.
        code: the exit code that goes with it.
        cause: ``error`` (its own), ``stop`` (a signal) or ``peer`` (another rank failed).
        digest: at ``ready``, the plan it computed.
        payload: at ``final``, its result.
        finished: after a stop, the files it finished.
        remaining: after a stop, the files it left.
    """

    failure: str | None = None
    code: int = 0
    cause: str = "error"
    digest: str | None = None
    payload: Any = None
    finished: tuple[str, ...] = ()
    remaining: int = 0


@dataclass
class Ranks:
    """The team of ranks ``torchrun`` started, meeting through a c10d store and gloo.

    Args:
        world: this rank's place.
        store: a c10d store (``set``, ``check``, ``add``) private to this run.
        gather: ``all_gather_object`` for one object per rank.
    """

    world: World
    store: Any
    gather: Callable[[Any], list[Any]]
    patience: float = 60.0
    _next: int = 0
    _stops: list[Stop] = field(default_factory=list)
    _failed_elsewhere: bool = False
    _quit: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _order: dict[str, int] = field(default_factory=dict)

    @property
    def leader(self) -> bool:
        return self.world.leader

    # Team ---------------------------------------------------------------------------------

    def mine(self, items: Sequence[T], size: Callable[[T], int]) -> list[T]:
        owner = balance([size(x) for x in items], self.world.size)
        return [x for x, r in zip(items, owner, strict=True) if r == self.world.rank]

    def share(self, p: Plan) -> Plan:
        for i, j in enumerate(p.finishes + p.converts):
            self._order.setdefault(j.label, i)
            self._order.setdefault(j.label.removesuffix(SUFFIX), i)
        return share_plan(p, self.world.rank, self.world.size)

    def watch(self, stop: Stop) -> None:
        with self._lock:
            self._stops.append(stop)
            if self._failed_elsewhere:
                stop.set()

    def ready(self, p: Plan) -> None:
        statuses = self.meet("ready", Status(digest=plan_digest(p)))
        if len({s.digest for s in statuses}) > 1:
            raise DistributedError(
                "the ranks see different files",
                hint="put the sources and outputs on a file system that every node shares",
            )

    def converted(self) -> None:
        self.meet("converted", Status())

    # Meeting points ------------------------------------------------------------------------

    def meet(self, point: str, status: Status) -> list[Status]:
        """Wait for every rank at ``point`` and exchange statuses; raise on another's failure."""
        statuses = self._exchange(point, status)
        if status.failure is None:
            failed = _first_failure(statuses)
            if failed is not None:
                r, s = failed
                raise PeerFailedError(r, s.failure or "", s.code)
        return statuses

    def finish(self, status: Status) -> list[Status]:
        """Go through the meeting points left (with ``status``) and return everyone's final one."""
        if status.failure is not None:
            self.announce_failure()
        quiet = replace(status, payload=None)
        while POINTS[self._next] != "final":
            self._exchange(POINTS[self._next], quiet)
        return self._exchange("final", status)

    def announce_failure(self) -> None:
        """Tell the other ranks at once that this one failed (they stop within a block)."""
        with suppress(Exception):  # the store is gone: the meeting points will say so
            self.store.set("failed", str(self.world.rank))

    def _exchange(self, point: str, status: Status) -> list[Status]:
        expected = POINTS[self._next]
        if point != expected:
            raise RuntimeError(f"ckptz ranks out of step: at {point!r}, expected {expected!r}")
        self._next += 1
        try:
            self.store.set(f"at/{point}/{self.world.rank}", "1")
            self._wait_for_all(point)
            statuses = self.gather(status)
        except (CkptzError, KeyboardInterrupt):
            raise
        except Exception as exc:
            raise self._lost_error(str(exc)) from None
        return [s if isinstance(s, Status) else Status("no answer", 1) for s in statuses]

    def _wait_for_all(self, point: str) -> None:
        """Wait in Python (signals stay live) until every rank reached ``point``.

        The polls back off to a quarter second and heartbeats are read once a second, so a
        long wait of many ranks costs the store a few requests per rank per second.
        """
        keys = [f"at/{point}/{r}" for r in range(self.world.size)]
        beats: dict[int, tuple[int, float]] = {}
        delay, looked = _POLL, 0.0
        while not self.store.check(keys):
            now = time.monotonic()
            if now - looked >= 1.0:
                looked = now
                self._look_for_the_dead(keys, beats, now)
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    def _look_for_the_dead(self, keys: list[str], beats: dict[int, tuple[int, float]], now: float) -> None:
        for r in range(self.world.size):
            if r == self.world.rank or self.store.check([keys[r]]):
                continue
            beat = int(self.store.add(f"beat/{r}", 0))
            last = beats.get(r)
            if last is None or last[0] != beat:
                beats[r] = (beat, now)
            elif now - last[1] > self.patience:
                raise self._lost_error(f"rank {r} stopped answering for {self.patience:.0f} s")

    def _lost_error(self, why: str) -> DistributedError:
        return DistributedError(
            f"lost contact with the other ranks ({why})",
            hint="see the other ranks' errors; run the same command again to finish",
        )

    # Heartbeat and failure watch -----------------------------------------------------------

    @contextmanager
    def beating(self) -> Iterator[None]:
        """Beat (so waiting ranks know this one lives) and watch for failures, on a thread."""
        thread = threading.Thread(target=self._beat, name="ckptz-rank-watch", daemon=True)
        thread.start()
        try:
            yield
        finally:
            self._quit.set()
            thread.join()

    def _beat(self) -> None:
        while not self._quit.wait(_BEAT):
            try:
                self.store.add(f"beat/{self.world.rank}", 1)
                failed = self.store.check(["failed"])
            except Exception:
                failed = True  # the store is gone: so is whoever hosted it
            if failed:
                with self._lock:
                    self._failed_elsewhere = True
                    for stop in self._stops:
                        stop.set()

    @property
    def failed_elsewhere(self) -> bool:
        return self._failed_elsewhere

    def order(self, path: str) -> int:
        return self._order.get(path, len(self._order))


def _first_failure(statuses: list[Status]) -> tuple[int, Status] | None:
    """The failure to report: the lowest rank's error, else its stop, else whoever stopped."""
    failed = [(r, s) for r, s in enumerate(statuses) if s.failure is not None]
    for cause in ("error", "stop"):
        first = next(((r, s) for r, s in failed if s.cause == cause), None)
        if first is not None:
            return first
    return failed[0] if failed else None


# Running a library call on every rank -----------------------------------------------------


def join(world: World) -> tuple[Ranks, Callable[[], None]]:
    """Join the gloo process group ``torchrun`` describes; return the team and how to leave.

    Every rank must join within three times ``$CKPTZ_PEER_TIMEOUT`` (default: 3 minutes).
    """
    from datetime import timedelta

    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        raise DistributedError(
            "this PyTorch has no gloo backend", hint="install a PyTorch with distributed support"
        )
    patience = _patience()
    wait = timedelta(seconds=3 * patience)
    try:
        store, _, _ = next(dist.rendezvous("env://", world.rank, world.size, timeout=wait))
        dist.init_process_group("gloo", store=store, rank=world.rank, world_size=world.size, timeout=wait)
        ids: list[Any] = [uuid.uuid4().hex if world.leader else None]
        dist.broadcast_object_list(ids, src=0)
    except Exception as exc:
        raise DistributedError(
            f"cannot join the other ranks: {exc}".splitlines()[0],
            hint="check MASTER_ADDR/MASTER_PORT and that every rank runs the same command",
        ) from None
    # Keys of this run only: a store may outlive one run (torchrun's agent, across restarts).
    mine = dist.PrefixStore(f"ckptz/{ids[0]}/", store)

    def gather(obj: Any) -> list[Any]:
        out: list[Any] = [None] * world.size
        dist.all_gather_object(out, obj)
        return out

    def leave() -> None:
        with suppress(Exception):  # a peer is gone: nothing left to tidy
            dist.destroy_process_group()

    return Ranks(world, mine, gather, patience=patience), leave


def _patience() -> float:
    try:
        return max(1.0, float(cast(float, settings.value("peer_timeout"))))
    except ValueError:
        raise DistributedError(
            "CKPTZ_PEER_TIMEOUT must be a number of seconds", hint="unset it or give e.g. 60"
        ) from None


#: Set by ``python -m ckptz`` (inherited by the ranks ``--nproc`` starts): when the command
#: started (``time.time()``), so the time reported is the whole run's, ranks' start-up included.
STARTED_AT = "_CKPTZ_STARTED_AT"


def _wall_seconds(start: float) -> float:
    """Seconds since the command started: the launcher's start where it set
    :data:`STARTED_AT`, else this rank's ``start`` (a ``perf_counter`` reading)."""
    try:
        return max(time.time() - float(os.environ[STARTED_AT]), 0.0)
    except (KeyError, ValueError):
        return time.perf_counter() - start


def across(world: World, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    """``fn(*args, **kwargs)`` as this rank's part of a run on every rank; the merged result.

    ``fn`` is :func:`ckptz.api.compress`, ``decompress`` or ``verify``; it gets ``team=``,
    and ``device=``/``threads=`` for this rank. Every rank returns the same merged result.

    Raises:
        CkptzError: this rank's own error, or :class:`PeerFailedError` naming the first rank
            that failed; the same exit code on every rank.
    """
    kwargs["device"] = world.device(kwargs.get("device"))
    kwargs["threads"] = world.threads(kwargs.get("threads"))
    team, leave = join(world)
    start = time.perf_counter()
    bug: BaseException | None = None
    own: BaseException | None = None
    try:
        with team.beating():
            try:
                status = Status(payload=fn(*args, team=team, **kwargs))
            except PeerFailedError as exc:
                own, status = exc, Status(exc.message, exc.exit_code, "peer")
            except StoppedError as exc:
                own, status = exc, _stopped(exc, team.failed_elsewhere)
            except KeyboardInterrupt:
                own, status = StoppedError(), _stopped(StoppedError(), team.failed_elsewhere)
            except (CkptzError, OSError) as exc:
                own, status = exc, Status(_text(exc), getattr(exc, "exit_code", 1))
            except BaseException as exc:
                bug, status = exc, Status(f"internal error: {exc!r}", 1)
            statuses = team.finish(status)
    finally:
        leave()
    if bug is not None:
        raise bug
    failed = _first_failure(statuses)
    if failed is None:
        return merge([s.payload for s in statuses], _wall_seconds(start), team)
    r, s = failed
    quiet = not world.leader
    if s.cause == "stop":
        if quiet:
            raise PeerFailedError(r, s.failure or "", s.code, quiet=True)
        raise StoppedError(tuple(f for x in statuses for f in x.finished), sum(x.remaining for x in statuses))
    if r == world.rank == 0 and own is not None and not isinstance(own, PeerFailedError):
        raise own
    raise PeerFailedError(r, s.failure or "", s.code, quiet=quiet)


def _stopped(exc: StoppedError, by_peer: bool) -> Status:
    return Status(
        "stopped",
        _signals.exit_code(),
        "peer" if by_peer and not _signals.received else "stop",
        finished=exc.finished,
        remaining=exc.remaining,
    )


def _text(exc: BaseException) -> str:
    if isinstance(exc, CkptzError):
        return str(exc)
    if isinstance(exc, OSError):
        return f"{exc.filename}: {exc.strerror or exc}" if exc.filename else str(exc.strerror or exc)
    return str(exc)


# Merging the ranks' results ----------------------------------------------------------------


def merge(parts: list[Any], seconds: float, team: Ranks) -> Any:
    """One result from every rank's (:class:`Summary` or :class:`VerifyResult`)."""
    first = parts[0]
    if isinstance(first, VerifyResult):
        return VerifyResult(
            first.root,
            tuple(sorted((f for p in parts for f in p.files), key=lambda f: f.path)),
            first.against,
            _devices(p.device for p in parts),
            seconds,
            tuple(dict.fromkeys(n for p in parts for n in p.notices)),
        )
    assert isinstance(first, Summary)
    placed = sorted(
        ((team.order(f.path), f.path, r, f) for r, p in enumerate(parts) for f in p.files),
        key=lambda x: (x[0], x[1]),
    )
    files = tuple(f for *_, f in placed)
    threads = [p.threads for p in parts if p.threads is not None]
    return replace(
        first,
        files=files,
        components=total_components(list(files)),
        device=_devices(p.device for p in parts),
        threads=sum(threads) if threads else None,
        seconds=seconds,
        notices=tuple(dict.fromkeys(n for p in parts for n in p.notices)),
        ranks=tuple(r for _, _, r, _ in placed),
    )


def _devices(devices: Iterator[str | None] | Any) -> str | None:
    seen = [d for d in dict.fromkeys(devices) if d is not None]
    return ", ".join(seen) if seen else None
