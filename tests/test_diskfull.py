"""A full disk or a refused write mid-run: clean error, originals intact, nothing partial, rerun completes.

Faults are injected at ``ckptz.safeio._open_temp`` and ``ckptz.safeio.pwrite_all`` (every
output is written through them): writes that raise ENOSPC after a byte budget, or an open
that raises EACCES. A real small
filesystem (a tmpfs in a private user+mount namespace, made by ``unshare``) is used too
where the kernel allows it; the test skips itself where it does not.
"""

from __future__ import annotations

import errno
import io
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

import numpy as np
import pytest
from conftest import tree_digests

from ckptz import api, safeio
from ckptz.errors import OutOfSpaceError, WriteError


class _FullDisk(io.FileIO):
    """A temp file on a disk that fills up after ``budget`` more bytes (shared by all files)."""

    budget: ClassVar[list[int]] = [0]

    def write(self, data: Any) -> int:
        n = len(memoryview(data).cast("B"))
        if n > self.budget[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.budget[0] -= n
        return super().write(data)


def _full_disk_after(monkeypatch: pytest.MonkeyPatch, budget: int) -> None:
    _FullDisk.budget[0] = budget
    real = safeio.pwrite_all
    lock = threading.Lock()

    def open_temp(tmp: Path, mode: int = 0o666, folder: int | None = None) -> BinaryIO:
        # Readable too, as the real temp file is: a restore in place reads back what it writes.
        return io.BufferedWriter(_FullDisk(tmp, "x+"))

    def pwrite_all(fd: int, parts: Any, offset: int) -> None:
        n = sum(len(memoryview(p).cast("B")) for p in parts)
        with lock:
            if n > _FullDisk.budget[0]:
                raise OSError(errno.ENOSPC, "No space left on device")
            _FullDisk.budget[0] -= n
        real(fd, parts, offset)

    monkeypatch.setattr(safeio, "_open_temp", open_temp)
    monkeypatch.setattr(safeio, "pwrite_all", pwrite_all)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    from safetensors.numpy import save_file

    root = tmp_path / "ckpt"
    (root / "sub").mkdir(parents=True)
    rng = np.random.default_rng(3)
    for i, where in enumerate((root, root, root / "sub")):
        save_file({"w": rng.standard_normal(60_000).astype(np.float32)}, str(where / f"m{i}.safetensors"))
    (root / "notes.txt").write_text("kept as is")
    return root


def _leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if safeio.is_temp(p)]


@pytest.mark.parametrize("budget", [0, 100_000, 300_000, 500_000])
def test_enospc_in_place(folder: Path, monkeypatch: pytest.MonkeyPatch, budget: int) -> None:
    want = tree_digests(folder)
    _full_disk_after(monkeypatch, budget)
    with pytest.raises(OutOfSpaceError, match="no space left"):
        api.compress(folder, in_place=True, device="cpu")
    assert _leftovers(folder) == []
    # Each original is either still there or has a verified container; never neither.
    for rel in want:
        if rel.endswith(".safetensors"):
            assert (folder / rel).exists() or (folder / (rel + ".ckptz")).exists()
    monkeypatch.undo()  # space freed
    api.compress(folder, in_place=True, device="cpu")
    _full_disk_after(monkeypatch, budget)
    with pytest.raises(OutOfSpaceError):
        api.decompress(folder, in_place=True, device="cpu")
    assert _leftovers(folder) == []
    monkeypatch.undo()
    api.decompress(folder, in_place=True, device="cpu")
    assert tree_digests(folder) == want
    assert _leftovers(folder) == []


