"""Format readers and component classification, against the corpus and hostile inputs."""

from __future__ import annotations

import contextlib
import io
import pickle
import shutil
import struct
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import sha256
from corpus import MARKER, make_corpus
from safetensors.torch import load_file

from ckptz import api
from ckptz.components import COMPONENTS, RULES, classify
from ckptz.errors import FormatError
from ckptz.formats import CHECKPOINT_SUFFIXES, FileLayout, is_checkpoint, read_layout
from ckptz.formats.legacy import read_legacy
from ckptz.formats.pickle_walk import scan_pickle
from ckptz.formats.safetensors import read_safetensors
from ckptz.formats.torchzip import read_torch_zip

# Files torch.load can open here (no foreign classes, nothing malicious, not protocol 0).
LOADABLE = (
    "hf/checkpoint-2/optimizer.pt",
    "hf/checkpoint-2/rng_state.pth",
    "hf/checkpoint-2/scaler.pt",
    "hf/bin/pytorch_model.bin",
    "megatron/iter_0000010/mp_rank_00/model_optim_rng.pt",
    "deepspeed/global_step10/mp_rank_00_model_states.pt",
    "lightning/epoch=0-step=10.ckpt",
    "edge/proto2.pt",
    "edge/proto4.pt",
    "edge/proto5.pt",
    "edge/bytesio.pt",
    "edge/tied.pt",
    "edge/views.pt",
    "edge/noncontig.pt",
    "edge/zero_size.pt",
    "edge/scalar.pt",
    "edge/dtypes.pt",
    "edge/parameter.pt",
    "edge/module.pt",
    "edge/quantized.pt",
    "edge/legacy.pt",
    "edge/crc_off.pt",
    "edge/exp_avg_names.pt",
)

