"""bench/movement.py: the host's data-movement ceiling under a GPU compression (GPU only)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from conftest import bench

pytestmark = pytest.mark.gpu


def test_each_variant_and_thread_count_reports_a_rate(tmp_path: Path) -> None:
    src = tmp_path / "input.bin"
    src.write_bytes(os.urandom(12 << 20) + b"tail")  # a last piece shorter than the rest
    run = bench("movement.py", str(src), "--threads", "1", "3", "--mib", "4")
    assert run.returncode == 0, run.stderr
    out = run.stdout
    rows = re.findall(r"^(\S+)\s+(\d+) threads:\s+([\d.]+) GB/s", out, re.M)
    assert [(v, int(t)) for v, t, _ in rows] == [
        (v, t) for t in (1, 3) for v in ("read", "read+h2d", "read+h2d+d2h")
    ], out
    assert all(float(rate) > 0 for _, _, rate in rows)
