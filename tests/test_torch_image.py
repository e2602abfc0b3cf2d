"""``ckptz.library.torch_skeleton`` and ``torch_image``: the bytes ``torch.save`` writes,
served from its skip_data archive and the tensors themselves."""

from __future__ import annotations

import io
import itertools
import os
import pickle
import tempfile
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from corpus import _dtypes, _rng_state, _trained
from hypothesis import given, settings
from hypothesis import strategies as st

import ckptz
from ckptz.library import torch_skeleton
from ckptz.library.torch_image import Image
from ckptz.library.torch_skeleton import Unsupported, crc32_combine


def _read_whole(image: Image, threads: int = 4, piece: int = 1000) -> bytes:
    """The image's bytes, read in ``piece``-byte reads from several threads at once, as the
    pipeline reads it."""
    buf = bytearray(image.size)
    view = memoryview(buf)
    with ThreadPoolExecutor(threads) as pool:
        got = list(
            pool.map(lambda at: image.readinto([view[at : at + piece]], at), range(0, image.size, piece))
        )
    assert sum(got) == image.size
    return bytes(buf)


def _built(obj: Any, name: str, **kw: Any) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        return _read_whole(Image(torch_skeleton.skeleton(obj, Path(d), name, kw)), piece=1 << 16)


def _torch_saved(obj: Any, tmp_path: Path, name: str, **kw: Any) -> bytes:
    path = tmp_path / "torch" / name
    path.parent.mkdir(exist_ok=True)
    torch.save(obj, path, **kw)
    return path.read_bytes()


def _shared() -> dict[str, Any]:
    base = torch.arange(64, dtype=torch.float32)
    return {
        "base": base,
        "view": base[8:24],  # one storage, two tensors
        "strided": base.view(8, 8).t(),
        "storage": torch.arange(6, dtype=torch.uint8).untyped_storage(),
        "typed": torch.arange(5, dtype=torch.int16).storage(),  # a TypedStorage
        "empty": torch.empty(0),
        "empty2": torch.zeros(0, 3, dtype=torch.bfloat16),
        "scalar": torch.tensor(3.5),
        "nested": [[torch.ones(2, 2)], (torch.zeros(3),), {"x": None, "y": 1.5, "z": "text"}],
    }


def _optimizer() -> dict[str, Any]:
    model, opt, sched = _trained(torch.Generator().manual_seed(5))
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict()}


OBJECTS: dict[str, Callable[[], Any]] = {
    "dtypes": lambda: _dtypes(torch.Generator().manual_seed(3)),
    "shared": _shared,
    "optimizer": _optimizer,
    "rng": _rng_state,
    "no tensors": lambda: {"step": 7, "names": ["a", "b"]},
    "one tensor": lambda: torch.randn(1000, 33, generator=torch.Generator().manual_seed(4)),
    "module": lambda: torch.nn.Linear(5, 3),
    "sparse": lambda: {"s": torch.eye(4).to_sparse(), "csr": torch.eye(3).to_sparse_csr()},
}


@pytest.mark.parametrize("kind", sorted(OBJECTS))
@pytest.mark.parametrize("name", ["model.pt", "optimizer.pt.ckptz", "archive", "no_suffix"])
def test_build_writes_exactly_torch_saves_bytes(tmp_path: Path, kind: str, name: str) -> None:
    obj = OBJECTS[kind]()
    assert _built(obj, name) == _torch_saved(obj, tmp_path, name)


def test_archive_is_what_torch_save_writes_to_a_file_object() -> None:
    obj = _shared()
    buf = io.BytesIO()
    torch.save(obj, buf)
    assert _built(obj, "archive") == buf.getvalue()


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_save_arguments_are_torch_saves(tmp_path: Path, protocol: int) -> None:
    obj = _optimizer()
    kw = {"pickle_protocol": protocol, "pickle_module": pickle}
    assert _built(obj, "p.pt", **kw) == _torch_saved(obj, tmp_path, "p.pt", **kw)


def test_chunks_smaller_than_records_combine_to_the_records_crc(tmp_path: Path) -> None:
    obj = {"a": torch.randn(10_000), "b": torch.arange(999, dtype=torch.int8), "c": torch.ones(1)}
    with_chunks = tmp_path / "chunks"
    with_chunks.mkdir()
    skel = torch_skeleton.skeleton(obj, with_chunks, "c.pt", {})
    image = Image(skel, threads=4, chunk=1000)  # 41 chunks, some records in one
    assert _read_whole(image) == _torch_saved(obj, tmp_path, "c.pt")


def test_crcs_stay_zero_where_torch_is_told_not_to_compute_them(tmp_path: Path) -> None:
    from torch.utils.serialization import config

    obj = _shared()
    config.save.compute_crc32 = False
    try:
        assert _built(obj, "n.pt") == _torch_saved(obj, tmp_path, "n.pt")
    finally:
        config.save.compute_crc32 = True


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=3000))
def test_crc32_combine_is_zlibs(a: bytes, b: bytes) -> None:
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def test_the_legacy_format_is_left_to_torch(tmp_path: Path) -> None:
    with pytest.raises(Unsupported):
        torch_skeleton.skeleton(
            {"a": torch.ones(2)}, tmp_path, "l.pt", {"_use_new_zipfile_serialization": False}
        )


