"""Hostile input: absurd sizes, deep or malicious pickles, crafted container tables, escaping paths.

Checkpoints go through the real command line in a child process whose address space is
capped (``RLIMIT_AS``) and whose run time is bounded, so "bounded memory and time" is
enforced by the kernel rather than asserted from timings. Each must end in a clean
one-line error or in opaque handling that restores byte-exact, with nothing written outside
the destination. Set ``CKPTZ_HOSTILE_REPORT=path`` for the table in RELIABILITY.md.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import resource
import struct
import subprocess
import sys
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard

from ckptz import api
from ckptz.container import FOOTER, MAJOR, MAX_INDEX_BYTES, MINOR, checksum, read_index
from ckptz.errors import CkptzError, ContainerError, UnsafePathError

MEMORY_CAP = 3 << 30
_RESULTS: dict[str, str] = {}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tree(root: Path) -> dict[str, str]:
    """Every entry under ``root``: file digests, link targets, folders."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_symlink():
            out[rel] = "-> " + os.readlink(p)
        elif p.is_file():
            out[rel] = _sha(p)
        else:
            out[rel] = "dir"
    return out


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ckptz", *args, "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit,
        env={**os.environ, "CKPTZ_DEVICE": "cpu"},
    )


# --- hostile checkpoint files -------------------------------------------------------------


