"""Runs with ``-o`` that can be finished: hard links, reruns after a stop, ``-f`` (issue 58, points 3-5)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import ckptz, tree_digests


@pytest.fixture
def linked(small_checkpoint: Path, tmp_path: Path) -> Path:
    """A checkpoint folder with a hard-linked plain file and a hard-linked checkpoint."""
    root = tmp_path / "hl2"
    shutil.copytree(small_checkpoint, root)
    (root / "x.txt").write_text("hello\n")
    os.link(root / "x.txt", root / "y.txt")
    os.link(root / "optimizer.pt", root / "optimizer-copy.pt")
    return root


def _inode(path: Path) -> int:
    return path.stat().st_ino


def test_hard_linked_plain_files_compress_and_restore_to_o(linked: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "hl2.ckptz"
    done = ckptz("compress", str(linked), "-o", str(out), "-q")
    assert done.returncode == 0, done.stderr
    assert _inode(out / "x.txt") == _inode(out / "y.txt")
    back = tmp_path / "back"
    done = ckptz("decompress", str(out), "-o", str(back), "-q")
    assert done.returncode == 0, done.stderr
    assert tree_digests(back) == tree_digests(linked)
    assert _inode(back / "x.txt") == _inode(back / "y.txt")


def test_excluded_hard_linked_checkpoints_are_copied_and_linked(linked: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = ckptz("compress", str(linked), "-o", str(out), "--exclude", "optimizer*.pt", "-q")
    assert done.returncode == 0, done.stderr
    assert _inode(out / "optimizer.pt") == _inode(out / "optimizer-copy.pt")
    back = tmp_path / "back"
    done = ckptz("decompress", str(out), "-o", str(back), "--exclude", "*.safetensors.ckptz", "-q")
    assert done.returncode == 0, done.stderr
    assert (back / "model.safetensors.ckptz").is_file()


@pytest.mark.parametrize("command", ["compress", "decompress"])
def test_a_rerun_skips_finished_outputs_and_finishes_the_rest(
    small_checkpoint: Path, tmp_path: Path, command: str
) -> None:
    """A run stopped midway leaves some outputs complete (each is renamed into place only
    once whole) and others missing; the same command again finishes the rest."""
    source = small_checkpoint
    if command == "decompress":
        source = tmp_path / "packed"
        assert ckptz("compress", str(small_checkpoint), "-o", str(source), "-q").returncode == 0
    out = tmp_path / "out"
    assert ckptz(command, str(source), "-o", str(out), "-q").returncode == 0
    kept = out / ("model.safetensors.ckptz" if command == "compress" else "model.safetensors")
    redo = out / ("optimizer.pt.ckptz" if command == "compress" else "optimizer.pt")
    redo.unlink()
    (out / "config.json").unlink()
    before = (_inode(kept), kept.stat().st_mtime_ns)
    again = ckptz(command, str(source), "-o", str(out))
    assert again.returncode == 0, again.stderr
    assert "done by an earlier run" in again.stderr
    assert (_inode(kept), kept.stat().st_mtime_ns) == before  # left as it was
    if command == "compress":
        checked = ckptz("verify", str(out), "--against", str(small_checkpoint), "--json")
        assert checked.returncode == 0, checked.stdout
    else:
        assert tree_digests(out) == tree_digests(small_checkpoint)


@pytest.mark.parametrize("command", ["compress", "decompress"])
def test_a_rerun_refuses_an_output_that_is_not_its_own(
    small_checkpoint: Path, tmp_path: Path, command: str
) -> None:
    source = tmp_path / "src"
    shutil.copytree(small_checkpoint, source)
    if command == "decompress":
        source = tmp_path / "packed"
        assert ckptz("compress", str(tmp_path / "src"), "-o", str(source), "-q").returncode == 0
    out = tmp_path / "out"
    assert ckptz(command, str(source), "-o", str(out), "-q").returncode == 0
    name = "optimizer.pt.ckptz" if command == "compress" else "optimizer.pt"
    if command == "compress":
        os.utime(source / "optimizer.pt")  # the source changed since
    else:
        with open(out / name, "r+b") as f:  # the output changed since (same size and mtime)
            st = os.fstat(f.fileno())
            f.seek(100)
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 1]))
        os.utime(out / name, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = ckptz(command, str(source), "-o", str(out))
    assert again.returncode == 2
    assert again.stderr.strip() == (
        f"ckptz: error: {out / name}: output already exists and is not this run's (remove it or pass --force)"
    )


@pytest.mark.parametrize("name", ["model.safetensors", "trainer_state.json"])
def test_a_rerun_refuses_an_output_whose_source_was_rewritten_with_its_size_and_mtime(
    small_checkpoint: Path, tmp_path: Path, name: str
) -> None:
    """The source is overwritten by another save of the same shape and its mtime set back
    (os.utime, as ``cp -p`` or ``rsync -t`` may leave it): its container (or copy) is stale
    and must not be taken as done; with ``-f`` the new bytes are written."""
    source = tmp_path / "src"
    shutil.copytree(small_checkpoint, source)
    out = tmp_path / "out"
    assert ckptz("compress", str(source), "-o", str(out), "-q").returncode == 0
    rewritten = source / name
    st = rewritten.stat()
    raw = bytearray(rewritten.read_bytes())
    raw[-3:] = bytes(b ^ 0x01 for b in raw[-3:])  # the last bytes, as a later save's
    rewritten.write_bytes(raw)
    os.utime(rewritten, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (rewritten.stat().st_size, rewritten.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)

    again = ckptz("compress", str(source), "-o", str(out))
    assert again.returncode == 2, again.stderr
    output = name + ".ckptz" if name.endswith(".safetensors") else name
    assert f"{output}: output already exists and is not this run's" in again.stderr, again.stderr
    assert ckptz("compress", str(source), "-o", str(out), "-f", "-q").returncode == 0
    checked = ckptz("verify", str(out), "--against", str(source))
    assert checked.returncode == 0, checked.stdout


def test_force_removes_containers_whose_sources_are_gone(small_checkpoint: Path, tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(small_checkpoint, source)
    (source / "sub").mkdir()
    shutil.copy(source / "rng_state.pth", source / "sub" / "extra.pth")
    out = tmp_path / "out"
    assert ckptz("compress", str(source), "-o", str(out), "-q").returncode == 0
    shutil.rmtree(source / "sub")
    (source / "optimizer.pt").unlink()
    (out / "mine.txt").write_text("the user's own file")
    again = ckptz("compress", str(source), "-o", str(out), "-f")
    assert again.returncode == 0, again.stderr
    assert "removed: its source is gone" in again.stderr
    assert not (out / "optimizer.pt.ckptz").exists() and not (out / "sub").exists()
    assert (out / "mine.txt").read_text() == "the user's own file"
    (out / "mine.txt").unlink()
    checked = ckptz("verify", str(out), "--against", str(source), "--json")
    assert checked.returncode == 0, checked.stdout
    assert json.loads(checked.stdout)["ok"]


def test_force_in_help_says_what_it_removes() -> None:
    text = " ".join(ckptz("compress", "--help").stdout.split())
    assert "whose sources are gone" in text and "a rerun skips the outputs an earlier run finished" in text


@pytest.mark.parametrize("command", ["compress", "decompress"])
def test_in_place_says_when_a_hard_link_outside_the_run_keeps_the_old_bytes(
    tmp_path: Path, command: str
) -> None:
    """In place, a file with a second name outside the folder given is replaced under the
    folder's name only: the other name keeps its bytes (nothing lost), and the run says so
    rather than break the link silently; links within the folder are kept as links."""
    import numpy as np
    from safetensors.numpy import save_file

    run = tmp_path / "run"
    run.mkdir()
    save_file({"w": np.arange(4096, dtype=np.float32)}, str(run / "model.safetensors"))
    save_file({"m": np.ones(4096, dtype=np.float32)}, str(run / "inside.safetensors"))
    os.link(run / "inside.safetensors", run / "inside-too.safetensors")
    if command == "decompress":
        assert ckptz("compress", str(run), "--in-place", "-q").returncode == 0
    linked = run / ("model.safetensors" + (".ckptz" if command == "decompress" else ""))
    outside = tmp_path / "snapshot"
    os.link(linked, outside)
    kept = outside.read_bytes()

    done = ckptz(command, str(run), "--in-place", "--json")
    assert done.returncode == 0, done.stderr
    line = f"{linked.name}: another hard link to it lies outside what this run was given"
    assert line in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert any(n.startswith(line) for n in json.loads(done.stdout)["notices"])
    assert done.stderr.count("hard link") == 1, done.stderr  # the names inside are not told of
    assert outside.read_bytes() == kept and outside.stat().st_nlink == 1
    assert not linked.exists()
