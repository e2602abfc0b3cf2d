"""Drop-in gaps of the library (issue 58, points 7-11 and 16), reproduced as users hit them.

Each test runs the public API the way code written for ``torch``/``safetensors`` calls it
and compares with what those libraries give on the same input.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import pickle
import struct
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
import safetensors
import safetensors.torch
import torch

import ckptz
from ckptz import api
from ckptz.errors import CkptzError, FormatError, UsageError
from ckptz.library import is_container


def same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], *, ordered: bool = True) -> None:
    assert list(a) == list(b) if ordered else sorted(a) == sorted(b)
    for k in a:
        assert (a[k].dtype, a[k].shape, a[k].stride()) == (b[k].dtype, b[k].shape, b[k].stride()), k
        assert a[k].view(torch.uint8).tolist() == b[k].view(torch.uint8).tolist(), k


def state() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    return {"w": torch.randn(32, 16, generator=gen), "step": 3, "ids": torch.arange(7, dtype=torch.int16)}


# -- point 7: file objects whose fileno() is another file's ----------------------------------


@pytest.mark.parametrize("module", [gzip, bz2, lzma], ids=lambda m: m.__name__)
def test_load_reads_a_container_inside_a_compressed_file_object(tmp_path: Path, module: Any) -> None:
    """gzip/bz2/lzma files pass on the compressed file's fileno(): it must not be read as
    the container."""
    obj = state()
    path = tmp_path / "ckpt.ckptz.z"
    with module.open(path, "wb") as out:
        ckptz.save(obj, out, device="cpu")
    with module.open(path, "rb") as f:
        loaded = ckptz.load(f)
        assert f.read() == b""  # the whole container was taken
    assert (
        loaded["step"] == 3 and torch.equal(loaded["w"], obj["w"]) and torch.equal(loaded["ids"], obj["ids"])
    )


def test_load_of_a_plain_checkpoint_in_gzip_equals_torch_load(tmp_path: Path) -> None:
    obj = state()
    with gzip.open(tmp_path / "x.pt.gz", "wb") as out:
        torch.save(obj, out)
    with gzip.open(tmp_path / "x.pt.gz", "rb") as a, gzip.open(tmp_path / "x.pt.gz", "rb") as b:
        assert torch.equal(ckptz.load(a)["w"], torch.load(b)["w"])


# -- point 11: several objects in one stream -------------------------------------------------


def _writer(kind: str, path: Path) -> Any:
    if kind == "BytesIO":
        return io.BytesIO()
    if kind == "gzip":
        return gzip.open(path, "wb")
    return open(path, "w+b")


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
@pytest.mark.parametrize("kind", ["real file", "BytesIO", "gzip"])
def test_several_objects_in_one_stream_read_back_in_order(
    tmp_path: Path, zip_format: bool, kind: str
) -> None:
    """pickle.dump, ckptz.save, pickle.dump, ckptz.save into one file object, read back in
    order: each ckptz.load takes exactly its own container's bytes."""
    a, b = state(), {"b": torch.ones(5, dtype=torch.float64)}
    path = tmp_path / "stream.bin"
    out = _writer(kind, path)
    pickle.dump(41, out)
    ckptz.save(a, out, device="cpu", _use_new_zipfile_serialization=zip_format)
    pickle.dump(43, out)
    ckptz.save(b, out, device="cpu", _use_new_zipfile_serialization=zip_format)
    ckptz.save(b, out, device="cpu", _use_new_zipfile_serialization=zip_format)  # two containers back to back
    if kind == "gzip":
        out.close()
        out = gzip.open(path, "rb")  # noqa: SIM115
    else:
        out.seek(0)
    with out:
        assert pickle.load(out) == 41
        assert torch.equal(ckptz.load(out)["w"], a["w"])
        assert pickle.load(out) == 43
        assert torch.equal(ckptz.load(out)["b"], b["b"])
        assert torch.equal(ckptz.load(out)["b"], b["b"])
        assert out.read() == b""