OPAQUE = (
    "edge/random.bin",
    "edge/truncated.pt",
    "edge/malicious.pkl",
    "edge/empty.pt",
    "hf/checkpoint-2/config.json",
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def layouts(corpus: dict[str, Path]) -> dict[str, FileLayout]:
    return {rel: read_layout(path, rel) for rel, path in corpus.items()}


def _bytes(path: Path, offset: int, length: int) -> bytes:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read(length)


def _components(layout: FileLayout) -> dict[str, str]:
    return {k: s.component for s in layout.segments if s.kind == "tensor" for k in s.keys}


def _resolve(obj: Any, parts: list[str]) -> Any:
    """Follow a ``.``-joined key path into a loaded object; dict keys may themselves contain dots."""
    if not parts:
        return obj
    candidates: list[tuple[Any, int]] = []
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if isinstance(obj, dict):
            for k, v in obj.items():
                if str(k) == name:
                    candidates.append((v, n))
        elif isinstance(obj, list | tuple) and n == 1 and name.isdigit() and int(name) < len(obj):
            candidates.append((obj[int(name)], n))
        elif isinstance(obj, torch.nn.Module) and n == 1 and hasattr(obj, name):
            candidates.append((getattr(obj, name), n))
    for value, n in candidates:
        found = _resolve(value, parts[n:])
        if found is not None:
            return found
    return None


# -- every file ---------------------------------------------------------------------------------


def test_segments_cover_every_file_exactly(corpus: dict[str, Path], layouts: dict[str, FileLayout]) -> None:
    for rel, layout in layouts.items():
        size = corpus[rel].stat().st_size
        assert layout.size == size, rel
        cursor = 0
        for seg in layout.segments:
            assert seg.offset == cursor and seg.length > 0, rel
            cursor = seg.end
            assert seg.component in COMPONENTS, rel
            if seg.kind == "meta":
                assert seg.component == ("other" if layout.format == "opaque" else "metadata"), rel
        assert cursor == size, rel


def test_formats_detected(layouts: dict[str, FileLayout]) -> None:
    for rel in OPAQUE:
        assert layouts[rel].format == "opaque" and layouts[rel].notes, rel
    assert layouts["edge/legacy.pt"].format == "torch-legacy"
    assert layouts["hf/checkpoint-2/model.safetensors"].format == "safetensors"
    for rel, layout in layouts.items():
        if rel.endswith((".pt", ".pth", ".ckpt", ".distcp")) and rel not in OPAQUE and "legacy" not in rel:
            assert layout.format == "torch-zip", rel


def test_malicious_pickles_never_run(corpus: dict[str, Path], layouts: dict[str, FileLayout]) -> None:
    root = corpus["edge/malicious.pt"].parent
    for rel in ("edge/malicious.pt", "edge/malicious_legacy.pt", "edge/malicious.pkl"):
        read_layout(corpus[rel], rel)
    scan_pickle(corpus["edge/malicious.pkl"].read_bytes())
    assert not (root / MARKER).exists()
    assert layouts["edge/malicious.pt"].format == "torch-zip"
    assert _components(layouts["edge/malicious.pt"]) == {"w": "other"}
    assert layouts["edge/malicious_legacy.pt"].format == "torch-legacy"


# -- tensor bytes, dtypes and key paths ----------------------------------------------------------


def test_tensor_bytes_match_torch_load(corpus: dict[str, Path], layouts: dict[str, FileLayout]) -> None:
    for rel in LOADABLE:
        loaded = torch.load(corpus[rel], weights_only=False)
        for seg in layouts[rel].segments:
            if seg.kind != "tensor":
                continue
            tensors = [t for k in seg.keys if isinstance(t := _resolve(loaded, k.split(".")), torch.Tensor)]
            if rel == "edge/quantized.pt" and not tensors:
                continue  # per-channel scales live inside the quantizer, not under a key
            assert tensors, (rel, seg.keys)
            for t in tensors:
                assert bytes(t.untyped_storage()) == _bytes(corpus[rel], seg.offset, seg.length), (
                    rel,
                    seg.keys,
                )
                assert str(t.dtype).removeprefix("torch.") == seg.dtype, (rel, seg.keys)


def test_zip_payloads_match_zipfile(corpus: dict[str, Path], layouts: dict[str, FileLayout]) -> None:
    for rel, layout in layouts.items():
        if layout.format != "torch-zip" or rel.endswith((".distcp", "crc_off.pt")):
            continue
        with zipfile.ZipFile(corpus[rel]) as zf:
            records = {zf.read(n) for n in zf.namelist() if "/data/" in n and zf.getinfo(n).file_size}
        segs = {_bytes(corpus[rel], s.offset, s.length) for s in layout.segments if s.kind == "tensor"}
        assert segs == records, rel


def test_safetensors_bytes(corpus: dict[str, Path], layouts: dict[str, FileLayout]) -> None:
    for rel, layout in layouts.items():
        if layout.format != "safetensors":
            continue
        tensors = load_file(corpus[rel])
        assert sorted(k for s in layout.segments for k in s.keys) == sorted(tensors)
        for seg in layout.segments:
            for key in seg.keys:
                t = tensors[key]
                assert t.contiguous().view(torch.uint8).numpy().tobytes() == _bytes(
                    corpus[rel], seg.offset, seg.length
                )
                assert seg.dtype == str(t.dtype).removeprefix("torch.")


def test_protocol0_matches_protocol2(corpus: dict[str, Path], layouts: dict[str, FileLayout]) -> None:
    def tensors(rel: str) -> dict[tuple[str, ...], tuple[str, bytes]]:
        return {
            s.keys: (s.dtype, _bytes(corpus[rel], s.offset, s.length))
            for s in layouts[rel].segments
            if s.kind == "tensor"
        }

    assert tensors("edge/proto0.pt") == tensors("edge/proto2.pt") == tensors("edge/proto5.pt")


def test_every_dtype(layouts: dict[str, FileLayout]) -> None:
    segs = [s for s in layouts["edge/dtypes.pt"].segments if s.kind == "tensor"]
    assert len(segs) >= 22
    for seg in segs:
        assert seg.keys == (seg.dtype,)


def test_shared_storages_and_views(corpus: dict[str, Path], layouts: dict[str, FileLayout]) -> None:
    (tied,) = [s for s in layouts["edge/tied.pt"].segments if s.kind == "tensor"]
    assert tied.keys == ("emb.weight", "lm_head.weight", "same.0", "same.1")
    assert tied.component == "weights"
    (views,) = [s for s in layouts["edge/views.pt"].segments if s.kind == "tensor"]
    assert views.keys == ("a", "b", "c") and views.length == 160
    with zipfile.ZipFile(corpus["edge/views.pt"]) as zf:
        scan = scan_pickle(zf.read("views/data.pkl"))
    got = {t.path: (t.offset, t.shape, t.stride) for t in scan.tensors}
    assert got == {"a": (5, (5,), (1,)), "b": (12, (3, 6), (6, 1)), "c": (0, (20,), (2,))}
    assert [s.keys for s in layouts["edge/zero_size.pt"].segments if s.kind == "tensor"] == [("one",)]
    with zipfile.ZipFile(corpus["edge/noncontig.pt"]) as zf:
        (t,) = scan_pickle(zf.read("noncontig/data.pkl")).tensors
    assert (t.shape, t.stride) == ((3, 5), (1, 3))


def test_wrappers_and_foreign_classes(layouts: dict[str, FileLayout]) -> None:
    assert _components(layouts["edge/parameter.pt"]) == {"p": "other"}
    assert _components(layouts["edge/module.pt"]) == {
        "_parameters.weight": "weights",
        "_parameters.bias": "weights",
    }
    quant = {s.keys[0]: s.dtype for s in layouts["edge/quantized.pt"].segments if s.kind == "tensor"}
    assert quant["q"] == "qint8" and quant["qc"] == "quint8"
    assert "float64" in quant.values() and "int64" in quant.values()
    assert _components(layouts["edge/foreign_classes.pt"]) == {"w": "other"}
    assert _components(layouts["edge/storage.pt"]) == {"s": "other"}
    assert _components(layouts["edge/nested_zip.pt"]) == {"w": "other"}
    assert layouts["hf/checkpoint-2/training_args.bin"].format == "torch-zip"


# -- components --------------------------------------------------------------------------------


EXPECTED = {
    "hf/checkpoint-2/optimizer.pt": {
        "state.0.exp_avg": "optimizer.exp_avg",
        "state.0.exp_avg_sq": "optimizer.exp_avg_sq",
        "state.3.step": "optimizer.other",
    },
    "hf/checkpoint-2/model.safetensors": {"0.weight": "weights", "2.bias": "weights"},
    "hf/checkpoint-2/rng_state.pth": {"cpu": "rng_state"},
    "hf/bin/pytorch_model.bin": {"embed.weight": "weights"},
    "hf/sharded/model-00001-of-00002.safetensors": {"embed.weight": "weights"},
    "megatron/iter_0000010/mp_rank_00/model_optim_rng.pt": {
        "model.language_model.encoder.embed.weight": "weights",
        "optimizer.optimizer.state.0.exp_avg": "optimizer.exp_avg",
        "optimizer.optimizer.state.1.exp_avg_sq": "optimizer.exp_avg_sq",
        "optimizer.optimizer.state.0.step": "optimizer.other",
        "optimizer.fp32_from_fp16_params.0.0": "master_weights",
        "rng_state.0.torch_rng_state": "rng_state",
        "rng_state.0.rng_tracker_states.model-parallel-rng": "rng_state",
    },
    "deepspeed/global_step10/mp_rank_00_model_states.pt": {"module.layers.0.mlp.weight": "weights"},
    "deepspeed/global_step10/zero_pp_rank_0_mp_rank_00_optim_states.pt": {
        "optimizer_state_dict.base_optimizer_state.state.0.exp_avg": "optimizer.exp_avg",
        "optimizer_state_dict.base_optimizer_state.state.0.exp_avg_sq": "optimizer.exp_avg_sq",
        "optimizer_state_dict.base_optimizer_state.state.0.step": "optimizer.other",
        "optimizer_state_dict.single_partition_of_fp32_groups.0": "master_weights",
    },
    "lightning/epoch=0-step=10.ckpt": {
        "state_dict.model.0.weight": "weights",
        "optimizer_states.0.state.1.exp_avg": "optimizer.exp_avg",
        "optimizer_states.0.state.1.exp_avg_sq": "optimizer.exp_avg_sq",
    },
    "edge/exp_avg_names.pt": {
        "state.0.max_exp_avg_sq": "optimizer.exp_avg_sq",
        "state.0.momentum_buffer": "optimizer.other",
        "state.0.exp_avg_sq_row": "optimizer.other",
        "grads.w": "gradients",
    },
    "dcp/step-10/__0_0.distcp": {
        "model.embed.weight": "weights",
        "optim.state.embed.weight.exp_avg": "optimizer.exp_avg",
    },
}


@pytest.mark.parametrize("rel", sorted(EXPECTED))
def test_components_per_framework(rel: str, layouts: dict[str, FileLayout]) -> None:
    got = _components(layouts[rel])
    for key, component in EXPECTED[rel].items():
        assert got.get(key) == component, (key, got)


def test_classify_table() -> None:
    assert classify("x/rng_state_3.pth", ("cuda",), "uint8") == "rng_state"
    assert classify("model.pt", ("layer.weight.grad",), "float32") == "gradients"
    assert classify("optimizer.bin", ("weird",), "float32") == "optimizer.other"
    assert classify("pytorch_model-00001-of-00002.bin", ("x",), "bfloat16") == "weights"
    assert classify("a.pt", ("fp32_flat_groups.0",), "float32") == "master_weights"
    assert classify("a.pt", ("anything",), "float32") == "other"
    # Several paths: the first rule in the table wins whatever the order of the paths.
    assert classify("a.pt", ("model.w", "optimizer.state.0.exp_avg"), "float32") == "optimizer.exp_avg"
    assert classify("a.pt", ("optimizer.state.0.exp_avg", "model.w"), "float32") == "optimizer.exp_avg"
    assert set(COMPONENTS) >= {"weights", "metadata", "other"} and len(COMPONENTS) == 9


def _walk_rules(relpath: str, keys: tuple[str, ...], dtype: str) -> str:
    """The table read top to bottom for one tensor, as RULES documents it (no caching)."""
    name = relpath.rsplit("/", 1)[-1]
    return next((r.component for r in RULES if r.matches(name, keys, dtype)), "other")


@pytest.mark.parametrize(
    "template",
    [
        "model.layers.{n}.mlp.experts.{n}.w1.weight",
        "optimizer.state.{n}.exp_avg",
        "optimizer.state.{n}.exp_avg_sq",
        "state.{n}.momentum_buffer",
        "optimizer_state_dict.fp32_flat_groups.{n}",
        "module.{n}.weight",
        "rng_tracker_states.model-parallel-rng.{n}",
        "{n}.cuda",
        "net.blocks.{n}.grad",
        "param_groups.{n}.lr",
        "base_optimizer_state.{n}.step",
        "model{n}.encoder.bias",
    ],
)
def test_classify_ignores_numbers_as_segments(template: str) -> None:
    # classify decides once for keys that differ only in all-digit segments: the table must
    # not tell them apart, and the cached decision must be the table's.
    for rel, dtype in (
        ("a.pt", "float32"),
        ("optimizer.pt", "bfloat16"),
        ("rng_state.pth", "uint8"),
        ("model.safetensors", "float16"),
        ("x/grads_rank1.pt", "float32"),
    ):
        walked = {_walk_rules(rel, (template.format(n=n),), dtype) for n in (0, 1, 7, 12, 4096)}
        assert len(walked) == 1, (template, rel, walked)
        for n in (0, 3, 123):
            assert classify(rel, (template.format(n=n),), dtype) in walked


def test_is_checkpoint() -> None:
    for name in (
        "a.pt",
        "b.PTH",
        "model.safetensors",
        "x.ckpt",
        "__0_0.distcp",
        "c.pth.tar",
        "training_args.bin",
    ):
        assert is_checkpoint(Path(name)), name
    for name in ("config.json", "model.safetensors.index.json", ".metadata", "latest", "README.md"):
        assert not is_checkpoint(Path(name)), name
    assert ".safetensors" in CHECKPOINT_SUFFIXES


# -- hostile inputs ----------------------------------------------------------------------------


def _quick(fn: Any, *args: Any) -> Any:
    start = time.monotonic()
    try:
        return fn(*args)
    finally:
        assert time.monotonic() - start < 5


def _expect_rejected(path: Path) -> None:
    layout = _quick(read_layout, path, path.name)
    assert layout.format == "opaque" and sum(s.length for s in layout.segments) == path.stat().st_size


def test_hostile_safetensors(tmp_path: Path) -> None:
    p = tmp_path / "h.safetensors"
    p.write_bytes(struct.pack("<Q", 1 << 60) + b'{"a":1}')
    _expect_rejected(p)
    with p.open("rb") as f, pytest.raises(FormatError):
        read_safetensors(f, p.stat().st_size, p.name)
    header = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,1099511627776]}}'
    p.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    _expect_rejected(p)
    header = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
    p.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    _expect_rejected(p)
    p.write_bytes(struct.pack("<Q", 3) + b"{xx" + b"\0" * 8)
    _expect_rejected(p)


