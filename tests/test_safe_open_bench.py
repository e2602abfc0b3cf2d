"""bench/safe_open.py at tiny scale on the CPU: it runs, reads honestly counted bytes, and checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("safetensors")


def test_safe_open_bench_small_cpu(tmp_path: Path) -> None:
    out = tmp_path / "safe_open.json"
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "CKPTZ_DEVICE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    argv = [sys.executable, str(ROOT / "bench" / "safe_open.py"), "--small", "--random", "3"]
    argv += ["--dir", str(tmp_path / "data"), "--json", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    assert [r["role"] for r in rows] == ["smallest", "median", "largest", "random", "random", "random"]
    assert {r["dtype"] for r in rows} <= {"BF16", "F32"} and doc["container_bytes"] < doc["plain_bytes"]
    for r in rows:
        assert r["equal"], r["key"]
        # The kernel's count of the process's reads is the reader's own count: nothing else read.
        assert r["bytes_read"] == r["reader_bytes_read"], r
        # Whole frames with their padding (at most 15 bytes per chunk), nothing more.
        assert r["compressed_bytes"] <= r["bytes_read"] <= r["compressed_bytes"] + 16 * 8 * r["frames"]
        assert 0 < r["share_bytes"] <= r["compressed_bytes"] + 1
    assert doc["sweep"]["tensors"] == doc["tensors"]
    assert doc["sweep"]["bytes_read"] < 1.01 * doc["container_bytes"]
    assert "| tensor |" in proc.stdout and "worst ratio" in proc.stdout
    assert not (tmp_path / "data").exists()
