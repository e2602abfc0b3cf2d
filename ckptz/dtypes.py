"""The dtype table: every element type ckptz meets, and how its bytes are transformed.

Names are PyTorch's without the ``torch.`` prefix. The transform of a dtype is described
by its *word size* (bytes per plane group) and whether the sign bit is rotated to the
bottom so a float's exponent sits in the top byte.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DType:
    """One element type.

    Attributes:
        name: PyTorch name without ``torch.`` (``float32``, ``bfloat16``, ``uint8``).
        itemsize: bytes per element.
        word: bytes per transform word; complex types split into their two float halves.
        is_float: IEEE-like layout with sign, exponent, mantissa; gets the sign rotation.
        exponent_bits: width of the exponent field, 0 for non-floats.
    """

    name: str
    itemsize: int
    word: int
    is_float: bool = False
    exponent_bits: int = 0


_TABLE = (
    DType("float64", 8, 8, True, 11),
    DType("float32", 4, 4, True, 8),
    DType("float16", 2, 2, True, 5),
    DType("bfloat16", 2, 2, True, 8),
    DType("complex128", 16, 8, True, 11),
    DType("complex64", 8, 4, True, 8),
    DType("complex32", 4, 2, True, 5),
    DType("float8_e4m3fn", 1, 1),
    DType("float8_e5m2", 1, 1),
    DType("float8_e4m3fnuz", 1, 1),
    DType("float8_e5m2fnuz", 1, 1),
    DType("float8_e8m0fnu", 1, 1),
    DType("float4_e2m1fn_x2", 1, 1),
    DType("int64", 8, 8),
    DType("int32", 4, 4),
    DType("int16", 2, 2),
    DType("int8", 1, 1),
    DType("uint64", 8, 8),
    DType("uint32", 4, 4),
    DType("uint16", 2, 2),
    DType("uint8", 1, 1),
    DType("bool", 1, 1),
    DType("qint8", 1, 1),
    DType("quint8", 1, 1),
    DType("qint32", 4, 4),
    DType("quint4x2", 1, 1),
    DType("quint2x4", 1, 1),
)

DTYPES: dict[str, DType] = {d.name: d for d in _TABLE}

BYTES = DTYPES["uint8"]

# Legacy typed-storage class names as they appear in pickles (torch/storage.py).
STORAGE_TYPES: dict[str, str] = {
    "DoubleStorage": "float64",
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128",
    "QInt8Storage": "qint8",
    "QUInt8Storage": "quint8",
    "QInt32Storage": "qint32",
    "QUInt4x2Storage": "quint4x2",
    "QUInt2x4Storage": "quint2x4",
    "UntypedStorage": "uint8",
}

# safetensors header dtype strings (safetensors/src/tensor.rs `Dtype`).
SAFETENSORS_TYPES: dict[str, str] = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E8M0": "float8_e8m0fnu",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "I16": "int16",
    "U16": "uint16",
    "F16": "float16",
    "BF16": "bfloat16",
    "I32": "int32",
    "U32": "uint32",
    "F32": "float32",
    "C64": "complex64",
    "F64": "float64",
    "I64": "int64",
    "U64": "uint64",
    "F4": "uint8",
    "F6_E2M3": "uint8",
    "F6_E3M2": "uint8",
}


def lookup(name: str) -> DType:
    """Return the table entry for ``name``, or raw bytes for a name ckptz does not know."""
    return DTYPES.get(name.removeprefix("torch."), BYTES)
