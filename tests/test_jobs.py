"""Ctrl-C and SIGTERM stop a run within 2 s, remove temp files, say which files finished and
lose nothing; a second run on the same files fails at once. Through the CLI, in subprocesses.
(``bench/signals.py`` runs the longer random-instant campaign quoted in RELIABILITY.md.)"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import CLI_ENV, ckptz, tree_digests

from ckptz.safeio import is_temp


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six 8 MB checkpoint files: a run has several in flight for a while."""
    from safetensors.numpy import save_file

    root = tmp_path_factory.mktemp("signals") / "run"
    root.mkdir()
    rng = np.random.default_rng(7)
    for i in range(6):
        save_file(
            {"w": (rng.standard_normal(2_000_000) * 0.02).astype(np.float32)}, str(root / f"m{i}.safetensors")
        )
    (root / "config.json").write_text("{}")
    return root


def _temps(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if is_temp(p)]


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ckptz", *args],
        env=CLI_ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_temp(root: Path, proc: subprocess.Popen[str], timeout: float = 30) -> bool:
    """Wait until the run has a file in flight (a temp file exists); False if it ended first."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if _temps(root):
            return True
        time.sleep(0.002)
    return False


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
@pytest.mark.parametrize("command", ["compress", "decompress"])
def test_stop_with_files_in_flight(pristine: Path, tmp_path: Path, sig: int, code: int, command: str) -> None:
    work = tmp_path / "run"
    shutil.copytree(pristine, work)
    want = tree_digests(work)
    if command == "decompress":
        assert ckptz("compress", str(work), "--in-place", "-q").returncode == 0
    proc = _start(command, str(work), "--in-place")
    assert _wait_for_temp(work, proc), "the run ended before a file was in flight"
    sent = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    stopped_in = time.monotonic() - sent
    assert stopped_in < 2.0, stopped_in
    assert proc.returncode == code, err
    assert "stopped:" in err and ("files finished" in err or "file finished" in err), err
    assert "Traceback" not in err
    assert _temps(work) == []
    # Nothing lost: each file is there in one form or the other; the report is right.
    for rel in want:
        assert (work / rel).exists() or (work / (rel + ".ckptz")).exists(), rel
    models = [rel for rel in want if rel.endswith(".safetensors")]
    converted = sum((work / (rel + ".ckptz")).exists() == (command == "compress") for rel in models)
    reported = re.search(r"stopped: (\d+) files? finished", err)
    assert reported is not None and int(reported.group(1)) == converted, err
    # The same command finishes the job.
    assert ckptz(command, str(work), "--in-place", "-q").returncode == 0
    if command == "compress":
        assert ckptz("decompress", str(work), "--in-place", "-q").returncode == 0
    assert tree_digests(work) == want


def test_second_run_fails_at_once(pristine: Path, tmp_path: Path) -> None:
    work = tmp_path / "run"
    shutil.copytree(pristine, work)
    want = tree_digests(work)
    first = _start("compress", str(work), "--in-place", "-q")
    assert _wait_for_temp(work, first)
    first.send_signal(signal.SIGSTOP)  # hold the first run mid-work
    try:
        for args in (("--in-place",), ("-o", str(tmp_path / "copy"))):
            t0 = time.monotonic()
            second = ckptz("compress", str(work), *args)
            assert time.monotonic() - t0 < 10
            assert second.returncode == 1, second.stderr
            assert "another ckptz run is working on this" in second.stderr, second.stderr
            assert second.stderr.count("\n") == 1
    finally:
        first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=60) == 0
    assert ckptz("decompress", str(work), "--in-place", "-q").returncode == 0
    assert tree_digests(work) == want


def test_lock_is_held_on_the_folder(tmp_path: Path) -> None:
    """Any holder of the folder's lock (another ckptz) makes a run stop before it starts."""
    from safetensors.numpy import save_file

    work = tmp_path / "run"
    work.mkdir()
    save_file({"w": np.ones(10, np.float32)}, str(work / "m.safetensors"))
    fd = os.open(work, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        done = ckptz("compress", str(work), "--in-place")
        assert done.returncode == 1 and "another ckptz run" in done.stderr
        assert (work / "m.safetensors").exists() and not (work / "m.safetensors.ckptz").exists()
        fcntl.flock(fd, fcntl.LOCK_UN)
        fcntl.flock(fd, fcntl.LOCK_SH)  # a reader (verify, compress -o) does not block another reader
        assert ckptz("inspect", str(work)).returncode == 0
        assert ckptz("compress", str(work), "-o", str(tmp_path / "out"), "-q").returncode == 0
    finally:
        os.close(fd)