def _small_zip(tmp_path: Path) -> bytes:
    torch.save({"w": torch.ones(4)}, tmp_path / "s.pt")
    return (tmp_path / "s.pt").read_bytes()


def _patch_cd(data: bytes, field: int, value: int) -> bytes:
    """Set a 4-byte field of the central directory entry of ``s/data/0``."""
    pos = data.index(b"PK\x01\x02")
    while data[pos + 46 : pos + 46 + 8] != b"s/data/0":
        pos = data.index(b"PK\x01\x02", pos + 4)
    return data[: pos + field] + struct.pack("<I", value) + data[pos + field + 4 :]


def test_hostile_zip_directory(tmp_path: Path) -> None:
    good = _small_zip(tmp_path)
    p = tmp_path / "h.pt"
    cases = [
        _patch_cd(good, 20, 0xFFFFFFF0),  # csize: a record claiming ~4 GiB, no ZIP64 extra
        _patch_cd(good, 20, 0x7FFFFFF0),  # csize: 2 GiB past the end
        _patch_cd(good, 42, 0x7FFFFFF0),  # local header offset
    ]
    eocd = good.rindex(b"PK\x05\x06")
    z64 = good.rindex(b"PK\x06\x06")
    cases.append(good[: z64 + 48] + struct.pack("<Q", 1 << 62) + good[z64 + 56 :])  # CD offset
    cases.append(good[: z64 + 40] + struct.pack("<Q", 1 << 40) + good[z64 + 48 :])  # CD size
    cases.append(good[: z64 + 32] + struct.pack("<Q", 1 << 40) + good[z64 + 40 :])  # entry count
    cases.append(good[:eocd] + good[eocd:] + b"trailing")
    for data in cases:
        p.write_bytes(data)
        _expect_rejected(p)
        with p.open("rb") as f, pytest.raises(FormatError):
            read_torch_zip(f, len(data), p.name)


