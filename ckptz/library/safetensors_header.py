"""Reading a safetensors header from a file object, checked before anything is trusted.

``u64 LE N`` ‖ N bytes of JSON ‖ tensor bytes. Every entry must name a known dtype, a shape
of non-negative integers and a ``data_offsets`` range inside the file whose length is the
shape's; ranges may not overlap. The limits are the reference reader's (a 100 MB header).
"""

from __future__ import annotations

import io
import itertools
import json
import math
import struct
from dataclasses import dataclass
from typing import IO, Any

from ckptz.dtypes import SAFETENSORS_TYPES, lookup
from ckptz.errors import FormatError
from ckptz.formats.safetensors import MAX_HEADER_BYTES

_LEN = struct.Struct("<Q")
#: safetensors dtype → torch dtype name, for the dtypes torch has an element type for (its
#: sub-byte floats, F4 and F6, have none: ckptz's table files them as raw bytes).
DTYPES: dict[str, str] = {k: v for k, v in SAFETENSORS_TYPES.items() if v != "uint8" or k == "U8"}


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor of a safetensors file.

    Attributes:
        dtype: its safetensors dtype (``F32``, ``BF16``).
        shape: its shape.
        begin: file offset of its first byte.
        end: file offset just past its last byte.
    """

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def torch_dtype(self) -> str:
        """The torch dtype's name (``float32``)."""
        return DTYPES[self.dtype]

    @property
    def itemsize(self) -> int:
        return lookup(DTYPES[self.dtype]).itemsize


@dataclass(frozen=True, slots=True)
class Header:
    """A safetensors file's header: its tensors by name, and ``__metadata__``."""

    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] | None


def read_header(f: IO[bytes] | io.RawIOBase | io.BufferedIOBase, size: int, path: str) -> Header:
    """Read and check the header of the ``size``-byte safetensors file open as ``f``.

    Raises:
        FormatError: not a safetensors file, or one whose header does not hold together.
    """
    f.seek(0)
    head = f.read(_LEN.size)
    if len(head) != _LEN.size:
        raise _bad("too short for a safetensors header", path)
    (n,) = _LEN.unpack(head)
    if n > MAX_HEADER_BYTES or _LEN.size + n > size:
        raise _bad(f"header length {n} exceeds the file or the 100 MB limit", path)
    try:
        raw = json.loads(f.read(n) or b"")
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _bad(f"header is not JSON ({exc})", path) from None
    if not isinstance(raw, dict):
        raise _bad("header is not a JSON object", path)
    start = _LEN.size + n
    metadata = raw.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise _bad("__metadata__ is not an object of strings", path)
    tensors = {name: _entry(name, info, start, size, path) for name, info in raw.items()}
    spans = sorted((t.begin, t.end) for t in tensors.values() if t.end > t.begin)
    for (_, end), (begin, _) in itertools.pairwise(spans):
        if begin < end:
            raise _bad("tensors overlap", path)
    return Header(tensors, metadata)


def _entry(name: str, info: Any, start: int, size: int, path: str) -> TensorInfo:
    if not isinstance(info, dict):
        raise _bad(f"entry {name!r} is not an object", path)
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPES:
        raise _bad(f"tensor {name!r} has dtype {dtype!r}, which ckptz cannot load", path)
    if not isinstance(shape, list) or not all(_count(d) for d in shape):
        raise _bad(f"tensor {name!r} has a bad shape", path)
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_count(v) for v in offsets):
        raise _bad(f"tensor {name!r} has bad data_offsets", path)
    begin, end = offsets
    if not begin <= end or start + end > size:
        raise _bad(f"tensor {name!r} lies outside the file", path)
    if end - begin != math.prod(shape) * lookup(DTYPES[dtype]).itemsize:
        raise _bad(f"tensor {name!r}'s data_offsets disagree with its shape and dtype", path)
    return TensorInfo(dtype, tuple(shape), start + begin, start + end)


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _bad(reason: str, path: str) -> FormatError:
    return FormatError(
        f"not a valid safetensors file: {reason}",
        path=path,
        hint="is it a safetensors file? load it with ckptz.load",
    )


__all__ = ["DTYPES", "Header", "TensorInfo", "read_header"]
