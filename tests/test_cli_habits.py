"""The command line follows zstd's and the hf CLI's habits. Each case runs the CLI in a
subprocess, as a user would: quiet, verbose, dry runs, progress (plain lines off a
terminal, files in flight on one), zstd's short options, notices once, 80-column tables,
the container's overhead on its own line, shell completion, and the README quickstart."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import CLI_ENV, REPO, ckptz, stderr_on_a_terminal, tree_digests


@pytest.fixture
def work(small_checkpoint: Path, tmp_path: Path) -> Path:
    root = tmp_path / "checkpoint-500"
    shutil.copytree(small_checkpoint, root)
    return root


def test_quiet_prints_nothing_but_errors(work: Path, tmp_path: Path) -> None:
    done = ckptz("compress", str(work), "-o", str(tmp_path / "out"), "-q", env={"CKPTZ_DEVICE": "auto"})
    assert done.returncode == 0 and done.stdout == "" and done.stderr == ""
    done = ckptz("decompress", str(tmp_path / "out"), "-o", str(tmp_path / "back"), "--quiet")
    assert done.returncode == 0 and done.stdout == "" and done.stderr == ""
    assert tree_digests(tmp_path / "back") == tree_digests(work)
    (tmp_path / "out" / "config.json").write_text("{}")  # not what this run writes
    done = ckptz("compress", str(work), "-o", str(tmp_path / "out"), "-q")
    assert done.returncode == 2 and "already exists" in done.stderr  # errors still show


def test_quiet_verify_gives_the_verdict_and_only_failing_files(work: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert ckptz("compress", str(work), "-o", str(out), "-q").returncode == 0
    done = ckptz("verify", str(out), "--against", str(work), "-q")
    files = sum(p.is_file() for p in work.rglob("*"))
    # One line, the verdict (wrapped where the path is long): no table of no rows.
    assert (
        done.returncode == 0
        and " ".join(done.stdout.split()) == f"all {files} files match {work}: byte-identical"
    )
    victim = next(p for p in sorted(out.rglob("*.ckptz")))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    done = ckptz("verify", str(out), "--against", str(work), "-q")
    rows = [line for line in done.stdout.splitlines() if victim.name.removesuffix(".ckptz") in line]
    assert done.returncode != 0 and len(rows) == 1 and "failed" in done.stdout


def test_verbose_lists_every_file(work: Path, tmp_path: Path) -> None:
    done = ckptz("compress", str(work), "-o", str(tmp_path / "out"), "-v")
    assert done.returncode == 0, done.stderr
    for name in ("model.safetensors", "optimizer.pt", "rng_state.pth", "config.json", "trainer_state.json"):
        assert f"done: {name}" in done.stderr


def test_dry_run_writes_nothing_and_estimates(work: Path, tmp_path: Path) -> None:
    before = tree_digests(work)
    done = ckptz("compress", str(work), "--in-place", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert tree_digests(work) == before and not list(work.glob("*.ckptz"))
    assert "estimated" in done.stdout and "would do: 3 to compress" in done.stdout
    data = json.loads(ckptz("compress", str(work), "-o", str(tmp_path / "x"), "--dry-run", "--json").stdout)
    assert data["dry_run"] and not (tmp_path / "x").exists()
    assert {a["action"] for a in data["actions"]} == {"compress", "copy"}
    assert 0 < data["compressed_bytes"] < data["bytes"]
    # The estimate is close to what compress achieves on this (fully sampled) checkpoint.
    real = json.loads(ckptz("compress", str(work), "-o", str(tmp_path / "y"), "--json").stdout)
    packed = sum(c["compressed_bytes"] for c in real["components"])
    assert abs(data["compressed_bytes"] - packed) <= 0.02 * packed
    listed = ckptz("compress", str(work), "--in-place", "--dry-run", "-v", env={"COLUMNS": "300"})
    assert "optimizer.pt.ckptz" in listed.stdout
    back = ckptz("decompress", str(tmp_path / "y"), "--in-place", "--dry-run")
    assert back.returncode == 0 and (tmp_path / "y" / "optimizer.pt.ckptz").exists()


@pytest.fixture(scope="module")
def medium(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Enough data that a run reports progress several times."""
    from safetensors.numpy import save_file

    root = tmp_path_factory.mktemp("medium") / "run"
    root.mkdir()
    rng = np.random.default_rng(3)
    for i in range(6):
        save_file(
            {"w": (rng.standard_normal(2_000_000) * 0.02).astype(np.float32)}, str(root / f"m{i}.safetensors")
        )
    return root