def _zip_with_pickle(path: Path, pkl: bytes) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", pkl)
        zf.writestr("archive/data/0", b"\0" * 16)


def test_hostile_pickles(tmp_path: Path) -> None:
    huge_memo = b"\x80\x02N" + b"r" + struct.pack("<I", 0xFFFFFFF0) + b"."
    with pytest.raises(FormatError):
        _quick(scan_pickle, huge_memo)
    with pytest.raises(FormatError):
        _quick(scan_pickle, b"(p99999999999999\n.")
    nested = b"\x80\x02" + b"(" * 300_000 + b"l" * 300_000 + b"."
    with contextlib.suppress(FormatError):
        assert _quick(scan_pickle, nested).tensors == ()
    # 2**200 paths through a DAG of shared lists: each list is walked once.
    chain: list[Any] = [[]]
    for _ in range(200):
        chain = [chain, chain]
    dag = pickle.dumps(chain, protocol=2)
    assert _quick(scan_pickle, dag).tensors == ()
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    assert _quick(scan_pickle, pickle.dumps(cyclic)).tensors == ()
    for pkl in (huge_memo, nested[:1000], b"garbage"):
        _zip_with_pickle(tmp_path / "h.pt", pkl)
        _expect_rejected(tmp_path / "h.pt")


def test_hostile_legacy(tmp_path: Path, corpus: dict[str, Path]) -> None:
    data = corpus["edge/legacy.pt"].read_bytes()
    layout = read_layout(corpus["edge/legacy.pt"], "legacy.pt")
    first = next(s for s in layout.segments if s.kind == "tensor")
    count = first.offset - 8
    p = tmp_path / "h.pt"
    p.write_bytes(data[:count] + struct.pack("<q", 1 << 61) + data[count + 8 :])
    _expect_rejected(p)
    p.write_bytes(data[: first.offset + 2])
    _expect_rejected(p)
    with p.open("rb") as f, pytest.raises(FormatError):
        read_legacy(f, p.stat().st_size, p.name)


