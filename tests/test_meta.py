"""Metadata survives a round trip: permission bits, mtimes, owner (as root), empty folders,
symlinks and hard links, with -o and --in-place alike; containers are never more readable
than their sources. Each case runs the CLI in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from conftest import REPO, ckptz, sha256, tree_digests

from ckptz import api, safeio

MTIME_NS = 1_600_000_000_123_456_789


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def tree(small_checkpoint: Path, tmp_path: Path) -> Path:
    """A checkpoint folder with private files, fixed mtimes, an empty folder, links."""
    root = tmp_path / "checkpoint-500"
    shutil.copytree(small_checkpoint, root)
    os.chmod(root / "optimizer.pt", 0o600)
    os.chmod(root / "trainer_state.json", 0o640)
    os.chmod(root / "model.safetensors", 0o644)
    for p in root.iterdir():
        os.utime(p, ns=(MTIME_NS, MTIME_NS))
    (root / "logs" / "empty").mkdir(parents=True)
    os.chmod(root / "logs", 0o700)
    os.symlink("model.safetensors", root / "latest.safetensors")  # a link to a compressed file
    os.symlink("/etc/hostname", root / "outside")  # never followed
    os.link(root / "rng_state.pth", root / "rng_state.copy.pth")  # two names, one inode
    return root


def _check_restored(src: Path, back: Path) -> None:
    assert tree_digests(back) == tree_digests(src)
    for name in ("optimizer.pt", "trainer_state.json", "model.safetensors", "rng_state.pth"):
        assert _mode(back / name) == _mode(src / name), name
        assert (back / name).stat().st_mtime_ns == (src / name).stat().st_mtime_ns, name
    assert (back / "logs" / "empty").is_dir() and _mode(back / "logs") == 0o700
    assert os.readlink(back / "latest.safetensors") == "model.safetensors"
    assert sha256(back / "latest.safetensors") == sha256(src / "model.safetensors")  # resolves again
    assert os.readlink(back / "outside") == "/etc/hostname"
    assert (back / "rng_state.pth").stat().st_ino == (back / "rng_state.copy.pth").stat().st_ino


def test_round_trip_with_output_folders(tree: Path, tmp_path: Path) -> None:
    packed, back = tmp_path / "packed", tmp_path / "back"
    done = ckptz("compress", str(tree), "-o", str(packed), "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    # Hard links: compressed once, the second name linked to the first container.
    assert sorted(f["path"] for f in data["files"]) == [
        "model.safetensors",
        "optimizer.pt",
        "rng_state.copy.pth",
    ]
    assert (packed / "rng_state.pth.ckptz").stat().st_ino == (
        packed / "rng_state.copy.pth.ckptz"
    ).stat().st_ino
    # Containers: no more readable than their sources, and their mtimes.
    assert _mode(packed / "optimizer.pt.ckptz") == 0o600
    assert _mode(packed / "trainer_state.json") == 0o640
    assert (packed / "optimizer.pt.ckptz").stat().st_mtime_ns == MTIME_NS
    assert (packed / "logs" / "empty").is_dir() and _mode(packed / "logs") == 0o700
    assert (packed / "latest.safetensors").is_symlink()  # dangles until decompressed, as the original name
    assert ckptz("verify", str(packed), "--against", str(tree)).returncode == 0
    done = ckptz("decompress", str(packed), "-o", str(back))
    assert done.returncode == 0, done.stderr
    _check_restored(tree, back)


def test_round_trip_in_place(tree: Path, tmp_path: Path) -> None:
    pristine = tmp_path / "pristine"
    shutil.copytree(tree, pristine, symlinks=True)
    done = ckptz("compress", str(tree), "--in-place")
    assert done.returncode == 0, done.stderr
    assert _mode(tree / "optimizer.pt.ckptz") == 0o600
    assert (tree / "optimizer.pt.ckptz").stat().st_mtime_ns == MTIME_NS
    assert (tree / "rng_state.pth.ckptz").stat().st_ino == (tree / "rng_state.copy.pth.ckptz").stat().st_ino
    assert not (tree / "rng_state.pth").exists() and not (tree / "rng_state.copy.pth").exists()
    assert (tree / "logs" / "empty").is_dir()
    done = ckptz("decompress", str(tree), "--in-place")
    assert done.returncode == 0, done.stderr
    _check_restored(pristine, tree)
    assert not list(tree.rglob("*.ckptz"))


def test_outputs_are_created_private(tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Permissions are set at creation, not by a chmod afterwards: no window where a
    container of a 0600 file is readable by others."""
    real = safeio._open_temp
    seen: dict[str, int] = {}

    def spy(tmp: Path, mode: int = 0o666, folder: int | None = None):  # type: ignore[no-untyped-def]
        f = real(tmp, mode, folder)
        seen[tmp.name] = _mode(tmp)
        return f

    monkeypatch.setattr(safeio, "_open_temp", spy)
    old = os.umask(0)  # even with a permissive umask
    try:
        api.compress(tree, tmp_path / "packed", device="cpu")
    finally:
        os.umask(old)
    private = [m for name, m in seen.items() if name.startswith((".optimizer.pt", ".trainer_state.json"))]
    assert len(private) == 2 and all(m & 0o077 in (0, 0o040) for m in private), seen
    assert all(m & 0o007 == 0 for name, m in seen.items() if name.startswith(".optimizer.pt"))


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="only root can give files away")
def test_owner_is_kept_as_root(tree: Path, tmp_path: Path) -> None:
    os.chown(tree / "optimizer.pt", 1234, 5678)
    packed, back = tmp_path / "packed", tmp_path / "back"
    assert ckptz("compress", str(tree), "-o", str(packed)).returncode == 0
    assert (packed / "optimizer.pt.ckptz").stat().st_uid == 1234
    assert ckptz("decompress", str(packed), "-o", str(back)).returncode == 0
    st = (back / "optimizer.pt").stat()
    assert (st.st_uid, st.st_gid) == (1234, 5678)


