"""bench/hf_callback.py at tiny scale on the CPU: the three configurations run and the
compressed checkpoints restore to the plain run's bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("transformers")
pytest.importorskip("safetensors")


def test_hf_callback_bench_small_cpu(tmp_path: Path) -> None:
    out = tmp_path / "hf_callback.json"
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "CKPTZ_DEVICE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["HF_HUB_OFFLINE"] = "1"
    argv = [sys.executable, str(ROOT / "bench" / "hf_callback.py"), "--small"]
    argv += ["--dir", str(tmp_path / "run"), "--json", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    runs = doc["runs"]
    assert set(runs) == {"plain", "ckptz", "none"}
    for name, run in runs.items():
        assert run["steps"] == 12 and len(run["step_s"]) == 12, name
        assert 0 < run["median_step_s"] <= run["p95_step_s"] <= run["max_step_s"], name
        assert run["loop_s"] < run["total_s"], name
    # Saves after steps 4 and 8 fall in the loop, the one after step 12 after it.
    assert runs["plain"]["saves"] == runs["ckptz"]["saves"] == 3 and runs["none"]["saves"] == 0
    assert runs["plain"]["saves_in_loop"] == 2 and runs["none"]["mean_save_step_s"] is None
    check = doc["check"]
    assert check["ok"] and check["bitwise_as_plain_run"]
    assert set(check["folders"]) == {"checkpoint-8", "checkpoint-12"}  # save_total_limit=2
    for row in check["folders"].values():
        assert row["compressed"] and row["restored"] and row["same_as_ckptz_read"]
        assert row["bytes"] < row["plain_bytes"]
    assert set(doc["overhead"]) >= {"total_pct", "per_save_s", "loop_pct", "loop_per_save_s"}
    assert "| configuration |" in proc.stdout and "ckptz vs plain" in proc.stdout
    assert not (tmp_path / "run").exists()