def test_distcp_splits_into_items(layouts: dict[str, FileLayout]) -> None:
    layout = layouts["dcp/step-10/__0_0.distcp"]
    assert layout.format == "torch-zip" and "concatenated" in layout.notes[0]
    assert {k for s in layout.segments for k in s.keys} >= {"model.embed.weight", "model.norm.weight"}


def test_distcp_without_metadata(tmp_path: Path, corpus: dict[str, Path]) -> None:
    p = tmp_path / "__0_0.distcp"
    p.write_bytes(corpus["dcp/step-10/__0_0.distcp"].read_bytes())
    layout = read_layout(p, p.name)
    assert layout.format == "torch-zip"
    assert sum(s.kind == "tensor" for s in layout.segments) == 5


def test_read_layout_is_stable(corpus: dict[str, Path], layouts: dict[str, FileLayout]) -> None:
    rel = "megatron/iter_0000010/mp_rank_00/model_optim_rng.pt"
    assert read_layout(corpus[rel], rel) == layouts[rel]


@pytest.mark.slow
def test_zip64_round_trip(tmp_path: Path) -> None:
    """A > 4 GiB torch.save file (ZIP64 records) is read without loading it and restores
    byte-exact; it is written in the test run and deleted after (skipped without the disk)."""
    if shutil.disk_usage(tmp_path).free < 11 << 30:
        pytest.skip("needs 11 GiB of free disk for a > 4 GiB file, its container and the restored copy")
    files = make_corpus(tmp_path / "corpus", large=True)
    src = files["large/zip64.pt"]
    try:
        layout = read_layout(src, "large/zip64.pt")
        big = max(layout.segments, key=lambda s: s.length)
        assert big.kind == "tensor" and big.length == (4 << 30) + 1000 and big.keys == ("big",)
        small = [s for s in layout.segments if s.keys == ("w",)]
        assert small and _bytes(src, small[0].offset, 12) == torch.ones(3).numpy().tobytes()
        want = sha256(src)
        api.compress(src, tmp_path / "zip64.pt.ckptz", device="cpu")
        api.decompress(tmp_path / "zip64.pt.ckptz", tmp_path / "back.pt", device="cpu")
        assert sha256(tmp_path / "back.pt") == want
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def test_bytesio_prefix(corpus: dict[str, Path]) -> None:
    with zipfile.ZipFile(io.BytesIO(corpus["edge/bytesio.pt"].read_bytes())) as zf:
        assert zf.namelist()[0].startswith("archive/")


