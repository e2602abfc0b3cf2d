"""``torch.save``'s archive without its tensor bytes, and what those bytes change in it.

``torch.save`` runs under ``torch.serialization.skip_data``: it pickles the object and
writes the whole archive (records, alignment, zip structure) but leaves every storage
record's bytes out (a hole in a sparse file) and its CRC-32 zero. A recording
``pickle_module`` notes which storage each ``data/<key>`` record holds, from torch's own
``persistent_id`` answers, so the keys are torch's. :mod:`ckptz.library.torch_image`
fills the holes.

What depends on the tensor bytes: each data record's CRC-32 (in its data descriptor or
local header, and in its central-directory entry), and the ``.data/serialization_id``
record. PyTorch's writer (``caffe2/serialize/inline_container.cc``) makes that id from a
hash of the record names (unchanged) and ``hash_combine`` of the CRC-32 of every record
with bytes, in write order, 20 decimal digits each; the id record's own CRC-32 follows.

That model is checked against the skeleton before it is trusted: the id recomputed from
the skeleton's own CRCs must equal the one torch wrote, every data record must be stored,
zero-CRC and as long as its storage, and every storage must have its record. Anything else
raises :class:`Unsupported`, and the caller falls back to ``torch.save``.
"""

from __future__ import annotations

import struct
import types
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptz.formats.torchzip import ZipEntry, read_directory

if TYPE_CHECKING:
    import torch

_DESCRIPTOR = b"PK\x07\x08"
_CD_CRC = 16  # offset of the CRC-32 in a central-directory entry
_LFH_CRC = 14
_HAS_DESCRIPTOR = 0x08
_U64 = (1 << 64) - 1
_ID_RECORD = ".data/serialization_id"
_ID_DIGITS = 20


class Unsupported(Exception):
    """The skeleton is not one this module can model; ``torch.save`` must write the bytes."""


@dataclass(frozen=True, slots=True)
class Record:
    """One zip record of the skeleton, and where its CRC-32 lives.

    Attributes:
        entry: the record (name, offsets, size).
        crc: its CRC-32 as the skeleton has it.
        crc_at: the offsets of every copy of its CRC-32 (descriptor or local header, and
            central directory).
    """

    entry: ZipEntry
    crc: int
    crc_at: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Skeleton:
    """A ``skip_data`` archive and the storages its holes stand for.

    The file has the finished archive's exact size and structure, so the pipeline takes the
    layout from it.

    Attributes:
        path: the sparse skeleton file.
        size: its length, which is the length of the finished image.
        records: every record, in file order.
        storages: ``data/<key>`` record name -> the storage to fill it with.
        compute_crc: whether torch computed CRC-32s (``torch.utils.serialization.config``).
        id_record: the ``.data/serialization_id`` record.
        id: its bytes as torch wrote them (from the skeleton's CRCs).
    """

    path: Path
    size: int
    records: tuple[Record, ...]
    storages: dict[str, torch.UntypedStorage]
    compute_crc: bool
    id_record: Record
    id: bytes