def test_a_legacy_stream_of_plain_objects_reads_as_torch_reads_it() -> None:
    """The plain legacy format, which torch.load reads object by object, through ckptz.load."""
    buf = io.BytesIO()
    pickle.dump(1, buf)
    torch.save(torch.arange(3), buf, _use_new_zipfile_serialization=False)
    ckptz.save(torch.arange(4), buf, device="cpu")
    torch.save(torch.arange(5), buf, _use_new_zipfile_serialization=False)
    buf.seek(0)
    assert pickle.load(buf) == 1
    assert [ckptz.load(buf).tolist() for _ in range(3)] == [list(range(n)) for n in (3, 4, 5)]


def test_a_stray_footer_magic_in_the_payload_does_not_end_the_container() -> None:
    """A tensor whose bytes hold ``CKPTZEND`` (stored raw: incompressible) before a second
    object: the container's end is found by a footer whose index checks."""
    gen = torch.Generator().manual_seed(3)
    noise = torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=gen)
    noise[1000:1008] = torch.tensor(list(b"CKPTZEND"), dtype=torch.uint8)
    buf = io.BytesIO()
    ckptz.save({"n": noise}, buf, device="cpu")
    pickle.dump("after", buf)
    assert b"CKPTZEND" in buf.getvalue()[:-60]
    buf.seek(0)
    assert torch.equal(ckptz.load(buf)["n"], noise)
    assert pickle.load(buf) == "after"


# -- point 16: the archive's name ------------------------------------------------------------


def test_save_names_the_archive_after_the_path_without_ckptz(tmp_path: Path) -> None:
    obj = state()
    ckptz.save(obj, tmp_path / "opt.pt.ckptz", device="cpu")
    torch.save(obj, tmp_path / "opt.pt")
    with ckptz.open(tmp_path / "opt.pt.ckptz") as f:
        restored = f.read()
    assert zipfile.ZipFile(io.BytesIO(restored)).namelist()[0].startswith("opt/")
    assert restored == (tmp_path / "opt.pt").read_bytes()
    # The legacy fallback (torch.save writes the original itself) is named the same way.
    q = {"q": torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8)}
    ckptz.save(q, tmp_path / "q.pt.ckptz", device="cpu")
    torch.save(q, tmp_path / "q.pt")
    with ckptz.open(tmp_path / "q.pt.ckptz") as f:
        assert f.read() == (tmp_path / "q.pt").read_bytes()


# -- point 10: a safetensors container through ckptz.load -------------------------------------


def test_load_reads_a_safetensors_container_as_torch_load_reads_the_file(tmp_path: Path) -> None:
    t = {"a": torch.ones(2), "b": torch.arange(3)}
    safetensors.torch.save_file(t, tmp_path / "m.safetensors")
    ckptz.save_file(t, tmp_path / "m.safetensors.ckptz", device="cpu")
    theirs = torch.load(tmp_path / "m.safetensors")
    for weights_only in (True, False):
        same_tensors(ckptz.load(tmp_path / "m.safetensors.ckptz", weights_only=weights_only), theirs)
        same_tensors(ckptz.load(tmp_path / "m.safetensors.ckptz", map_location="cpu", mmap=True), theirs)
    with open(tmp_path / "m.safetensors.ckptz", "rb") as f:  # the container says what it holds
        same_tensors(ckptz.load(f), theirs)
    for mapping in ({"cpu": "cpu"}, lambda s, loc: s):  # torch's own refusals, same type
        with pytest.raises(RuntimeError) as theirs_error:
            torch.load(tmp_path / "m.safetensors", map_location=mapping)
        with pytest.raises(RuntimeError) as ours_error:
            ckptz.load(tmp_path / "m.safetensors.ckptz", map_location=mapping)
        assert str(ours_error.value) == str(theirs_error.value)


# -- point 8: every dtype safetensors 0.8 knows ----------------------------------------------


