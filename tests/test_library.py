"""The Python library: ckptz.save/load (torch-shaped), ckptz.open, save_file/load_file/safe_open.

Containers are made both by the library and by the CLI's path (``api.compress``); every read
is compared with the original file or with what torch/safetensors load from it.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.torch
import torch
from conftest import CLI_ENV
from hypothesis import given, settings
from hypothesis import strategies as st

import ckptz
from ckptz import api
from ckptz.container import FOOTER, index_bytes, read_index
from ckptz.digest import Digest
from ckptz.errors import CkptzError, ContainerError, CorruptionError, FormatError, UsageError
from ckptz.library import ContainerReader, is_container

# -- helpers --------------------------------------------------------------------------------


def assert_same(a: Any, b: Any, where: str = "obj") -> None:
    """Equal structure and types; tensors equal bit for bit, with the same dtype and shape."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device), where
        if a.is_quantized:
            a, b = a.int_repr(), b.int_repr()
        assert torch.equal(_bits(a), _bits(b)), where
    elif isinstance(a, dict):
        assert type(a) is type(b) and list(a) == list(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.TypedStorage | torch.UntypedStorage):
        assert type(a) is type(b) and a.tolist() == b.tolist(), where
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), where
    else:
        assert a == b, where


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def state() -> dict[str, Any]:
    """A small state dict: several dtypes, nesting, a shared storage, plain values."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 48, generator=gen)
    return {
        "model": {"w": w, "w_t": w.t(), "b": torch.randn(48, generator=gen).bfloat16()},
        "opt": {"step": torch.tensor(7), "m": torch.randn(64, 48, generator=gen).half()},
        "ids": torch.arange(10, dtype=torch.int8),
        "mask": torch.rand(5, generator=gen) > 0.5,
        "z": torch.randn(3, generator=gen).to(torch.complex64),
        "empty": torch.zeros(0, 3),
        "meta": ["epoch", 3, 0.5, None, (1, 2)],
    }


def tensors() -> dict[str, torch.Tensor]:
    """Tensors for safetensors: a large one over several frames and small ones of many dtypes."""
    gen = torch.Generator().manual_seed(1)
    return {
        "big": torch.randn(3072, 1024, generator=gen),  # 12 MiB: three 4 MiB frames
        "small": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "bf16": torch.randn(17, 5, generator=gen).bfloat16(),
        "fp16": torch.randn(9, generator=gen).half(),
        "i8": torch.randint(-100, 100, (33,), generator=gen, dtype=torch.int8),
        "flag": torch.tensor([True, False, True]),
        "f8": torch.randn(12, generator=gen).to(torch.float8_e4m3fn),
        "scalar": torch.tensor(2.5),
        "none": torch.zeros(0, 4),
    }


class Evil:
    """Unpickling this makes a folder: if the marker appears, a pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


def cli_container(src: Path, tmp: Path) -> Path:
    """``src`` compressed as ``ckptz compress`` does it."""
    out = tmp / (src.name + ".ckptz")
    api.compress(src, out, device="cpu", threads=2)
    return out


