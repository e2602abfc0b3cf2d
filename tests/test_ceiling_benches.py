"""bench/pipeline_ceiling.py (the pipeline around a null engine; CPU) and
bench/engine_ceiling.py (the GPU engine alone; GPU)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import bench


def test_pipeline_ceiling_reports_each_configuration(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    # Tensors of several streams, one over a frame, and a file that is not a checkpoint.
    state = {"w": torch.randn(1_500_000, generator=gen), "h": torch.randn(3000, generator=gen).half()}
    torch.save(state, tmp_path / "model.pt")
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    run = bench(
        "pipeline_ceiling.py", str(tmp_path), "--readers", "1", "3", "--ahead", "1", "2", "--repeats", "1"
    )
    assert run.returncode == 0, run.stderr
    rows = re.findall(r"^null engine, readers (\d+) look-ahead x(\d+):\s+([\d.]+) GB/s", run.stdout, re.M)
    assert [(int(r), int(a)) for r, a, _ in rows] == [(1, 1), (1, 2), (3, 1), (3, 2)], run.stdout
    assert all(float(rate) > 0 for _, _, rate in rows)


def test_pipeline_ceiling_refuses_a_folder_without_checkpoints(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    run = bench("pipeline_ceiling.py", str(tmp_path), timeout=120)
    assert run.returncode != 0
    assert "no checkpoint files" in run.stderr


@pytest.mark.gpu
def test_engine_ceiling_reports_each_configuration() -> None:
    run = bench(
        "engine_ceiling.py",
        *(
            "--gb",
            "0.2",
            "--workers",
            "1",
            "2",
            "--leaves",
            "on",
            "off",
            "--repeats",
            "1",
            "--memory-gib",
            "0.25",
        ),
    )
    assert run.returncode == 0, run.stderr
    rows = re.findall(
        r"^ans workers (\d+) memory ([\d.]+) GiB leaves (on|off):\s+([\d.]+) GB/s", run.stdout, re.M
    )
    assert [(int(w), v) for w, _, v, _ in rows] == [(1, "on"), (1, "off"), (2, "on"), (2, "off")], run.stdout
    assert all(float(rate) > 0 for *_, rate in rows)
