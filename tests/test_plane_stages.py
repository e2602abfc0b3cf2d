"""The native planes' step clocks: each thread's time by step, in the process's totals and
in a CKPTZ_TRACE trace."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ckptz

from ckptz import api
from ckptz.container import read_index
from ckptz.pipeline import plane_stages


def _checkpoint(path: Path) -> Path:
    """An optimizer-like state: fp32 moments in several frames, and a bf16 tensor."""
    g = torch.Generator().manual_seed(5)
    grad = torch.randn(3_000_000, generator=g) * 1e-3
    state = {"exp_avg": grad * 0.1, "exp_avg_sq": grad * grad, "w": grad.to(torch.bfloat16)}
    torch.save(state, path)
    return path


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[plane_stages.CallStages]:
    """Every native call's clocks, as the planes report them."""
    seen: list[plane_stages.CallStages] = []
    real = plane_stages.record

    def record(call: plane_stages.CallStages, *args: object, **kwargs: object) -> None:
        seen.append(call)
        real(call, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(plane_stages, "record", record)
    return seen


def _sane(call: plane_stages.CallStages, threads: int) -> dict[str, int]:
    """Checks what any call's clocks must satisfy; the counts of its steps, summed."""
    assert 1 <= len(call.threads) <= threads
    counts: dict[str, int] = {}
    for t in call.threads:
        assert t.role == plane_stages.CPU
        assert all(ns >= 0 for ns in t.ns.values()) and all(c > 0 for c in t.counts.values())
        # Each mark charges the time since the one before: the steps tile the thread's life,
        # which lies inside the native call.
        assert sum(t.ns.values()) == t.life_ns
        assert 0 <= t.life_ns <= call.wall_ns
        assert 0 <= t.cpu_ns <= t.life_ns + 1_000_000
        for name, c in t.counts.items():
            counts[name] = counts.get(name, 0) + c
    assert sum(t.life_ns for t in call.threads) <= call.wall_ns * len(call.threads)
    return counts


def test_a_cpu_compression_and_restore_report_each_step(
    tmp_path: Path, calls: list[plane_stages.CallStages]
) -> None:
    src = _checkpoint(tmp_path / "optimizer.pt")
    dst = tmp_path / "optimizer.pt.ckptz"
    before = {plane: plane_stages.totals(plane) for plane in ("compress", "restore")}
    api.compress(src, dst, device="cpu", threads=2)
    api.decompress(dst, tmp_path / "back.pt", device="cpu", threads=2)
    assert (tmp_path / "back.pt").read_bytes() == src.read_bytes()
    with open(dst, "rb") as f:
        index = read_index(f, "optimizer.pt")
    compressed, restored = calls
    assert (compressed.plane, restored.plane) == ("compress", "restore")

    counts = _sane(compressed, 2)
    spent = compressed.summed()
    # Every frame is read, hashed, split and coded once, by one thread.
    for step in ("read", "hash", "split", "code", "checksum", "write"):
        assert counts[step] == len(index.frames), step
    assert spent["code"] > 0 and spent["read"] > 0
    assert not {"gpu", "delta", "verify"} & spent.keys()

    counts = _sane(restored, 2)
    spent = restored.summed()
    # Every payload is read and checked once; every frame decoded, merged and hashed once.
    assert counts["read"] == counts["check"] == len(index.chunks)
    for step in ("decode", "merge", "hash"):
        assert counts[step] == len(index.frames), step
    assert spent["decode"] > 0 and counts["write"] >= len(index.frames)

    # The process's totals gained both calls.
    for plane, call in (("compress", compressed), ("restore", restored)):
        gained = plane_stages.totals(plane).since(before[plane])
        assert gained.calls == 1 and gained.wall_ns == call.wall_ns
        assert gained.capacity_ns == {plane_stages.CPU: call.wall_ns * len(call.threads)}
        assert {k[1]: v for k, v in gained.ns.items()} == call.summed()


def test_a_trace_shows_each_native_threads_steps(tmp_path: Path) -> None:
    src = _checkpoint(tmp_path / "optimizer.pt")
    traces = {}
    for op, args in [
        ("compress", [str(src), "-o", str(tmp_path / "o.ckptz")]),
        ("decompress", [str(tmp_path / "o.ckptz"), "-o", str(tmp_path / "back.pt")]),
    ]:
        traces[op] = tmp_path / f"{op}.json"
        proc = ckptz(
            op, *args, "-q", "--device", "cpu", "--threads", "2", env={"CKPTZ_TRACE": str(traces[op])}
        )
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "back.pt").read_bytes() == src.read_bytes()
    for op, name, busiest in [
        ("compress", "ckptz-native-compress", "code"),
        ("decompress", "ckptz-native-restore", "decode"),
    ]:
        doc = json.loads(traces[op].read_text())
        events = doc["traceEvents"]
        rows = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
        (call,) = [e for e in events if e["ph"] == "X" and e["name"] == name]
        # The call's span carries its steps' totals, summed over its threads.
        assert call["args"]["threads"] in (1, 2)
        steps = call["args"]["stage_s"]
        assert steps[busiest] > 0 and min(steps.values()) >= 0
        assert sum(steps.values()) <= call["dur"] / 1e6 * call["args"]["threads"] * 1.01
        # Each native thread has a row of its own with its steps laid end to end, inside the call.
        threads = {tid for tid, row in rows.items() if row.startswith(f"{name} thread-")}
        assert len(threads) == call["args"]["threads"]
        laid = [e for e in events if e["ph"] == "X" and e["tid"] in threads]
        assert {e["name"] for e in laid} == set(steps)
        for tid in threads:
            mine = sorted((e for e in laid if e["tid"] == tid), key=lambda e: e["ts"])
            assert mine[0]["ts"] >= call["ts"] - 1
            assert mine[-1]["ts"] + mine[-1]["dur"] <= call["ts"] + call["dur"] + 1
        by_step: dict[str, float] = {}
        for e in laid:
            by_step[e["name"]] = by_step.get(e["name"], 0.0) + e["dur"] / 1e6
        assert by_step == pytest.approx(steps, abs=1e-5)
        assert np.isfinite(list(by_step.values())).all()


def test_a_small_files_call_takes_no_more_threads_than_it_has_frames(
    tmp_path: Path, calls: list[plane_stages.CallStages]
) -> None:
    # Threads a call cannot give a frame to sit idle, and would keep the other files in
    # flight from their calls (files are coded a few at a time, from one thread budget).
    src = tmp_path / "small.pt"
    torch.save({"w": torch.randn(600_000, generator=torch.Generator().manual_seed(3))}, src)
    dst = tmp_path / "small.pt.ckptz"
    api.compress(src, dst, device="cpu", threads=8)
    api.decompress(dst, tmp_path / "back.pt", device="cpu", threads=8)
    assert (tmp_path / "back.pt").read_bytes() == src.read_bytes()
    with open(dst, "rb") as f:
        frames = len(read_index(f, "small.pt").frames)
    assert 1 < frames < 8
    assert [len(call.threads) for call in calls] == [frames, frames]
    compressed, restored = calls
    assert sum(t.counts.get("code", 0) for t in compressed.threads) == frames
    assert sum(t.counts.get("decode", 0) for t in restored.threads) == frames
