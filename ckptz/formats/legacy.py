"""The legacy torch.save format (torch < 1.6, or ``_use_new_zipfile_serialization=False``).

A stream of back-to-back pickles followed by raw storages (``torch/serialization.py``
``_legacy_save``)::

    pickle(MAGIC_NUMBER = 0x1950A86A20F9469CFC6C)
    pickle(PROTOCOL_VERSION = 1001)
    pickle(sys_info)              {'protocol_version', 'little_endian', 'type_sizes'}
    pickle(obj)                   storages as ('storage', type, key, location, numel, view)
    pickle(sorted storage keys)
    per key: i64 LE count, then count * itemsize raw bytes (itemsize of the storage type)

The pickles' ends are found with :func:`pickletools.genops` over a bounded window read from the
head of the file; only the object pickle and the key list are unpickled (by the stub unpickler).
"""

from __future__ import annotations

import io
import pickletools
import struct
from typing import BinaryIO

from ckptz.components import classify
from ckptz.dtypes import lookup
from ckptz.errors import FormatError
from ckptz.formats.layout import FileLayout, Segment, fill_gaps
from ckptz.formats.pickle_walk import MAX_PICKLE_BYTES, load_stub, scan_pickle

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
_MAGIC_BIN = b"\x8a\x0a" + MAGIC_NUMBER.to_bytes(10, "little")
_MAGIC_TEXT = b"L" + str(MAGIC_NUMBER).encode()
_COUNT = struct.Struct("<q")


def sniff(head: bytes) -> bool:
    """Whether ``head`` (the first 16 bytes of a file) starts like a legacy torch file."""
    if head[:1] == b"\x80":  # PROTO n, then LONG1 of the magic
        return head[2:14] == _MAGIC_BIN
    return head.startswith(_MAGIC_TEXT)  # protocols 0 and 1 write longs as text


def _pickle_ends(f: BinaryIO, size: int, count: int) -> list[int]:
    """End offsets of the first ``count`` pickles, reading a window that grows as needed."""
    window = min(size, 1 << 20)
    while True:
        f.seek(0)
        buf = io.BytesIO(f.read(window))
        ends: list[int] = []
        try:
            for _ in range(count):
                for _op in pickletools.genops(buf):
                    pass
                ends.append(buf.tell())
            return ends
        except Exception as exc:  # genops raises ValueError or struct errors on bad bytes
            if window >= size or window > MAX_PICKLE_BYTES:
                raise FormatError(f"legacy header pickles cannot be read: {exc}") from None
            window = min(size, window * 4)


def read_legacy(f: BinaryIO, size: int, relpath: str) -> FileLayout:
    """Cut a legacy torch.save file into segments.

    Raises:
        FormatError: the header, pickles or storage counts are inconsistent with the file.
    """
    ends = _pickle_ends(f, size, 5)
    f.seek(0)
    head = f.read(ends[-1])
    if load_stub(head[: ends[0]]) != MAGIC_NUMBER:
        raise FormatError("legacy magic number does not match")
    if load_stub(head[ends[0] : ends[1]]) != PROTOCOL_VERSION:
        raise FormatError("unsupported legacy torch protocol version")
    info = load_stub(head[ends[1] : ends[2]])
    little = not isinstance(info, dict) or info.get("little_endian", True)
    scan = scan_pickle(head[ends[2] : ends[3]])
    keys = load_stub(head[ends[3] : ends[4]])
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise FormatError("legacy storage key list is not a list of strings")
    tensors: list[Segment] = []
    pos = ends[4]
    for key in keys:
        ref = scan.storages.get(key)
        if ref is None:
            raise FormatError(f"legacy storage {key!r} is not named by the pickle")
        f.seek(pos)
        raw = f.read(_COUNT.size)
        if len(raw) != _COUNT.size:
            raise FormatError(f"file ends before storage {key!r}")
        (count,) = _COUNT.unpack(raw)
        nbytes = count * lookup(ref.dtype).itemsize
        start = pos + _COUNT.size
        if count < 0 or start + nbytes > size:
            raise FormatError(f"legacy storage {key!r} claims {count} elements past the end of the file")
        dtype = scan.dtype(key) if little else "uint8"
        if nbytes % lookup(dtype).itemsize:
            dtype = "uint8"
        paths = scan.paths(key)
        tensors.append(Segment(start, nbytes, "tensor", dtype, paths, classify(relpath, paths, dtype)))
        pos = start + nbytes
    notes: tuple[str, ...] = () if little else ("big-endian legacy file: tensors treated as raw bytes",)
    if pos != size:
        notes += (f"{size - pos} trailing bytes kept as metadata",)
    return FileLayout("torch-legacy", size, fill_gaps(size, tensors), notes)
