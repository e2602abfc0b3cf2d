"""bench/dcp_save.py at tiny scale on the CPU: every row it can run here runs and round-trips."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("torch.distributed.checkpoint")


@pytest.mark.slow
def test_dcp_bench_small_cpu(tmp_path: Path) -> None:
    out = tmp_path / "dcp.json"
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "CKPTZ_DEVICE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    argv = [sys.executable, str(ROOT / "bench" / "dcp_save.py"), "--small", "--repeats", "1"]
    argv += ["--state-device", "cpu", "--dir", str(tmp_path / "ckpt"), "--json", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    rows = {r["writer"]: r for r in doc["rows"]}
    for writer in ("plain", "ckptz-cpu"):
        row = rows[writer]
        assert row["status"] == "ok", row["reason"]
        assert row["roundtrip"] == "ok"
        assert row["save_s"] and row["load_s"] and row["async_stall_s"] and row["bytes"]
    assert rows["ckptz-cpu"]["ratio"] > 1.1
    for writer in ("ckptz-cuda-ans", "ckptz-cuda-auto"):
        assert rows[writer]["status"] in ("ok", "skipped")
    assert rows["zstd"]["status"] in ("ok", "skipped")
    assert "| writer |" in proc.stdout
