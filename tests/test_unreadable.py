"""A file the user running ckptz cannot read is named on stderr with the reason, and the run
fails before doing anything unless ``--skip-unreadable`` asks to leave such files out
(compress, decompress and verify walk trees alike).

The tests run as root, who reads every file: each CLI run here is a root process without
the capabilities that bypass permission bits (``setpriv`` drops them), so a file of another
user with mode 0600 is as unreadable to it as a root-owned one is to an unprivileged user.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CLI_ENV, tree_digests

_DROP = "-dac_override,-dac_read_search"
#: Run a command as a process that permission bits apply to.
_UNPRIVILEGED = ["setpriv", f"--bounding-set={_DROP}", f"--inh-caps={_DROP}"]
_OTHER_USER = 65534


def _as_user(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_UNPRIVILEGED, sys.executable, "-m", "ckptz", *args, "--device", "cpu"],
        capture_output=True,
        text=True,
        env=CLI_ENV,
        timeout=120,
    )


def _lock_out(path: Path) -> None:
    """Make ``path`` readable by its owner only, another user."""
    os.chown(path, _OTHER_USER, _OTHER_USER)
    os.chmod(path, 0o600)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """``tree/model.pt`` (unreadable to the CLI runs) and ``tree/sub/other.pt``."""
    import torch

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv(1) to run ckptz as a user that permission bits apply to")
    root = tmp_path / "tree"
    (root / "sub").mkdir(parents=True)
    torch.save({"w": torch.arange(4096, dtype=torch.float32)}, root / "model.pt")
    torch.save({"w": torch.ones(4096)}, root / "sub" / "other.pt")
    probe = subprocess.run([*_UNPRIVILEGED, "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"setpriv cannot drop capabilities here: {probe.stderr[:200]!r}")
    return root


def test_compress_in_place_names_an_unreadable_checkpoint_and_fails(tree: Path) -> None:
    """It exited 0 and said nothing, the checkpoint left uncompressed."""
    _lock_out(tree / "model.pt")
    before = tree_digests(tree)
    done = _as_user("compress", str(tree), "--in-place")
    assert done.returncode == 1, done.stderr
    assert f"ckptz: {tree / 'model.pt'}: cannot be read (Permission denied)\n" in done.stderr
    assert "--skip-unreadable" in done.stderr and "Traceback" not in done.stderr
    assert tree_digests(tree) == before  # nothing was done


def test_skip_unreadable_converts_the_rest_and_still_names_it(tree: Path) -> None:
    _lock_out(tree / "model.pt")
    locked = (tree / "model.pt").read_bytes()
    done = _as_user("compress", str(tree), "--in-place", "--skip-unreadable", "--json")
    assert done.returncode == 0, done.stderr
    assert f"ckptz: {tree / 'model.pt'}: cannot be read (Permission denied); skipped\n" in done.stderr
    result = json.loads(done.stdout)
    assert result["skipped"] == [
        {"path": str(tree / "model.pt"), "reason": "cannot be read (Permission denied)"}
    ]
    assert [f["path"] for f in result["files"]] == ["sub/other.pt"]
    assert (tree / "sub" / "other.pt.ckptz").is_file() and not (tree / "sub" / "other.pt").exists()
    assert (tree / "model.pt").read_bytes() == locked


def test_decompress_and_verify_name_an_unreadable_container(tree: Path, tmp_path: Path) -> None:
    want = tree_digests(tree)
    packed = tmp_path / "packed"
    shutil.copytree(tree, packed)
    assert _as_user("compress", str(packed), "--in-place").returncode == 0
    _lock_out(packed / "model.pt.ckptz")
    line = f"ckptz: {packed / 'model.pt.ckptz'}: cannot be read (Permission denied)"

    refused = _as_user("decompress", str(packed), "-o", str(tmp_path / "out"))
    assert refused.returncode == 1 and line + "\n" in refused.stderr, refused.stderr
    assert not (tmp_path / "out").exists()
    skipped = _as_user("decompress", str(packed), "-o", str(tmp_path / "out"), "--skip-unreadable")
    assert skipped.returncode == 0 and line + "; skipped\n" in skipped.stderr, skipped.stderr
    assert tree_digests(tmp_path / "out") == {"sub/other.pt": want["sub/other.pt"]}

    for against in ((), ("--against", str(tree))):
        failed = _as_user("verify", str(packed), *against, "--json")
        assert failed.returncode == 1 and line + "\n" in failed.stderr, failed.stderr
        verdicts = {f["path"]: f["status"] for f in json.loads(failed.stdout)["files"]}
        assert verdicts == {"model.pt.ckptz": "unreadable", "sub/other.pt.ckptz": "ok"}
        passed = _as_user("verify", str(packed), *against, "--skip-unreadable")
        assert passed.returncode == 0 and line + "; skipped\n" in passed.stderr, passed.stderr