def _torch_zip(path: Path, pkl: bytes, members: dict[str, bytes] | None = None) -> Path:
    """A torch.save-shaped zip (stored records) with the given ``data.pkl``."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        for name, data in (members or {"archive/data/0": b"\x00" * 64}).items():
            z.writestr(name, data)
        z.writestr("archive/version", b"3\n")
    return path


def _safetensors_2p60(path: Path) -> Path:
    path.write_bytes(struct.pack("<Q", 1 << 60) + b'{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}')
    return path


def _safetensors_huge_range(path: Path) -> Path:
    header = json.dumps({"w": {"dtype": "F32", "shape": [1 << 58], "data_offsets": [0, 1 << 60]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\x00" * 64)
    return path


def _zip_terabyte(path: Path) -> Path:
    """A zip whose only record claims 1 TB through its ZIP64 extra field."""
    name = b"archive/data/0"
    tb = 1 << 40
    extra = struct.pack("<HHQQ", 1, 16, tb, tb)
    local = struct.pack(
        "<4sHHHHHIIIHH", b"PK\x03\x04", 45, 0, 0, 0, 0, 0, 0xFFFFFFFF, 0xFFFFFFFF, len(name), 0
    )
    body = local + name + b"\x00" * 32
    cd = struct.pack(
        "<4sHHHHHHIIIHHHHHII",
        b"PK\x01\x02",
        45,
        45,
        0,
        0,
        0,
        0,
        0,
        0xFFFFFFFF,
        0xFFFFFFFF,
        len(name),
        len(extra),
        0,
        0,
        0,
        0,
        0,
    )
    cd += name + extra
    eocd = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 1, 1, len(cd), len(body), 0)
    path.write_bytes(body + cd + eocd)
    return path


def _deep_pickle(path: Path) -> Path:
    depth = 1_000_000
    return _torch_zip(path, b"\x80\x02" + b"(" * depth + b"l" * depth + b".")


def _memo_pickle(path: Path) -> Path:
    return _torch_zip(path, b"\x80\x02N" + b"r" + struct.pack("<I", 0xFFFFFFF0) + b".")


def _exploit_pickle(path: Path) -> Path:
    marker = path.parent / "PWNED"
    return _torch_zip(path, b"cos\nsystem\n(V" + f"touch {marker}".encode() + b"\ntR.")


def _dotdot_members(path: Path) -> Path:
    pkl = pickle.dumps({"w": 1}, protocol=2)
    return _torch_zip(path, pkl, {"archive/data/../../../escape": b"x" * 32, "../../evil.txt": b"y" * 32})


def _legacy_huge_count(path: Path) -> Path:
    import torch

    class _P(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            if obj == "STORAGE":
                return ("storage", torch.FloatStorage, "0", "cpu", 4)
            return None

    buf = io.BytesIO()
    for part in (0x1950A86A20F9469CFC6C, 1001, {"protocol_version": 1001, "little_endian": True}):
        pickle.dump(part, buf, protocol=2)
    _P(buf, protocol=2).dump({"w": "STORAGE"})
    pickle.dump(["0"], buf, protocol=2)
    buf.write(struct.pack("<q", 1 << 62) + b"\x00" * 16)
    path.write_bytes(buf.getvalue())
    return path


HOSTILE_FILES: dict[str, Callable[[Path], Path]] = {
    "safetensors header length 2^60": lambda d: _safetensors_2p60(d / "a.safetensors"),
    "safetensors tensor range 2^60": lambda d: _safetensors_huge_range(d / "b.safetensors"),
    "zip record claiming 1 TB (ZIP64)": lambda d: _zip_terabyte(d / "c.pt"),
    "pickle nested 10^6 deep": lambda d: _deep_pickle(d / "d.pt"),
    "pickle memo index 2^32-16": lambda d: _memo_pickle(d / "e.pt"),
    "pickle calling os.system": lambda d: _exploit_pickle(d / "f.pt"),
    "zip member names with ..": lambda d: _dotdot_members(d / "g.pt"),
    "legacy storage count 2^62": lambda d: _legacy_huge_count(d / "h.pt"),
}


@pytest.mark.parametrize("case", list(HOSTILE_FILES))
def test_hostile_checkpoint(case: str, tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    path = HOSTILE_FILES[case](src)
    before = _tree(tmp_path)
    out = tmp_path / "out"
    done = _cli("compress", str(path), "-o", str(out / (path.name + ".ckptz")))
    assert "Traceback" not in done.stderr
    if done.returncode != 0:
        assert done.stderr.strip().count("\n") == 0, done.stderr
        _RESULTS[case] = f"compress refused: {done.stderr.strip()}"
    else:
        restored = tmp_path / "back"
        back = _cli("decompress", str(out / (path.name + ".ckptz")), "-o", str(restored / path.name))
        assert back.returncode == 0, back.stderr
        assert _sha(restored / path.name) == _sha(path)
        from ckptz.formats import read_layout

        layout = read_layout(path, path.name)
        how = f"{layout.format} ({layout.notes[0]})" if layout.notes else layout.format
        _RESULTS[case] = f"compressed as {how}; restored byte-exact"
    assert not (src / "PWNED").exists(), "a pickle was executed"
    after = {k: v for k, v in _tree(tmp_path).items() if not k.startswith(("out", "back"))}
    assert after == before, "something outside the destination changed"


# --- hostile containers --------------------------------------------------------------------


def _container(tmp_path: Path) -> bytes:
    from safetensors.numpy import save_file

    src = tmp_path / "m.safetensors"
    save_file({"w": np.arange(64, dtype=np.float32), "b": np.ones(8, np.float32)}, str(src))
    api.compress(src, tmp_path / "m.safetensors.ckptz", device="cpu")
    return (tmp_path / "m.safetensors.ckptz").read_bytes()


def _split(data: bytes) -> tuple[dict[str, Any], bytes, int]:
    off, isize, raw_size, *_ = FOOTER.unpack(data[-FOOTER.size :])
    raw = zstandard.ZstdDecompressor().decompress(data[off : off + isize], max_output_size=raw_size)
    (jsize,) = struct.unpack_from("<I", raw)
    return json.loads(raw[4 : 4 + jsize]), raw[4 + jsize :], off


def _join(data: bytes, header: dict[str, Any] | bytes, tables: bytes, raw_size: int | None = None) -> bytes:
    """Re-seal an edited index with valid checksums, as an attacker would."""
    _, _, off = _split(data)
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    raw = struct.pack("<I", len(text)) + text + tables
    blob = zstandard.ZstdCompressor().compress(raw)
    footer = FOOTER.pack(off, len(blob), raw_size or len(raw), checksum(blob), MAJOR, MINOR, 0, b"CKPTZEND")
    return data[:off] + blob + footer


def _edit_tables(data: bytes, field: str, value: int, table: str = "chunk") -> bytes:
    from ckptz.container import CHUNK_DTYPE, FRAME_DTYPE, SEGMENT_DTYPE

    header, tables, _ = _split(data)
    n = header["counts"]
    seg = np.frombuffer(tables, SEGMENT_DTYPE, n["segments"]).copy()
    fr = np.frombuffer(tables, FRAME_DTYPE, n["frames"], seg.nbytes).copy()
    ch = np.frombuffer(tables, CHUNK_DTYPE, n["chunks"], seg.nbytes + fr.nbytes).copy()
    {"segment": seg, "frame": fr, "chunk": ch}[table][field][0] = value
    return _join(data, header, seg.tobytes() + fr.tobytes() + ch.tobytes())


def _edit_header(data: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    header, tables, _ = _split(data)
    edit(header)
    return _join(data, header, tables)


def _wrap_segments(data: bytes) -> bytes:
    """Two segments of 2^63 bytes: a uint64 sum wraps to 0 (the source claims 0 bytes)."""
    from ckptz.container import SEGMENT_DTYPE

    header, tables, _ = _split(data)
    n = header["counts"]
    rest = tables[n["segments"] * SEGMENT_DTYPE.itemsize :]
    seg = np.array([(0, 1 << 63), (0, 1 << 63)], SEGMENT_DTYPE)
    header["counts"]["segments"] = 2
    header["source"]["size"] = 0
    return _join(data, header, seg.tobytes() + rest)


def _huge_index_frame(data: bytes) -> bytes:
    """An index frame that inflates to 256 MiB while the footer claims a few hundred bytes."""
    off = _split(data)[2]
    blob = zstandard.ZstdCompressor().compress(b"\x00" * (256 << 20))
    return data[:off] + blob + FOOTER.pack(off, len(blob), 300, checksum(blob), MAJOR, MINOR, 0, b"CKPTZEND")


def _deep_json(data: bytes) -> bytes:
    _, tables, _ = _split(data)
    return _join(data, b"[" * 200_000 + b"]" * 200_000, tables)


def _many_streams(data: bytes) -> bytes:
    def edit(h: dict[str, Any]) -> None:
        s = h["streams"][0]
        h["streams"] = [{**s, "id": i} for i in range(300_000)]

    return _edit_header(data, edit)


HOSTILE_CONTAINERS: dict[str, Callable[[bytes], bytes]] = {
    "chunk count 10^12": lambda d: _edit_header(d, lambda h: h["counts"].update(chunks=10**12)),
    "chunk offset 2^63": lambda d: _edit_tables(d, "offset", 1 << 63),
    "chunk size 2^62": lambda d: _edit_tables(d, "size", 1 << 62),
    "chunk raw size 2^40": lambda d: _edit_tables(d, "raw_size", 1 << 40),
    "frame claims 65535 chunks": lambda d: _edit_tables(d, "chunks", 65535, "frame"),
    "frame length 2^60": lambda d: _edit_tables(d, "length", 1 << 60, "frame"),
    "segment lengths wrapping 2^64": _wrap_segments,
    "source size 2^62": lambda d: _edit_header(d, lambda h: h["source"].update(size=1 << 62)),
    "frame size 2^60": lambda d: _edit_header(d, lambda h: h["streams"][0].update(frame_size=1 << 60)),
    "300k streams": _many_streams,
    "index raw size 2^40 in footer": lambda d: _join(d, *_split(d)[:2], raw_size=1 << 40),
    "index frame inflating to 256 MiB": _huge_index_frame,
    "JSON nested 200k deep": _deep_json,
    "count given as Infinity": lambda d: _edit_header(d, lambda h: h["counts"].update(frames=float("inf"))),
}


@pytest.mark.parametrize("case", list(HOSTILE_CONTAINERS))
def test_hostile_container(case: str, tmp_path: Path) -> None:
    bad = tmp_path / "x.ckptz"
    bad.write_bytes(HOSTILE_CONTAINERS[case](_container(tmp_path)))
    tracemalloc.start()
    try:
        with open(bad, "rb") as f, pytest.raises(ContainerError) as err:
            read_index(f, str(bad))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MAX_INDEX_BYTES // 4, f"{peak} bytes traced"
    _RESULTS[f"container: {case}"] = f"{type(err.value).__name__}: {err.value.message}"
    assert not api.verify(bad, device="cpu").ok


def test_container_source_name_is_never_a_path(tmp_path: Path) -> None:
    """The name recorded inside a container never chooses where decompress writes."""
    data = _container(tmp_path)
    evil = _edit_header(data, lambda h: h["source"].update(name="../../escaped.safetensors"))
    box = tmp_path / "box"
    box.mkdir()
    (box / "m.safetensors.ckptz").write_bytes(evil)
    before = _tree(tmp_path)
    api.decompress(box, in_place=True, device="cpu")
    after = _tree(tmp_path)
    assert {k for k in after if not k.startswith("box/")} == {k for k in before if not k.startswith("box/")}
    assert sorted(p.name for p in box.iterdir()) == ["m.safetensors"]
    _RESULTS["container: source name ../../escaped"] = "ignored; output named after the container file"


# --- paths ---------------------------------------------------------------------------------


@pytest.fixture
def linked(tmp_path: Path) -> tuple[Path, Path]:
    """A checkpoint folder with symlinks (file and folder) pointing outside it."""
    import torch

    outside = tmp_path / "outside"
    outside.mkdir()
    torch.save({"secret": torch.arange(10)}, outside / "secret.pt")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    torch.save({"w": torch.randn(50)}, ckpt / "model.pt")
    (ckpt / "leak.pt").symlink_to("../outside/secret.pt")
    (ckpt / "dirlink").symlink_to(outside)
    (ckpt / "abs.pt").symlink_to(outside / "secret.pt")
    return ckpt, outside


def test_symlinks_out_of_the_folder_are_never_followed(linked: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, outside = linked
    before = _tree(outside)
    out = tmp_path / "out"
    api.compress(ckpt, out, device="cpu")
    assert _tree(outside) == before
    for name in ("leak.pt", "dirlink", "abs.pt"):
        assert (out / name).is_symlink() and os.readlink(out / name) == os.readlink(ckpt / name)
    api.compress(ckpt, in_place=True, device="cpu")
    api.decompress(ckpt, in_place=True, device="cpu")
    assert _tree(outside) == before
    assert (ckpt / "leak.pt").is_symlink()
    _RESULTS["symlinks to outside (file, folder, absolute)"] = (
        "kept as links, never followed or written through"
    )


def test_symlinked_destination_folder_is_refused(linked: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, outside = linked
    (ckpt / "sub").mkdir()
    (ckpt / "sub" / "x.pt").write_bytes((ckpt / "model.pt").read_bytes())
    out = tmp_path / "out"
    out.mkdir()
    (out / "sub").symlink_to(outside)
    before = _tree(outside)
    with pytest.raises(UnsafePathError):
        api.compress(ckpt, out, device="cpu", force=True)
    assert _tree(outside) == before
    _RESULTS["destination sub-folder is a symlink outside"] = "UnsafePathError, nothing written"


def test_symlinked_container_name_is_refused_in_place(tmp_path: Path) -> None:
    """``X.ckptz`` linking elsewhere must not make an in-place run delete ``X``."""
    import torch

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    torch.save({"w": torch.randn(50)}, ckpt / "model.pt")
    elsewhere = tmp_path / "elsewhere.ckptz"
    api.compress(ckpt / "model.pt", elsewhere, device="cpu")
    (ckpt / "model.pt.ckptz").symlink_to(elsewhere)
    with pytest.raises(CkptzError):
        api.compress(ckpt, in_place=True, device="cpu")
    assert (ckpt / "model.pt").is_file()


def test_output_never_overwrites_an_input(tmp_path: Path) -> None:
    import torch

    src = tmp_path / "a.pt"
    torch.save({"w": torch.randn(10)}, src)
    digest = _sha(src)
    with pytest.raises(CkptzError, match="input"):
        api.compress(src, src, device="cpu", force=True)
    assert _sha(src) == digest


def test_inputs_never_modified_without_in_place(tmp_path: Path, small_checkpoint: Path) -> None:
    from corpus import make_corpus

    corpus = tmp_path / "corpus"
    make_corpus(corpus)
    for root in (small_checkpoint, corpus):
        before = _tree(root)
        api.compress(root, tmp_path / f"{root.name}.out", device="cpu")
        api.verify(tmp_path / f"{root.name}.out", against=root, device="cpu")
        api.decompress(tmp_path / f"{root.name}.out", tmp_path / f"{root.name}.back", device="cpu")
        assert _tree(root) == before
    single = next(p for p in corpus.rglob("*.pt") if p.is_file() and not p.is_symlink())
    before = _tree(corpus)
    api.compress(single, device="cpu")  # writes X.ckptz beside X
    single.with_name(single.name + ".ckptz").unlink()
    assert _tree(corpus) == before


def test_zz_report() -> None:
    report = os.environ.get("CKPTZ_HOSTILE_REPORT")
    if report:
        Path(report).write_text(json.dumps(_RESULTS, indent=2))
