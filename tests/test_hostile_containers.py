"""Hostile containers met by the library and the command line: damaged magic bytes,
re-sealed indexes with hostile field values, decompression bombs, and an output folder
swapped for a symlink during a run.

Command-line runs go through a child process whose address space is capped (``RLIMIT_AS``),
so bounded memory is enforced by the kernel.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import crafted
import numpy as np
import pytest
import torch

import ckptz
from ckptz import api
from ckptz.container import MAGIC
from ckptz.errors import CkptzError, CorruptionError

MEMORY_CAP = 3 << 30


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _cli(*args: str, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckptz", *args, "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_limit,
        env={**os.environ, "CKPTZ_DEVICE": "cpu"},
    )


def _one_line_error(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().count("\n") == 0, done.stderr


@pytest.fixture(scope="module")
def torch_container(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A torch.save zip of two tensors, compressed."""
    root = tmp_path_factory.mktemp("torch")
    torch.save({"w": torch.arange(4096, dtype=torch.float32), "b": torch.ones(64)}, root / "m.pt")
    api.compress(root / "m.pt", root / "m.pt.ckptz", device="cpu")
    return (root / "m.pt.ckptz").read_bytes()


def _library_outcome(path: Path) -> str:
    """What the public API does with ``path``: "ok", or the CkptzError class raised. Any
    other exception fails the test."""
    try:
        ckptz.load(path)
        with ckptz.open(path) as f:
            f.read()
    except CkptzError as exc:
        return type(exc).__name__
    return "ok"


# --- point 7: damaged magic and truncation -------------------------------------------------