def test_zip_read_from_memory_or_descriptor(corpus: dict[str, Path], layouts: dict[str, FileLayout]) -> None:
    """A zip's local headers are read in one call from a file's descriptor, one at a time
    from an object without one, and the layout is the same; a file cut inside a local
    header is refused either way."""
    read = 0
    for rel, layout in layouts.items():
        if layout.format != "torch-zip":
            continue
        data = corpus[rel].read_bytes()
        with corpus[rel].open("rb") as f:
            got = [_layout_or_error(g, len(data), rel) for g in (io.BytesIO(data), f)]
        assert got[0] == got[1]
        read += got[0] == layout  # else a zip after a prefix, which read_layout finds
    assert read >= 3


def _layout_or_error(f: Any, size: int, rel: str) -> FileLayout | str:
    try:
        return read_torch_zip(f, size, rel)
    except FormatError as exc:
        return str(exc)


def test_local_header_cut_short(tmp_path: Path) -> None:
    """A central directory that points a record's local header into its own last bytes,
    too close to hold one: refused before any header is read, from a file and from memory
    (the batched read's own length check guards a file that shrinks meanwhile)."""
    p = tmp_path / "z.pt"
    _zip_with_pickle(p, pickle.dumps({"w": 1}, protocol=2))
    good = bytearray(p.read_bytes())
    cd = good.rindex(b"PK\x01\x02")  # the last record's central entry
    lho = struct.unpack_from("<I", good, cd + 42)[0]
    struct.pack_into("<I", good, cd + 42, cd - 10)  # 10 bytes before the directory
    assert lho != cd - 10
    for f in (io.BytesIO(bytes(good)), None):
        if f is None:
            p.write_bytes(bytes(good))
            f = p.open("rb")
        with f, pytest.raises(FormatError, match="local header"):
            read_torch_zip(f, len(good), p.name)
