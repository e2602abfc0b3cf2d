"""``compress --series`` on a small real training run: ratio, byte-identity, deletions,
adding a checkpoint, keyframes, ``detach``, and SIGKILL while the previous newest is re-coded."""

from __future__ import annotations

import io
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CLI_ENV, ckptz, tree_digests
from series_run import make_run

from ckptz import api
from ckptz.container import read_index
from ckptz.errors import ReferenceMissingError
from ckptz.library.reader import ContainerReader
from ckptz.series.detect import step_of
from ckptz.series.run import chain

STEPS = (10, 20, 30, 40, 50, 60)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The pristine run (checkpoints 10-50) and one more checkpoint (60) of the same training."""
    root = tmp_path_factory.mktemp("series")
    make_run(root / "all", STEPS)
    five = root / "five"
    five.mkdir()
    for s in STEPS[:-1]:
        shutil.copytree(root / "all" / f"checkpoint-{s}", five / f"checkpoint-{s}")
    return five, root / "all" / "checkpoint-60"


def _restores(run: Path, want: dict[str, str], tmp: Path) -> None:
    """Every checkpoint of ``run`` restores byte-identical to ``want``."""
    out = tmp / f"out-{time.monotonic_ns()}"
    api.decompress(run, out)
    got = tree_digests(out)
    assert {k: v for k, v in want.items() if k in got} == got
    assert set(got) == set(want)


def _containers(run: Path) -> list[Path]:
    return sorted(run.rglob("*.ckptz"))


def test_step_names() -> None:
    assert step_of("checkpoint-500") == 500
    assert step_of("global_step1200") == 1200
    assert step_of("iter_0002000") == 2000
    assert step_of("step-7") == 7
    assert step_of("epoch=3-step=1200.ckpt") == 1200
    assert step_of("step_40.pt.ckptz") == 40
    assert step_of("runs") is None and step_of("checkpoint-best") is None


def test_series_beats_plain_and_restores(runs: tuple[Path, Path], tmp_path: Path) -> None:
    five, _ = runs
    want = tree_digests(five)
    plain, series = tmp_path / "plain", tmp_path / "series"
    shutil.copytree(five, plain)
    shutil.copytree(five, series)
    api.compress(plain, in_place=True)
    api.compress(series, in_place=True, series=True)
    size = lambda d: sum(p.stat().st_size for p in _containers(d))  # noqa: E731
    assert size(series) < 0.95 * size(plain)
    newest = [p for p in _containers(series) if "checkpoint-50" in str(p)]
    for p in _containers(series):
        with open(p, "rb") as f:
            header = read_index(f, str(p)).header
        assert ("reference" in header) == (p not in newest)
    _restores(series, want, tmp_path)

    # Deleting the oldest checkpoints breaks nothing.
    shutil.rmtree(series / "checkpoint-10")
    shutil.rmtree(series / "checkpoint-20")
    _restores(
        series,
        {k: v for k, v in want.items() if not k.startswith(("checkpoint-10", "checkpoint-20"))},
        tmp_path,
    )


def test_missing_reference_is_one_clear_line(runs: tuple[Path, Path], tmp_path: Path) -> None:
    five, _ = runs
    run = tmp_path / "run"
    shutil.copytree(five, run)
    api.compress(run, in_place=True, series=True)
    shutil.rmtree(run / "checkpoint-30")
    before = tree_digests(run)
    for args in (
        ("verify", str(run / "checkpoint-20")),
        ("inspect", str(run / "checkpoint-20")),
        ("decompress", str(run / "checkpoint-20"), "--in-place"),
        ("decompress", str(run), "-o", str(tmp_path / "out")),
    ):
        done = ckptz(*args)
        assert done.returncode != 0, args
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
        assert "checkpoint-30/" in lines[0] and "missing" in lines[0], lines[0]
    assert tree_digests(run) == before
    with pytest.raises(ReferenceMissingError):
        ContainerReader(run / "checkpoint-10" / "optimizer.pt.ckptz")
    # The newer ones still restore.
    assert ckptz("verify", str(run / "checkpoint-40")).returncode == 0


def test_a_replaced_reference_is_called_changed_not_missing(runs: tuple[Path, Path], tmp_path: Path) -> None:
    """checkpoint-30's container swapped for another whole container: verify calls the older
    ones coded against it ``changed reference`` (the file is there, it is another one), says
    so in one line, and exits 1; inspect of their folder says the same."""
    five, _ = runs
    run = tmp_path / "run"
    shutil.copytree(five, run)
    api.compress(run, in_place=True, series=True)
    name = "model.safetensors.ckptz"
    shutil.copyfile(run / "checkpoint-50" / name, run / "checkpoint-30" / name)
    before = tree_digests(run)

    done = ckptz("verify", str(run), "--json")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    status = {f["path"]: f for f in json.loads(done.stdout)["files"]}
    for older in ("checkpoint-10", "checkpoint-20"):
        verdict = status[f"{older}/{name}"]
        assert verdict["status"] == "changed reference", verdict
        assert "not the file it was coded against" in verdict["error"], verdict
    assert status[f"checkpoint-30/{name}"]["status"] == "ok"
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("ckptz: error:")]
    assert len(lines) == 1 and "not the file it was coded against" in lines[0], done.stderr

    shown = ckptz("inspect", str(run / "checkpoint-20"), "--json")
    assert shown.returncode == 1 and "Traceback" not in shown.stderr, shown.stderr
    formats = {f["path"]: f["format"] for f in json.loads(shown.stdout)["files"]}
    assert formats["model.safetensors"] == "changed reference", formats
    assert tree_digests(run) == before


@pytest.mark.parametrize("where", ["payload", "index"])
def test_a_damaged_reference_is_blamed_not_the_intact_containers_coded_against_it(
    runs: tuple[Path, Path], tmp_path: Path, where: str
) -> None:
    """One bit flipped in checkpoint-30's container: ``verify`` calls that one damaged, and the
    older, intact containers coded against it (directly or down the chain) unusable because
    of it, never damaged themselves; ``decompress`` of an older one says the same in one line."""
    five, _ = runs
    run = tmp_path / "run"
    shutil.copytree(five, run)
    api.compress(run, in_place=True, series=True)
    bad = run / "checkpoint-30" / "model.safetensors.ckptz"
    with open(bad, "rb") as f:
        index = read_index(f, str(bad))
    chunk = index.chunks[int(index.chunks["size"].argmax())]
    data_end = int(chunk["offset"]) + int(chunk["size"])
    at = int(chunk["offset"]) + int(chunk["size"]) // 2 if where == "payload" else bad.stat().st_size - 60
    assert where == "payload" or at > data_end
    raw = bytearray(bad.read_bytes())
    raw[at] ^= 0x10
    bad.write_bytes(raw)
    before = tree_digests(run)

    done = ckptz("verify", str(run), "--json")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    status = {f["path"]: f for f in json.loads(done.stdout)["files"]}
    assert status["checkpoint-30/model.safetensors.ckptz"]["status"] == "damaged"
    for older in ("checkpoint-10", "checkpoint-20"):
        verdict = status[f"{older}/model.safetensors.ckptz"]
        assert verdict["status"] == "missing reference", verdict
        assert "checkpoint-30/model.safetensors.ckptz is damaged" in verdict["error"], verdict
    for newer in ("checkpoint-40", "checkpoint-50"):
        assert status[f"{newer}/model.safetensors.ckptz"]["status"] == "ok"

    done = ckptz("decompress", str(run / "checkpoint-20"), "-o", str(tmp_path / "out"))
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "its reference" in lines[0] and "checkpoint-30/model.safetensors.ckptz is damaged" in lines[0]
    assert tree_digests(run) == before


def test_a_recode_that_cannot_write_names_the_file_and_loses_nothing(tmp_path: Path) -> None:
    """Adding a checkpoint re-codes the previous newest, which is first restored beside its
    container; a file-size limit (``ulimit -f``) that the new containers fit but that
    restore does not ends the run with one line naming the file, and every checkpoint still
    restores; the same command without the limit finishes the job."""
    import numpy as np
    from safetensors.numpy import save_file

    run, plain = tmp_path / "run", tmp_path / "plain"
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 512)).astype(np.float32)
    for step in (10, 20, 30):
        w = w + np.float32(0.001) * rng.standard_normal(w.shape).astype(np.float32)
        (plain / f"checkpoint-{step}").mkdir(parents=True)
        save_file({"w": w}, str(plain / f"checkpoint-{step}" / "model.safetensors"))
    shutil.copytree(plain, run, ignore=shutil.ignore_patterns("checkpoint-30"))
    api.compress(run, in_place=True, series=True)
    shutil.copytree(plain / "checkpoint-30", run / "checkpoint-30")
    size = (plain / "checkpoint-30" / "model.safetensors").stat().st_size
    limit_kib = (size - 64 * 1024) // 1024  # below the original, above a container of it
    args = " ".join(["-m", "ckptz", "compress", str(run), "--series", "--in-place", "-q"])
    done = subprocess.run(
        ["bash", "-c", f"ulimit -f {limit_kib} && exec {sys.executable} {args}"],
        capture_output=True,
        text=True,
        env=CLI_ENV,
        timeout=120,
    )
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "checkpoint-20/model.safetensors" in lines[0] and "File too large" in lines[0], lines[0]
    assert not [p for p in run.rglob("*") if ".ckptz-tmp-" in p.name]
    _restores(run, tree_digests(plain), tmp_path)
    assert ckptz("compress", str(run), "--series", "--in-place", "-q").returncode == 0
    _restores(run, tree_digests(plain), tmp_path)


def test_add_checkpoint_recodes_previous_newest_and_detach(runs: tuple[Path, Path], tmp_path: Path) -> None:
    five, sixty = runs
    run = tmp_path / "run"
    shutil.copytree(five, run)
    api.compress(run, in_place=True, series=True)
    shutil.copytree(sixty, run / "checkpoint-60")
    want = tree_digests(five) | {f"checkpoint-60/{k}": v for k, v in tree_digests(sixty).items()}
    prev = run / "checkpoint-50" / "model.safetensors.ckptz"
    old_size = prev.stat().st_size
    api.compress(run, in_place=True, series=True)
    with open(prev, "rb") as f:
        assert read_index(f, "").header["reference"]["path"] == "../checkpoint-60/model.safetensors.ckptz"
    assert prev.stat().st_size < old_size
    assert len(chain(run / "checkpoint-10" / "model.safetensors.ckptz")) == 6
    _restores(run, want, tmp_path)

    # detach makes checkpoint-30 self-contained: then deleting 40 and newer leaves 10-30 whole.
    api.detach(run / "checkpoint-30")
    assert all(len(chain(p)) == 1 for p in _containers(run / "checkpoint-30"))
    for s in (40, 50, 60):
        shutil.rmtree(run / f"checkpoint-{s}")
    _restores(
        run,
        {k: v for k, v in want.items() if k.startswith(("checkpoint-10", "checkpoint-20", "checkpoint-30"))},
        tmp_path,
    )


def test_keyframes_bound_chains_and_survive_additions(runs: tuple[Path, Path], tmp_path: Path) -> None:
    five, sixty = runs
    run = tmp_path / "run"
    shutil.copytree(five, run)
    done = ckptz("compress", str(run), "--series", "--in-place", "--keyframe-every", "2")
    assert done.returncode == 0, done.stderr
    lengths = {p.relative_to(run).as_posix(): len(chain(p)) for p in _containers(run)}
    assert max(lengths.values()) == 2
    assert lengths["checkpoint-20/optimizer.pt.ckptz"] == 1  # a keyframe
    shutil.copytree(sixty, run / "checkpoint-60")
    before = {p: p.stat().st_mtime_ns for p in _containers(run)}
    assert ckptz("compress", str(run), "--series", "--in-place", "--keyframe-every", "2").returncode == 0
    changed = [p.relative_to(run).as_posix() for p, t in before.items() if p.stat().st_mtime_ns != t]
    assert changed == []  # checkpoint-50 heads a full chain (40 → 50): it stays a keyframe
    assert max(len(chain(p)) for p in _containers(run)) == 2


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ckptz", *args, "--device", "cpu"]


def _each_restores(run: Path, want: dict[str, str]) -> None:
    """Every file of the run, in whatever form a kill left it, gives its original bytes."""
    import hashlib

    for rel, digest in want.items():
        plain, container = run / rel, run / (rel + ".ckptz")
        if container.exists():
            with ContainerReader(container) as r:
                data = r.read()
        else:
            data = plain.read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest, rel


def test_sigkill_while_recoding(runs: tuple[Path, Path], tmp_path: Path) -> None:
    five, sixty = runs
    base = tmp_path / "base"
    shutil.copytree(five, base)
    api.compress(base, in_place=True, series=True)
    want = tree_digests(five) | {f"checkpoint-60/{k}": v for k, v in tree_digests(sixty).items()}
    calib = tmp_path / "calib"
    shutil.copytree(base, calib)
    shutil.copytree(sixty, calib / "checkpoint-60")
    t0 = time.perf_counter()
    assert subprocess.run(_cli("compress", str(calib), "--series", "--in-place"), env=CLI_ENV).returncode == 0
    full = time.perf_counter() - t0
    rng = random.Random(18)
    rounds = 6
    for i in range(rounds):
        work = tmp_path / f"round-{i}"
        shutil.copytree(base, work)
        shutil.copytree(sixty, work / "checkpoint-60")
        proc = subprocess.Popen(
            _cli("compress", str(work), "--series", "--in-place"),
            env=CLI_ENV,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            proc.wait(timeout=full * (i + rng.random()) / rounds)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        _each_restores(work, want)
        again = subprocess.run(
            _cli("compress", str(work), "--series", "--in-place"), env=CLI_ENV, capture_output=True, text=True
        )
        assert again.returncode in (0, 1), again.stderr
        if again.returncode:  # killed after the last file: nothing left to do
            assert "nothing" in again.stderr.lower() or "already" in again.stderr.lower(), again.stderr
        _each_restores(work, want)
        assert not [p for p in work.rglob(".*")]
        shutil.rmtree(work)


# --------------------------------------------------------------------------- inspect and bench


def _render(view: object, width: int) -> str:
    from rich.console import Console

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(view)
    return console.export_text()


@pytest.fixture(scope="module")
def packed(runs: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """The five-checkpoint run compressed with --series (-o), and its whole-run ratio."""
    five, _ = runs
    out = tmp_path_factory.mktemp("packed") / "run.ckptz"
    summary = api.compress(five, out, series=True, device="cpu")
    assert summary.ratio is not None
    return out, summary.ratio


def test_inspect_reports_deltas_and_their_references(packed: tuple[Path, float]) -> None:
    from ckptz.report import summary_json, summary_view

    out, _ = packed
    summary = api.inspect(out)
    by_path = {f.path: f for f in summary.files}
    delta = by_path["checkpoint-10/model.safetensors"]
    assert delta.reference == "../checkpoint-20/model.safetensors.ckptz" and not delta.keyframe
    assert by_path["checkpoint-50/model.safetensors"].reference is None
    weights = next(c for c in delta.components if c.name == "weights")
    assert 0 < weights.delta_bytes <= weights.bytes
    assert all(c.delta_bytes == 0 for c in by_path["checkpoint-50/optimizer.pt"].components)
    total = next(c for c in summary.components if c.name == "weights")
    assert total.delta_bytes == sum(
        c.delta_bytes for f in summary.files for c in f.components if c.name == "weights"
    )
    data = summary_json(summary)
    assert data["files"][0]["reference"] == "../checkpoint-20/model.safetensors.ckptz"
    assert data["files"][0]["components"][0]["delta_bytes"] > 0
    for width in (140, 80):
        text = _render(summary_view(summary), width)
        assert "checkpoint-20/" in text and "…" not in text, text
    assert "delta" in _render(summary_view(summary), 140)
    assert "as series delta" in _render(summary_view(summary), 80)


def test_bench_series_estimates_gain_per_component(
    runs: tuple[Path, Path], packed: tuple[Path, float], tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from ckptz.bench.series import bench_series
    from ckptz.cli import app
    from ckptz.report import series_bench_view

    five, _ = runs
    _, actual = packed
    result = bench_series(five, threads=1)
    assert result.checkpoints == tuple(f"checkpoint-{s}" for s in STEPS[:-1])
    assert result.deltas == 2 * 4 and result.tracks == 2
    rows = {r.component: r for r in result.rows}
    w = rows["weights"]
    assert w.series_ratio > w.plain_ratio and w.series_bound > w.plain_bound
    assert w.paired_bytes == w.delta_bytes and w.delta_bytes == w.bytes * 4 // 5
    assert rows["metadata"].paired_bytes == 0
    # The estimate agrees with what compress --series wrote (the sample is the whole run).
    assert result.series_ratio == pytest.approx(actual, rel=0.03)
    assert result.series_ratio > result.plain_ratio
    for width in (140, 80):
        text = _render(series_bench_view(result), width)
        assert "weights" in text and "…" not in text, text

    done = CliRunner().invoke(app, ["bench", str(five), "--series", "--json", "-T", "1"])
    assert done.exit_code == 0, done.output
    data = json.loads(done.stdout)
    assert {c["component"] for c in data["components"]} == set(rows)
    assert data["series_ratio"] > data["plain_ratio"]
    one = CliRunner().invoke(app, ["bench", str(five / "checkpoint-10"), "--series"])
    assert one.exit_code == 2 and "step" in one.output


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_a_reference_that_cannot_be_opened_leaves_no_noise(tmp_path: Path) -> None:
    """A plain reference that vanished raises; the half-made reader says nothing on stderr
    when it is collected (it printed "Exception ignored ... no attribute '_fd'")."""
    import gc

    from ckptz.series.reference import PlainReference

    with pytest.raises(FileNotFoundError):
        PlainReference(tmp_path / "gone.pt")
    gc.collect()


def test_inspect_of_several_files_names_each_by_its_folder(tmp_path: Path) -> None:
    """``ckptz inspect run/checkpoint-*/x.ckptz`` labels rows ``checkpoint-N/x``, not ``x`` five times."""
    import safetensors.torch
    import torch

    from ckptz import api

    paths = []
    for step in (10, 20):
        (tmp_path / f"checkpoint-{step}").mkdir()
        paths.append(tmp_path / f"checkpoint-{step}" / "model.safetensors")
        safetensors.torch.save_file({"w": torch.full((64,), float(step))}, str(paths[-1]))
    summary = api.inspect(paths)
    assert [f.path for f in summary.files] == [
        "checkpoint-10/model.safetensors",
        "checkpoint-20/model.safetensors",
    ]


# --------------------------------------------------------------------------- in place, undisturbed


def _torch_run(root: Path, checkpoints: int = 4, n: int = 1 << 18) -> None:
    """``root/checkpoint-N/{model,optim}.pt``: torch.save of tensors that change a little per checkpoint."""
    import torch

    gen = torch.Generator().manual_seed(5)
    w = {"a": torch.randn(n, generator=gen), "b": torch.randn(n // 2, generator=gen).to(torch.bfloat16)}
    for step in range(1, checkpoints + 1):
        ck = root / f"checkpoint-{step}"
        ck.mkdir(parents=True)
        torch.save(w, ck / "model.pt")
        torch.save({k: v * 0.5 for k, v in w.items()}, ck / "optim.pt")
        w = {k: v + (1e-3 * torch.randn(v.shape, generator=gen)).to(v.dtype) for k, v in w.items()}


def test_decompress_in_place_of_a_series_run_never_loses_a_reference(tmp_path: Path) -> None:
    """Restoring a run in place removes each container once its file is back, while an older
    checkpoint's delta may still be reading it as its reference (or be about to open it):
    every run must finish, byte-identical (it failed in most runs with "checkpoint-2/model.pt.ckptz:
    No such file or directory" or "its folder ... cannot be found")."""
    plain = tmp_path / "plain"
    _torch_run(plain)
    want = tree_digests(plain)
    packed = tmp_path / "packed"
    shutil.copytree(plain, packed)
    done = ckptz("compress", str(packed), "--in-place", "--series")
    assert done.returncode == 0, done.stderr
    assert len(_containers(packed)) == len(want)
    for i in range(10):
        work = tmp_path / f"work-{i}"
        shutil.copytree(packed, work)
        back = ckptz("decompress", str(work), "--in-place")
        assert back.returncode == 0, f"run {i}: {back.stderr}"
        assert tree_digests(work) == want
        shutil.rmtree(work)
