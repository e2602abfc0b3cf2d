"""Refusals and streams, through the CLI in a subprocess: every input issue 14 found
mishandled now ends in the right output or in one clear line and a non-zero exit."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CLI_ENV, ckptz, sha256, tree_digests


@pytest.fixture
def work(small_checkpoint: Path, tmp_path: Path) -> Path:
    root = tmp_path / "checkpoint-500"
    shutil.copytree(small_checkpoint, root)
    return root


def _one_line_error(done: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptz: error: "), done.stderr
    return lines[0]


def test_decompress_of_a_non_container_is_an_error(work: Path, tmp_path: Path) -> None:
    line = _one_line_error(ckptz("decompress", str(work / "optimizer.pt"), "-o", str(tmp_path / "out")))
    assert "optimizer.pt" in line and "not a ckptz container" in line
    assert not (tmp_path / "out").exists()
    line = _one_line_error(ckptz("decompress", str(work)))  # a folder without containers
    assert "no .ckptz containers" in line


def test_compress_of_a_container_is_skipped_with_a_note(work: Path) -> None:
    assert ckptz("compress", str(work / "optimizer.pt"), "-q").returncode == 0
    container = work / "optimizer.pt.ckptz"
    before = sha256(container)
    done = ckptz("compress", str(container))
    assert done.returncode == 0, done.stderr
    assert "already a ckptz container" in done.stderr
    assert sha256(container) == before and not (work / "optimizer.pt.ckptz.ckptz").exists()


def test_dash_o_dash_streams_to_stdout(work: Path, tmp_path: Path) -> None:
    """`-o -` / `-c` stream one container or one restored file; `-` reads stdin (like zstd)."""
    cli = [sys.executable, "-m", "ckptz"]
    original = (work / "optimizer.pt").read_bytes()
    packed = subprocess.run(
        [*cli, "compress", str(work / "optimizer.pt"), "-o", "-"], capture_output=True, env=CLI_ENV
    )
    assert packed.returncode == 0, packed.stderr
    assert packed.stdout.startswith(b"CKPTZ\x00\r\n") and not (Path.cwd() / "-").exists()
    back = subprocess.run(
        [*cli, "decompress", "-", "-c"], input=packed.stdout, capture_output=True, env=CLI_ENV
    )
    assert back.returncode == 0, back.stderr
    assert back.stdout == original
    # A file container to stdout, and stdin to a file.
    assert ckptz("compress", str(work / "optimizer.pt"), "-q").returncode == 0
    out = subprocess.run(
        [*cli, "decompress", str(work / "optimizer.pt.ckptz"), "-c"], capture_output=True, env=CLI_ENV
    )
    assert out.returncode == 0 and out.stdout == original
    piped = subprocess.run(
        [*cli, "compress", "-", "-o", str(tmp_path / "s.ckptz")],
        input=original,
        capture_output=True,
        env=CLI_ENV,
    )
    assert piped.returncode == 0, piped.stderr
    back = subprocess.run(
        [*cli, "decompress", str(tmp_path / "s.ckptz"), "-o", str(tmp_path / "s.pt")],
        capture_output=True,
        env=CLI_ENV,
    )
    assert back.returncode == 0 and (tmp_path / "s.pt").read_bytes() == original
    # A folder cannot go down a pipe.
    _one_line_error(ckptz("compress", str(work), "-c"), 2)


def test_trailing_slash_names_a_folder(work: Path, tmp_path: Path) -> None:
    newdir = tmp_path / "newdir"
    done = ckptz("compress", str(work / "optimizer.pt"), "-o", f"{newdir}/", "-q")
    assert done.returncode == 0, done.stderr
    assert (newdir / "optimizer.pt.ckptz").is_file()
    restored = tmp_path / "restored"
    done = ckptz("decompress", str(newdir / "optimizer.pt.ckptz"), "-o", f"{restored}/", "-q")
    assert done.returncode == 0, done.stderr
    assert sha256(restored / "optimizer.pt") == sha256(work / "optimizer.pt")
    # Without the slash, -o names the file.
    assert ckptz("compress", str(work / "optimizer.pt"), "-o", str(tmp_path / "plain"), "-q").returncode == 0
    assert (tmp_path / "plain").is_file()


def _strict(text: str) -> object:
    def refuse(name: str) -> object:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_json_is_strict(work: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    done = ckptz("inspect", str(empty), "--json")
    assert done.returncode == 0 and _strict(done.stdout)["ratio"] is None  # type: ignore[index]
    (tmp_path / "zeros").mkdir()
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"z": np.zeros(0, np.float32)}, str(tmp_path / "zeros" / "empty.safetensors"))
    for args in (
        ("compress", str(tmp_path / "zeros"), "-o", str(tmp_path / "zeros.ckptz"), "--json"),
        ("inspect", str(tmp_path / "zeros.ckptz"), "--json"),
        ("compress", str(work), "--dry-run", "--json"),
    ):
        done = ckptz(*args)
        assert done.returncode == 0, done.stderr
        assert "Infinity" not in done.stdout and "NaN" not in done.stdout
        _strict(done.stdout)


def test_unknown_codec_lists_the_valid_ones(work: Path) -> None:
    line = _one_line_error(ckptz("compress", str(work), "--codec", "foo"), 2)
    assert "unknown codec 'foo'" in line and "auto, zstd, ans" in line and "GPU" not in line


def test_stale_container_is_named_with_the_fix(work: Path, tmp_path: Path) -> None:
    # A container of another file sits where optimizer.pt's would go.
    assert (
        ckptz(
            "compress", str(work / "rng_state.pth"), "-o", str(work / "optimizer.pt.ckptz"), "-q"
        ).returncode
        == 0
    )
    before = tree_digests(work)
    line = _one_line_error(ckptz("compress", str(work), "--in-place"), 2)
    assert "optimizer.pt.ckptz" in line and "stale" in line and "--force" in line
    assert tree_digests(work) == before  # nothing touched
    line = _one_line_error(ckptz("compress", str(work), "-o", str(tmp_path / "out")), 2)
    assert "optimizer.pt.ckptz" in line and "stale" in line
    done = ckptz("compress", str(work), "--in-place", "--force", "-q")
    assert done.returncode == 0, done.stderr
    assert ckptz("decompress", str(work), "--in-place", "-q").returncode == 0
    assert sha256(work / "optimizer.pt") == before["optimizer.pt"]


def test_nothing_matched_is_said_clearly(work: Path, tmp_path: Path) -> None:
    line = _one_line_error(ckptz("compress", str(work), "--include", "*.nomatch"))
    assert "--include '*.nomatch' matches no file" in line
    only_text = tmp_path / "notes"
    only_text.mkdir()
    (only_text / "a.txt").write_text("hello")
    line = _one_line_error(ckptz("compress", str(only_text)))
    assert "no checkpoint files" in line and "--include" in line
    line = _one_line_error(ckptz("compress", str(tmp_path / "ghost-*")))
    assert "pattern matches nothing" in line


def test_leftover_temps_beside_outputs_are_removed(work: Path, tmp_path: Path) -> None:
    # A killed run leaves temp files beside the outputs it was writing; the next run into the
    # same folder removes those of its own outputs (its containers and its copies), and no
    # other file, however it is named.
    from ckptz.safeio import TMP_MARK

    out = tmp_path / "out"
    assert ckptz("compress", str(work), "-o", str(out)).returncode == 0
    files = sorted(p.relative_to(work) for p in work.rglob("*") if p.is_file())
    converted = next(f for f in files if f.suffix in (".pt", ".safetensors", ".bin"))
    copied = next(f for f in files if f.suffix == ".json")
    left = [
        out / converted.parent / f".{converted.name}.ckptz{TMP_MARK}99999-0123abcd",
        out / copied.parent / f".{copied.name}{TMP_MARK}99999-89abcdef",
    ]
    kept = [out / f".unrelated.pt.ckptz{TMP_MARK}99999-0123abcd", out / f"notes{TMP_MARK}1-0123abcd.txt"]
    for p in left + kept:
        p.write_bytes(b"partial")
    done = ckptz("compress", str(work), "-o", str(out), "-f")
    assert done.returncode == 0, done.stderr
    assert not any(p.exists() for p in left)
    assert all(p.read_bytes() == b"partial" for p in kept)
    for p in kept:
        p.unlink()
    assert ckptz("verify", str(out), "--against", str(work)).returncode == 0