def test_progress_lines_when_stderr_is_not_a_terminal(medium: Path, tmp_path: Path) -> None:
    done = ckptz("compress", str(medium), "-o", str(tmp_path / "o"), env={"CKPTZ_PROGRESS_SECONDS": "0"})
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("ckptz: compress ")]
    assert len(lines) > 3 and "\x1b" not in done.stderr and "\r" not in done.stderr
    assert re.search(r"compress \d+% \(.* of .*B, .*B/s\); in flight: m\d\.safetensors", done.stderr)
    quiet = ckptz(
        "compress",
        str(medium),
        "-o",
        str(tmp_path / "p"),
        "--no-progress",
        env={"CKPTZ_PROGRESS_SECONDS": "0"},
    )
    assert quiet.returncode == 0 and "ckptz: compress " not in quiet.stderr


def test_progress_bar_names_the_files_in_flight(medium: Path, tmp_path: Path) -> None:
    """On a terminal (a pty here), the bar shows the files being worked on, not the last started."""
    text = stderr_on_a_terminal(
        "compress", str(medium), "-o", str(tmp_path / "o"), "-T", "1", columns=120, timeout=60
    )
    assert re.search(r"m\d\.safetensors, m\d\.safetensors", text), text[-2000:]


def test_zstd_short_options(work: Path, tmp_path: Path) -> None:
    done = ckptz(
        "compress", str(work / "optimizer.pt"), "-T", "1", "-f", "-q", "-o", str(tmp_path / "a.ckptz")
    )
    assert done.returncode == 0, done.stderr
    again = ckptz("compress", str(work / "optimizer.pt"), "-f", "-q", "-o", str(tmp_path / "a.ckptz"))
    assert again.returncode == 0, again.stderr  # -f is --force
    out = subprocess.run(
        [sys.executable, "-m", "ckptz", "decompress", str(tmp_path / "a.ckptz"), "-c"],
        capture_output=True,
        env=CLI_ENV,
    )
    assert out.returncode == 0 and out.stdout == (work / "optimizer.pt").read_bytes()  # -c is stdout
    for old in ("-t", "-l", "-d"):  # threads, level, device: zstd's test, list, decompress
        wrong = ckptz("compress", str(work), old, "1")
        assert wrong.returncode == 2 and "no such option" in wrong.stderr, old
    assert ckptz("-V").stdout.startswith("ckptz ")
    assert "Usage" in ckptz("compress", "-h").stdout


def test_cpu_notice_printed_once(work: Path, tmp_path: Path) -> None:
    """The quickstart's three commands print the fallback notice once, not three times."""
    from ckptz.engines import gpu_unavailable_reason

    if gpu_unavailable_reason() is None:
        pytest.skip("a GPU is usable here: there is no CPU notice")
    auto = {"CKPTZ_DEVICE": "auto"}
    runs = [
        ckptz("compress", str(work), "-o", str(tmp_path / "c"), env=auto),
        ckptz("verify", str(tmp_path / "c"), "--against", str(work), env=auto),
        ckptz("decompress", str(tmp_path / "c"), "-o", str(tmp_path / "r"), env=auto),
    ]
    assert all(r.returncode == 0 for r in runs)
    assert sum(r.stderr.count("running on the CPU") for r in runs) == 1


def _widths_ok(text: str, width: int = 80) -> None:
    for line in text.splitlines():
        assert len(line.rstrip()) <= width, line
    assert "…" not in text  # nothing cut, headers least of all


def test_tables_fit_80_columns(work: Path, tmp_path: Path) -> None:
    env = {"COLUMNS": "80"}
    done = ckptz("compress", str(work), "-o", str(tmp_path / "c"), env=env)
    assert done.returncode == 0
    _widths_ok(done.stdout)
    for header in ("component", "original", "compressed", "ratio", "saved", "file"):
        assert header in done.stdout
    for args in (
        ("inspect", str(work)),
        ("inspect", str(tmp_path / "c")),
        ("verify", str(tmp_path / "c"), "--against", str(work)),
    ):
        out = ckptz(*args, env=env)
        assert out.returncode == 0
        _widths_ok(out.stdout)
    bench = ckptz(
        "bench",
        str(work),
        "--storage-gbps",
        "2",
        "--sample",
        "64KiB",
        "--codecs",
        "ckptz-auto,zstd-raw",
        env=env,
    )
    assert bench.returncode == 0, bench.stderr
    _widths_ok(bench.stdout)
    for header in (
        "codec",
        "device",
        "ratio",
        "compress",
        "decompress",
        "decodes",
        "write s",
        "$ storage/mo",
    ):
        assert header in bench.stdout
    wide = ckptz("compress", str(work), "-o", str(tmp_path / "w"), env={"COLUMNS": "160"})
    assert "tensors" in wide.stdout and "codecs" in wide.stdout  # the wide layout where there is room