def damage(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x10]))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Originals and their containers, made once: ``pt`` (torch.save, with several streams of
    several frames) and ``st`` (safetensors), each with a CLI-made container."""
    root = tmp_path_factory.mktemp("library")
    gen = torch.Generator().manual_seed(2)
    obj = {
        **state(),
        "big": torch.randn(640, 1024, generator=gen),  # 2.5 MiB of fp32
        "half": torch.randn(700, 1024, generator=gen).bfloat16(),  # 1.4 MiB of bf16
    }
    pt = root / "optimizer.pt"
    torch.save(obj, pt)
    st_path = root / "model.safetensors"
    safetensors.torch.save_file(tensors(), st_path, metadata={"format": "pt", "note": "ckptz"})
    return {
        "pt": pt,
        "pt.ckptz": cli_container(pt, root),
        "st": st_path,
        "st.ckptz": cli_container(st_path, root),
    }


# -- ckptz.save -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["model.pt", "model.pt.ckptz"])
def test_save_writes_exactly_torch_saves_bytes(tmp_path: Path, name: str) -> None:
    obj = state()
    ours, theirs = tmp_path / "ours" / name, tmp_path / "theirs" / name.removesuffix(".ckptz")
    ours.parent.mkdir()
    theirs.parent.mkdir()
    ckptz.save(obj, ours, device="cpu")
    # The file's name is part of the bytes (the zip archive's name): a container holds what
    # torch.save writes under its name less ".ckptz".
    torch.save(obj, theirs)
    assert is_container(ours)
    with ckptz.open(ours) as f:
        assert isinstance(f, ContainerReader)
        assert f.read() == theirs.read_bytes()
    # The CLI restores it to the same bytes, and nothing was left beside it.
    api.decompress(ours, tmp_path / "restored", device="cpu")
    assert (tmp_path / "restored").read_bytes() == theirs.read_bytes()
    assert sorted(p.name for p in ours.parent.iterdir()) == [name]


def test_save_to_a_file_object_writes_torch_saves_bytes(tmp_path: Path) -> None:
    obj = state()
    theirs = io.BytesIO()
    torch.save(obj, theirs)
    ours = io.BytesIO(b"head")
    ours.seek(4)
    ckptz.save(obj, ours, device="cpu")
    ours.seek(4)  # written from the position it was at
    assert ckptz.load(ours)["ids"].tolist() == list(range(10))
    (tmp_path / "c.ckptz").write_bytes(ours.getvalue()[4:])
    with ckptz.open(tmp_path / "c.ckptz") as f:
        assert f.read() == theirs.getvalue()
    with open(tmp_path / "file.ckptz", "wb") as out:  # a real file, not at its start
        out.write(b"xy")
        ckptz.save(obj, out, device="cpu", _use_new_zipfile_serialization=False)
    legacy = io.BytesIO()
    torch.save(obj, legacy, _use_new_zipfile_serialization=False)
    (tmp_path / "legacy.ckptz").write_bytes((tmp_path / "file.ckptz").read_bytes()[2:])
    with ckptz.open(tmp_path / "legacy.ckptz") as f:
        assert f.read() == legacy.getvalue()


def test_save_failure_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "model.pt"
    target.write_bytes(b"old")
    with pytest.raises((pickle.PicklingError, AttributeError)):  # torch.save's own error
        ckptz.save({"f": lambda: 0}, target, device="cpu")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]
    with pytest.raises(UsageError):
        ckptz.save({}, tmp_path / "x.pt", device="tpu")


def test_save_to_a_device_writes_into_it(tmp_path: Path) -> None:
    """``torch.save(obj, "/dev/null")`` writes into the device; ckptz's writers replaced it
    with a regular file (as root: /dev/null broken for the whole machine). Tested on a
    device node of the test's own, never the real one."""
    import stat

    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    ckptz.save({"w": torch.ones(2)}, null, device="cpu")
    ckptz.save({"w": torch.ones(2)}, null, device="cpu", _use_new_zipfile_serialization=False)
    ckptz.save_file({"w": torch.ones(2)}, null, device="cpu")
    assert stat.S_ISCHR(null.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]


def test_save_through_a_symlink_keeps_the_link(tmp_path: Path) -> None:
    """``torch.save(obj, "latest.pt")`` with ``latest.pt -> step_100.pt`` writes step_100.pt
    and keeps the link; ckptz's writers replaced the link by a file."""
    (tmp_path / "theirs.pt").write_bytes(b"old")
    (tmp_path / "theirs_link.pt").symlink_to("theirs.pt")
    torch.save({"w": torch.ones(2)}, tmp_path / "theirs_link.pt")
    assert (tmp_path / "theirs_link.pt").is_symlink()
    writers = {
        "save": lambda p: ckptz.save({"w": torch.ones(2)}, p, device="cpu"),
        "save_file": lambda p: ckptz.save_file({"w": torch.ones(2)}, p, device="cpu"),
    }
    for name, write in writers.items():
        target, link = tmp_path / f"{name}.ckptz", tmp_path / f"latest_{name}.ckptz"
        target.write_bytes(b"old")
        link.symlink_to(target.name)
        write(link)
        assert link.is_symlink() and os.readlink(link) == target.name, name
        assert torch.equal(ckptz.load(target)["w"], torch.ones(2)), name
    dangling = tmp_path / "dangling.pt.ckptz"
    dangling.symlink_to("made.pt.ckptz")
    ckptz.save({"w": torch.ones(2)}, dangling, device="cpu")
    assert dangling.is_symlink() and (tmp_path / "made.pt.ckptz").is_file()


