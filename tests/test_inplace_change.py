"""An in-place run replaces a file only if it is still the file it read, and two in-place runs
on overlapping trees never meet. Through the CLI, in subprocesses, as a user (or a trainer
saving beside a running ckptz) would meet them.

A run is held with SIGSTOP while its temp output exists (so it has read the file and has
neither renamed its output nor removed the file yet); the file is changed meanwhile; the
run is resumed with SIGCONT.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import ckptz, sha256
from test_jobs import _start

from ckptz.safeio import is_temp

#: float32 values per file: 8 MB, so a CPU run has its temp output for a good while.
VALUES = 2_000_000


def _save(path: Path, seed: int) -> None:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    save_file({"w": (rng.standard_normal(VALUES) * 0.02).astype(np.float32)}, str(path))


def _run_folder(tmp_path: Path) -> tuple[Path, Path]:
    """A run folder ``run/`` holding ``sub/model.safetensors``: the folder and the file."""
    work = tmp_path / "run"
    (work / "sub").mkdir(parents=True)
    x = work / "sub" / "model.safetensors"
    _save(x, 1)
    return work, x


def _temps(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if is_temp(p)]


def _hold_mid_write(folder: Path, *args: str) -> subprocess.Popen[str]:
    """Start ``ckptz ARGS`` and SIGSTOP it while it writes a temp output in ``folder``; the
    temp file still there once stopped proves it has renamed and removed nothing yet."""
    for _ in range(5):
        proc = _start(*args)
        end = time.monotonic() + 60
        while time.monotonic() < end and proc.poll() is None and not _temps(folder):
            time.sleep(0.001)
        if proc.poll() is None:
            proc.send_signal(signal.SIGSTOP)
            _wait_stopped(proc.pid)
            if _temps(folder):
                return proc
            proc.send_signal(signal.SIGCONT)
        proc.communicate(timeout=60)
        pytest.fail(f"the run ended before it could be held: {proc.stderr}")
    raise AssertionError("unreachable")


def _wait_stopped(pid: int) -> None:
    """Wait until every thread of ``pid`` has stopped (a signal is delivered asynchronously)."""
    end = time.monotonic() + 10
    while time.monotonic() < end:
        states = [
            (Path("/proc") / str(pid) / "task" / t / "stat").read_text().rsplit(")", 1)[1].split()[0]
            for t in os.listdir(f"/proc/{pid}/task")
        ]
        if all(state in "tTZX" for state in states):
            return
        time.sleep(0.001)
    raise AssertionError("the run did not stop")


def _changed_while_held(folder: Path, change: Callable[[], object], *args: str) -> str:
    """Run ``ckptz ARGS`` held mid-write in ``folder`` (:func:`_hold_mid_write`), ``change``
    a file meanwhile, and resume it: it must fail without a traceback, saying that a file
    changed during the run; its stderr."""
    proc = _hold_mid_write(folder, *args)
    try:
        change()
    finally:
        proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0, err
    assert "Traceback" not in err
    assert "changed during the run" in err, err
    return err


def _overwrite_same_size(path: Path, new: bytes) -> None:
    """Write new bytes over the file, in place (same inode, same size)."""
    with open(path, "r+b") as f:
        f.write(new)


def _rewrite(path: Path, new: bytes) -> None:
    """Truncate and write the file again, whole (same inode)."""
    path.write_bytes(new)


def _replace(path: Path, new: bytes) -> None:
    """Write a new file under a temp name and rename it over the file (``torch.save`` to a
    temp name, then a rename: what Lightning does for ``last.ckpt``)."""
    tmp = path.with_name(path.name + ".saving")
    tmp.write_bytes(new)
    os.replace(tmp, path)


CHANGES: dict[str, Callable[[Path, bytes], None]] = {
    "overwrite": _overwrite_same_size,
    "rewrite": _rewrite,
    "replace": _replace,
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_compress_in_place_keeps_a_file_changed_during_the_run(tmp_path: Path, change: str) -> None:
    work, x = _run_folder(tmp_path)
    _save(tmp_path / "new.safetensors", 2)  # the same structure, new values: same size
    new = (tmp_path / "new.safetensors").read_bytes()
    assert len(new) == x.stat().st_size

    err = _changed_while_held(
        work, lambda: CHANGES[change](x, new), "compress", str(work), "--in-place", "-q"
    )
    assert err.count("\n") == 1, err
    assert "sub/model.safetensors" in err, err
    assert x.read_bytes() == new  # the new file is untouched
    assert not (work / "sub" / "model.safetensors.ckptz").exists()
    assert _temps(work) == []

    # A rerun compresses the new bytes, and its container restores them exactly.
    assert ckptz("compress", str(work), "--in-place", "-q").returncode == 0
    assert not x.exists()
    assert ckptz("decompress", str(work), "--in-place", "-q").returncode == 0
    assert x.read_bytes() == new


def test_other_files_finish_beside_a_changed_one(tmp_path: Path) -> None:
    """Only the file that changed is kept back; the run still converts the others."""
    work = tmp_path / "run"
    work.mkdir()
    _save(work / "a.safetensors", 1)
    _save(work / "b.safetensors", 3)
    want_b = sha256(work / "b.safetensors")
    _save(tmp_path / "new.safetensors", 2)
    new = (tmp_path / "new.safetensors").read_bytes()

    changed: list[Path] = []

    def replace_one_in_flight() -> None:
        in_flight = {p.name.split(".ckptz-tmp-")[0].lstrip(".") for p in _temps(work)}
        changed.append(work / sorted(in_flight)[0].removesuffix(".ckptz"))
        _replace(changed[0], new)

    err = _changed_while_held(work, replace_one_in_flight, "compress", str(work), "--in-place", "-q")
    (target,) = changed
    assert target.name in err, err
    other = (work / "b.safetensors") if target.name == "a.safetensors" else (work / "a.safetensors")
    assert target.read_bytes() == new and not target.with_name(target.name + ".ckptz").exists()
    assert not other.exists() and other.with_name(other.name + ".ckptz").exists()
    assert ckptz("decompress", str(work), "--in-place", "-q").returncode == 0
    if other.name == "b.safetensors":
        assert sha256(other) == want_b


@pytest.mark.parametrize("change", ["overwrite both names", "replace the second name"])
def test_hard_linked_names_of_a_changed_file_are_kept(tmp_path: Path, change: str) -> None:
    """Two names of one file: a name whose file changed is kept, without a container (the
    second name is linked to the first's container, then removed, only while it is still
    the file read)."""
    work = tmp_path / "run"
    work.mkdir()
    a, b = work / "a.safetensors", work / "b.safetensors"
    _save(a, 1)
    os.link(a, b)
    old = a.read_bytes()
    _save(tmp_path / "new.safetensors", 2)
    new = (tmp_path / "new.safetensors").read_bytes()

    def make_change() -> None:
        if change == "overwrite both names":
            _overwrite_same_size(a, new)
        else:
            _replace(b, new)

    _changed_while_held(work, make_change, "compress", str(work), "--in-place", "-q")
    assert _temps(work) == []
    if change == "overwrite both names":
        assert a.read_bytes() == new and b.read_bytes() == new
        assert sorted(p.name for p in work.iterdir()) == ["a.safetensors", "b.safetensors"]
    else:
        # Renaming over ``b`` unlinked a name of ``a``'s file too (its ctime moved): ``a`` may
        # be reported with it; nothing is lost either way.
        assert b.read_bytes() == new and not (work / "b.safetensors.ckptz").exists()
        if (work / "a.safetensors.ckptz").exists():
            assert not a.exists()
            assert ckptz("decompress", str(work), "--in-place", "-q").returncode == 0
        assert a.read_bytes() == old and b.read_bytes() == new


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_decompress_in_place_keeps_a_container_changed_during_the_run(tmp_path: Path, change: str) -> None:
    work, x = _run_folder(tmp_path)
    assert ckptz("compress", str(work), "--in-place", "-q").returncode == 0
    # A container of new bytes of the same size (same structure, values of the same spread).
    other = tmp_path / "other"
    other.mkdir()
    _save(other / "model.safetensors", 2)
    want = sha256(other / "model.safetensors")
    assert ckptz("compress", str(other), "--in-place", "-q").returncode == 0
    new = (other / "model.safetensors.ckptz").read_bytes()
    container = work / "sub" / "model.safetensors.ckptz"
    if change == "overwrite" and len(new) != container.stat().st_size:
        new = new[: container.stat().st_size].ljust(container.stat().st_size, b"\0")

    err = _changed_while_held(
        work, lambda: CHANGES[change](container, new), "decompress", str(work), "--in-place", "-q"
    )
    assert err.count("\n") == 1, err
    assert "sub/model.safetensors.ckptz" in err, err
    assert container.read_bytes() == new  # the new container is untouched
    assert not x.exists()  # nothing restored from the old one
    assert _temps(work) == []
    if change != "overwrite" or new == (other / "model.safetensors.ckptz").read_bytes():
        # A rerun restores the new container's bytes exactly.
        assert ckptz("decompress", str(work), "--in-place", "-q").returncode == 0
        assert sha256(x) == want


@pytest.mark.parametrize("command", ["decompress", "compress"])
def test_a_file_saved_under_the_output_name_during_the_run_is_never_replaced(
    tmp_path: Path, command: str
) -> None:
    """A trainer saves ``X`` again while ``X.ckptz`` is restored in place (or some program
    writes ``X.ckptz`` while ``X`` is compressed): the newcomer is kept, byte for byte, and
    so is the file the run read; the run says so and exits 1."""
    work, x = _run_folder(tmp_path)
    container = work / "sub" / "model.safetensors.ckptz"
    if command == "decompress":
        want = sha256(x)
        assert ckptz("compress", str(work), "--in-place", "-q").returncode == 0
        source, output = container, x
    else:
        source, output = x, container
    kept = source.read_bytes()
    newcomer = b"saved by another program during the run"
    proc = _hold_mid_write(work, command, str(work), "--in-place", "-q")
    try:
        output.write_bytes(newcomer)
    finally:
        proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate(timeout=120)

    assert proc.returncode == 1, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert f"{output.name} appeared beside it during the run" in err, err
    assert output.read_bytes() == newcomer
    assert source.read_bytes() == kept
    assert _temps(work) == []
    if command == "decompress":
        output.unlink()  # the user keeps the container's bytes
        assert ckptz("decompress", str(work), "--in-place", "-q").returncode == 0
        assert sha256(x) == want


def _overlapping(tmp_path: Path) -> tuple[Path, Path]:
    """``a`` holding a container (``top``) and ``a/sub`` a plain checkpoint (``w``), 8 MB each."""
    a = tmp_path / "a"
    (a / "sub").mkdir(parents=True)
    _save(a / "top.safetensors", 1)
    assert ckptz("compress", str(a / "top.safetensors"), "-q").returncode == 0
    (a / "top.safetensors").unlink()
    _save(a / "sub" / "w.safetensors", 2)
    return a, a / "sub"


def _fails_at_once(*args: str) -> None:
    t0 = time.monotonic()
    second = ckptz(*args)
    assert time.monotonic() - t0 < 20
    assert second.returncode == 1, second.stderr
    assert "another ckptz run is working on this" in second.stderr, second.stderr
    assert second.stderr.count("\n") == 1, second.stderr


@pytest.mark.parametrize("via", ["path", "symlink"])
def test_in_place_run_inside_a_held_tree_fails_at_once(tmp_path: Path, via: str) -> None:
    """``decompress a --in-place`` is working; ``compress a/sub --in-place`` (or through a
    symlink to ``a/sub``) must not start beside it."""
    a, sub = _overlapping(tmp_path)
    inner = sub
    if via == "symlink":
        inner = tmp_path / "elsewhere" / "link"
        inner.parent.mkdir()
        inner.symlink_to(sub, target_is_directory=True)
    want = sha256(sub / "w.safetensors")
    first = _hold_mid_write(a, "decompress", str(a), "--in-place", "-q")
    try:
        _fails_at_once("compress", str(inner), "--in-place", "-q")
        assert sorted(p.name for p in sub.iterdir()) == ["w.safetensors"]
        assert sha256(sub / "w.safetensors") == want
    finally:
        first.send_signal(signal.SIGCONT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert (a / "top.safetensors").exists() and sha256(sub / "w.safetensors") == want


def _comparing(pid: int, container: Path, folder: Path) -> bool:
    """Whether ``pid`` holds its exclusive lock on ``folder`` and has ``container`` open
    (finishing a file a killed run left in both forms: comparing, no temp file anywhere)."""
    try:
        names = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return False
    inode = f":{folder.stat().st_ino} "
    locks = Path("/proc/locks").read_text().splitlines()
    held = any(f" WRITE {pid} " in line and inode in line for line in locks)
    return held and str(container) in names


def test_in_place_run_around_a_held_tree_fails_at_once(tmp_path: Path) -> None:
    """``compress a/sub --in-place`` is finishing a file a killed run left in both forms
    (comparing them: no temp file to trip over); ``decompress a --in-place`` must not
    start beside it (it would remove the container while the other removes the file)."""
    for _ in range(5):
        a, sub = _overlapping(tmp_path / str(time.monotonic_ns()))
        w = sub / "w.safetensors"
        assert ckptz("compress", str(w), "-q").returncode == 0  # both forms, as a kill leaves them
        container = w.with_name(w.name + ".ckptz")
        first = _start("compress", str(sub), "--in-place", "-q")
        end = time.monotonic() + 60
        while first.poll() is None and time.monotonic() < end and not _comparing(first.pid, container, sub):
            time.sleep(0.001)
        if first.poll() is None:
            first.send_signal(signal.SIGSTOP)
            _wait_stopped(first.pid)
            if _comparing(first.pid, container, sub) and not _temps(a):
                break
            first.send_signal(signal.SIGCONT)
        first.communicate(timeout=120)
    else:
        pytest.fail("the run could not be held while comparing")
    top = sha256(a / "top.safetensors.ckptz")
    want = sha256(w)
    try:
        _fails_at_once("decompress", str(a), "--in-place", "-q")
        assert sorted(p.name for p in a.iterdir()) == ["sub", "top.safetensors.ckptz"]
        assert sha256(a / "top.safetensors.ckptz") == top and w.exists() and container.exists()
    finally:
        first.send_signal(signal.SIGCONT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert sorted(p.name for p in sub.iterdir()) == ["w.safetensors.ckptz"]
    assert ckptz("decompress", str(a), "--in-place", "-q").returncode == 0
    assert sha256(w) == want


@pytest.mark.parametrize("command", ["decompress", "compress"])
def test_finishing_a_file_in_both_forms_keeps_both_if_the_kept_one_changes(
    tmp_path: Path, command: str
) -> None:
    """A killed run left ``X`` and ``X.ckptz``; the rerun compares them, and meanwhile the form
    it keeps is replaced (a trainer saves ``X`` again): the form it would remove is the only
    copy of the old bytes now, so both stay, and the run says which changed."""
    for attempt in range(5):
        work = tmp_path / str(attempt)
        work.mkdir()
        x = work / "model.safetensors"
        _save(x, 1)
        old = x.read_bytes()
        assert ckptz("compress", str(x), "-q").returncode == 0  # both forms, as a kill leaves them
        container = x.with_name(x.name + ".ckptz")
        kept, removed = (x, container) if command == "decompress" else (container, x)
        proc = _start(command, str(work), "--in-place", "-q")
        end = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < end and not _comparing(proc.pid, container, work):
            time.sleep(0.001)
        if proc.poll() is None:
            proc.send_signal(signal.SIGSTOP)
            _wait_stopped(proc.pid)
            if _comparing(proc.pid, container, work):
                break
            proc.send_signal(signal.SIGCONT)
        proc.communicate(timeout=120)
    else:
        pytest.fail("the run could not be held while comparing")
    before = removed.read_bytes()
    newcomer = b"saved again by another program"
    try:
        _replace(kept, newcomer)
    finally:
        proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert f"{kept.name}: changed during the run" in err, err
    assert kept.read_bytes() == newcomer
    assert removed.read_bytes() == before  # the old bytes, in the form the run would have removed
    if command == "decompress":
        kept.unlink()
        assert ckptz("decompress", str(work), "--in-place", "-q").returncode == 0
        assert x.read_bytes() == old
