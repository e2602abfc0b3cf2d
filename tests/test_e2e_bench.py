"""bench/e2e.py at tiny scale on the CPU: every row runs and every round trip is byte-exact."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("safetensors")


def _run(tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path / "e2e.json"
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "CKPTZ_DEVICE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    argv = [sys.executable, str(ROOT / "bench" / "e2e.py"), "--small", "--devices", "cpu", "--repeats", "1"]
    argv += ["--budget-s", "240", "--tmpfs", str(tmp_path / "shm"), "--disk", str(tmp_path / "disk")]
    proc = subprocess.run([*argv, "--json", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


@pytest.mark.slow
def test_e2e_small_cpu(tmp_path: Path) -> None:
    proc, doc = _run(tmp_path)
    rows = {r["key"]: r for r in doc["rows"]}

    def ok(key: str, roundtrip: bool = False) -> dict[str, Any]:
        row = rows[key]
        assert row["status"] == "ok", (key, row["reason"])
        assert row["runs"] and row["GBps"] > 0, key
        if roundtrip:
            assert row["roundtrip"] == "ok", (key, row["roundtrip"])
        return row

    assert 30e6 <= doc["data"]["mixed_bytes"] + doc["data"]["single_bytes"] <= 60e6
    assert set(doc["data"]["files"]["mixed"]) == {
        "config.json",
        "model.safetensors",
        "optimizer.pt",
        "rng_state.pth",
        "scheduler.pt",
        "trainer_state.json",
    }
    ceilings = {r["root"] for r in doc["rows"] if r["tool"] == "pwrite" and r["status"] == "ok"}
    assert ceilings == {"tmpfs", "disk"}
    assert rows["ckptz/cpu/startup/compress-tiny"]["status"] == "ok"
    assert rows["ckptz/startup/help"]["status"] == "ok"
    for inp in ("mixed", "single"):
        base = f"ckptz/cpu/auto/{{}}/{inp}/{{}}"
        for where in ("inproc/tmpfs", "cli -o/tmpfs", "cli -o/disk", "cli in-place/tmpfs"):
            packed = ok(base.format(where, "compress"))
            assert 1.05 < packed["ratio"] < 2, (where, packed["ratio"])
            assert packed["peak_rss"] > 0
            ok(base.format(where, "decompress"), roundtrip=True)
        for op in ("compress", "decompress"):  # writes discarded: there, or not yet in the api
            row = rows[base.format("discard", op)]
            assert row["status"] == "ok" or "discard" in row["reason"], row["reason"]
            if row["status"] == "ok":  # timed several times in its process: the median reported
                assert len(row["runs"]) == 3, len(row["runs"])
        # The page cache's pread ceiling, measured in the same run, and each ckptz row against it.
        ceiling = ok(f"pread/{os.cpu_count()} threads/tmpfs/{inp}/read")
        assert len(ceiling["runs"]) == 3
        packed = rows[base.format("inproc/tmpfs", "compress")]
        assert packed["of_pread_ceiling"] == pytest.approx(packed["GBps"] / ceiling["GBps"])
        ok(f"cp/cp -r/tmpfs/{inp}/copy")
        ok(f"cp/cp -r && sync/disk/{inp}/copy")
        for where in ("file/tmpfs", "file/disk", "discard"):
            ok(f"python-zstandard/zstd -3/{where}/{inp}/compress")
            ok(f"python-zstandard/zstd -3/{where}/{inp}/decompress", roundtrip=where != "discard")
        if shutil.which("zstd"):
            ok(f"zstd-cli/zstd -T0 -3/file/tmpfs/{inp}/decompress", roundtrip=True)
        if importlib.util.find_spec("zipnn"):
            ok(f"zipnn/zipnn/discard/{inp}/decompress", roundtrip=True)
        else:
            assert rows[f"zipnn/zipnn/discard/{inp}/compress"]["status"] == "skipped"
    assert not [r["key"] for r in doc["rows"] if r["roundtrip"] not in (None, "ok")]
    assert not [r["key"] for r in doc["rows"] if r["status"] in ("pending", "error", "timeout")]
    report = proc.stdout[proc.stdout.index("## ckptz e2e") :].splitlines()
    assert len(report) <= 40 and "| configuration |" in proc.stdout
    assert "pread ceilings" in proc.stdout and "compress ÷ pread" in proc.stdout
    assert not (tmp_path / "shm").exists() and not (tmp_path / "disk").exists()  # cleaned up
