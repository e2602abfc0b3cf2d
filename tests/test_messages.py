"""Help texts and error messages as a user reads them (issue 58, points 13-15)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import ckptz, stderr_on_a_terminal

COMMANDS = ("compress", "decompress", "inspect", "verify", "detach", "bench")


def test_help_shows_metavars_not_python_types() -> None:
    for command in COMMANDS:
        text = ckptz(command, "--help").stdout
        assert not any(f"<{t}" in text for t in ("list", "int", "float", "str", "path")), (command, text)


def test_top_level_help_gives_whole_summaries() -> None:
    text = ckptz("--help").stdout
    commands = text.split("Commands:")[1]
    assert "..." not in commands
    assert "recommend one and project the savings." in " ".join(commands.split())


def test_only_streaming_commands_promise_stdin(small_checkpoint: Path) -> None:
    assert "'-' reads stdin" in ckptz("compress", "--help").stdout
    for command in ("inspect", "verify", "detach"):
        assert "stdin" not in ckptz(command, "--help").stdout
        done = ckptz(command, "-")
        assert done.returncode == 2
        assert done.stderr.strip() == (
            "ckptz: error: '-' (stdin) is read by compress and decompress only "
            "(save the stream to a file and name it)"
        )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("verify", "--series", "x"), "ckptz: error: no such option: --series (see 'ckptz verify -h')"),
        (
            ("compress", "--seris", "x"),
            "ckptz: error: no such option: --seris (did you mean --series?) (see 'ckptz compress -h')",
        ),
        (("compress",), "ckptz: error: missing argument 'SOURCE' (see 'ckptz compress -h')"),
    ],
)
def test_usage_errors_take_one_line(args: tuple[str, ...], line: str) -> None:
    done = ckptz(*args)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [line]


def test_fast_help_says_it_needs_a_gpu() -> None:
    text = " ".join(ckptz("compress", "--help").stdout.split())
    assert "--fast Same as --codec ans: fastest, but only a GPU can write or restore it" in text


def test_a_symlinked_file_says_symlinks_are_not_followed(small_checkpoint: Path, tmp_path: Path) -> None:
    """The Hugging Face cache layout: snapshots/<rev>/model.safetensors -> ../../blobs/<hash>."""
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    shutil.copy(small_checkpoint / "model.safetensors", blobs / "0123abcd")
    snapshot = tmp_path / "snapshots" / "main"
    snapshot.mkdir(parents=True)
    link = snapshot / "model.safetensors"
    os.symlink("../../blobs/0123abcd", link)
    done = ckptz("compress", str(link), "-o", str(tmp_path / "m.ckptz"))
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"ckptz: error: {link}: is a symlink, and ckptz does not follow symlinks "
        f'(name the file it points to: ckptz compress "$(readlink -f {link})")'
    )


def test_a_missing_series_reference_is_called_so(small_checkpoint: Path, tmp_path: Path) -> None:
    import torch

    run = tmp_path / "run"
    torch.manual_seed(0)
    weights = torch.randn(256, 256)
    for step in (1, 2):
        folder = run / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        weights[step] += 1.0  # one row changes per step: the older checkpoint codes against the newer
        torch.save({"w": weights}, folder / "model.pt")
    assert ckptz("compress", str(run), "--series", "--in-place", "-q").returncode == 0
    shutil.rmtree(run / "checkpoint-2")
    done = ckptz("verify", str(run), "--json")
    assert done.returncode == 1
    statuses = {f["path"]: f["status"] for f in json.loads(done.stdout)["files"]}
    assert "missing reference" in statuses.values() and "unreferenced" not in statuses.values()


def test_damage_is_told_in_the_originals_terms(small_checkpoint: Path, tmp_path: Path) -> None:
    packed = tmp_path / "m.safetensors.ckptz"
    assert ckptz("compress", str(small_checkpoint / "model.safetensors"), "-o", str(packed)).returncode == 0
    from ckptz.container import read_index

    with open(packed, "rb") as f:
        index = read_index(f, str(packed))
    largest = int(index.chunks["size"].argmax())
    with open(packed, "r+b") as f:
        at = int(index.chunks["offset"][largest]) + 5
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x40]))
    done = ckptz("verify", str(packed), "--json")
    (verdict,) = json.loads(done.stdout)["files"]
    assert verdict["status"] == "damaged"
    detail = verdict["error"]
    assert not detail.startswith(packed.name) and "stream" not in detail and "chunk" not in detail, detail
    assert "offset" in detail and "(in tensor " in detail, detail


def test_a_truncated_checkpoint_is_named_when_stored_as_opaque_bytes(
    small_checkpoint: Path, tmp_path: Path
) -> None:
    source = tmp_path / "cut"
    source.mkdir()
    for name in ("optimizer.pt", "model.safetensors"):
        data = (small_checkpoint / name).read_bytes()
        (source / name).write_bytes(data[: len(data) // 2])
    out = tmp_path / "cut.ckptz"
    done = ckptz("compress", str(source), "-o", str(out))
    assert done.returncode == 0, done.stderr
    for name in ("optimizer.pt", "model.safetensors"):
        line = f"ckptz: warning: {name} is not a readable checkpoint; stored as opaque bytes"
        assert line in done.stderr.splitlines(), done.stderr
    shown = ckptz("inspect", str(out)).stdout
    assert "warning: optimizer.pt is not a readable checkpoint; stored as opaque bytes" in shown
    healthy = ckptz("compress", str(small_checkpoint), "-o", str(tmp_path / "ok.ckptz"))
    assert "warning" not in healthy.stderr


def test_piped_tables_carry_no_trailing_spaces(small_checkpoint: Path, tmp_path: Path) -> None:
    done = ckptz("compress", str(small_checkpoint), "-o", str(tmp_path / "x.ckptz"), env={"COLUMNS": "120"})
    assert done.returncode == 0 and done.stdout
    assert all(line == line.rstrip() for line in done.stdout.splitlines()), done.stdout


def test_a_large_tree_gets_a_summary_and_v_lists_every_file(tmp_path: Path) -> None:
    import torch

    source = tmp_path / "many"
    source.mkdir()
    for i in range(30):
        torch.save({"w": torch.full((8,), float(i))}, source / f"part-{i:02d}.pt")
    done = ckptz("compress", str(source), "-o", str(tmp_path / "a"))
    assert done.returncode == 0, done.stderr
    assert "30 files (-v lists each)" in done.stdout and "part-17.pt" not in done.stdout
    assert len(done.stdout.splitlines()) < 20
    every = ckptz("compress", str(source), "-o", str(tmp_path / "b"), "-v")
    assert all(f"part-{i:02d}.pt" in every.stdout for i in range(30))


def test_bench_prints_figures_people_read(small_checkpoint: Path) -> None:
    done = ckptz(
        "bench", str(small_checkpoint / "model.safetensors"), "--codecs", "ckptz-auto", "--storage-gbps", "1"
    )
    assert done.returncode == 0, done.stderr
    assert not re.search(r"\de[-+]\d", done.stdout), done.stdout
    assert "+0.00 " not in done.stdout and not done.stdout.rstrip().endswith("+0.00")


def test_nproc_reports_the_whole_runs_time(small_checkpoint: Path, tmp_path: Path) -> None:
    import time

    began = time.perf_counter()
    done = ckptz(
        "compress", str(small_checkpoint), "-o", str(tmp_path / "x.ckptz"), "--nproc", "2", timeout=300
    )
    wall = time.perf_counter() - began
    assert done.returncode == 0, done.stderr
    (reported,) = re.findall(r" in ([\d.]+) s", done.stdout)
    assert float(reported) >= 0.6 * wall, (reported, wall)


def test_the_progress_bar_keeps_its_figures_whole_at_80_columns(tmp_path: Path) -> None:
    """On a terminal (a pty here) 80 columns wide, long names in flight are cut short; the
    byte counts and the speed are never split or elided."""

    import torch

    source = tmp_path / "run"
    source.mkdir()
    for i in range(3):
        torch.save({"w": torch.randn(512, 1024)}, source / f"a-rather-long-checkpoint-file-name-{i}.pt")
    text = stderr_on_a_terminal("compress", str(source), "-o", str(tmp_path / "o"), "-T", "1", columns=80)
    bars = [s for s in text.split("\r") if "━" in s]
    assert bars, text
    for line in bars:
        assert "\n" not in line and len(line) <= 80, repr(line)
        assert re.search(r" [\d.]+/[\d.]+ [kMG]?B ", line), repr(line)


def test_file_names_stay_whole_at_80_columns(tmp_path: Path) -> None:
    """At 80 columns the per-file table shortens long paths by their middle folders and never
    splits a file's name across lines."""
    deep = tmp_path / "run" / "a-long-experiment-name" / "checkpoint-12000"
    deep.mkdir(parents=True)
    from safetensors.torch import save_file

    names = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    for name in names:
        save_file({"w": torch.randn(64, 64)}, str(deep / name))
    done = ckptz("compress", str(tmp_path / "run"), "-o", str(tmp_path / "out") + "/", env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), done.stdout
    for name in names:
        assert any(name in line for line in lines), done.stdout