def test_a_skeleton_unlike_the_model_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If torch changed how it makes the serialization id, the check against the skeleton
    itself catches it, before a byte of the image is written."""
    real = torch_skeleton.serialization_id

    def other(skel: Any, crcs: dict[str, int]) -> bytes:
        return real(skel, crcs)[:-1] + b"0"

    monkeypatch.setattr(torch_skeleton, "serialization_id", other)
    with pytest.raises(Unsupported, match="serialization_id"):
        torch_skeleton.skeleton({"a": torch.ones(2)}, tmp_path, "x.pt", {})


def test_tensors_that_cannot_skip_their_data_are_saved_by_torch(tmp_path: Path) -> None:
    obj = {"q": torch.quantize_per_tensor(torch.randn(40), 0.1, 3, torch.qint8), "w": torch.ones(3)}
    with pytest.raises(Unsupported, match="skip data"):
        torch_skeleton.skeleton(obj, tmp_path, "q.pt", {})
    ckptz.save(obj, tmp_path / "q.pt", device="cpu")
    with ckptz.open(tmp_path / "q.pt") as f:
        assert f.read() == _torch_saved(obj, tmp_path, "q.pt")


def test_save_falls_back_to_torch_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_a: Any, **_k: Any) -> Any:
        raise Unsupported("test")

    from ckptz.library import saving

    monkeypatch.setattr(saving, "skeleton", refuse)
    obj = _optimizer()
    ckptz.save(obj, tmp_path / "f.pt", device="cpu")
    with ckptz.open(tmp_path / "f.pt") as f:
        assert f.read() == _torch_saved(obj, tmp_path, "f.pt")


def test_reads_at_any_offset_give_the_images_bytes(tmp_path: Path) -> None:
    """The pipeline reads pieces that straddle structure and records, from many threads."""
    obj = {"a": torch.randn(3000), "e": torch.empty(0), "b": torch.arange(77, dtype=torch.int8)}
    want = _torch_saved(obj, tmp_path, "r.pt")
    image = Image(torch_skeleton.skeleton(obj, tmp_path, "r.pt", {}), threads=3, chunk=500)
    assert image.size == len(want)
    for offset, n in [(0, len(want)), (0, 1), (5, 700), (600, 11_000), (len(want) - 3, 10), (len(want), 4)]:
        buf = bytearray(n)
        got = image.readinto([memoryview(buf)], offset)
        assert got == min(n, len(want) - offset)
        assert bytes(buf[:got]) == want[offset : offset + got]
    # A scatter read fills its buffers one after another, across structure and records.
    cuts = [0, 1, 64, 700, 701, 5000, 12_000, len(want) + 9]
    bufs = [bytearray(b - a) for a, b in itertools.pairwise(cuts)]
    assert image.readinto([memoryview(b) for b in bufs], 0) == len(want)
    assert b"".join(bufs)[: len(want)] == want


def test_save_writes_no_uncompressed_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tensors go straight into the pipeline: nothing beside the container, nothing in
    ``$TMPDIR`` but the skeleton (holes where the tensors go)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    seen: list[int] = []
    real = torch_skeleton._read

    def spy(path: Path, *a: Any) -> Any:
        seen.append(os.stat(path).st_blocks * 512)
        return real(path, *a)

    monkeypatch.setattr(torch_skeleton, "_read", spy)
    obj = {"w": torch.randn(1 << 20)}  # 4 MiB
    out = tmp_path / "out" / "m.pt"
    out.parent.mkdir()
    ckptz.save(obj, out, device="cpu")
    with ckptz.open(out) as f:
        assert f.read() == _torch_saved(obj, tmp_path, "m.pt")
    assert [p.name for p in out.parent.iterdir()] == ["m.pt"]
    assert list((tmp_path / "tmp").iterdir()) == []
    assert seen and seen[0] < 1 << 20  # the skeleton held no tensor bytes (sparse)


@pytest.mark.gpu
def test_gpu_tensors_are_read_from_the_device(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(6)
    obj: dict[str, Any] = {k: v.cuda() for k, v in _dtypes(gen).items()}
    obj["big"] = torch.randn(3_000_000, generator=gen).cuda()
    obj["view"] = obj["big"][10:20]
    obj["host"] = torch.arange(100)
    want = _torch_saved(obj, tmp_path, "g.pt")
    image = Image(torch_skeleton.skeleton(obj, tmp_path, "g.pt", {}), threads=4, chunk=1 << 20)
    buf = bytearray(len(want))
    assert image.readinto([memoryview(buf)], 0) == len(want)
    assert bytes(buf) == want
    assert _read_whole(image, threads=4, piece=1 << 20) == want  # from several threads


def test_save_plans_streams_on_the_tensors_bytes(tmp_path: Path) -> None:
    """The stream plan samples the bytes that are coded, not the skeleton's holes: fp32
    tensors holding bf16 values get a stream apart from true fp32 ones, as when the file
    itself is compressed, and the payloads come out the same size (the headers differ by
    the file metadata they record)."""
    from ckptz import api
    from ckptz.container import read_index

    gen = torch.Generator().manual_seed(0)
    obj = {
        "master": torch.randn(300_000, generator=gen).bfloat16().float(),
        "true": torch.randn(300_000, generator=gen),
    }
    ckptz.save(obj, tmp_path / "a.pt", device="cpu")
    (tmp_path / "ref").mkdir()
    torch.save(obj, tmp_path / "ref" / "a.pt")
    api.compress(tmp_path / "ref" / "a.pt", tmp_path / "file.ckptz", device="cpu")
    streams, payloads = [], []
    for path in (tmp_path / "a.pt", tmp_path / "file.ckptz"):
        with open(path, "rb") as f:
            index = read_index(f, "a.pt")
        streams.append([(s.component, s.dtype, s.length) for s in index.streams])
        payloads.append(int(index.chunks["size"].sum()))
    assert streams[0] == streams[1] and len(streams[0]) == 3
    assert payloads[0] == payloads[1]