def float4(n: int, m: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(4)
    return torch.randint(0, 256, (n, m), dtype=torch.uint8, generator=gen).view(torch.float4_e2m1fn_x2)


@pytest.mark.parametrize("container", [False, True], ids=["plain", "container"])
def test_float4_and_e8m0_tensors_load(tmp_path: Path, container: bool) -> None:
    """MXFP4/NVFP4 checkpoints: F4 packed values and F8_E8M0 scales."""
    t = {
        "w": float4(6, 4),
        "scale": torch.ones(6).to(torch.float8_e8m0fnu),
        "bias": torch.arange(4, dtype=torch.float32),
    }
    path = tmp_path / "mx.safetensors"
    safetensors.torch.save_file(t, path)
    theirs = safetensors.torch.load_file(path)
    if container:
        ckptz.save_file(t, path, device="cpu")
        assert is_container(path)
    same_tensors(ckptz.load_file(path), theirs)
    with ckptz.safe_open(path, "pt") as f:
        same_tensors(f.get_tensors(), theirs)
        assert f.get_slice("w").get_dtype() == "F4" and f.get_slice("w").get_shape() == [6, 8]
        assert torch.equal(f.get_slice("w")[2:5].view(torch.uint8), theirs["w"][2:5].view(torch.uint8))


def sub_byte_file(path: Path, dtype: str) -> None:
    """A safetensors file with one tensor of ``dtype`` (6-bit: torch has no type) and one F32."""
    header = {
        "odd": {"dtype": dtype, "shape": [2, 4], "data_offsets": [0, 6]},
        "ok": {"dtype": "F32", "shape": [2], "data_offsets": [6, 14]},
    }
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(range(6)) + struct.pack("<2f", 1.0, 2.0))


@pytest.mark.parametrize("dtype", ["F6_E2M3", "F6_E3M2"])
def test_a_dtype_torch_lacks_refuses_only_that_tensor(tmp_path: Path, dtype: str) -> None:
    path = tmp_path / "f6.safetensors"
    sub_byte_file(path, dtype)
    with safetensors.safe_open(path, "pt") as theirs:
        ok = theirs.get_tensor("ok")
        assert theirs.get_slice("odd").get_shape() == [2, 4]
        with pytest.raises(safetensors.SafetensorError):
            theirs.get_tensor("odd")
    with pytest.raises(safetensors.SafetensorError):
        safetensors.torch.load_file(path)
    for source in (path, tmp_path / "f6.safetensors.ckptz"):
        if source != path:
            api.compress(path, source, device="cpu")
        with ckptz.safe_open(source, "pt") as f:
            assert f.keys() == ["odd", "ok"]
            assert torch.equal(f.get_tensor("ok"), ok)
            assert f.get_slice("odd").get_dtype() == dtype and f.get_slice("odd").get_shape() == [2, 4]
            with pytest.raises(FormatError, match="no type for"):
                f.get_tensor("odd")
            with pytest.raises(FormatError):
                f.get_slice("odd")[:1]
        with pytest.raises(FormatError, match="'odd'"):
            ckptz.load_file(source)
        with ckptz.open(source) as raw:  # the bytes stay readable
            assert raw.read() == path.read_bytes()


# -- point 9: the rest of safetensors 0.8's API ----------------------------------------------


def test_backend_get_tensors_and_offset_keys_as_safetensors(tmp_path: Path) -> None:
    t = {
        "z": torch.arange(6, dtype=torch.int64),
        "a": torch.ones(3, dtype=torch.float16),
        "m": torch.zeros(0),
    }
    plain = tmp_path / "p.safetensors"
    safetensors.torch.save_file(t, plain)
    ckptz.save_file(t, tmp_path / "c.safetensors", device="cpu")
    for backend in ("mmap", "pread"):
        theirs = safetensors.torch.load_file(plain, backend=backend)
        for path in (plain, tmp_path / "c.safetensors"):
            same_tensors(ckptz.load_file(path, backend=backend), theirs)
            with (
                safetensors.safe_open(plain, "pt", backend=backend) as s,
                ckptz.safe_open(path, "pt", backend=backend) as c,
            ):
                same_tensors(c.get_tensors(), s.get_tensors())
                assert c.offset_keys() == s.offset_keys() and c.keys() == s.keys()
    with pytest.raises(safetensors.SafetensorError, match="backend"):
        safetensors.safe_open(plain, "pt", backend="uring")
    with pytest.raises(UsageError, match="backend"):
        ckptz.safe_open(plain, "pt", backend="uring")
    with pytest.raises(UsageError, match="backend"):
        ckptz.load_file(plain, backend="uring")


