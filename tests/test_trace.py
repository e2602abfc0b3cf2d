"""CKPTZ_TRACE: a run's stages recorded per thread, as a Chrome trace that bench/timeline.py sums."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
from conftest import REPO, ckptz


def _timeline():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("timeline", REPO / "bench" / "timeline.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_traced_round_trip_records_every_stage(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    # The header is another stream than the tensor: leaves straddle the two, for the joins.
    src = tmp_path / "w.safetensors"
    save_file({"w": np.random.default_rng(0).standard_normal(3 << 20).astype(np.float32)}, str(src))
    traces = {}
    for op, args in [
        ("compress", [str(src), "-o", str(tmp_path / "w.ckptz")]),
        ("decompress", [str(tmp_path / "w.ckptz"), "-o", str(tmp_path / "back.bin")]),
    ]:
        traces[op] = tmp_path / f"{op}.json"
        proc = ckptz(op, *args, "-q", env={"CKPTZ_TRACE": str(traces[op])})
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()
    timeline = _timeline()
    # A CPU compression or restore is one native call per file (its threads' steps: test_plane_stages.py).
    for op, stages in [
        ("compress", {"layout", "plan", "native compress", "index"}),
        ("decompress", {"plan", "native restore"}),
    ]:
        doc = json.loads(traces[op].read_text())
        spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
        assert stages <= {e["name"] for e in spans}, op
        assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
        summary = timeline.summarize(doc)
        if op == "decompress":
            continue
        (caller,) = [g for g in summary["groups"].values() if "native compress" in g["stages"]]
        assert caller["stages"]["native compress"]["count"] == 1
        shares = [r["share"] for r in caller["stages"].values()]
        assert abs(sum(shares) - 1) < 0.01 and min(shares) >= 0


def test_no_trace_unless_asked(tmp_path: Path) -> None:
    src = tmp_path / "w.bin"
    src.write_bytes(bytes(1 << 20))
    proc = ckptz("compress", str(src), "-o", str(tmp_path / "w.ckptz"), "-q", env={"CKPTZ_TRACE": ""})
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.bin", "w.ckptz"]
