"""``ckptz verify`` compares trees: every case of issue 14, through the CLI in a subprocess."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import ckptz

from ckptz import api


@pytest.fixture
def packed(small_checkpoint: Path, tmp_path: Path) -> tuple[Path, Path]:
    """(the original folder, its compressed mirror), both private to the test."""
    src = tmp_path / "checkpoint-500"
    shutil.copytree(small_checkpoint, src)
    out = tmp_path / "checkpoint-500.ckptz"
    done = ckptz("compress", str(src), "-o", str(out), "-q")
    assert done.returncode == 0, done.stderr
    return src, out


def _verdicts(result_stdout: str) -> dict[str, dict[str, object]]:
    return {f["path"]: f for f in json.loads(result_stdout)["files"]}


def test_untouched_tree_is_byte_identical(packed: tuple[Path, Path]) -> None:
    src, out = packed
    done = ckptz("verify", str(out), "--against", str(src))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "byte-identical" in done.stdout
    data = json.loads(ckptz("verify", str(out), "--against", str(src), "--json").stdout)
    assert data["ok"] and data["counts"] == {"ok": 5}
    assert {f["path"] for f in data["files"]} == {
        "config.json",
        "model.safetensors.ckptz",
        "optimizer.pt.ckptz",
        "rng_state.pth.ckptz",
        "trainer_state.json",
    }


def test_container_deleted(packed: tuple[Path, Path]) -> None:
    src, out = packed
    (out / "optimizer.pt.ckptz").unlink()
    done = ckptz("verify", str(out), "--against", str(src))
    assert done.returncode == 1
    assert "byte-identical" not in done.stdout
    line = next(ln for ln in done.stdout.splitlines() if "optimizer.pt" in ln)
    assert "missing" in line
    verdicts = _verdicts(ckptz("verify", str(out), "--against", str(src), "--json").stdout)
    assert verdicts["optimizer.pt"]["status"] == "missing" and not verdicts["optimizer.pt"]["ok"]


def test_plain_file_changed(packed: tuple[Path, Path]) -> None:
    src, out = packed
    (out / "trainer_state.json").write_text('{"global_step": 501}')  # same length, one byte differs
    done = ckptz("verify", str(out), "--against", str(src))
    assert done.returncode == 1
    line = next(ln for ln in done.stdout.splitlines() if "trainer_state.json" in ln)
    assert "changed" in line and "byte 18" in line
    verdicts = _verdicts(ckptz("verify", str(out), "--against", str(src), "--json").stdout)
    assert verdicts["trainer_state.json"]["status"] == "changed"


def test_stray_file_added(packed: tuple[Path, Path]) -> None:
    src, out = packed
    (out / "notes.txt").write_text("scratch")
    (out / "empty").mkdir()
    done = ckptz("verify", str(out), "--against", str(src), "--json")
    assert done.returncode == 1
    verdicts = _verdicts(done.stdout)
    assert verdicts["notes.txt"]["status"] == "extra"
    assert verdicts["empty/"]["status"] == "extra"
    assert verdicts["model.safetensors.ckptz"]["status"] == "ok"


def test_original_changed_or_grown(packed: tuple[Path, Path]) -> None:
    """The comparison runs both ways: a change on the original's side fails too."""
    src, out = packed
    with open(src / "optimizer.pt", "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    (src / "added.bin").write_bytes(b"new")
    verdicts = _verdicts(ckptz("verify", str(out), "--against", str(src), "--json").stdout)
    assert verdicts["optimizer.pt.ckptz"]["status"] == "changed"
    assert "byte 100" in str(verdicts["optimizer.pt.ckptz"]["error"])
    assert verdicts["added.bin"]["status"] == "missing"


def test_both_forms_present_is_reported(packed: tuple[Path, Path]) -> None:
    src, out = packed
    shutil.copy(src / "optimizer.pt", out / "optimizer.pt")
    verdicts = _verdicts(ckptz("verify", str(out), "--against", str(src), "--json").stdout)
    assert verdicts["optimizer.pt.ckptz"]["status"] == "extra"
    assert "both restore to optimizer.pt" in str(verdicts["optimizer.pt.ckptz"]["error"])


def test_alone_checks_containers_and_lists_the_rest(packed: tuple[Path, Path]) -> None:
    _, out = packed
    done = ckptz("verify", str(out))
    assert done.returncode == 0, done.stdout
    assert "3 containers decode" in done.stdout and "2 not checked" in done.stdout
    data = json.loads(ckptz("verify", str(out), "--json").stdout)
    status = {f["path"]: f["status"] for f in data["files"]}
    assert status == {
        "config.json": "unchecked",
        "trainer_state.json": "unchecked",
        "model.safetensors.ckptz": "ok",
        "optimizer.pt.ckptz": "ok",
        "rng_state.pth.ckptz": "ok",
    }


def test_damaged_container_alone_and_against(packed: tuple[Path, Path]) -> None:
    src, out = packed
    target = out / "optimizer.pt.ckptz"
    data = bytearray(target.read_bytes())
    data[200] ^= 0x01
    target.write_bytes(bytes(data))
    for args in ((), ("--against", str(src))):
        done = ckptz("verify", str(out), *args, "--json")
        assert done.returncode == 1
        assert _verdicts(done.stdout)["optimizer.pt.ckptz"]["status"] == "damaged"


def test_quiet_lists_only_failures(packed: tuple[Path, Path]) -> None:
    src, out = packed
    (out / "rng_state.pth.ckptz").unlink()
    done = ckptz("verify", str(out), "--against", str(src), "-q")
    assert done.returncode == 1
    assert "rng_state.pth" in done.stdout and "config.json" not in done.stdout


def test_compares_in_place_without_writing(
    packed: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Containers are compared in a stream: verify opens no file for writing."""
    from ckptz import safeio

    src, out = packed

    def no_writes(*_a: object, **_k: object) -> None:
        raise AssertionError("verify wrote a file")

    monkeypatch.setattr(safeio, "_open_temp", no_writes)
    result = api.verify(out, against=src, device="cpu")
    assert result.ok and result.counts == {"ok": 5}


def test_single_file_against_file_or_folder(packed: tuple[Path, Path]) -> None:
    src, out = packed
    one = out / "model.safetensors.ckptz"
    assert ckptz("verify", str(one), "--against", str(src / "model.safetensors")).returncode == 0
    assert ckptz("verify", str(one), "--against", str(src)).returncode == 0
    assert ckptz("verify", str(one), "--against", str(src / "optimizer.pt")).returncode == 1


def test_a_fifo_that_compress_left_out_is_not_missing(small_checkpoint: Path, tmp_path: Path) -> None:
    """compress -o leaves a fifo out (it says so and exits 0); verify --against must not then
    fail the copy for it, and its footer counts only the files that matched."""
    import os

    src = tmp_path / "checkpoint-500"
    shutil.copytree(small_checkpoint, src)
    os.mkfifo(src / "events.fifo")
    out = tmp_path / "packed"
    done = ckptz("compress", str(src), "-o", str(out), "-q")
    assert done.returncode == 0, done.stderr
    assert not (out / "events.fifo").exists()
    done = ckptz("verify", str(out), "--against", str(src), "--json")
    assert done.returncode == 0, done.stdout
    verdicts = _verdicts(done.stdout)
    assert verdicts["events.fifo"]["status"] == "unchecked"
    assert json.loads(done.stdout)["counts"] == {"ok": 5, "unchecked": 1}
    done = ckptz("verify", str(out), "--against", str(src))
    assert " ".join(done.stdout.split()).endswith(
        f"5 files match {src}: byte-identical; 1 not checked (not regular files)"
    )
