"""ckptz bench: recommendation and projection arithmetic, sampling, bounds, and the CLI's --json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import CLI_ENV, ckptz
from typer.testing import CliRunner

from ckptz import api
from ckptz.bench.benchmark import bench
from ckptz.bench.savings import CodecTotals, CostModel, StorageSpeed, plan_codec, recommend
from ckptz.bench.storage import measure_storage
from ckptz.cli import app
from ckptz.errors import UsageError
from ckptz.pipeline.sampling import Frame, entropy_bound, sample_components

GB = 10**9


def _totals(
    name: str,
    ratio: float,
    compress_gbps: float,
    decompress_gbps: float,
    portable: bool = True,
    ckptz: bool = True,
) -> CodecTotals:
    size = 100 * GB
    return CodecTotals(
        name,
        "cuda:0",
        ckptz,
        portable,
        size,
        size / ratio,
        size / (compress_gbps * GB),
        size / (decompress_gbps * GB),
    )


def _storage(gbps: float) -> StorageSpeed:
    return StorageSpeed(gbps, gbps, "given")


# The blog's two GPU codecs: Zstd (portable, ~16 GB/s) and ANS (GPU only, ~180 GB/s).
ZSTD = _totals("zstd", 1.25, 16, 40)
ANS = _totals("ans", 1.30, 180, 250, portable=False)
CPU = _totals("cpu", 1.30, 0.2, 0.5)


def test_write_time_is_pipelined_max() -> None:
    plan = plan_codec(ZSTD, _storage(5), CostModel())
    assert plan.write_seconds == pytest.approx(max(100 / 16, 80 / 5))  # storage-bound: 16 s
    assert plan.restore_seconds == pytest.approx(max(100 / 40, 80 / 5))
    assert plan.stall_saved_seconds == pytest.approx(20 - 16)
    fast = plan_codec(ZSTD, _storage(50), CostModel())
    assert fast.write_seconds == pytest.approx(100 / 16)  # codec-bound
    assert fast.stall_saved_seconds == pytest.approx(2 - 100 / 16)  # a loss


def test_recommends_the_shortest_stall() -> None:
    storage = _storage(5)
    plans = [plan_codec(t, storage, CostModel()) for t in (ZSTD, ANS, CPU)]
    rec = recommend(plans, 100 * GB, storage)
    assert rec.pays and rec.codec == "ans"  # 15.4 s against zstd's 16 s: more than a tie apart
    assert rec.baseline_write_seconds == pytest.approx(20)


def test_fast_storage_wants_the_fast_codec() -> None:
    storage = _storage(50)
    rec = recommend([plan_codec(t, storage, CostModel()) for t in (ZSTD, ANS)], 100 * GB, storage)
    assert rec.codec == "ans" and rec.pays


def test_says_when_compression_does_not_pay() -> None:
    storage = _storage(50)
    rec = recommend([plan_codec(CPU, storage, CostModel())], 100 * GB, storage)
    assert not rec.pays and rec.codec is None
    assert "does not pay" in rec.reason and "23% of the storage" in rec.reason


def test_tie_goes_to_the_portable_codec() -> None:
    storage = _storage(5)
    portable = _totals("portable", 1.30, 16, 40)
    gpu_only = _totals("gpu-only", 1.305, 180, 250, portable=False)
    plans = [plan_codec(t, storage, CostModel()) for t in (gpu_only, portable)]
    assert recommend(plans, 100 * GB, storage).codec == "portable"


def test_reference_rows_are_never_recommended() -> None:
    storage = _storage(5)
    plans = [plan_codec(t, storage, CostModel()) for t in (_totals("ref", 2.0, 100, 100, ckptz=False), ZSTD)]
    assert recommend(plans, 100 * GB, storage).codec == "zstd"


def test_projection_arithmetic() -> None:
    cost = CostModel(gpus=8, gpu_hour_usd=2.0, every_min=30, storage_usd_tb_month=20.0, keep=5)
    plan = plan_codec(ZSTD, _storage(5), cost)  # 4 s saved per checkpoint
    assert cost.checkpoints_per_month == 1440
    assert plan.idle_gpu_hours_month == pytest.approx(1440 * 4 * 8 / 3600)
    assert plan.idle_usd_month == pytest.approx(1440 * 4 * 8 / 3600 * 2.0)
    assert plan.storage_tb_saved == pytest.approx(5 * 20 * GB / 1e12)
    assert plan.storage_usd_month == pytest.approx(0.1 * 20.0)


def test_entropy_bound_extremes() -> None:
    from ckptz.container import StreamInfo

    stream = StreamInfo(0, "weights", "uint8", 1, False, 1 << 20, 1 << 20, 1)
    zeros = Frame(stream, np.zeros(1 << 20, np.uint8))
    assert entropy_bound((zeros,)).global_ratio == float("inf")
    noise = Frame(stream, np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8))
    bound = entropy_bound((noise,))
    assert bound.global_ratio == pytest.approx(1.0, abs=0.01)
    assert bound.chunk_ratio == pytest.approx(1.0, abs=0.01)
    # Two halves of different constant bytes: globally 1 bit a byte, locally nothing.
    halves = Frame(stream, np.repeat(np.array([0, 255], np.uint8), 1 << 19))
    b = entropy_bound((halves,))
    assert b.global_ratio == pytest.approx(8.0) and b.chunk_ratio == float("inf")


def test_large_components_are_sampled_evenly(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    path = tmp_path / "model.safetensors"
    save_file({"w": np.arange(2 << 20, dtype=np.float32)}, str(path))  # 8 MiB: 8 frames
    (weights,) = (s for s in sample_components([(path, path.name)], 2 << 20) if s.name == "weights")
    assert weights.bytes == 8 << 20 and weights.total_frames == 8 and not weights.whole
    assert weights.sample_bytes == 2 << 20
    firsts = [int(f.data[:4].view(np.float32)[0]) for f in weights.frames]
    assert firsts == [2 * (1 << 18), 6 * (1 << 18)]  # frames 2 and 6 of 0..7: evenly spaced


def test_bench_ratio_agrees_with_compress(small_checkpoint: Path, tmp_path: Path) -> None:
    result = bench(small_checkpoint, device="cpu", codecs=["ckptz-auto"], storage_gbps=1.0)
    packed = api.compress(small_checkpoint, tmp_path / "out.ckptz", device="cpu")
    achieved = {c.name: c.ratio for c in packed.components}
    rows = [r for r in result.rows if r.component != "metadata"]  # metadata also carries container overhead
    assert rows and all(s.sampled_frames == s.frames for s in result.samples)
    for r in rows:
        assert r.ratio == pytest.approx(achieved[r.component], rel=0.01), r.component


def test_bench_refuses_bad_arguments(small_checkpoint: Path) -> None:
    with pytest.raises(UsageError):
        bench(small_checkpoint, storage_gbps=1.0, storage_dir=small_checkpoint)
    with pytest.raises(UsageError):
        bench(small_checkpoint, storage_gbps=1.0, codecs=["lz4"])


def test_bench_of_an_empty_file_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """A zero-byte checkpoint (a save that died at once) has nothing to measure: say so."""
    empty = tmp_path / "model.pt"
    empty.write_bytes(b"")
    done = ckptz("bench", str(empty), "--storage-gbps", "1")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("ckptz: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "empty" in done.stderr


def test_bench_refuses_figures_that_are_not_numbers(small_checkpoint: Path) -> None:
    """nan or inf for a bandwidth or a price made a report of "nan s" and "inf $": refuse
    them as any other bad value, in one line."""
    target = str(small_checkpoint / "rng_state.pth")
    for args in (
        ["--storage-gbps", "nan"],
        ["--storage-gbps", "inf"],
        ["--storage-gbps", "1", "--storage-usd-tb-month", "inf"],
        ["--storage-gbps", "1", "--every-min", "inf"],
    ):
        done = ckptz("bench", target, *args)
        assert done.returncode == 2, (args, done.stdout)
        assert done.stderr.startswith("ckptz: error: ") and done.stderr.count("\n") == 1, done.stderr
        assert "nan" not in done.stdout and done.stdout == "", done.stdout


def test_measure_storage_cleans_up(tmp_path: Path) -> None:
    speed = measure_storage(tmp_path, size=8 << 20)
    assert speed.write_gbps > 0 and speed.read_gbps > 0 and speed.path == str(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_cli_json_shape(small_checkpoint: Path) -> None:
    args = [
        "bench",
        str(small_checkpoint),
        "--device",
        "cpu",
        "--storage-gbps",
        "2",
        "--sample",
        "64KiB",
        "--json",
    ]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert {"rows", "storage", "recommendation", "projection", "samples", "plans", "skipped"} <= data.keys()
    row_keys = {
        "component",
        "codec",
        "device",
        "ratio",
        "compress_gbps",
        "decompress_gbps",
        "portable",
        "bound_ratio",
    }
    assert data["rows"] and all(row_keys <= r.keys() for r in data["rows"])
    assert {r["codec"] for r in data["rows"]} == {"ckptz-auto", "ckptz-zstd", "zstd-raw"}
    assert data["storage"]["write_gbps"] == 2.0 and data["storage"]["read_gbps"] == 2.0
    assert {"codec", "pays", "reason"} <= data["recommendation"].keys()
    assert data["projection"]["gpus"] == 8 and len(data["projection"]["codecs"]) == 3


def test_cli_table(small_checkpoint: Path) -> None:
    args = [
        "bench",
        str(small_checkpoint),
        "--device",
        "cpu",
        "--storage-gbps",
        "2",
        "--codecs",
        "ckptz-auto",
    ]
    out = CliRunner().invoke(app, args, env={"COLUMNS": "160"})
    assert out.exit_code == 0, out.output
    assert "optimizer.exp_avg_sq" in out.stdout and "recommended" in out.stdout and "whole" in out.stdout


def test_cli_measures_where_the_checkpoint_lives(
    small_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No storage option: the storage measured is the checkpoint's own folder, and --help says so."""
    import ckptz.bench.storage

    measured: list[Path] = []

    def fake(folder: Path) -> StorageSpeed:
        measured.append(Path(folder))
        return StorageSpeed(3.0, 4.0, "measured (test double)", str(folder))

    monkeypatch.setattr(ckptz.bench.storage, "measure_storage", fake)
    args = ["bench", str(small_checkpoint), "--device", "cpu", "--codecs", "ckptz-auto", "--json"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    assert measured == [small_checkpoint]
    assert json.loads(out.stdout)["storage"]["path"] == str(small_checkpoint)
    helped = subprocess.run(
        [sys.executable, "-m", "ckptz", "bench", "--help"], capture_output=True, text=True, env=CLI_ENV
    )
    assert "the folder the checkpoint is in" in " ".join(helped.stdout.split())