def test_a_closed_safe_open_answers_nothing(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    safetensors.torch.save_file({"a": torch.ones(2)}, path)
    with ckptz.safe_open(path, "pt") as f:
        kept = f.get_slice("a")
    with pytest.raises(UsageError, match="closed"):
        kept[:1]
    for opener in (safetensors.safe_open, ckptz.safe_open):
        with opener(path, "pt") as f:
            assert f.keys() == ["a"]
        for call in (f.keys, f.offset_keys, f.metadata, f.get_tensors, lambda: f.get_tensor("a")):
            with pytest.raises(Exception, match=r"(?i)closed") as caught:
                call()
            if opener is ckptz.safe_open:
                assert isinstance(caught.value, CkptzError)


def test_bytes_save_and_load(tmp_path: Path) -> None:
    t = {"w": torch.randn(8, 3), "f4": float4(2, 2), "b": torch.tensor([True, False])}
    data = ckptz.safetensors.save(t, {"k": "v"}, device="cpu")
    assert data.startswith(b"CKPTZ")
    theirs = safetensors.torch.save(t, {"k": "v"})
    (tmp_path / "c.ckptz").write_bytes(data)
    with ckptz.open(tmp_path / "c.ckptz") as f:
        assert f.read() == theirs  # the container holds safetensors' bytes exactly
    loaded = ckptz.safetensors.load(data)
    (tmp_path / "p.safetensors").write_bytes(theirs)
    with safetensors.safe_open(tmp_path / "p.safetensors", "pt") as f:
        assert list(loaded) == f.offset_keys()
    for k in t:
        assert (loaded[k].dtype, loaded[k].shape) == (t[k].dtype, t[k].shape)
        assert loaded[k].view(torch.uint8).tolist() == t[k].view(torch.uint8).tolist()
    plain = {"w": t["w"], "b": t["b"]}  # safetensors' own load has no F4 type
    # safetensors' load orders the names as its hash map does; ckptz's in file order.
    same_tensors(
        ckptz.safetensors.load(safetensors.torch.save(plain)),
        safetensors.torch.load(safetensors.torch.save(plain)),
        ordered=False,
    )
    with pytest.raises(FormatError):
        ckptz.safetensors.load(b"abc")


def test_save_model_and_load_model_with_tied_weights(tmp_path: Path) -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(5, 3)
            self.head = torch.nn.Linear(3, 5, bias=False)
            self.head.weight = self.emb.weight

    torch.manual_seed(0)
    model = Tied()
    ckptz.save_model(model, tmp_path / "m.safetensors", device="cpu")
    safetensors.torch.save_model(model, str(tmp_path / "p.safetensors"))
    with ckptz.open(tmp_path / "m.safetensors") as f:
        assert f.read() == (tmp_path / "p.safetensors").read_bytes()
    ours, theirs = Tied(), Tied()
    got = ckptz.load_model(ours, tmp_path / "m.safetensors")
    assert got == safetensors.torch.load_model(theirs, tmp_path / "p.safetensors")
    assert torch.equal(ours.head.weight, model.head.weight) and ours.head.weight is ours.emb.weight
    with pytest.raises(RuntimeError) as theirs_error:
        safetensors.torch.load_model(torch.nn.Linear(2, 2), tmp_path / "p.safetensors")
    with pytest.raises(RuntimeError) as ours_error:
        ckptz.load_model(torch.nn.Linear(2, 2), tmp_path / "m.safetensors")
    assert str(ours_error.value) == str(theirs_error.value)


def test_a_named_temporary_file_object_still_loads() -> None:
    """A wrapper whose fileno() is its own file (tempfile's) is read by copying, correctly."""
    with tempfile.NamedTemporaryFile() as f:
        ckptz.save(state(), f, device="cpu")
        f.seek(0)
        assert ckptz.load(f)["step"] == 3


@pytest.mark.parametrize("block", [7, 13, 48, 4096])
def test_a_footer_split_between_reads_is_found(monkeypatch: pytest.MonkeyPatch, block: int) -> None:
    """The end of a container in a stream is found whichever reads its footer falls across."""
    from ckptz.library import sources

    monkeypatch.setattr(sources, "_BLOCK", block)
    buf = io.BytesIO()
    for n in range(3):
        ckptz.save({"n": torch.arange(n + 2)}, buf, device="cpu")
    buf.seek(0)
    assert [ckptz.load(buf)["n"].tolist() for _ in range(3)] == [[0, 1], [0, 1, 2], [0, 1, 2, 3]]
    assert buf.read() == b""
