"""bench/python_overhead.py: the Python around each file's native call, step by step."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from conftest import bench


def test_python_overhead_splits_each_run_into_native_call_and_python(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    for i in range(3):
        state = {f"layer{j}.weight": torch.randn(4096, generator=gen) for j in range(4)}
        torch.save(state, tmp_path / f"part{i}.pt")
    run = bench("python_overhead.py", str(tmp_path), "--repeat", "1")
    assert run.returncode == 0, run.stderr
    rows = re.findall(
        r"^(compress|decompress): (\d+) files, per file: wall ([\d.]+) ms, native call ([\d.]+) ms",
        run.stdout,
        re.M,
    )
    assert [(op, int(n)) for op, n, _, _ in rows] == [("compress", 3), ("decompress", 3)], run.stdout
    assert all(0 < float(native) <= float(wall) for _, _, wall, native in rows), run.stdout
    steps = dict(
        re.findall(r"^  (\w[\w ]*?)\s+1\.0 calls/file  thread CPU\s+([\d.]+) ms/file", run.stdout, re.M)
    )
    assert {"file job", "read layout", "plan streams", "make index", "decoder plan"} <= set(steps), run.stdout
