"""torch.save zip files (the default since PyTorch 1.6) and DCP ``.distcp`` files made of them.

The zip is parsed by seeking: end of central directory (EOCD), ZIP64 locator and record, central
directory (CD), then each record's local header for its payload offset
(``lho + 30 + name length + extra length``; sizes always come from the CD, because torch writes
zeros in local headers). Payloads are never read. Every offset and size is checked against the
region the zip occupies, so a hostile directory ends in :class:`FormatError`, not an allocation.

Each stored (method 0), non-empty ``<prefix>/data/<key>`` record becomes a tensor segment whose
dtype and key paths come from walking ``<prefix>/data.pkl`` with the stub unpickler; everything
else (headers, pickles, padding, descriptors, CD, compressed records) is meta.

Byte layout of the structures read here (little-endian)::

    EOCD          PK\\x05\\x06 u16 disk, u16 cd_disk, u16 n_disk, u16 n, u32 cd_size, u32 cd_off, u16 clen
    ZIP64 locator PK\\x06\\x07 u32 disk, u64 zip64_eocd_off, u32 ndisks               (20 B, before EOCD)
    ZIP64 EOCD    PK\\x06\\x06 u64 size, u16 made, u16 need, u32 disk, u32 cd_disk, u64 n_disk, u64 n,
                  u64 cd_size, u64 cd_off                                            (56 B)
    CD entry      PK\\x01\\x02 ... u16 method @10, u32 csize @20, u32 usize @24, u16 nlen @28,
                  u16 elen @30, u16 clen @32, u16 disk @34, u32 lho @42, name, extra, comment
    local header  PK\\x03\\x04 ... u16 nlen @26, u16 elen @28, name, extra (30 B fixed)
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from typing import BinaryIO

from ckptz import safeio
from ckptz.components import classify
from ckptz.dtypes import lookup
from ckptz.errors import FormatError
from ckptz.formats.layout import FileLayout, Segment, fill_gaps
from ckptz.formats.pickle_walk import MAX_PICKLE_BYTES, PickleScan, scan_pickle

ZIP_MAGIC = b"PK\x03\x04"
_EOCD = struct.Struct("<4sHHHHIIH")
_LOCATOR = struct.Struct("<4sIQI")
_EOCD64 = struct.Struct("<4sQHHIIQQQQ")
_CDH = struct.Struct("<4sHHHHHHIIIHHHHHII")
_LFH = struct.Struct("<4sHHHHHIIIHH")
_U32_MAX = 0xFFFFFFFF
_U16_MAX = 0xFFFF
_MAX_CD_BYTES = 512 << 20


@dataclass(frozen=True, slots=True)
class ZipEntry:
    """One record of a zip, with absolute file offsets.

    Attributes:
        name: record name (``archive/data/0``).
        method: 0 = stored, 8 = deflate, ...
        size: compressed size from the central directory (the payload's length in the file).
        header: offset of the local file header.
        data: offset of the first payload byte.
        flags: the general-purpose bit flags (bit 3: a data descriptor follows the payload).
        directory: offset of the record's central-directory entry.
    """

    name: str
    method: int
    size: int
    header: int
    data: int
    flags: int
    directory: int

    @property
    def end(self) -> int:
        return self.data + self.size


def _read_at(f: BinaryIO, offset: int, length: int) -> bytes:
    f.seek(offset)
    data = f.read(length)
    if len(data) != length:
        raise FormatError(f"file ends before {length} bytes at offset {offset}")
    return data


def _read_spans(f: BinaryIO, spans: list[tuple[int, int]]) -> list[bytes]:
    """The bytes at each ``(offset, size)`` of ``f``: from its descriptor in one call where it
    has one (a large optimizer's zip has thousands of local headers), else one at a time."""
    try:
        fd = f.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return [_read_at(f, at, n) for at, n in spans]
    return safeio.pread_spans(fd, spans)


def _find_eocd(f: BinaryIO, start: int, end: int) -> int:
    """Offset of the EOCD whose comment ends exactly at ``end``."""
    span = min(end - start, _EOCD.size + _U16_MAX)
    if span < _EOCD.size:
        raise FormatError("too short for a zip end-of-central-directory record")
    tail = _read_at(f, end - span, span)
    pos = len(tail)
    while True:
        pos = tail.rfind(b"PK\x05\x06", 0, pos)
        if pos < 0:
            raise FormatError("no zip end-of-central-directory record at the end of the file")
        if pos + _EOCD.size <= len(tail):
            clen = _EOCD.unpack_from(tail, pos)[7]
            if pos + _EOCD.size + clen == len(tail):
                return end - span + pos


def _zip64_extra(extra: bytes, usize: int, csize: int, lho: int) -> tuple[int, int, int]:
    """Replace the 0xFFFFFFFF fields by the values of the ZIP64 extra field (id 1), in spec order."""
    pos = 0
    while pos + 4 <= len(extra):
        hid, hlen = struct.unpack_from("<HH", extra, pos)
        body = extra[pos + 4 : pos + 4 + hlen]
        pos += 4 + hlen
        if hid != 1:
            continue
        vals = [v for (v,) in struct.iter_unpack("<Q", body[: len(body) // 8 * 8])]
        fields = [usize, csize, lho]
        for i, v in enumerate(fields):
            if v == _U32_MAX:
                if not vals:
                    raise FormatError("ZIP64 extra field is missing a value")
                fields[i] = vals.pop(0)
        return fields[0], fields[1], fields[2]
    if _U32_MAX in (csize, lho):
        raise FormatError("record overflows 32 bits but has no ZIP64 extra field")
    return usize, csize, lho


def read_directory(f: BinaryIO, end: int, start: int = 0) -> tuple[int, list[ZipEntry]]:
    """Parse the zip that ends exactly at ``end`` and lies at or after ``start``.

    Args:
        f: the file, opened for binary reading.
        end: offset just past the zip's EOCD.
        start: lowest offset the zip may begin at.

    Returns:
        The zip's first byte (its *base*: offsets inside it are relative to it) and its
        records sorted by local-header offset.

    Raises:
        FormatError: the structures are missing, inconsistent or out of range.
    """
    eocd = _find_eocd(f, start, end)
    _, disk, cd_disk, _, count, cd_size, cd_off, _ = _EOCD.unpack(_read_at(f, eocd, _EOCD.size))
    cd_limit = eocd
    base = None
    if eocd - start >= _LOCATOR.size + _EOCD64.size:
        lsig, _, z64_off, ndisks = _LOCATOR.unpack(_read_at(f, eocd - _LOCATOR.size, _LOCATOR.size))
        if lsig == b"PK\x06\x07":
            # torch writes the ZIP64 record right before the locator; its stored offset is relative
            # to the zip's start, which is how the start of an embedded zip is found.
            z64 = eocd - _LOCATOR.size - _EOCD64.size
            rec = _EOCD64.unpack(_read_at(f, z64, _EOCD64.size))
            if rec[0] != b"PK\x06\x06" or ndisks > 1:
                raise FormatError("ZIP64 end-of-central-directory record is not where the locator says")
            _, _, _, _, disk, cd_disk, _, count, cd_size, cd_off = rec
            base, cd_limit = z64 - z64_off, z64
    if disk or cd_disk:
        raise FormatError("multi-disk zip archives are not supported")
    if base is None:
        base = cd_limit - cd_size - cd_off
    cd_abs = base + cd_off
    if base < start or cd_abs < base or cd_abs + cd_size != cd_limit:
        raise FormatError("central directory lies outside the zip")
    if cd_size > _MAX_CD_BYTES or count > cd_size // _CDH.size:
        raise FormatError(f"central directory claims {count} records in {cd_size} bytes")
    cd = _read_at(f, cd_abs, cd_size)
    records: list[tuple[str, int, int, int, int, int]] = []  # name, method, size, header, flags, directory
    pos = 0
    for _ in range(count):
        if pos + _CDH.size > len(cd):
            raise FormatError("central directory is truncated")
        h = _CDH.unpack_from(cd, pos)
        if h[0] != b"PK\x01\x02":
            raise FormatError("bad central directory entry signature")
        flags, method, csize, usize, nlen, elen, clen, lho = (
            h[3],
            h[4],
            h[8],
            h[9],
            h[10],
            h[11],
            h[12],
            h[16],
        )
        name_end = pos + _CDH.size + nlen
        name = cd[pos + _CDH.size : name_end].decode("utf-8", "surrogateescape")
        usize, csize, lho = _zip64_extra(cd[name_end : name_end + elen], usize, csize, lho)
        directory, pos = cd_abs + pos, name_end + elen + clen
        header = base + lho
        if header < base or header + _LFH.size > cd_abs:
            raise FormatError(f"record {name!r} has its local header outside the zip")
        records.append((name, method, csize, header, flags, directory))
    entries: list[ZipEntry] = []
    for (name, method, csize, header, flags, directory), raw in zip(
        records, _read_spans(f, [(r[3], _LFH.size) for r in records]), strict=True
    ):
        if len(raw) != _LFH.size:
            raise FormatError(f"file ends before {_LFH.size} bytes at offset {header}")
        lfh = _LFH.unpack(raw)
        if lfh[0] != ZIP_MAGIC:
            raise FormatError(f"record {name!r} has no local header")
        data = header + _LFH.size + lfh[9] + lfh[10]
        if data + csize > cd_abs:
            raise FormatError(f"record {name!r} claims {csize} bytes past the central directory")
        entries.append(ZipEntry(name, method, csize, header, data, flags, directory))
    entries.sort(key=lambda e: e.header)
    for a, b in itertools.pairwise(entries):
        if a.end > b.header:
            raise FormatError(f"records {a.name!r} and {b.name!r} overlap")
    return base, entries


def _pickle_for(f: BinaryIO, entries: list[ZipEntry]) -> tuple[str, PickleScan]:
    """The archive prefix and the walked ``<prefix>/data.pkl``."""
    if not entries:
        raise FormatError("zip has no records")
    prefix = entries[0].name.split("/", 1)[0]
    pkl = next((e for e in entries if e.name == f"{prefix}/data.pkl"), None)
    if pkl is None:
        raise FormatError(f"zip has no {prefix}/data.pkl: not a torch.save file")
    if pkl.method != 0:
        raise FormatError("data.pkl is compressed; ckptz only walks stored pickles")
    if pkl.size > MAX_PICKLE_BYTES:
        raise FormatError(f"data.pkl of {pkl.size} bytes is larger than ckptz walks")
    return prefix, scan_pickle(_read_at(f, pkl.data, pkl.size))


def zip_tensors(
    f: BinaryIO, entries: list[ZipEntry], relpath: str, outer: tuple[str, ...] = ()
) -> tuple[list[Segment], list[str]]:
    """Tensor segments of one torch zip's stored storage records, plus notes.

    Args:
        f: the file.
        entries: the zip's records (from :func:`read_directory`).
        relpath: the file's path relative to the checkpoint folder, for classification.
        outer: key paths under which this zip's object sits (DCP items); prefixed to its paths.
    """
    prefix, scan = _pickle_for(f, entries)
    segments: list[Segment] = []
    compressed = 0
    for e in entries:
        key = e.name.removeprefix(f"{prefix}/data/")
        if key == e.name or "/" in key or e.size == 0:
            continue
        if e.method != 0:
            compressed += 1
            continue
        dtype = scan.dtype(key) if key in scan.storages else "uint8"
        if e.size % lookup(dtype).itemsize:
            dtype = "uint8"
        paths = scan.paths(key)
        if outer:
            paths = tuple(f"{o}.{p}" if p else o for o in outer for p in (paths or ("",)))
        segments.append(Segment(e.data, e.size, "tensor", dtype, paths, classify(relpath, paths, dtype)))
    notes = [f"{compressed} compressed storage record(s) kept as metadata"] if compressed else []
    return segments, notes


def _layout(fmt: str, size: int, tensors: list[Segment], notes: list[str]) -> FileLayout:
    try:
        return FileLayout(fmt, size, fill_gaps(size, tensors), tuple(notes))
    except ValueError as exc:
        raise FormatError(f"storage records overlap: {exc}") from None


def read_torch_zip(f: BinaryIO, size: int, relpath: str) -> FileLayout:
    """Cut a torch.save zip (or TorchScript zip) into segments.

    Raises:
        FormatError: the zip is malformed, hostile, has bytes before it, or its pickle cannot be walked.
    """
    base, entries = read_directory(f, size)
    if base != 0:
        raise FormatError(f"{base} unexpected bytes before the zip")
    tensors, notes = zip_tensors(f, entries, relpath)
    return _layout("torch-zip", size, tensors, notes)


def read_concatenated(
    f: BinaryIO, size: int, relpath: str, items: dict[int, tuple[str, ...]] | None = None
) -> FileLayout:
    """Cut a DCP ``.distcp`` file (torch.save zips written back to back) into segments.

    The zips are found from the end: each one's ZIP64 record gives its own start, which is the
    end of the one before.

    Args:
        f: the file.
        size: its size.
        relpath: its path relative to the checkpoint folder.
        items: optional map from an item's start offset to its fully qualified names (from the
            sibling ``.metadata``), so tensors get paths like ``optim.state.0.exp_avg``.

    Raises:
        FormatError: some part of the file is not a torch zip.
    """
    tensors: list[Segment] = []
    notes: list[str] = []
    end = size
    count = 0
    while end > 0:
        base, entries = read_directory(f, end)
        segs, more = zip_tensors(f, entries, relpath, (items or {}).get(base, ()))
        tensors.extend(segs)
        notes.extend(more)
        end = base
        count += 1
    return _layout("torch-zip", size, tensors, [f"{count} concatenated torch.save items", *notes])
