"""Containers crafted as an attacker would: edited indexes re-sealed with valid checksums,
and decompression bombs (constant frames that expand far past the container's size).

Shared by tests/test_hostile.py's neighbours and tests/test_campaign.py.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
import zstandard

from ckptz.container import (
    CHUNK_DTYPE,
    FOOTER,
    FRAME_DTYPE,
    MAJOR,
    MINOR,
    PREFIX,
    SEGMENT_DTYPE,
    checksum,
)
from ckptz.digest import Hasher

CONST_ID = 1


def split(data: bytes) -> tuple[dict[str, Any], bytes, int]:
    """A container's JSON header, its packed tables, and the index's offset."""
    off, isize, raw_size, *_ = FOOTER.unpack(data[-FOOTER.size :])
    raw = zstandard.ZstdDecompressor().decompress(data[off : off + isize], max_output_size=raw_size)
    (jsize,) = struct.unpack_from("<I", raw)
    return json.loads(raw[4 : 4 + jsize]), raw[4 + jsize :], off


def seal(data_area: bytes, header: dict[str, Any] | bytes, tables: bytes) -> bytes:
    """A container of ``data_area`` (prefix included) and an index, with valid checksums."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    raw = struct.pack("<I", len(text)) + text + tables
    blob = zstandard.ZstdCompressor().compress(raw)
    off = len(data_area)
    footer = FOOTER.pack(off, len(blob), len(raw), checksum(blob), MAJOR, MINOR, 0, b"CKPTZEND")
    return data_area + blob + footer


def reseal(data: bytes, edit: Callable[[dict[str, Any]], None]) -> bytes:
    """``data`` with its JSON header edited by ``edit``, re-sealed."""
    header, tables, off = split(data)
    edit(header)
    return seal(data[:off], header, tables)


#: Index header fields the readers use, as paths into the JSON header (a list's member by
#: its position).
HEADER_FIELDS: list[tuple[str, ...]] = [
    ("tensor_keys",),
    ("tensor_keys", "0"),
    ("source",),
    ("source", "size"),
    ("source", "name"),
    ("source", "format"),
    ("source", "mode"),
    ("source", "mtime_ns"),
    ("source", "xxh3_tree"),
    ("source", "xxh3_tree", "leaf"),
    ("source", "xxh3_tree", "digest"),
    ("codecs",),
    ("streams",),
    ("streams", "0"),
    ("streams", "0", "id"),
    ("streams", "0", "word"),
    ("streams", "0", "rotate"),
    ("streams", "0", "frame_size"),
    ("streams", "0", "length"),
    ("streams", "0", "dtype"),
    ("counts",),
    ("counts", "segments"),
    ("counts", "frames"),
    ("counts", "chunks"),
    ("reference",),
    ("series",),
]


def with_field(data: bytes, path: tuple[str, ...], value: Any) -> bytes:
    """``data`` with the header field at ``path`` (:data:`HEADER_FIELDS`) set to ``value``,
    re-sealed.

    Raises:
        KeyError, IndexError, TypeError, ValueError: the field's parent is not there.
    """

    def edit(header: dict[str, Any]) -> None:
        node: Any = header
        for key in path[:-1]:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(path[-1])] = value
        else:
            node[path[-1]] = value

    return reseal(data, edit)


def _zeros_checksum(size: int) -> int:
    """xxh3_64 of ``size`` zero bytes, hashed in pieces (never ``size`` bytes at once)."""
    h = xxhash.xxh3_64()
    piece = np.zeros(min(size, 16 << 20), np.uint8)
    left = size
    while left:
        n = min(left, len(piece))
        h.update(piece[:n].data)
        left -= n
    return int(h.intdigest())


def _zeros_digest(size: int, digest: bool) -> dict[str, Any]:
    if not digest:
        return {"xxh3_tree": {"leaf": 524288, "digest": "0" * 32}}
    hasher = Hasher()
    piece = np.zeros(min(size, 16 << 20) or 1, np.uint8)
    left = size
    while left:
        n = min(left, len(piece))
        hasher.update(piece[:n])
        left -= n
    return hasher.digest().to_json()


def bomb(frame_size: int, frames: int, *, digest: bool = False) -> bytes:
    """A container of one stream of ``frames`` constant (zero) frames of ``frame_size`` bytes,
    every frame and chunk checksum valid (a 1-byte payload each; frames of up to 1 GiB). With ``digest`` the whole-
    file digest is right too (hashing every byte: keep such bombs small)."""
    size = frame_size * frames
    data = PREFIX + b"".join(b"\x00" * 16 for _ in range(frames))
    # Frames past 1 GiB are refused on their declared size alone: not worth hashing here.
    frame_sum = _zeros_checksum(frame_size) if frame_size <= 1 << 30 else 0
    payload_sum = checksum(b"\x00")
    seg = np.array([(0, size)], SEGMENT_DTYPE)
    fr = np.zeros(frames, FRAME_DTYPE)
    fr["stream"], fr["chunks"], fr["length"], fr["checksum"] = 0, 1, frame_size, frame_sum
    ch = np.zeros(frames, CHUNK_DTYPE)
    ch["offset"] = 16 + 16 * np.arange(frames, dtype=np.uint64)
    ch["size"], ch["raw_size"], ch["checksum"], ch["codec"], ch["plane"] = (
        1,
        frame_size,
        payload_sum,
        CONST_ID,
        0,
    )
    header = {
        "source": {
            "name": "bomb.bin",
            "size": size,
            "format": "raw",
            "notes": [],
            **_zeros_digest(size, digest),
        },
        "streams": [
            {
                "id": 0,
                "component": "meta",
                "dtype": "uint8",
                "word": 1,
                "rotate": False,
                "frame_size": frame_size,
                "length": size,
                "tensors": 0,
            }
        ],
        "codecs": {},
        "tensor_keys": [[]],
        "counts": {"segments": 1, "frames": frames, "chunks": frames},
    }
    return seal(data, header, seg.tobytes() + fr.tobytes() + ch.tobytes())


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