def test_container_overhead_is_its_own_line(work: Path, tmp_path: Path) -> None:
    done = ckptz("compress", str(work), "-o", str(tmp_path / "c"), env={"COLUMNS": "160"})
    assert "container index" in done.stdout
    data = json.loads(ckptz("inspect", str(tmp_path / "c"), "--json").stdout)
    metadata = next(c for c in data["components"] if c["name"] == "metadata")
    assert metadata["ratio"] > 1  # no longer charged the index
    on_disk = sum(p.stat().st_size for p in (tmp_path / "c").glob("*.ckptz"))
    assert sum(c["compressed_bytes"] for c in data["components"]) + data["overhead_bytes"] == on_disk


def test_shell_completion() -> None:
    env = {"_CKPTZ_COMPLETE": "complete_bash", "COMP_WORDS": "ckptz comp", "COMP_CWORD": "1"}
    assert ckptz(env=env).stdout.split() == ["compress"]
    env = {"_CKPTZ_COMPLETE": "complete_bash", "COMP_WORDS": "ckptz compress --in", "COMP_CWORD": "2"}
    assert set(ckptz(env=env).stdout.split()) == {"--in-place", "--include"}
    env = {"_CKPTZ_COMPLETE": "complete_bash", "COMP_WORDS": "ckptz compress --codec ", "COMP_CWORD": "3"}
    assert set(ckptz(env=env).stdout.split()) == {"auto", "zstd", "ans"}
    # --show-completion prints the script for the shell it runs under (found from its parent
    # processes), so run it from bash: `; exit` keeps bash from exec'ing it in its place.
    shown = subprocess.run(
        ["bash", "-c", f"{shlex.quote(sys.executable)} -m ckptz --show-completion; exit $?"],
        capture_output=True,
        text=True,
        env={**CLI_ENV},
        timeout=120,
    )
    assert "complete -o default -F _ckptz_completion ckptz" in shown.stdout  # file names complete too


def test_readme_quickstart_runs_twice(tmp_path: Path) -> None:
    """The README's first command, as written (minus the install), run twice in a row: each
    run makes its own folder, compresses it in place and verifies it against the originals."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("## Try it", 1)[1].split("```bash\n", 1)[1].split("\n```", 1)[0]
    command = block.strip().split(" && ", 1)[1]  # after "pip install ..."
    assert "mktemp -d" in command and "/tmp/" not in command
    command = command.replace("mktemp -d", f"mktemp -d -p {tmp_path}")
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "ckptz").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m ckptz "$@"\n')
    (shim / "ckptz").chmod(0o755)
    env = {**CLI_ENV, "PATH": f"{shim}:{os.environ['PATH']}"}
    folders = []
    for run in (1, 2):
        done = subprocess.run(
            ["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, (run, done.stderr[-2000:])
        last = done.stdout.rstrip().splitlines()[-1]
        assert last.startswith("done: "), (run, last)
        folders.append(Path(last.removeprefix("done: ")))
    assert folders[0] != folders[1] and all(f.parent == tmp_path for f in folders)
    for folder in folders:
        assert list((folder / "runs").rglob("*.ckptz")), folder


def test_bench_measures_the_checkpoint_storage(work: Path) -> None:
    """No storage option: bench measures where the checkpoint lives (and leaves nothing there)."""
    before = sorted(p.name for p in work.iterdir())
    done = ckptz("bench", str(work), "--codecs", "zstd-raw", "--sample", "64KiB", "--json")
    assert done.returncode == 0, done.stderr
    storage = json.loads(done.stdout)["storage"]
    assert storage["path"] == str(work) and storage["write_gbps"] > 0 and "wrote" in storage["method"]
    assert sorted(p.name for p in work.iterdir()) == before
    assert "the folder the checkpoint is in" in " ".join(ckptz("bench", "--help").stdout.split())