def _recording(module: Any, seen: dict[str, Any]) -> types.ModuleType:
    """``module`` with a ``Pickler`` that notes every storage torch's ``persistent_id`` names."""
    base = module.Pickler
    setter = getattr(base, "persistent_id", None)

    class Pickler(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            inner = self.persistent_id  # type: ignore[has-type]

            def record(obj: Any) -> Any:
                pid = inner(obj)
                if isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage":
                    seen.setdefault(str(pid[2]), getattr(obj, "_untyped_storage", obj))
                return pid

            # torch's subclass defines persistent_id as a method; the C pickler took it at
            # __init__, so the new one goes in through the base class's own descriptor.
            if hasattr(setter, "__set__"):
                setter.__set__(self, record)  # type: ignore[union-attr]
            else:
                self.persistent_id = record

    proxy = types.ModuleType(module.__name__)
    proxy.__dict__.update(vars(module))
    proxy.Pickler = Pickler  # type: ignore[attr-defined]
    return proxy


def skeleton(obj: object, folder: Path, name: str, save_args: dict[str, Any]) -> Skeleton:
    """Write ``obj``'s ``skip_data`` archive as ``folder/name`` (the name is part of the archive).

    Raises:
        Unsupported: this torch cannot skip data (or not for ``obj``), the arguments ask
            for the legacy format, or the archive is not one :mod:`ckptz.library.torch_image` knows how to fill.
    """
    import pickle

    import torch

    skip = getattr(torch.serialization, "skip_data", None)
    if skip is None or not save_args.get("_use_new_zipfile_serialization", True):
        raise Unsupported("this torch.save cannot skip data")
    seen: dict[str, Any] = {}
    args = dict(save_args)
    args["pickle_module"] = _recording(args.get("pickle_module", pickle), seen)
    path = folder / name
    try:
        with skip():
            torch.save(obj, path, **args)
    except Exception as exc:
        # Some tensors refuse to skip their data (quantized ones); an object torch.save
        # cannot save at all fails again, with torch's own error, in the fallback.
        raise Unsupported(f"torch.save could not skip data: {exc}") from None
    from torch.utils.serialization import config

    return _read(path, seen, bool(config.save.compute_crc32))


def _read(path: Path, seen: dict[str, Any], compute_crc: bool) -> Skeleton:
    size = path.stat().st_size
    with open(path, "rb") as f:
        try:
            _base, entries = read_directory(f, size)
        except Exception as exc:  # a skeleton this module cannot parse is torch's business
            raise Unsupported(f"unexpected skeleton: {exc}") from None
        records = tuple(_record(f, e) for e in entries)
        id_record = next((r for r in records if r.entry.name.endswith("/" + _ID_RECORD)), None)
        if id_record is None:
            raise Unsupported("no serialization_id record")
        f.seek(id_record.entry.data)
        sid = f.read(id_record.entry.size)
    prefix = entries[0].name.split("/", 1)[0] + "/" if entries else ""
    storages = {}
    for rec in records:
        rel = rec.entry.name.removeprefix(prefix)
        if rel.startswith("data/"):
            storage = seen.get(rel[5:])
            if storage is None or storage.nbytes() != rec.entry.size or rec.entry.method != 0:
                raise Unsupported(f"record {rec.entry.name} does not match a storage")
            if rec.crc:
                raise Unsupported(f"record {rec.entry.name} has a CRC without its data")
            storages[rec.entry.name] = storage
    if len(storages) != len(seen):
        raise Unsupported("a storage has no record")
    if len(sid) != 2 * _ID_DIGITS or not sid.isdigit():
        raise Unsupported("serialization_id is not 40 digits")
    skel = Skeleton(path, size, records, storages, compute_crc, id_record, sid)
    if serialization_id(skel, {}) != sid:
        raise Unsupported("serialization_id is not made as this module expects")
    return skel


def _record(f: Any, e: ZipEntry) -> Record:
    """``e`` and where its CRC-32 lives: its data descriptor (after an optional signature)
    or its local header, and its central-directory entry; the two copies must agree."""
    if e.flags & _HAS_DESCRIPTOR:
        f.seek(e.end)
        first = e.end + 4 if f.read(4) == _DESCRIPTOR else e.end
    else:
        first = e.header + _LFH_CRC
    crcs = []
    for at in (first, e.directory + _CD_CRC):
        f.seek(at)
        crcs.append(struct.unpack("<I", f.read(4))[0])
    if crcs[0] != crcs[1]:
        raise Unsupported(f"record {e.name}: CRC-32 copies disagree")
    return Record(e, crcs[1], (first, e.directory + _CD_CRC))


def serialization_id(skel: Skeleton, crcs: dict[str, int]) -> bytes:
    """The id record's bytes with every record's CRC-32 (``crcs`` over the skeleton's)."""
    combined = 0
    for other in skel.records:
        if other is skel.id_record:
            break
        if not other.entry.size:  # the writer combines only records with bytes
            continue
        crc = crcs.get(other.entry.name, other.crc)
        # c10::hash_combine on size_t
        combined ^= (crc + 0x9E3779B9 + ((combined << 6) & _U64) + (combined >> 2)) & _U64
    return skel.id[:_ID_DIGITS] + str(combined).zfill(_ID_DIGITS).encode()


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32 of ``a + b`` from ``crc32(a)``, ``crc32(b)`` and ``len(b)`` (zlib's method)."""
    if len2 <= 0:
        return crc1
    odd = [0xEDB88320] + [1 << n for n in range(31)]  # the operator for one zero bit
    even = _gf2_square(odd)  # two zero bits
    odd = _gf2_square(even)  # four
    while True:
        even = _gf2_square(odd)  # first pass: one zero byte
        if len2 & 1:
            crc1 = _gf2_times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = _gf2_square(even)
        if len2 & 1:
            crc1 = _gf2_times(odd, crc1)
        len2 >>= 1
        if not len2:
            break
    return crc1 ^ crc2


def _gf2_times(mat: list[int], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_square(mat: list[int]) -> list[int]:
    return [_gf2_times(mat, mat[n]) for n in range(32)]


__all__ = ["Record", "Skeleton", "Unsupported", "crc32_combine", "serialization_id", "skeleton"]