def test_save_over_a_private_file_keeps_it_private(tmp_path: Path) -> None:
    """``torch.save`` over an existing 0600 file writes into it, so it stays 0600; ckptz.save
    replaced it by a new file with the umask's bits (0644: readable by everyone)."""
    import stat

    for legacy in (False, True):
        theirs, ours = tmp_path / f"theirs{legacy}.pt", tmp_path / f"ours{legacy}.pt.ckptz"
        for f in (theirs, ours):
            f.write_bytes(b"old")
            f.chmod(0o600)
        torch.save({"w": torch.ones(2)}, theirs, _use_new_zipfile_serialization=not legacy)
        ckptz.save({"w": torch.ones(2)}, ours, device="cpu", _use_new_zipfile_serialization=not legacy)
        assert stat.S_IMODE(theirs.stat().st_mode) == 0o600
        assert stat.S_IMODE(ours.stat().st_mode) == 0o600, legacy
        assert torch.equal(ckptz.load(ours)["w"], torch.ones(2))
        back = tmp_path / f"back{legacy}.pt"
        api.decompress(ours, back, device="cpu")
        assert stat.S_IMODE(back.stat().st_mode) == 0o600


def test_save_into_a_missing_folder_fails_and_makes_no_folder(tmp_path: Path) -> None:
    """torch.save and safetensors' save_file refuse a path whose folder does not exist (a
    typo); ckptz's writers must too, every one, and leave no folder behind."""
    with pytest.raises(RuntimeError):
        torch.save({"w": torch.ones(2)}, tmp_path / "typo" / "model.pt")
    writers = {
        "save": lambda p: ckptz.save({"w": torch.ones(2)}, p, device="cpu"),
        "save legacy": lambda p: ckptz.save(
            {"w": torch.ones(2)}, p, device="cpu", _use_new_zipfile_serialization=False
        ),
        "save_file": lambda p: ckptz.save_file({"w": torch.ones(2)}, p, device="cpu"),
    }
    for name, write in writers.items():
        with pytest.raises(OSError, match="does not exist"):
            write(tmp_path / name / "model.pt.ckptz")
        assert not (tmp_path / name).exists(), name


# -- ckptz.load -----------------------------------------------------------------------------


