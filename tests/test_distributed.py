"""ckptz under torchrun (ckptz.runs.share, .distributed, .launch): real ranks on the CPU over gloo.

The ranks are real processes: ``python -m torch.distributed.run`` for the torchrun cases, and
for the failure cases ranks started by hand with the variables torchrun sets (as ``srun``
would), so each rank's exit code and stderr can be read. Every run has a timeout: a hang fails.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import CLI_ENV, ckptz, tree_digests

from ckptz.errors import DistributedError, PeerFailedError
from ckptz.runs.distributed import Ranks, Status
from ckptz.runs.jobs import Stop
from ckptz.runs.plan import Job, Plan
from ckptz.runs.share import World, balance, share_plan
from ckptz.runs.tree import Entry

TIMEOUT = 60


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc-per-node N -m ckptz ARGS`` on a free port."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    cmd += [f"--master-port={_port()}", "-m", "ckptz", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=CLI_ENV, timeout=TIMEOUT)


def by_hand(nproc: int, *args: str, env: dict[str, str] | None = None) -> list[subprocess.Popen[str]]:
    """``nproc`` ranks started as srun would start them: rank 0 hosts the store."""
    base = {**CLI_ENV, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_port()), "WORLD_SIZE": str(nproc)}
    base |= {"LOCAL_WORLD_SIZE": str(nproc), "CKPTZ_DISTRIBUTED": "1", **(env or {})}
    return [
        subprocess.Popen(
            [sys.executable, "-m", "ckptz", *args],
            env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(nproc)
    ]


def _entry(name: str, size: int) -> Entry:
    return Entry(Path(name), name, "checkpoint", size, (0, hash(name)), 1)


@pytest.fixture
def tree(small_checkpoint: Path, tmp_path: Path) -> Path:
    """Five checkpoints of quite different sizes, and two other files."""
    root = tmp_path / "runs"
    shutil.copytree(small_checkpoint, root / "a")
    shutil.copytree(small_checkpoint, root / "b", ignore=shutil.ignore_patterns("model.*", "*.json"))
    return root


# The split --------------------------------------------------------------------------------


def test_balance_puts_the_largest_first_on_the_least_loaded_rank() -> None:
    assert balance([10, 70, 20, 30, 40], 2) == [1, 0, 0, 1, 1]  # 70+20 | 40+30+10
    assert balance([5, 5, 5, 5], 4) == [0, 1, 2, 3]
    assert balance([1], 3) == [0] and balance([], 2) == []
    # One file far over the fair share gets a rank of its own; the rest share the others.
    assert balance([100, 1, 1, 1, 1], 2) == [0, 1, 1, 1, 1]
    sizes = [7, 3, 9, 9, 1, 4, 4, 8]
    assert balance(sizes, 3) == balance(list(sizes), 3)  # the same on every rank


def test_share_plan_gives_every_file_to_one_rank_and_the_folders_to_rank_0() -> None:
    jobs = [
        Job("convert", _entry(f"f{i}", s), Path(f"f{i}.ckptz"), f"f{i}") for i, s in enumerate([9, 2, 5, 4])
    ]
    carry = Job("copy", _entry("c", 1), Path("out/c"), "c")
    p = Plan(converts=jobs, carries=[carry], writes=[Path("out")], dirs=[(Path("in"), Path("out"))])
    parts = [share_plan(p, r, 3) for r in range(3)]
    assert sorted(j.label for part in parts for j in part.converts) == ["f0", "f1", "f2", "f3"]
    assert parts[0].carries == [carry] and parts[0].writes == [Path("out")] and parts[0].dirs
    assert not any(part.carries or part.writes or part.dirs or part.temps for part in parts[1:])


def test_world_comes_from_torchrun_variables_only_for_its_own_workers() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    env |= {"MASTER_ADDR": "h", "MASTER_PORT": "1"}
    assert World.from_env({}) is None
    # pytest is not torchrun: variables merely inherited (ckptz called from a training run)
    # leave it a single process, unless CKPTZ_DISTRIBUTED=1 says to trust them.
    assert World.from_env(env) is None
    assert World.from_env({**env, "CKPTZ_DISTRIBUTED": "1"}) == World(1, 2, 1, 2)
    assert World.from_env({**env, "CKPTZ_DISTRIBUTED": "1", "WORLD_SIZE": "1", "RANK": "0"}) is None
    with pytest.raises(DistributedError):
        World.from_env({**env, "CKPTZ_DISTRIBUTED": "1", "RANK": "x"})
    assert World(0, 4, 0, 2).threads(None) == max(1, len(os.sched_getaffinity(0)) // 2)
    assert World(0, 4, 0, 2).threads(3) == 3 and World(1, 2).device("cpu") == "cpu"


# The meeting protocol, on threads --------------------------------------------------------


class _Store:
    """The part of a c10d store the ranks use, in memory."""

    def __init__(self) -> None:
        self.data: dict[str, int] = {}
        self.lock = threading.Lock()

    def set(self, key: str, value: str) -> None:
        with self.lock:
            self.data[key] = 1

    def check(self, keys: list[str]) -> bool:
        with self.lock:
            return all(k in self.data for k in keys)

    def add(self, key: str, n: int) -> int:
        with self.lock:
            self.data[key] = self.data.get(key, 0) + n
            return self.data[key]


def _team(n: int, patience: float = 60.0) -> list[Ranks]:
    store, barrier = _Store(), threading.Barrier(n)
    slots: list[object] = [None] * n

    def gather_for(r: int) -> Callable[[object], list[object]]:
        def gather(obj: object) -> list[object]:
            slots[r] = obj
            barrier.wait(timeout=10)
            out = list(slots)
            barrier.wait(timeout=10)
            return out

        return gather

    return [Ranks(World(r, n), store, gather_for(r), patience=patience) for r in range(n)]


def test_a_failure_reaches_every_rank_at_the_next_meeting() -> None:
    ranks = _team(2)
    seen: dict[int, object] = {}

    def rank0() -> None:
        try:
            ranks[0].ready(Plan())
        except PeerFailedError as exc:
            seen[0] = exc
            ranks[0].finish(Status(exc.message, exc.exit_code, "peer"))

    def rank1() -> None:
        seen[1] = ranks[1].finish(Status("disk on fire", 5))

    threads = [threading.Thread(target=f) for f in (rank0, rank1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    error = seen[0]
    assert isinstance(error, PeerFailedError) and error.rank == 1 and error.exit_code == 5
    assert "disk on fire" in str(error)
    assert ranks[0].store.check(["failed"])  # said at once, for the others' Stop


def test_a_failure_sets_the_others_stop_flag_at_once() -> None:
    ranks = _team(2)
    stop = Stop()
    with ranks[0].beating():
        ranks[0].watch(stop)
        ranks[1].announce_failure()
        deadline = time.monotonic() + 5
        while not stop.is_set and time.monotonic() < deadline:
            time.sleep(0.05)
    assert stop.is_set and ranks[0].failed_elsewhere


def test_a_rank_that_stops_beating_is_given_up_on() -> None:
    ranks = _team(2, patience=1.0)
    start = time.monotonic()
    with pytest.raises(DistributedError, match="stopped answering"):
        ranks[0].ready(Plan())  # rank 1 never comes, and never beats
    assert time.monotonic() - start < 5


# Real ranks ------------------------------------------------------------------------------


def test_torchrun_compress_verify_and_nproc_decompress_byte_exact(tree: Path, tmp_path: Path) -> None:
    out, back = tmp_path / "out", tmp_path / "back"
    done = torchrun(2, "compress", str(tree), "-o", str(out), "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)  # exactly one summary: one JSON document on stdout
    assert "Traceback" not in done.stderr and "ckptz:" not in done.stderr
    files = {f["path"]: f for f in data["files"]}
    assert len(files) == 5 and {f["rank"] for f in files.values()} == {0, 1}
    # The split is balance()'s over the plan's files (sizes, in plan order).
    order = sorted(files)
    assert [files[p]["rank"] for p in order] == balance([files[p]["bytes"] for p in order], 2)
    assert data["bytes"] == sum(f["bytes"] for f in files.values())
    assert sorted(data["copied"]) == ["a/config.json", "a/trainer_state.json"]

    done = torchrun(2, "verify", str(out), "--against", str(tree), "--json")
    assert done.returncode == 0, done.stderr
    checked = json.loads(done.stdout)
    assert checked["ok"] and checked["counts"] == {"ok": 7}

    # --nproc: the same ranks, started by ckptz itself.
    done = ckptz("decompress", str(out), "-o", str(back), "--nproc", "2", timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("decompress:") == 1 and "5 files on cpu (2 ranks" in done.stdout
    assert tree_digests(back) == tree_digests(tree)
    (back / "a" / "config.json").write_text("{}")  # not what this run writes
    done = ckptz("decompress", str(out), "-o", str(back), "--nproc", "2", timeout=TIMEOUT)
    assert done.returncode == 2 and done.stderr.count("already exists") == 1  # once, from rank 0
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_torchrun_in_place_on_three_ranks(tree: Path) -> None:
    before = tree_digests(tree)
    done = torchrun(3, "compress", str(tree), "--in-place", "-q")
    assert done.returncode == 0 and done.stdout == "", done.stderr
    assert len(list(tree.rglob("*.ckptz"))) == 5
    assert not [p for p in tree.rglob("*") if p.is_file() and p.suffix in (".pt", ".pth", ".safetensors")]
    done = ckptz("decompress", str(tree), "--in-place", "-q", "--nproc", "3", timeout=TIMEOUT)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert tree_digests(tree) == before


def test_a_failing_rank_stops_every_rank_with_its_error_and_loses_nothing(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert ckptz("compress", str(tree), "-o", str(out)).returncode == 0
    # Damage the file that the split gives to rank 1.
    containers = sorted(p for p in out.rglob("*.ckptz"))
    owner = balance([p.stat().st_size for p in containers], 2)
    bad = next(p for p, r in zip(containers, owner, strict=True) if r == 1)
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    names = {p.relative_to(out).as_posix().removesuffix(".ckptz") for p in out.rglob("*") if p.is_file()}

    ranks = by_hand(2, "decompress", str(out), "--in-place")
    results = [p.communicate(timeout=TIMEOUT) for p in ranks]
    codes = [p.returncode for p in ranks]
    assert codes[0] == codes[1] == 1, results
    (out0, err0), (out1, err1) = results
    assert out0 == out1 == "" and err1 == ""  # rank 0 alone reports
    assert err0.count("\n") == 1 and err0.startswith("ckptz: error: rank 1 failed: ")
    assert bad.name in err0 and "checksum" in err0 and "Traceback" not in err0
    # Nothing lost: every file is there, restored or still compressed; the damaged one kept.
    left = {p.relative_to(out).as_posix().removesuffix(".ckptz") for p in out.rglob("*") if p.is_file()}
    assert left == names and bad.exists()


def test_a_rank_that_dies_does_not_leave_the_others_waiting(tree: Path, tmp_path: Path) -> None:
    ranks = by_hand(2, "compress", str(tree), "-o", str(tmp_path / "out"), env={"CKPTZ_PEER_TIMEOUT": "1"})
    time.sleep(1.0)
    ranks[1].send_signal(signal.SIGKILL)
    start = time.monotonic()
    _, err = ranks[0].communicate(timeout=TIMEOUT)
    ranks[1].wait()
    # Either it finished before the kill or it noticed: never a hang, never a traceback.
    assert time.monotonic() - start < 30
    assert "Traceback" not in err
    if ranks[0].returncode != 0:
        assert err.startswith("ckptz: error: "), err


def test_streams_refuse_ranks(tree: Path) -> None:
    done = ckptz("compress", str(tree / "a" / "optimizer.pt"), "-c", "--nproc", "2", timeout=TIMEOUT)
    assert done.returncode == 2 and "one process" in done.stderr and "Traceback" not in done.stderr
