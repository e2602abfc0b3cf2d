"""A full disk or a refused write mid-run: clean error, originals intact, nothing partial, rerun completes.

A full disk is a real one: a small tmpfs in a private user+mount namespace (made by
``unshare``, :func:`faults.on_small_tmpfs`), filled up to a few bytes, so every writer meets
the kernel's own ``ENOSPC``; the tests skip themselves where the kernel allows no such mount.
A refused write is an open of ``ckptz.safeio._open_temp`` (every output is made through it)
that raises EACCES.
"""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np
import pytest
from conftest import tree_digests
from faults import on_small_tmpfs

from ckptz import api, safeio
from ckptz.errors import WriteError


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


#: Runs in the namespace of a small tmpfs (``argv``: its mount point, the folder to work on,
#: ``in-place`` or the output folder, and the bytes to leave free): each step tried with
#: the file system full but those bytes, then again once the room is back; what each left
#: is printed as JSON.
_FULL_DISK_RUN = r"""
import json, shutil, sys
from pathlib import Path
from conftest import tree_digests
from faults import on_small_tmpfs
from faults import leave_free
from ckptz import api, safeio
from ckptz.errors import CkptzError

mnt, src, where, free = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
in_place = where == "in-place"
folder = Path(shutil.copytree(src, mnt / "ckpt")) if in_place else src
out = folder if in_place else mnt / where
seen = {}


def full(step, call):
    filler = leave_free(mnt, free)
    try:
        call()
        seen[step] = None
    except CkptzError as exc:
        seen[step] = [type(exc).__name__, str(exc)]
    seen[step + " temps"] = [str(p) for p in mnt.rglob("*") if safeio.is_temp(p)]
    seen[step + " files"] = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    made = [f for f in seen[step + " files"] if f.endswith(".ckptz")]
    seen[step + " verify"] = not made or api.verify(out, device="cpu").ok
    filler.unlink()


if in_place:
    full("compress", lambda: api.compress(folder, in_place=True, device="cpu"))
    api.compress(folder, in_place=True, device="cpu")
    full("decompress", lambda: api.decompress(folder, in_place=True, device="cpu"))
    api.decompress(folder, in_place=True, device="cpu")
    seen["after"] = tree_digests(folder)
else:
    full("compress", lambda: api.compress(folder, out, device="cpu"))
    api.compress(folder, out, device="cpu", force=True)  # -o refuses existing outputs without --force
    full("decompress", lambda: api.decompress(out, mnt / "back", device="cpu"))
    seen["restored"] = tree_digests(mnt / "back") if (mnt / "back").exists() else {}
    api.decompress(out, mnt / "back", device="cpu", force=True)
    seen["after"] = tree_digests(mnt / "back")
seen["source"] = tree_digests(src)
print(json.dumps(seen))
"""


def _on_a_full_disk(tmp_path: Path, folder: Path, where: str, free: int) -> dict[str, Any]:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = on_small_tmpfs(_FULL_DISK_RUN, 4 << 20, mnt, str(folder), where, str(free))
    assert result.returncode == 0, result.stdout + result.stderr
    return cast(dict[str, Any], json.loads(result.stdout.splitlines()[-1]))


#: Each container is about 200 KB and each original 240 KB: with less room than one, every
#: run fails at its first write or part way through one.
@pytest.mark.parametrize("free", [0, 100_000, 190_000])
def test_enospc_in_place(folder: Path, tmp_path: Path, free: int) -> None:
    want = tree_digests(folder)
    seen = _on_a_full_disk(tmp_path, folder, "in-place", free)
    for step in ("compress", "decompress"):
        assert seen[step] is not None, f"{step} fitted in {free} bytes"
        kind, message = seen[step]
        assert kind == "OutOfSpaceError" and "no space left" in message, seen[step]
        assert seen[f"{step} temps"] == []
        assert seen[f"{step} verify"]  # every container there is whole
    # Each original is either still there or has a verified container; never neither.
    for rel in want:
        if rel.endswith(".safetensors"):
            assert rel in seen["compress files"] or rel + ".ckptz" in seen["compress files"]
    assert {rel.removesuffix(".ckptz") for rel in seen["decompress files"]} == set(want)
    assert seen["after"] == want  # space freed: the reruns complete


def test_enospc_to_output_folder(folder: Path, tmp_path: Path) -> None:
    """Room for one or two of three outputs, written at once or one after another."""
    want = tree_digests(folder)
    seen = _on_a_full_disk(tmp_path, folder, "out", 300_000)
    for step in ("compress", "decompress"):
        assert seen[step] is not None and seen[step][0] == "OutOfSpaceError", seen[step]
        assert seen[f"{step} temps"] == []
    # Whatever is under a final name is complete: a container verifies, a restored file is exact.
    assert seen["compress verify"]
    assert all(want[rel] == digest for rel, digest in seen["restored"].items())
    assert seen["source"] == want
    assert seen["after"] == want


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
