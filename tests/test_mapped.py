"""Writes through shared mappings (:mod:`ckptz.mapped`): the same bytes and sizes as
``pwrite``, in parallel; a full file system is an error, never a ``SIGBUS``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import tree_digests

from ckptz import api, mapped, safeio

_ON_LINUX = sys.platform.startswith("linux")
needs_linux = pytest.mark.skipif(not _ON_LINUX, reason="mapped writes are Linux-only")


def _roots(tmp_path: Path) -> list[Path]:
    roots = [tmp_path]
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        roots.append(shm)
    return roots


def _file_in(tmp_path: Path, where: str, name: str) -> Path:
    """A file's path in the test's folder (``tmp``) or on ``/dev/shm`` (``shm``; skipped
    where there is none)."""
    roots = _roots(tmp_path)
    if where == "shm" and len(roots) < 2:
        pytest.skip("no writable /dev/shm")
    return (roots[0] if where == "tmp" else roots[1]) / f"ckptz-{name}-{os.getpid()}-{where}.bin"


def _in_threads(pieces: list[tuple[int, int]], write: Callable[[int, int], None], threads: int = 4) -> None:
    """``write(at, n)`` for every piece, the pieces dealt out to ``threads`` threads."""
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            for at, n in pieces[k::threads]:
                write(at, n)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors, errors


@needs_linux
@pytest.mark.parametrize("where", ["tmp", "shm"])
def test_threads_write_what_pwrite_would(tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _file_in(tmp_path, where, "mapped")
    monkeypatch.setattr(mapped, "MIN_BYTES", 64 << 10)
    monkeypatch.setattr(mapped, "STEP", 1 << 20)
    rng = np.random.default_rng(7)
    sizes = rng.integers(0, 3 << 20, 40)
    sizes[::5] = rng.integers(0, 64 << 10, sizes[::5].size)  # some under MIN_BYTES: pwrite
    data = rng.integers(0, 256, int(sizes.sum()), dtype=np.uint8)
    ends = np.cumsum(sizes)
    pieces = list(zip((ends - sizes).tolist(), sizes.tolist(), strict=True))
    rng.shuffle(pieces)  # out of order, as the pipeline's writers are
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        out = mapped.MappedOutput(fd)  # wherever it is used or not: the same bytes
        started = [0]
        lock = threading.Lock()

        def put(at: int, n: int) -> None:
            with lock:
                started[0] = max(started[0], at + n)
            view = memoryview(data[at : at + n])
            out.write([view[: n // 3], view[n // 3 :]], at)
            with lock:
                # Never longer than the end of a write begun: no reservation shows.
                assert os.fstat(fd).st_size <= started[0]

        _in_threads(pieces, put)
        assert os.fstat(fd).st_size == data.size
        out.write([memoryview(b"")], data.size + (8 << 20))  # nothing to write: no longer
        assert os.fstat(fd).st_size == data.size
        out.finish()
        st = os.fstat(fd)
        assert st.st_size == data.size
        assert st.st_blocks * 512 < data.size + (1 << 20)  # the reservation past the end given back
        assert os.pread(fd, data.size + 1, 0) == data.tobytes()
    finally:
        os.close(fd)
        path.unlink()


@needs_linux
@pytest.mark.parametrize("where", ["tmp", "shm"])
def test_a_file_of_known_size_is_written_through_windows(
    tmp_path: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Told its final size, the file is that long at once, and its space is reserved in the
    background; threads writing pieces of every size out of order, across windows, give the
    same bytes, each window mapped only once its space is reserved; each window is unmapped
    as soon as all of it is written."""
    path = _file_in(tmp_path, where, "windows")
    monkeypatch.setattr(mapped, "WINDOW", 256 << 10)
    monkeypatch.setattr(mapped, "STEP", 512 << 10)
    reserved = _record_reservations(monkeypatch)
    rng = np.random.default_rng(11)
    sizes = rng.integers(0, 600 << 10, 60)
    sizes[::3] = rng.integers(0, 300, sizes[::3].size)  # small pieces: copied too
    data = rng.integers(0, 256, int(sizes.sum()), dtype=np.uint8)
    ends = np.cumsum(sizes)
    pieces = list(zip((ends - sizes).tolist(), sizes.tolist(), strict=True))
    rng.shuffle(pieces)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        out = mapped.MappedOutput(fd)
        out.expect(data.size)
        assert os.fstat(fd).st_size == data.size
        open_windows: list[int] = []

        def put(at: int, n: int) -> None:
            view = memoryview(data[at : at + n])
            out.write([view[: n // 2], view[n // 2 :]], at)
            open_windows.append(len(out._windows))

        _in_threads(pieces, put)
        assert not out._windows  # every window written whole: all unmapped already
        assert 1 <= max(open_windows) < -(-data.size // mapped.WINDOW)  # some, never all at once
        out.finish()
        assert os.fstat(fd).st_size == data.size
        assert os.pread(fd, data.size + 1, 0) == data.tobytes()
        assert _covered(reserved, 0, data.size)  # every byte's space, once the reserving stopped
    finally:
        os.close(fd)
        path.unlink()


def _record_reservations(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every range :func:`mapped.reserve` reserved, as ``(start, end)``; a mapping of a
    file made while this is in force fails the test unless all of it was reserved first."""
    got: list[tuple[int, int]] = []
    real_reserve, real_mmap = mapped.reserve, mapped.mmap.mmap

    def reserve(fd: int, offset: int, length: int) -> None:
        real_reserve(fd, offset, length)
        got.append((offset, offset + length))

    def mapping(fd: int, length: int, *args: object, offset: int = 0, **kw: object) -> object:
        assert _covered(list(got), offset, offset + length), f"[{offset}, +{length}) mapped unreserved"
        return real_mmap(fd, length, *args, offset=offset, **kw)  # type: ignore[call-overload]

    monkeypatch.setattr(mapped, "reserve", reserve)
    monkeypatch.setattr(mapped.mmap, "mmap", mapping)
    return got


def _covered(ranges: list[tuple[int, int]], start: int, end: int) -> bool:
    """Whether ``ranges`` together cover ``[start, end)``."""
    at = start
    for a, b in sorted(ranges):
        if a > at:
            break
        at = max(at, b)
    return at >= end


@needs_linux
def test_a_window_the_background_could_not_reserve_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where reserving fails past some offset (the file system filled up after the restore
    began), the reserving thread stops, and a write into a window past it fails with the
    file system's error, its space never mapped; writes before it go through."""
    path = tmp_path / "f.bin"
    monkeypatch.setattr(mapped, "WINDOW", 64 << 10)
    monkeypatch.setattr(mapped, "STEP", 64 << 10)
    reserved = _record_reservations(monkeypatch)
    inner = mapped.reserve

    def full_past(fd: int, offset: int, length: int) -> None:
        if offset + length > 256 << 10:
            raise OSError(28, os.strerror(28))  # ENOSPC
        inner(fd, offset, length)

    monkeypatch.setattr(mapped, "reserve", full_past)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        out = mapped.MappedOutput(fd)
        out.expect(1 << 20)
        out.write([memoryview(b"a" * (128 << 10))], 0)
        with pytest.raises(OSError) as err:
            out.write([memoryview(b"b" * (64 << 10))], 512 << 10)
        assert err.value.errno == 28
        out.close()
        assert reserved and all(b <= 256 << 10 for _, b in reserved)
        assert os.pread(fd, 128 << 10, 0) == b"a" * (128 << 10)
    finally:
        os.close(fd)


@needs_linux
def test_a_known_size_beyond_the_free_space_fails_before_any_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``expect`` of more bytes than the file system has free raises ``ENOSPC`` at once: the
    file keeps its size, and nothing is reserved or mapped."""
    path = tmp_path / "f.bin"
    reserved = _record_reservations(monkeypatch)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        free = os.fstatvfs(fd)
        out = mapped.MappedOutput(fd)
        with pytest.raises(OSError) as err:
            out.expect(free.f_bavail * free.f_frsize + (1 << 30))
        assert err.value.errno == 28
        assert os.fstat(fd).st_size == 0 and not reserved and out.final is None
    finally:
        os.close(fd)


@needs_linux
def test_only_files_open_for_reading_and_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"")
    fd = os.open(path, os.O_WRONLY)
    try:
        assert mapped.open_output(fd) is None  # a shared writable mapping needs read access
    finally:
        os.close(fd)
    r, w = os.pipe()
    try:
        assert mapped.open_output(w) is None
    finally:
        os.close(r)
        os.close(w)
    fd = os.open(path, os.O_RDWR)
    try:
        assert (mapped.open_output(fd) is not None) == (mapped.file_system(fd) in mapped.FILE_SYSTEMS)
    finally:
        os.close(fd)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    from safetensors.numpy import save_file

    root = tmp_path / "ckpt"
    root.mkdir()
    rng = np.random.default_rng(3)
    save_file({"w": rng.standard_normal(600_000).astype(np.float32)}, str(root / "a.safetensors"))
    save_file({"b": (rng.standard_normal(300_000) * 1e-3).astype(np.float32)}, str(root / "b.safetensors"))
    return root


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A folder on tmpfs, where outputs are written through mappings."""
    shm = Path("/dev/shm")
    if not (_ON_LINUX and shm.is_dir() and os.access(shm, os.W_OK)):
        pytest.skip("no writable /dev/shm")
    where = Path(tempfile.mkdtemp(prefix="ckptz-test-", dir=shm))
    try:
        probe = os.open(where, os.O_RDONLY)
        try:
            if mapped.file_system(probe) not in mapped.FILE_SYSTEMS:
                pytest.skip("/dev/shm is not a tmpfs")
        finally:
            os.close(probe)
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


@needs_linux
def test_round_trips_through_mappings(folder: Path, shm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mapped, "MIN_BYTES", 0)
    monkeypatch.setattr(mapped, "STEP", 64 << 10)
    monkeypatch.setattr(mapped, "WINDOW", 64 << 10)  # restores: writes across windows
    copies = [0]
    real = mapped.MappedOutput._copy

    def count(self: mapped.MappedOutput, *args: object) -> None:
        copies[0] += 1
        real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(mapped.MappedOutput, "_copy", count)
    folder = Path(shutil.copytree(folder, shm_dir / "ckpt"))
    want = tree_digests(folder)
    packed, back = shm_dir / "packed", shm_dir / "back"
    api.compress(folder, packed, device="cpu")
    assert copies[0] > 0
    windows = [0]
    expect = mapped.MappedOutput.expect

    def sized(self: mapped.MappedOutput, size: int) -> None:
        windows[0] += 1
        expect(self, size)

    monkeypatch.setattr(mapped.MappedOutput, "expect", sized)
    api.decompress(packed, back, device="cpu")
    assert tree_digests(back) == want
    assert windows[0] == 2  # each restore written through windows
    api.compress(folder, in_place=True, device="cpu")  # read back from the mapped writes
    api.decompress(folder, in_place=True, device="cpu")
    assert tree_digests(folder) == want
    assert not [p for p in shm_dir.rglob("*") if safeio.is_temp(p)]
    assert not safeio._MAPPED  # every output's entry gone with its descriptor


_FULL = r"""
set -u
mount -t tmpfs -o size=4m ckptz-test "$1" || exit 77
"$PY" - "$1/out.bin" <<'EOF'
import errno, os, sys
from ckptz import mapped
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
out = mapped.open_output(fd)
assert out is not None, "tmpfs not mapped"
try:
    out.write([memoryview(bytes(1 << 20))], 0)
    out.write([memoryview(bytes(8 << 20))], 1 << 20)
except OSError as exc:
    print("error", errno.errorcode[exc.errno], os.fstat(fd).st_size)
else:
    print("no error")
fd = os.open(sys.argv[1] + ".sized", os.O_RDWR | os.O_CREAT, 0o600)
out = mapped.open_output(fd)
try:
    out.expect(8 << 20)
except OSError as exc:
    print("error", errno.errorcode[exc.errno], os.fstat(fd).st_size, len(out._windows))
else:
    print("no error")
EOF
"""


@needs_linux
def test_a_full_file_system_is_an_error_not_a_signal(tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = subprocess.run(
        ["unshare", "-rm", "sh", "-c", _FULL, "sh", str(mnt)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PY": sys.executable, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    if result.returncode == 77:
        pytest.skip(f"cannot mount a private tmpfs here: {result.stderr.strip()[:200]}")
    assert result.returncode == 0, result.stderr  # a SIGBUS would be -7 / 135
    assert result.stdout.split() == ["error", "ENOSPC", str(1 << 20), "error", "ENOSPC", "0", "0"], (
        result.stdout + result.stderr
    )


_BESIDE = r"""
set -u
mount -t tmpfs -o size=32m ckptz-test "$1" || exit 77
"$PY" - "$1" "$2" <<'EOF'
import shutil, sys
from pathlib import Path
from ckptz import api, mapped
from ckptz.errors import CkptzError
mapped.STEP = 30 << 20  # the tmpfs and the files scaled down by the same factor
out = Path(sys.argv[1]) / "out"
for attempt in range(4):
    # Then each output runs ahead into all the free space: only giving it back lets the others write.
    mapped.AHEAD_SHARE = 1 if attempt % 2 else 8
    try:
        api.compress(sys.argv[2], out, device="cpu", threads=2)
    except CkptzError as exc:
        print("error", exc)
        break
    shutil.rmtree(out)
else:
    print("fits")
EOF
"""


@needs_linux
def test_outputs_written_together_never_run_out_of_room_that_exists(tmp_path: Path) -> None:
    """Several outputs compressed at once to a tmpfs with room for all of them: each reserved
    :data:`~ckptz.mapped.STEP` ahead of its writes, and the first one's reservation left the
    others without room ("no space left on the device" in most runs, never with
    ``CKPTZ_MAPPED_WRITES=0``)."""
    import torch

    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    gen = torch.Generator().manual_seed(3)
    for i in range(4):  # 4 x 4 MB of noise (stored as it is): 16 MB for 32 MiB of room
        torch.save({"w": torch.randn(1_000_000, generator=gen)}, src / f"m{i}.pt")
    result = subprocess.run(
        ["unshare", "-rm", "sh", "-c", _BESIDE, "sh", str(mnt), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PY": sys.executable, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    if result.returncode == 77:
        pytest.skip(f"cannot mount a private tmpfs here: {result.stderr.strip()[:200]}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["fits"], result.stdout + result.stderr
