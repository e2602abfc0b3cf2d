"""The container layer: tables round-trip, and damaged or foreign files are refused."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest

from ckptz.container import (
    FOOTER,
    HEADER,
    MAGIC,
    ContainerWriter,
    Index,
    StreamInfo,
    checksum,
    make_tables,
    read_index,
    stream_frame_lists,
)
from ckptz.errors import ContainerError, CorruptionError, UnsupportedVersionError


def _write(path: Path) -> Index:
    payloads = [b"a" * 10, b"bc" * 7, b"", b"x", b"meta"]
    with open(path, "wb") as f:
        w = ContainerWriter(f)
        offsets = [w.add_payload(p) for p in payloads]
        streams = (
            StreamInfo(0, "weights", "float32", 4, True, 8, 8, 1),
            StreamInfo(1, "metadata", "uint8", 1, False, 16, 4, 0),
        )
        planes, raw_sizes = [0, 1, 2, 3, 0], [2, 2, 2, 2, 4]
        seg, frames, chunks = make_tables(
            [(1, 2), (0, 8), (1, 2)],
            [(0, 4, 8, 123), (1, 1, 4, 456)],
            [
                (o, len(p), r, checksum(p), 2, pl)
                for o, p, r, pl in zip(offsets, payloads, raw_sizes, planes, strict=True)
            ],
        )
        index = Index(
            {"source": {"name": "x.pt", "size": 12, "xxh3_128": "00"}}, streams, seg, frames, chunks
        )
        w.finish(index)
    return index


def test_index_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "a.ckptz"
    written = _write(path)
    with open(path, "rb") as f:
        index = read_index(f, str(path))
    assert index.streams == written.streams
    assert index.segments.tolist() == written.segments.tolist()
    assert index.frames.tolist() == written.frames.tolist()
    assert index.chunks.tolist() == written.chunks.tolist()
    assert all(int(o) % 16 == 0 for o in index.chunks["offset"])
    assert [r.tolist() for r in stream_frame_lists(index)] == [[0], [1]]
    assert index.header["counts"] == {"segments": 3, "frames": 2, "chunks": 5}


def test_header_and_footer_layout(tmp_path: Path) -> None:
    path = tmp_path / "a.ckptz"
    _write(path)
    data = path.read_bytes()
    assert data[:8] == MAGIC == b"CKPTZ\x00\r\n"
    assert struct.unpack("<HH", data[8:12]) == (1, 4)
    assert data[-8:] == b"CKPTZEND"
    off, size, _raw, isum, major, minor, _flags, _end = FOOTER.unpack(data[-FOOTER.size :])
    assert off + size == len(data) - FOOTER.size and (major, minor) == (1, 4)
    assert checksum(data[off : off + size]) == isum


def _read(data: bytes, tmp_path: Path) -> Index:
    path = tmp_path / "b.ckptz"
    path.write_bytes(data)
    with open(path, "rb") as f:
        return read_index(f, str(path))


def test_rejects_foreign_and_damaged(tmp_path: Path) -> None:
    path = tmp_path / "a.ckptz"
    _write(path)
    good = path.read_bytes()
    with pytest.raises(ContainerError, match="bad magic"):
        _read(b"PK\x03\x04" + good[4:], tmp_path)
    with pytest.raises(ContainerError):
        _read(good[:-1], tmp_path)
    with pytest.raises(ContainerError):
        _read(good[:20], tmp_path)
    off = FOOTER.unpack(good[-FOOTER.size :])[0]
    flipped = bytearray(good)
    flipped[off + 3] ^= 0x10
    with pytest.raises(CorruptionError, match="index checksum"):
        _read(bytes(flipped), tmp_path)


def test_rejects_other_major_version(tmp_path: Path) -> None:
    path = tmp_path / "a.ckptz"
    _write(path)
    data = bytearray(path.read_bytes())
    data[: HEADER.size] = HEADER.pack(MAGIC, 2, 0, 0)
    footer = list(FOOTER.unpack(bytes(data[-FOOTER.size :])))
    footer[4], footer[5] = 2, 0  # a newer writer puts its version in both places
    data[-FOOTER.size :] = FOOTER.pack(*footer)
    with pytest.raises(UnsupportedVersionError, match="upgrade ckptz"):
        _read(bytes(data), tmp_path)


def test_tables_must_add_up(tmp_path: Path) -> None:
    buf = io.BytesIO()
    w = ContainerWriter(buf)
    streams = (StreamInfo(0, "weights", "float32", 4, True, 8, 8, 1),)
    seg, frames, chunks = make_tables([(0, 8)], [(0, 1, 8, 0)], [(16, 0, 8, 0, 1, 0)])
    # The source claims 9 bytes but the segments hold 8: a reader must refuse it.
    w.finish(Index({"source": {"name": "x", "size": 9, "xxh3_128": "0"}}, streams, seg, frames, chunks))
    with pytest.raises(ContainerError, match="add up"):
        _read(buf.getvalue(), tmp_path)


def test_checksum_is_xxh3_64() -> None:
    import xxhash

    data = np.arange(1000, dtype=np.uint8)
    assert checksum(data) == xxhash.xxh3_64_intdigest(data.tobytes())


def test_an_index_read_again_is_parsed_once_and_rewritten_one_afresh(tmp_path: Path) -> None:
    """A command reads each container's index several times (its coder, its progress, its
    restore): the same stored bytes give the index parsed the first time; bytes changed
    since are read, checked and parsed again."""
    path = tmp_path / "a.ckptz"
    _write(path)
    with open(path, "rb") as f:
        first = read_index(f, str(path))
    with open(path, "rb") as f:
        assert read_index(f, str(path)) is first
    data = bytearray(path.read_bytes())
    off, isize = struct.unpack_from("<QQ", data, len(data) - FOOTER.size)
    data[off + isize // 2] ^= 0x10  # the stored index, after its first parse
    path.write_bytes(bytes(data))
    with open(path, "rb") as f, pytest.raises(CorruptionError, match="index checksum"):
        read_index(f, str(path))
    with open(path, "wb") as f:  # another container at the same path
        w = ContainerWriter(f)
        w.finish(
            Index({"source": {"name": "y.pt", "size": 0, "xxh3_128": "00"}}, (), *make_tables([], [], []))
        )
    with open(path, "rb") as f:
        again = read_index(f, str(path))
    assert again.source_name == "y.pt" and again.source_size == 0