def test_load_equals_torch_load_of_the_original(
    files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = torch.load(files["pt"], weights_only=True)
    for source in (files["pt.ckptz"], str(files["pt.ckptz"]), files["pt"]):
        assert_same(original, ckptz.load(source))
    loaded = ckptz.load(files["pt.ckptz"])
    assert (
        loaded["model"]["w_t"].untyped_storage().data_ptr()
        == loaded["model"]["w"].untyped_storage().data_ptr()
    )
    with open(files["pt.ckptz"], "rb") as f:
        assert_same(original, ckptz.load(f, map_location="cpu"))
    assert_same(original, ckptz.load(io.BytesIO(files["pt.ckptz"].read_bytes())))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    assert_same(original, ckptz.load(files["pt.ckptz"], mmap=True))
    assert not list((tmp_path / "tmp").iterdir())  # the mapped copy was unlinked


class _Pipe(io.RawIOBase):
    """A stream that cannot seek (stdin, a socket)."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        return self._data.readinto(b)


def test_load_from_a_stream_that_cannot_seek(files: dict[str, Path]) -> None:
    original = torch.load(files["pt"], weights_only=True)
    assert_same(original, ckptz.load(_Pipe(files["pt.ckptz"].read_bytes())))
    assert_same(original, ckptz.load(_Pipe(files["pt"].read_bytes())))


def test_load_never_runs_a_pickle_unless_asked(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    ckptz.save({"w": torch.ones(2), "evil": Evil(marker)}, tmp_path / "evil.pt", device="cpu")
    for f in (tmp_path / "evil.pt", io.BytesIO((tmp_path / "evil.pt").read_bytes())):
        with pytest.raises(pickle.UnpicklingError):
            ckptz.load(f)
        assert not marker.exists()
    with pytest.raises(pickle.UnpicklingError), ckptz.open(tmp_path / "evil.pt") as f:
        torch.load(f, weights_only=True)
    assert not marker.exists()
    ckptz.load(tmp_path / "evil.pt", weights_only=False)  # the caller trusts the file
    assert marker.is_dir()


def test_load_with_weights_only_none_runs_no_pickle(tmp_path: Path) -> None:
    """``weights_only=None`` is ``torch.load``'s own default (code that forwards its caller's
    argument passes it): it means the safe unpickler, as in torch.load, never the pickle."""
    marker = tmp_path / "pwned"
    ckptz.save({"w": torch.ones(2), "evil": Evil(marker)}, tmp_path / "evil.pt", device="cpu")
    for f in (tmp_path / "evil.pt", io.BytesIO((tmp_path / "evil.pt").read_bytes())):
        with pytest.raises(pickle.UnpicklingError):
            ckptz.load(f, weights_only=None)
        assert not marker.exists()
    ckptz.save({"w": torch.ones(2)}, tmp_path / "plain.pt", device="cpu")
    assert torch.equal(ckptz.load(tmp_path / "plain.pt", weights_only=None)["w"], torch.ones(2))


def test_torch_force_weights_only_load_holds_for_containers(tmp_path: Path) -> None:
    """``TORCH_FORCE_WEIGHTS_ONLY_LOAD=1`` makes torch.load refuse to run any pickle, even one
    its caller trusts; a container must be refused as the plain file is."""
    marker = tmp_path / "pwned"
    ckptz.save({"w": torch.ones(2), "evil": Evil(marker)}, tmp_path / "evil.pt", device="cpu")
    torch.save({"w": torch.ones(2), "evil": Evil(marker)}, tmp_path / "plain.pt")
    code = (
        "import ckptz, pickle, sys\n"
        "try:\n"
        "    ckptz.load(sys.argv[1], weights_only=False)\n"
        "except pickle.UnpicklingError:\n"
        "    print('refused')\n"
    )
    env = {**CLI_ENV, "TORCH_FORCE_WEIGHTS_ONLY_LOAD": "1"}
    for path in (tmp_path / "plain.pt", tmp_path / "evil.pt"):
        run = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == "refused", path
        assert not marker.exists(), path


@pytest.fixture(scope="module")
def corpus_containers(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from corpus import make_corpus

    root = tmp_path_factory.mktemp("corpus")
    make_corpus(root / "orig")
    api.compress(root / "orig", root / "packed", device="cpu", threads=2)
    return root / "orig", root / "packed"


def _outcome(load: Any) -> tuple[str, Any]:
    try:
        return "ok", load()
    except Exception as exc:
        return type(exc).__name__, None


@pytest.mark.filterwarnings("ignore")
def test_every_corpus_file_loads_as_torch_and_safetensors_load_it(
    corpus_containers: tuple[Path, Path],
) -> None:
    orig, packed = corpus_containers
    checked = 0
    for container in sorted(packed.rglob("*.ckptz")):
        original = orig / container.relative_to(packed).with_suffix("")
        if original.suffix == ".safetensors":
            assert_same(safetensors.torch.load_file(original), ckptz.load_file(container), str(original))
            checked += 1
            continue
        theirs = _outcome(lambda p=original: torch.load(p, weights_only=True))
        ours = _outcome(lambda p=container: ckptz.load(p))
        assert ours[0] == theirs[0], f"{original}: torch.load {theirs[0]}, ckptz.load {ours[0]}"
        if theirs[0] == "ok":
            assert_same(theirs[1], ours[1], str(original))
            checked += 1
    assert checked >= 20


# -- ckptz.open -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def opened(files: dict[str, Path]) -> Iterator[ContainerReader]:
    """One reader for every example, with a cache smaller than the file: reads meet cached
    and evicted frames alike."""
    with ckptz.open(files["pt.ckptz"], cache_bytes=3 << 20) as f:
        assert isinstance(f, ContainerReader)
        yield f


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 1.05), st.integers(-1, 3 << 20), st.sampled_from([0, 1, 2])), max_size=6)
)
def test_open_reads_any_range_like_the_original(
    files: dict[str, Path], opened: ContainerReader, ops: list[tuple[float, int, int]]
) -> None:
    f, original = opened, _original(files["pt"])
    f.seek(0)
    ref = io.BytesIO(original)
    for where, size, whence in ops:
        target = int(where * len(original))
        offset = {0: target, 1: target - ref.tell(), 2: target - len(original)}[whence]
        assert f.seek(offset, whence) == ref.seek(offset, whence)
        assert f.read(size) == ref.read(size)
        assert f.tell() == ref.tell()


@functools.cache
def _original(path: Path) -> bytes:
    return path.read_bytes()


def test_open_is_a_file_object_libraries_take(files: dict[str, Path]) -> None:
    original = files["pt"].read_bytes()
    with ckptz.open(files["pt.ckptz"]) as f:
        assert f.readable() and f.seekable() and not f.writable()
        assert zipfile.ZipFile(f).namelist() == zipfile.ZipFile(files["pt"]).namelist()
        f.seek(0)  # torch.load reads from the position, as it does with any file object
        assert_same(torch.load(files["pt"], weights_only=True), torch.load(f, weights_only=True))
        buf = np.zeros(1000, np.uint8)
        f.seek(-1000, os.SEEK_END)
        assert f.readinto(buf) == 1000 and buf.tobytes() == original[-1000:]
        assert f.read(10) == b""
        f.seek(len(original) + 5)
        assert f.read() == b""
        with pytest.raises(ValueError):
            f.seek(-1)
        f.seek(0)
        assert io.BufferedReader(f).read(100) == original[:100]
    with pytest.raises(ValueError):
        f.read(1)
    plain = ckptz.open(files["pt"])
    assert not isinstance(plain, ContainerReader) and plain.read() == original
    plain.close()
    with pytest.raises(UsageError):
        ckptz.open(files["pt.ckptz"], "wb")


def test_open_answers_as_a_file_opened_rb_does(files: dict[str, Path]) -> None:
    """What code written for ``open(p, "rb")`` calls: ``read(None)``, ``mode``, a write
    refused with ``io.UnsupportedOperation``, a float offset refused with ``TypeError``."""
    with open(files["pt"], "rb") as plain, ckptz.open(files["pt.ckptz"]) as ours:
        for f in (plain, ours):
            assert f.mode == "rb"
            assert f.read(5) == files["pt"].read_bytes()[:5]
            assert f.read(None) == files["pt"].read_bytes()[5:]
            assert f.read(None) == b""
            with pytest.raises(io.UnsupportedOperation):
                f.write(b"x")
            with pytest.raises(TypeError):
                f.seek(1.5)  # type: ignore[arg-type]
            assert f.tell() == len(files["pt"].read_bytes())


def test_open_decodes_only_the_frames_a_read_needs(files: dict[str, Path]) -> None:
    with ckptz.open(files["pt.ckptz"]) as f:
        assert isinstance(f, ContainerReader)
        frames = len(f.frames_over(0, f.size))
        assert frames >= 6
        f.seek(f.size // 2)
        f.read(100)
        assert f.stats.frames_decoded == len(f.frames_over(f.size // 2, 100)) <= 2
        f.seek(f.size // 2)
        f.read(100)  # from the cache
        assert f.stats.frames_decoded <= 2
        f.seek(0)
        assert len(f.read()) == f.size  # read in order: the whole-file digest is checked too
        assert f.stats.frames_decoded <= frames + 2


def test_open_checks_the_digest_of_a_file_read_in_order(files: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "digest.ckptz"
    shutil.copy(files["pt.ckptz"], bad)
    with open(bad, "r+b") as f:
        index = read_index(f, str(bad))
        index.header["source"].update(Digest(index.source_digest.kind, "0" * 32).to_json())
        f.seek(-FOOTER.size, os.SEEK_END)
        data_end = FOOTER.unpack(f.read(FOOTER.size))[0]
        f.truncate(data_end)
        f.seek(data_end)
        f.write(index_bytes(index, data_end))
    with ckptz.open(bad) as r:
        r.seek(1000)
        assert len(r.read()) == r.size - 1000  # not read from the start: no digest to check
        r.seek(0)
        with pytest.raises(CorruptionError, match="digest"):
            r.read()


FIXTURES = Path(__file__).parent.parent / "fixtures"
FROZEN = sorted(p for p in FIXTURES.glob("*/*.ckptz"))


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("container", FROZEN, ids=[f"{p.parent.name}/{p.name}" for p in FROZEN])
def test_frozen_containers_read_through_the_library(container: Path) -> None:
    expected = json.loads((container.parent / "manifest.json").read_text())[container.name]
    with ckptz.open(container) as f:
        assert isinstance(f, ContainerReader)
        backwards = b""
        for at in range(f.size, 0, -4096):  # from the end: no frame is read in order
            f.seek(max(0, at - 4096))
            backwards = f.read(at - max(0, at - 4096)) + backwards
        f.seek(0)
        whole = f.read()
    assert whole == backwards
    assert hashlib.sha256(whole).hexdigest() == expected["sha256"]
    if container.name.endswith(".safetensors.ckptz"):
        theirs = safetensors.torch.load(whole)
        assert_same(dict(sorted(theirs.items())), dict(sorted(ckptz.load_file(container).items())))
    else:
        theirs = _outcome(lambda: torch.load(io.BytesIO(whole), weights_only=True))
        ours = _outcome(lambda: ckptz.load(container))
        assert ours[0] == theirs[0]
        if theirs[0] == "ok":
            assert_same(theirs[1], ours[1])


# -- safetensors ----------------------------------------------------------------------------


def test_save_file_writes_safetensors_bytes(tmp_path: Path) -> None:
    t = tensors()
    ckptz.save_file(t, tmp_path / "ours.safetensors", metadata={"a": "b"}, device="cpu")
    safetensors.torch.save_file(t, tmp_path / "theirs.safetensors", metadata={"a": "b"})
    with ckptz.open(tmp_path / "ours.safetensors") as f:
        assert isinstance(f, ContainerReader)
        assert f.read() == (tmp_path / "theirs.safetensors").read_bytes()


def test_load_file_and_safe_open_equal_safetensors(files: dict[str, Path]) -> None:
    theirs = safetensors.torch.load_file(files["st"])
    for path in (files["st"], files["st.ckptz"]):
        assert_same(dict(sorted(theirs.items())), dict(sorted(ckptz.load_file(path).items())))
        with ckptz.safe_open(path, framework="pt") as f, safetensors.safe_open(files["st"], "pt") as ref:
            assert f.keys() == sorted(ref.keys())
            assert f.metadata() == ref.metadata()
            for k in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                assert_same(ref.get_tensor(k), f.get_tensor(k), k)


SLICES: list[Any] = [
    0,
    -1,
    slice(None),
    slice(1, 3),
    slice(5, 700, 7),
    slice(-4, None),
    slice(10, 2),
    (slice(2, 4), slice(None, 8)),
    (3, slice(1, 5)),
    (slice(None), 2),
    (..., 1),
]


def test_get_slice_equals_safetensors(files: dict[str, Path]) -> None:
    with ckptz.safe_open(files["st.ckptz"]) as f, safetensors.safe_open(files["st"], "pt") as ref:
        for name in ("big", "bf16", "small", "i8"):
            ours, theirs = f.get_slice(name), ref.get_slice(name)
            assert ours.get_shape() == theirs.get_shape()
            assert ours.get_dtype() == theirs.get_dtype()
            for index in SLICES:
                if isinstance(index, tuple) and len(ours.get_shape()) < 2:
                    continue
                expected = _outcome(lambda t=theirs, i=index: t[i])
                got = _outcome(lambda t=ours, i=index: t[i])
                assert got[0] == expected[0], f"{name}[{index}]"
                if expected[0] == "ok":
                    assert_same(expected[1], got[1], f"{name}[{index}]")
        with pytest.raises(IndexError):
            f.get_slice("small")[5]


def test_safe_open_decodes_only_the_frames_of_the_tensor(files: dict[str, Path]) -> None:
    with ckptz.safe_open(files["st.ckptz"]) as f:
        reader = f.file
        assert isinstance(reader, ContainerReader)
        total = len(reader.frames_over(0, reader.size))
        header = reader.stats.frames_decoded
        assert header >= 1
        small = f.get_tensor("small")
        stats = reader.stats
        begin, end = _range(files["st"], "small")
        assert stats.frames_decoded - header == len(reader.frames_over(begin, end - begin)) == 1
        assert total >= 5
        assert small.tolist() == [[0, 1, 2], [3, 4, 5]]
        before = reader.stats.frames_decoded
        f.get_slice("big")[:2]  # two rows of a 3-frame tensor
        assert reader.stats.frames_decoded - before == 1
        assert reader.stats.stored_bytes_read < files["st.ckptz"].stat().st_size / 2


def test_reading_tensors_in_order_decodes_each_frame_once(tmp_path: Path) -> None:
    """Tensors of two streams side by side (exp_avg and exp_avg_sq, 6 MiB each, 4 MiB
    frames), read one by one in file order through a two-frame cache: the frame a tensor
    shares with the next of its stream survives the other stream's reads in between, because
    frames a read covers whole are not kept."""
    gen = torch.Generator().manual_seed(3)
    moments = {}
    for layer in range(2):
        m = torch.randn(1536, 1024, generator=gen).mul_(1e-4)
        moments[f"{layer}.exp_avg"], moments[f"{layer}.exp_avg_sq"] = m, m * m
    path = tmp_path / "moments.safetensors"
    safetensors.torch.save_file(moments, path)
    container = cli_container(path, tmp_path)
    spans = sorted(_range(path, name) for name in moments)
    with ckptz.open(container, cache_bytes=8 << 20) as f:
        assert isinstance(f, ContainerReader)
        needed = {i for begin, end in spans for i in f.frames_over(begin, end - begin)}
        assert len(needed) >= 6 and len({f.frames_over(b, e - b)[0] for b, e in spans}) == 4
        for begin, end in spans:
            f.seek(begin)
            assert f.read(end - begin) == path.read_bytes()[begin:end]
        assert f.stats.frames_decoded == len(needed)


def _range(path: Path, name: str) -> tuple[int, int]:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    begin, end = json.loads(raw[8 : 8 + n])[name]["data_offsets"]
    return 8 + n + begin, 8 + n + end


def test_safe_open_from_threads(files: dict[str, Path]) -> None:
    theirs = safetensors.torch.load_file(files["st"])
    errors: list[BaseException] = []
    with ckptz.safe_open(files["st.ckptz"]) as f:

        def work(k: str) -> None:
            try:
                for _ in range(3):
                    assert_same(theirs[k], f.get_tensor(k), k)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(k,)) for k in theirs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors


def test_safe_open_refuses_what_is_not_safetensors(files: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(FormatError):
        ckptz.safe_open(files["pt.ckptz"])
    with pytest.raises(FormatError):
        ckptz.load_file(files["pt"])
    with pytest.raises(UsageError):
        ckptz.safe_open(files["st"], framework="tf")
    with pytest.raises(KeyError):
        ckptz.safe_open(files["st"]).get_tensor("missing")
    raw = files["st"].read_bytes()
    (n,) = np.frombuffer(raw[:8], "<u8")
    header = raw[8 : 8 + int(n)].replace(
        b'"small":{"dtype":"I64","shape":[2,3]', b'"small":{"dtype":"I64","shape":[9,3]'
    )
    (tmp_path / "bad.safetensors").write_bytes(raw[:8] + header + raw[8 + int(n) :])
    with pytest.raises(FormatError, match="disagree"):
        ckptz.safe_open(tmp_path / "bad.safetensors")


# -- damage ---------------------------------------------------------------------------------


def test_damaged_containers_raise_corruption(files: dict[str, Path], tmp_path: Path) -> None:
    for key in ("pt.ckptz", "st.ckptz"):
        bad = tmp_path / files[key].name
        shutil.copy(files[key], bad)
        with open(bad, "rb") as f:
            index = read_index(f, str(bad))
        chunk = int(np.argmax(index.chunks["size"]))  # a chunk of the largest tensor
        damage(bad, int(index.chunks["offset"][chunk]) + 3)
        with pytest.raises(CorruptionError):
            ckptz.load(bad) if key == "pt.ckptz" else ckptz.load_file(bad)
        with ckptz.open(bad) as f, pytest.raises(CorruptionError) as err:
            f.read()
        assert err.value.chunk == chunk
    with ckptz.safe_open(tmp_path / "model.safetensors.ckptz") as f:
        assert f.get_tensor("small").tolist() == [[0, 1, 2], [3, 4, 5]]  # other frames still read
        with pytest.raises(CorruptionError, match="big"):
            f.get_tensor("big")
    truncated = tmp_path / "t.ckptz"
    truncated.write_bytes(files["pt.ckptz"].read_bytes()[:-7])
    for attempt in (ckptz.load, ckptz.open, ckptz.load_file, ckptz.safe_open):
        with pytest.raises(ContainerError):
            attempt(truncated)


def test_damaged_padding_is_found(files: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "pad.ckptz"
    shutil.copy(files["st.ckptz"], bad)
    with open(bad, "rb") as f:
        index = read_index(f, str(bad))
    sizes, offsets = index.chunks["size"], index.chunks["offset"]
    padded = np.flatnonzero(sizes % 16)
    damage(bad, int(offsets[padded[0]] + sizes[padded[0]]))
    with pytest.raises(CkptzError, match="padding"), ckptz.open(bad) as f:
        f.read()


# -- packaging ------------------------------------------------------------------------------


def test_import_ckptz_stays_light_until_the_library_is_used() -> None:
    probe = (
        "import sys, ckptz\n"
        "assert 'torch' not in sys.modules\n"
        "ckptz.open\n"
        "print(sorted(m for m in ('torch', 'safetensors', 'rich', 'typer') if m in sys.modules))\n"
        "ckptz.load\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=CLI_ENV, check=True
    )
    assert out.stdout.strip() == "[]"
    assert {"save", "load", "open", "safe_open", "load_file", "save_file"} <= set(dir(ckptz))
    with pytest.raises(AttributeError):
        ckptz.nothing  # noqa: B018


def test_the_readmes_python_section_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    section = readme.split("## From Python", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CKPTZ_DEVICE", "cpu")
    scope: dict[str, Any] = {
        "model": torch.nn.Linear(4, 3),
        "tensors": {"lm_head.weight": torch.ones(3, 4), "embed.weight": torch.zeros(2000, 2)},
    }
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["w"].shape == (3, 4) and scope["rows"].shape == (1024, 2)


# -- GPU ------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_save_and_load(tmp_path: Path) -> None:
    obj = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in state().items()}
    ckptz.save(obj, tmp_path / "gpu.pt", device="cuda")
    (tmp_path / "ref").mkdir()
    torch.save(obj, tmp_path / "ref" / "gpu.pt")
    with ckptz.open(tmp_path / "gpu.pt", device="cuda") as f:
        assert f.read() == (tmp_path / "ref" / "gpu.pt").read_bytes()
    assert_same(
        torch.load(tmp_path / "ref" / "gpu.pt", map_location="cuda:0"),
        ckptz.load(tmp_path / "gpu.pt", map_location="cuda:0"),
    )
    t = {k: v.cuda() for k, v in tensors().items()}
    ckptz.save_file(t, tmp_path / "gpu.safetensors", device="cuda")
    back = ckptz.load_file(tmp_path / "gpu.safetensors", device="cuda:0")
    assert_same(dict(sorted(t.items())), dict(sorted(back.items())))  # safetensors orders its keys