@pytest.mark.parametrize("name", ["m.pt.ckptz", "model.pt"])
def test_every_bit_flip_of_the_magic_is_a_damaged_container(
    torch_container: bytes, tmp_path: Path, name: str
) -> None:
    """With one bit of the magic flipped, the library reports a damaged container, whatever
    the file's name, instead of handing the bytes to torch.load as a plain file."""
    path = tmp_path / name
    for bit in range(len(MAGIC) * 8):
        data = bytearray(torch_container)
        data[bit // 8] ^= 1 << (bit % 8)
        path.write_bytes(bytes(data))
        with pytest.raises(CorruptionError):
            ckptz.load(path)
        with pytest.raises(CorruptionError):
            ckptz.open(path).read()
        with open(path, "rb") as f, pytest.raises(CorruptionError):
            ckptz.load(f)


@pytest.mark.parametrize("name", ["m.pt.ckptz", "model.pt"])
def test_a_container_truncated_below_the_magic_is_damaged(
    torch_container: bytes, tmp_path: Path, name: str
) -> None:
    path = tmp_path / name
    # An empty file is a container only by its name.
    for n in range(0 if name.endswith(".ckptz") else 1, len(MAGIC)):
        path.write_bytes(torch_container[:n])
        with pytest.raises(CorruptionError):
            ckptz.load(path)
        with pytest.raises(CorruptionError):
            ckptz.open(path).read()


def test_a_container_with_its_header_wiped_is_found_by_its_footer(
    torch_container: bytes, tmp_path: Path
) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(b"\xff" * 16 + torch_container[16:])
    with pytest.raises(CorruptionError):
        ckptz.load(path)


def test_plain_files_still_load_as_themselves(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save({"w": torch.arange(3)}, path)
    assert torch.equal(ckptz.load(path)["w"], torch.arange(3))
    assert ckptz.open(path).read() == path.read_bytes()


# --- point 8: hostile index fields in the library ------------------------------------------

#: A value of every JSON type, and a few shapes of the right type with wrong contents.
HOSTILE_VALUES: list[Any] = [
    None,
    True,
    5,
    -1,
    2**70,
    1.5,
    "abc",
    "",
    [],
    {},
    {"a": 1},
    [5],
    ["a", "b"],
    [{"a": 1}],
    [[5]],
    [[None]],
    [["w"]] * 50,
]


#: The index fields the library reads: all but the metadata it does not restore and the
#: fields it takes from the tables themselves.
LIBRARY_FIELDS: list[tuple[str, ...]] = [
    f
    for f in crafted.HEADER_FIELDS
    if f
    not in {
        ("source", "mode"),
        ("source", "mtime_ns"),
        ("source", "xxh3_tree", "leaf"),
        ("source", "xxh3_tree", "digest"),
        ("streams", "0", "id"),
        ("streams", "0", "rotate"),
        ("streams", "0", "dtype"),
        ("counts", "segments"),
        ("counts", "chunks"),
    }
]


@pytest.mark.parametrize("field", LIBRARY_FIELDS, ids=lambda f: ".".join(f))
def test_hostile_index_fields_raise_ckptz_errors_in_the_library(
    torch_container: bytes, tmp_path: Path, field: tuple[str, ...]
) -> None:
    """Every hostile value of an index field the library reads, re-sealed with valid
    checksums, ends in a CkptzError from ckptz.load and ckptz.open: never a TypeError or a
    ValueError from deep inside."""
    path = tmp_path / "x.ckptz"
    for value in HOSTILE_VALUES:
        try:
            data = crafted.with_field(torch_container, field, value)
        except (KeyError, IndexError, TypeError, ValueError):
            continue  # the field's parent has no such member: nothing to set
        path.write_bytes(data)
        try:
            _library_outcome(path)
        except Exception as exc:  # the assertion: nothing but CkptzError escapes
            raise AssertionError(f"{'.'.join(field)} = {json.dumps(value)[:40]}: {exc!r}") from exc


# --- point 6: decompression bombs ----------------------------------------------------------


def test_a_bomb_of_gigabyte_frames_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    """544 bytes of 1 GiB constant frames (every checksum valid) claiming 8 GiB: verify and
    decompress under a 3 GiB address space end in one clean line, before any output."""
    bomb = crafted.write(tmp_path / "bomb.bin.ckptz", crafted.bomb(1 << 30, 8))
    _one_line_error(_cli("verify", str(bomb)))
    out = tmp_path / "out"
    _one_line_error(_cli("decompress", str(bomb), "-o", str(out)))
    assert not out.exists()
    with pytest.raises(CorruptionError):
        ckptz.open(bomb).read(16)


def test_a_bomb_within_the_frame_limit_verifies_in_bounded_memory(tmp_path: Path) -> None:
    """The largest frames the format allows, decoded under a 3 GiB address space: verify
    gives its verdict (the digest is not the zeros', so "damaged") without a traceback."""
    bomb = crafted.write(tmp_path / "bomb.bin.ckptz", crafted.bomb(64 << 20, 16))
    done = _cli("verify", str(bomb))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "damaged" in done.stdout + done.stderr


def test_a_bomb_larger_than_the_free_space_fails_before_writing(tmp_path: Path) -> None:
    """A restore checks the declared size against the file system's free space (on any
    file system) and writes nothing when it does not fit."""
    vfs = os.statvfs(tmp_path)
    frame = 64 << 20
    claim = 2 * vfs.f_blocks * vfs.f_frsize  # more than the whole file system holds
    bomb = crafted.write(tmp_path / "bomb.bin.ckptz", crafted.bomb(frame, claim // frame))
    out = tmp_path / "out"
    out.mkdir()
    before = shutil.disk_usage(tmp_path).free
    start = time.monotonic()
    done = _cli("decompress", str(bomb), "-o", str(out / "bomb.bin"))
    _one_line_error(done)
    assert "space" in done.stderr, done.stderr
    assert time.monotonic() - start < 60
    assert list(out.iterdir()) == []
    assert shutil.disk_usage(tmp_path).free >= before - (64 << 20)


def test_a_small_bomb_with_a_valid_digest_restores(tmp_path: Path) -> None:
    """Constant frames are legitimate: a bomb whose every check holds restores exactly."""
    bomb = crafted.write(tmp_path / "zeros.bin.ckptz", crafted.bomb(1 << 20, 8, digest=True))
    assert _cli("verify", str(bomb)).returncode == 0
    done = _cli("decompress", str(bomb), "-o", str(tmp_path / "zeros.bin"))
    assert done.returncode == 0, done.stderr
    data = np.fromfile(tmp_path / "zeros.bin", np.uint8)
    assert data.size == 8 << 20 and not data.any()


# --- point 3: an output folder swapped for a symlink during a run --------------------------


def _finished_outputs(out: Path) -> list[Path]:
    """Files a run has renamed to their final names under ``out`` (temp files are hidden)."""
    return [p for p in out.rglob("*.pt") if not p.name.startswith(".")] if out.is_dir() else []


def test_an_output_folder_swapped_for_a_symlink_mid_run_is_never_written_through(tmp_path: Path) -> None:
    """``decompress packed -o out`` is stopped after its first output appears; ``out/sub``
    is then replaced by a symlink to a decoy folder and the run resumed. Nothing may be
    written into the decoy: the run writes only into the real tree, or fails cleanly."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    rng = np.random.default_rng(5)
    torch.save({"w": torch.from_numpy(rng.standard_normal(40_000).astype(np.float32))}, src / "a.pt")
    for i in range(6):
        torch.save(
            {"w": torch.from_numpy(rng.standard_normal(40_000).astype(np.float32))}, src / "sub" / f"m{i}.pt"
        )
    packed = tmp_path / "packed"
    api.compress(src, packed, device="cpu")
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    out = tmp_path / "out"
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ckptz",
            "decompress",
            str(packed),
            "-o",
            str(out),
            "--device",
            "cpu",
            "--threads",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CKPTZ_DEVICE": "cpu"},
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _finished_outputs(out):
            time.sleep(0.001)
        child.send_signal(signal.SIGSTOP)
        moved = tmp_path / "real-sub"
        os.rename(out / "sub", moved)
        os.symlink(decoy, out / "sub")
        child.send_signal(signal.SIGCONT)
        _, stderr = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert list(decoy.iterdir()) == [], "files were written through the swapped link"
    assert "Traceback" not in stderr, stderr
    if child.returncode != 0:
        assert stderr.strip().count("\n") == 0, stderr
