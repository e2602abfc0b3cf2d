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

from ckptz.errors import FormatError
from ckptz.formats.safetensors import MAX_HEADER_BYTES

_LEN = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class DType:
    """A safetensors dtype: its element width and the torch dtype that holds it.

    Attributes:
        bits: bits per element (4 and 6 for the sub-byte floats).
        torch_name: the torch dtype's name, or None where torch has none.
        packed: elements per torch element (two ``F4`` values in one ``float4_e2m1fn_x2``).
    """

    bits: int
    torch_name: str | None
    packed: int = 1


#: Every dtype safetensors 0.8 reads, by its header name.
DTYPES: dict[str, DType] = {
    "BOOL": DType(8, "bool"),
    "F4": DType(4, "float4_e2m1fn_x2", 2),
    "F6_E2M3": DType(6, None),
    "F6_E3M2": DType(6, None),
    "U8": DType(8, "uint8"),
    "I8": DType(8, "int8"),
    "F8_E5M2": DType(8, "float8_e5m2"),
    "F8_E4M3": DType(8, "float8_e4m3fn"),
    "F8_E8M0": DType(8, "float8_e8m0fnu"),
    "F8_E4M3FNUZ": DType(8, "float8_e4m3fnuz"),
    "F8_E5M2FNUZ": DType(8, "float8_e5m2fnuz"),
    "I16": DType(16, "int16"),
    "U16": DType(16, "uint16"),
    "F16": DType(16, "float16"),
    "BF16": DType(16, "bfloat16"),
    "I32": DType(32, "int32"),
    "U32": DType(32, "uint32"),
    "F32": DType(32, "float32"),
    "C64": DType(64, "complex64"),
    "F64": DType(64, "float64"),
    "I64": DType(64, "int64"),
    "U64": DType(64, "uint64"),
}


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor of a safetensors file.

    Attributes:
        dtype: its safetensors dtype (``F32``, ``BF16``).
        shape: its shape as the header gives it (in elements, two per byte for ``F4``).
        begin: file offset of its first byte.
        end: file offset just past its last byte.
    """

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def torch_dtype(self) -> str | None:
        """The torch dtype's name (``float32``), or None where torch has none (``F6_E2M3``)."""
        return DTYPES[self.dtype].torch_name

    @property
    def bits(self) -> int:
        """Bits per element."""
        return DTYPES[self.dtype].bits

    @property
    def torch_shape(self) -> tuple[int, ...] | None:
        """The shape of the torch tensor that holds it (the last dimension halved for ``F4``),
        or None where no torch shape can (``F4`` with an odd last dimension)."""
        packed = DTYPES[self.dtype].packed
        if packed == 1:
            return self.shape
        if not self.shape or self.shape[-1] % packed:
            return None
        return (*self.shape[:-1], self.shape[-1] // packed)


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
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise _bad(f"tensor {name!r} has dtype {dtype!r}, which safetensors does not know", path)
    if not isinstance(shape, list) or not all(_count(d) for d in shape):
        raise _bad(f"tensor {name!r} has a bad shape", path)
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_count(v) for v in offsets):
        raise _bad(f"tensor {name!r} has bad data_offsets", path)
    begin, end = offsets
    if not begin <= end or start + end > size:
        raise _bad(f"tensor {name!r} lies outside the file", path)
    bits = math.prod(shape) * DTYPES[dtype].bits
    if bits % 8:
        raise _bad(f"tensor {name!r} of sub-byte dtype {dtype} does not end on a byte", path)
    if end - begin != bits // 8:
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


__all__ = ["DTYPES", "DType", "Header", "TensorInfo", "read_header"]