def test_enospc_to_output_folder(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    want = tree_digests(folder)
    out = tmp_path / "out"
    _full_disk_after(monkeypatch, 300_000)
    with pytest.raises(OutOfSpaceError):
        api.compress(folder, out, device="cpu")
    assert tree_digests(folder) == want
    assert _leftovers(out) == []
    # Whatever is under a final name is complete: it verifies.
    done = [p for p in out.rglob("*.ckptz")]
    if done:
        assert api.verify(out, device="cpu").ok
    monkeypatch.undo()
    api.compress(folder, out, device="cpu", force=True)  # -o refuses existing outputs without --force
    back = tmp_path / "back"
    api.decompress(out, back, device="cpu")
    assert tree_digests(back) == want


def test_eacces_on_destination(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    want = tree_digests(folder)

    def refuse(tmp: Path, mode: int = 0o666, folder: int | None = None) -> BinaryIO:
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp))

    monkeypatch.setattr(safeio, "_open_temp", refuse)
    with pytest.raises(WriteError, match="Permission denied"):
        api.compress(folder, in_place=True, device="cpu")
    with pytest.raises(WriteError):
        api.compress(folder, tmp_path / "out", device="cpu")
    assert tree_digests(folder) == want
    monkeypatch.undo()
    api.compress(folder, in_place=True, device="cpu")
    api.decompress(folder, in_place=True, device="cpu")
    assert tree_digests(folder) == want


def test_read_only_folder_for_real(folder: Path) -> None:
    import os

    if os.geteuid() == 0:
        pytest.skip("root ignores permission bits")
    want = tree_digests(folder)
    folder.chmod(0o555)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "ckptz", "compress", str(folder), "--in-place", "--device", "cpu"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        folder.chmod(0o755)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert tree_digests(folder) == want


_SMALL_FS = r"""
set -u
mnt="$1"; src="$2"
mount -t tmpfs -o size=6m ckptz-test "$mnt" || exit 77
cp -r "$src" "$mnt/ckpt"
# Leave too little room for even one container beside its original.
head -c $(( $(df -B1 --output=avail "$mnt" | tail -1) - 150000 )) /dev/zero > "$mnt/filler" 2>/dev/null
"$PY" -m ckptz compress "$mnt/ckpt" --in-place --device cpu; echo "first=$?"
find "$mnt/ckpt" -name '.*' | sed 's/^/leftover=/'
(cd "$mnt/ckpt" && find . -type f | sort | xargs sha256sum) | sed 's/^/during=/'
rm "$mnt/filler"
"$PY" -m ckptz compress "$mnt/ckpt" --in-place --device cpu > /dev/null; echo "second=$?"
"$PY" -m ckptz decompress "$mnt/ckpt" --in-place --device cpu > /dev/null; echo "third=$?"
(cd "$mnt/ckpt" && find . -type f | sort | xargs sha256sum) | sed 's/^/after=/'
"""


def test_small_filesystem(folder: Path, tmp_path: Path) -> None:
    """A real ENOSPC from a 6 MiB tmpfs, then a rerun once space is freed."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = subprocess.run(
        ["unshare", "-rm", "sh", "-c", _SMALL_FS, "sh", str(mnt), str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PY": sys.executable, "PATH": "/usr/bin:/bin", "CKPTZ_DEVICE": "cpu"},
    )
    if result.returncode == 77 or "first=" not in result.stdout:
        pytest.skip(f"cannot mount a private tmpfs here: {result.stderr.strip()[:200]}")
    lines = result.stdout.splitlines()
    get = {k: v for k, _, v in (line.partition("=") for line in lines if "=" in line and " " not in line[:8])}
    assert get["first"] == "1", result.stdout + result.stderr
    assert "no space left" in result.stderr and "Traceback" not in result.stderr
    assert not any(line.startswith("leftover=") for line in lines)
    assert get["second"] == "0" and get["third"] == "0", result.stderr
    want = tree_digests(folder)
    after = {
        line.split()[1].removeprefix("./"): line.split()[0].removeprefix("after=")
        for line in lines
        if line.startswith("after=")
    }
    assert after == want
    during = [line for line in lines if line.startswith("during=")]
    # Every original was still present (or replaced by a verified container) after the failure.
    assert during
