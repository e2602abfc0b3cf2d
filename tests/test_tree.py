"""Selection: several sources and globs, --include/--exclude, checkpoints recognised by
content, and a clear message when nothing matched. Through the CLI in a subprocess."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import ckptz, sha256, tree_digests

from ckptz.formats import sniff
from ckptz.runs.tree import scan


@pytest.fixture
def runs(small_checkpoint: Path, tmp_path: Path) -> Path:
    """runs/checkpoint-1, runs/checkpoint-2 and an unrelated runs/logs."""
    root = tmp_path / "runs"
    for n in (1, 2):
        shutil.copytree(small_checkpoint, root / f"checkpoint-{n}")
    (root / "logs").mkdir()
    (root / "logs" / "train.log").write_text("loss 1.0\n")
    return root


def test_several_sources_and_a_glob(runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "packed"
    # The pattern as the shell leaves it when quoted: ckptz expands it itself.
    done = ckptz("compress", str(runs / "checkpoint-*"), "-o", str(out), "--json")
    assert done.returncode == 0, done.stderr
    files = sorted(f["path"] for f in json.loads(done.stdout)["files"])
    assert files == [
        f"checkpoint-{n}/{name}"
        for n in (1, 2)
        for name in ("model.safetensors", "optimizer.pt", "rng_state.pth")
    ]
    assert (out / "checkpoint-1" / "optimizer.pt.ckptz").is_file()
    assert (out / "checkpoint-2" / "config.json").is_file()
    assert not (out / "logs").exists()
    # Several sources given one by one, back again.
    back = tmp_path / "back"
    done = ckptz("decompress", str(out / "checkpoint-1"), str(out / "checkpoint-2"), "-o", str(back), "-q")
    assert done.returncode == 0, done.stderr
    for n in (1, 2):
        assert tree_digests(back / f"checkpoint-{n}") == tree_digests(runs / f"checkpoint-{n}")


def test_in_place_over_several_folders(runs: Path) -> None:
    want = tree_digests(runs)
    assert (
        ckptz(
            "compress", str(runs / "checkpoint-1"), str(runs / "checkpoint-2"), "--in-place", "-q"
        ).returncode
        == 0
    )
    assert sorted(p.name for p in (runs / "checkpoint-2").iterdir() if p.name.endswith(".ckptz")) == [
        "model.safetensors.ckptz",
        "optimizer.pt.ckptz",
        "rng_state.pth.ckptz",
    ]
    assert ckptz("decompress", str(runs / "checkpoint-*"), "--in-place", "-q").returncode == 0
    assert tree_digests(runs) == want


def test_include_and_exclude(runs: Path, tmp_path: Path) -> None:
    src = runs / "checkpoint-1"
    out = tmp_path / "only-optimizer"
    done = ckptz("compress", str(src), "-o", str(out), "--include", "optimizer*", "--json")
    assert done.returncode == 0, done.stderr
    assert [f["path"] for f in json.loads(done.stdout)["files"]] == ["optimizer.pt"]
    # What is not selected is carried over unchanged, so the tree still verifies.
    assert sha256(out / "model.safetensors") == sha256(src / "model.safetensors")
    assert ckptz("verify", str(out), "--against", str(src)).returncode == 0

    out2 = tmp_path / "no-rng"
    done = ckptz(
        "compress", str(src), "-o", str(out2), "--exclude", "rng_*", "--exclude", "*.safetensors", "--json"
    )
    assert done.returncode == 0, done.stderr
    assert [f["path"] for f in json.loads(done.stdout)["files"]] == ["optimizer.pt"]
    assert (out2 / "rng_state.pth").is_file() and not (out2 / "rng_state.pth.ckptz").exists()

    # --include chooses files whatever their content: a log file compressed on request.
    done = ckptz("compress", str(runs / "logs"), "-o", str(tmp_path / "logs"), "--include", "*.log", "-q")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "logs" / "train.log.ckptz").is_file()


def test_checkpoints_recognised_by_content(small_checkpoint: Path, tmp_path: Path) -> None:
    """A Hugging Face hub cache: suffix-less blobs, and snapshots of symlinks to them."""
    cache = tmp_path / "models--org--name"
    blobs = cache / "blobs"
    blobs.mkdir(parents=True)
    names = {"model.safetensors": "a1b2", "optimizer.pt": "c3d4", "config.json": "e5f6"}
    for name, blob in names.items():
        shutil.copy(small_checkpoint / name, blobs / blob)
    snap = cache / "snapshots" / "0123"
    snap.mkdir(parents=True)
    for name, blob in names.items():
        (snap / name).symlink_to(f"../../blobs/{blob}")
    kinds = {e.rel: e.kind for e in scan(cache).entries}
    assert kinds["blobs/a1b2"] == "checkpoint" and kinds["blobs/c3d4"] == "checkpoint"
    assert kinds["blobs/e5f6"] == "other" and kinds["snapshots/0123/model.safetensors"] == "symlink"
    want = tree_digests(cache)
    done = ckptz("compress", str(cache), "--in-place", "--json")
    assert done.returncode == 0, done.stderr
    assert sorted(f["path"] for f in json.loads(done.stdout)["files"]) == ["blobs/a1b2", "blobs/c3d4"]
    assert ckptz("decompress", str(cache), "--in-place", "-q").returncode == 0
    assert tree_digests(cache) == want
    assert sha256(snap / "model.safetensors") == sha256(small_checkpoint / "model.safetensors")


def test_sniff_formats(small_checkpoint: Path, tmp_path: Path) -> None:
    import pickle
    import zipfile

    def head(path: Path) -> tuple[bytes, int]:
        return path.read_bytes()[:64], path.stat().st_size

    assert sniff(*head(small_checkpoint / "optimizer.pt")) == "torch-zip"
    assert sniff(*head(small_checkpoint / "model.safetensors")) == "safetensors"
    (tmp_path / "plain.pkl").write_bytes(pickle.dumps({"a": 1}, protocol=4))
    assert sniff(*head(tmp_path / "plain.pkl")) == "pickle"
    with zipfile.ZipFile(tmp_path / "docs.zip", "w") as z:
        z.writestr("readme.txt", "not a checkpoint")
    assert sniff(*head(tmp_path / "docs.zip")) is None
    assert sniff(*head(small_checkpoint / "config.json")) is None


def test_nothing_matched_in_several_ways(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("x")
    for args, words in (
        (("compress", str(tmp_path / "docs")), "no checkpoint files"),
        (("decompress", str(tmp_path / "docs"), "-o", str(tmp_path / "o")), "no .ckptz containers"),
        (("compress", str(tmp_path / "docs"), "--include", "*.pt"), "matches no file"),
        (("compress", str(tmp_path / "nope-*")), "pattern matches nothing"),
        (("verify", str(tmp_path / "docs")), "no .ckptz containers"),
    ):
        done = ckptz(*args)
        assert done.returncode == 1, (args, done.stderr)
        assert words in done.stderr and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_a_file_named_twice_is_one_source(runs: Path, tmp_path: Path) -> None:
    """Overlapping arguments (the same file twice, a folder and a file in it) are each one
    job, never a collision of a file with itself; tables never label a file '/name'."""
    ckpt = runs / "checkpoint-1"
    want = tree_digests(ckpt)
    out = tmp_path / "packed"
    done = ckptz(
        "compress", str(ckpt / "optimizer.pt"), str(ckpt / "." / "optimizer.pt"), "-o", f"{out}/", "-q"
    )
    assert done.returncode == 0, done.stderr
    assert [p.name for p in out.iterdir()] == ["optimizer.pt.ckptz"]
    done = ckptz("compress", str(ckpt), str(ckpt / "optimizer.pt"), "--in-place", "-q")
    assert done.returncode == 0, done.stderr
    assert not (ckpt / "optimizer.pt").exists() and (ckpt / "optimizer.pt.ckptz").is_file()
    for command in ("inspect", "verify"):
        done = ckptz(command, ".", "optimizer.pt.ckptz", "rng_state.pth.ckptz", "--json", cwd=ckpt)
        assert done.returncode == 0, done.stderr
        labels = [f["path"] for f in json.loads(done.stdout)["files"]]
        assert labels and not [label for label in labels if label.startswith("/")], labels
    done = ckptz("decompress", str(ckpt), str(ckpt / "optimizer.pt.ckptz"), "--in-place", "-q")
    assert done.returncode == 0, done.stderr
    assert tree_digests(ckpt) == want
