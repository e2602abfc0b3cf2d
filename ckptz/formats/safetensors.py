"""safetensors files: ``u64 LE N`` ‖ N bytes of JSON header ‖ tensor bytes.

The header (and its space padding, and ``__metadata__``) is one meta segment kept verbatim; each
tensor's ``data_offsets`` range (relative to the end of the header) is a tensor segment. The
header is capped at 100 MB, as the reference Rust reader does, and every range must lie inside
the file; holes and trailing bytes are tolerated (they become meta).
"""

from __future__ import annotations

import json
import struct
from typing import Any, BinaryIO

from ckptz.components import classify
from ckptz.dtypes import SAFETENSORS_TYPES, lookup
from ckptz.errors import FormatError
from ckptz.formats.layout import FileLayout, Segment, fill_gaps

MAX_HEADER_BYTES = 100_000_000
_LEN = struct.Struct("<Q")


def sniff(head: bytes, size: int) -> bool:
    """Whether ``head`` (the first 16 bytes) looks like a safetensors header of a ``size``-byte file."""
    if len(head) < 9:
        return False
    (n,) = _LEN.unpack_from(head)
    return 2 <= n <= min(size - 8, MAX_HEADER_BYTES) and head[8:9] == b"{"


def _range(name: str, info: Any, start: int, size: int) -> tuple[int, int, str]:
    if not isinstance(info, dict):
        raise FormatError(f"safetensors entry {name!r} is not an object")
    offsets = info.get("data_offsets")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in offsets)
    ):
        raise FormatError(f"safetensors entry {name!r} has bad data_offsets")
    begin, end = offsets
    if not 0 <= begin <= end or start + end > size:
        raise FormatError(f"safetensors entry {name!r} range {begin}..{end} lies outside the file")
    dtype = SAFETENSORS_TYPES.get(str(info.get("dtype")), "uint8")
    if (end - begin) % lookup(dtype).itemsize:
        dtype = "uint8"
    return start + begin, end - begin, dtype


def read_safetensors(f: BinaryIO, size: int, relpath: str) -> FileLayout:
    """Cut a safetensors file into segments.

    Raises:
        FormatError: the header is too large, not JSON, or names ranges outside the file.
    """
    f.seek(0)
    raw = f.read(_LEN.size)
    if len(raw) != _LEN.size:
        raise FormatError("too short for a safetensors header")
    (n,) = _LEN.unpack(raw)
    if n > MAX_HEADER_BYTES or _LEN.size + n > size:
        raise FormatError(f"safetensors header length {n} exceeds the file or the 100 MB limit")
    try:
        header = json.loads(f.read(n))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(f"safetensors header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise FormatError("safetensors header is not a JSON object")
    start = _LEN.size + n
    # Identical ranges (shared tensors from a writer other than safetensors') become one segment.
    ranges: dict[tuple[int, int], tuple[str, list[str]]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offset, length, dtype = _range(name, info, start, size)
        ranges.setdefault((offset, length), (dtype, []))[1].append(name)
    tensors = [
        Segment(offset, length, "tensor", dtype, tuple(names), classify(relpath, tuple(names), dtype))
        for (offset, length), (dtype, names) in ranges.items()
    ]
    try:
        segments = fill_gaps(size, tensors)
    except ValueError as exc:
        raise FormatError(f"safetensors tensors overlap: {exc}") from None
    return FileLayout("safetensors", size, segments)