def test_old_containers_still_restore(tmp_path: Path) -> None:
    """Format 1.0 containers (no metadata) restore byte-exact; the file gets default bits."""
    fixtures = REPO / "fixtures" / "v1.0"
    manifest = json.loads((fixtures / "manifest.json").read_text())
    work = tmp_path / "v1.0"
    shutil.copytree(fixtures, work)
    back = tmp_path / "back"
    done = ckptz("decompress", str(work), "-o", str(back))
    assert done.returncode == 0, done.stderr
    files = manifest.get("files", manifest)
    for name, info in files.items():
        digest = info["sha256"] if isinstance(info, dict) else info
        assert sha256(back / name.removesuffix(".ckptz")) == digest


@pytest.mark.parametrize("mtime_ns", [7_258_118_400_123_456_789, (1 << 63) - 1], ids=["2200", "2262"])
def test_any_mtime_the_kernel_takes_comes_back(small_checkpoint: Path, tmp_path: Path, mtime_ns: int) -> None:
    """A file's mtime anywhere in the signed 64-bit nanosecond range (where the file system
    keeps it) is restored, not only those before 2116."""
    src = tmp_path / "model.safetensors"
    shutil.copy(small_checkpoint / "model.safetensors", src)
    try:
        os.utime(src, ns=(mtime_ns, mtime_ns))
    except OSError:
        pytest.skip("this file system does not keep such a time")
    if src.stat().st_mtime_ns != mtime_ns:
        pytest.skip("this file system does not keep such a time")
    packed, back = tmp_path / "model.safetensors.ckptz", tmp_path / "back.safetensors"
    assert ckptz("compress", str(src), "-o", str(packed), "--device", "cpu").returncode == 0
    done = ckptz("decompress", str(packed), "-o", str(back), "--device", "cpu")
    assert done.returncode == 0, done.stderr
    assert back.stat().st_mtime_ns == mtime_ns
