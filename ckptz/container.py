"""The `.ckptz` container: one compressed source file, readable in one pass from its end.

The format is specified in one place, ``docs/FORMAT.md`` (header, payloads at 16-byte
boundaries with zero padding, the zstd-compressed index of JSON header and segment, frame
and chunk tables, the footer; versions and codec ids). This module implements it: the
``struct`` and numpy record definitions below are that page's tables, :class:`ContainerWriter`
and :func:`index_bytes` write it, and :func:`read_index` reads and validates it — the
header's magic and version against the footer's, the footer's offsets against the file
size, the index's xxh3_64 and raw size, and every table cross-reference, so decoding never
reads or allocates out of bounds (see ``RELIABILITY.md``).
"""

from __future__ import annotations

import io
import json
import os
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol

import numpy as np
import zstandard

from ckptz.checksums import xxh3_64
from ckptz.digest import Digest
from ckptz.errors import ContainerError, CorruptionError, UnsupportedVersionError

MAGIC = b"CKPTZ\x00\r\n"
END_MAGIC = b"CKPTZEND"
MAJOR, MINOR = 1, 4
SUFFIX = ".ckptz"
ALIGN = 16

HEADER = struct.Struct("<8sHHI")
FOOTER = struct.Struct("<QQQQHHI8s")
_JSON_SIZE = struct.Struct("<I")

SEGMENT_DTYPE = np.dtype([("stream", "<u4"), ("length", "<u8")])
FRAME_DTYPE = np.dtype(
    [("stream", "<u4"), ("chunks", "<u2"), ("reserved", "<u2"), ("length", "<u8"), ("checksum", "<u8")]
)
CHUNK_DTYPE = np.dtype(
    [
        ("offset", "<u8"),
        ("size", "<u8"),
        ("raw_size", "<u8"),
        ("checksum", "<u8"),
        ("codec", "u1"),
        ("plane", "u1"),
    ]
)

# An index larger than this is not one ckptz wrote; refusing it bounds memory on hostile input
# (1 GiB of tables is ~30 million chunks, a source of tens of terabytes).
MAX_INDEX_BYTES = 1 << 30
# Limits that keep every allocation made while decoding bounded: one frame at a time, and
# sizes that stay exact in float64 (2**53 bytes is 8 PiB). ckptz writes frames of at most
# 16 MiB; a frame declared larger than this is refused before anything is decoded, so a
# decompression bomb of constant frames costs memory by this bound, not by its claims.
MAX_FRAME_BYTES = 64 << 20
MAX_SOURCE_BYTES = (1 << 53) - 1


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """One stream of a container (see the module docstring)."""

    id: int
    component: str
    dtype: str
    word: int
    rotate: bool
    frame_size: int
    length: int
    tensors: int

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "component": self.component,
            "dtype": self.dtype,
            "word": self.word,
            "rotate": self.rotate,
            "frame_size": self.frame_size,
            "length": self.length,
            "tensors": self.tensors,
        }


@dataclass(frozen=True, slots=True)
class Index:
    """Everything a container says about its payloads."""

    header: dict[str, Any]
    streams: tuple[StreamInfo, ...]
    segments: np.ndarray
    frames: np.ndarray
    chunks: np.ndarray

    @property
    def source_name(self) -> str:
        return str(self.header["source"]["name"])

    @property
    def source_size(self) -> int:
        return int(self.header["source"]["size"])

    @property
    def source_digest(self) -> Digest:
        """The source file's whole-file digest (``xxh3_tree``, or ``xxh3_128`` before 1.4)."""
        digest = Digest.from_json(self.header["source"])
        assert digest is not None  # read_index refuses a header without one
        return digest


def checksum(data: bytes | memoryview | np.ndarray) -> int:
    """The checksum of frames and chunks: xxh3_64, seed 0 (:mod:`ckptz.checksums`)."""
    return xxh3_64(data)


class Writable(Protocol):
    """Where a container goes: an open binary file, or anything with its ``write``."""

    def write(self, data: bytes | memoryview, /) -> int: ...


class ContainerWriter:
    """Writes one container to an open binary file, payloads first, index last."""

    def __init__(self, f: Writable) -> None:
        self._f = f
        self._pos = 0
        self._write(PREFIX)

    def _write(self, data: bytes | memoryview) -> None:
        self._f.write(data)
        self._pos += len(data)

    def _pad(self) -> None:
        pad = -self._pos % ALIGN
        if pad:
            self._write(b"\x00" * pad)

    def add_payload(self, payload: bytes | memoryview) -> int:
        """Append one chunk payload at a 16-byte boundary; return its offset."""
        offset = self._pos
        self._write(payload)
        self._pad()
        return offset

    def finish(self, index: Index) -> int:
        """Write the index and footer; return the container's total size."""
        self._write(index_bytes(index, self._pos))
        return self._pos


#: The container's first bytes, padded to the first payload's offset.
PREFIX = HEADER.pack(MAGIC, MAJOR, MINOR, 0)
assert len(PREFIX) == ALIGN


def index_bytes(index: Index, offset: int) -> bytes:
    """The index and footer of a container whose data area ends at ``offset``."""
    header = dict(index.header)
    header["counts"] = {
        "segments": len(index.segments),
        "frames": len(index.frames),
        "chunks": len(index.chunks),
    }
    header["streams"] = [s.to_json() for s in index.streams]
    text = json.dumps(header, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()
    raw = b"".join(
        (
            _JSON_SIZE.pack(len(text)),
            text,
            np.ascontiguousarray(index.segments, SEGMENT_DTYPE).tobytes(),
            np.ascontiguousarray(index.frames, FRAME_DTYPE).tobytes(),
            np.ascontiguousarray(index.chunks, CHUNK_DTYPE).tobytes(),
        )
    )
    blob = zstandard.ZstdCompressor(level=9).compress(raw)
    footer = FOOTER.pack(offset, len(blob), len(raw), checksum(blob), MAJOR, MINOR, 0, END_MAGIC)
    return blob + footer


#: Bits in which a file's first bytes may differ from :data:`MAGIC` and still be taken for
#: a (damaged) container: no checkpoint format ckptz reads starts within them.
MAGIC_SLACK_BITS = 2


def near_magic(head: bytes) -> bool:
    """Whether ``head`` (a file's first bytes, all of them when fewer than the magic's) is
    the magic, or within :data:`MAGIC_SLACK_BITS` bits of it or of its start (a damaged or
    truncated container)."""
    head = head[: len(MAGIC)]
    if not head:
        return False
    flipped = int.from_bytes(head, "big") ^ int.from_bytes(MAGIC[: len(head)], "big")
    return flipped.bit_count() <= MAGIC_SLACK_BITS


def judged_container(head: bytes, tail: bytes = b"", name: str = "") -> bool:
    """Whether a file is to be read as a container, damaged or not: it is named ``*.ckptz``,
    its first bytes are near the magic (:func:`near_magic`), or its last bytes are the
    footer's magic. A damaged container is then reported as damaged, never read as the
    plain file it is not."""
    return name.endswith(SUFFIX) or near_magic(head) or (len(tail) == len(END_MAGIC) and tail == END_MAGIC)


def read_index(f: BinaryIO, path: str) -> Index:
    """Read and validate a container's header, footer and index.

    Memory and time stay bounded by the file's size (and :data:`MAX_INDEX_BYTES`) whatever
    the tables claim.

    Raises:
        ContainerError: not a container, truncated, or inconsistent tables.
        UnsupportedVersionError: written by an incompatible ckptz.
        CorruptionError: the index fails its checksum.
    """
    size = os.fstat(f.fileno()).st_size
    f.seek(0)
    head = f.read(HEADER.size)
    if size < HEADER.size + FOOTER.size:
        # Read as a container (by its name or its first bytes), it is one cut short.
        raise CorruptionError("too small to be a ckptz container (truncated?)", path=path)
    f.seek(size - FOOTER.size)
    off, isize, raw_size, isum, fmajor, fminor, fflags, end = FOOTER.unpack(f.read(FOOTER.size))
    magic, major, minor, flags = HEADER.unpack(head)
    if magic != MAGIC:
        # A container's footer, or bytes close to the magic: a damaged container, never some
        # other kind of file.
        if near_magic(head) or end == END_MAGIC:
            raise CorruptionError("damaged ckptz container (bad magic)", path=path)
        raise ContainerError("not a ckptz container (bad magic)", path=path)
    if end != END_MAGIC:
        raise ContainerError("footer missing or damaged (truncated?)", path=path)
    # The header's version and flags are repeated in the footer; comparing them is what makes a
    # flipped bit there detectable (neither copy is covered by a checksum).
    if (major, minor, flags) != (fmajor, fminor, fflags):
        raise ContainerError("header and footer disagree on version or flags (damaged)", path=path)
    if major != MAJOR:
        raise UnsupportedVersionError(
            f"container format {major}.x; this ckptz reads {MAJOR}.x", path=path, hint="upgrade ckptz"
        )
    if not (HEADER.size <= off and off + isize == size - FOOTER.size) or not 4 <= raw_size <= MAX_INDEX_BYTES:
        raise ContainerError("footer points outside the file (truncated or damaged)", path=path)
    f.seek(off)
    blob = f.read(isize)
    if checksum(blob) != isum:
        raise CorruptionError("index checksum mismatch", path=path)
    # Everything the checks below read besides the bytes is part of the key, so a damaged
    # footer field (the index's size) is never met by an index parsed from a sound one.
    key = (blob, off, raw_size, minor, flags)
    known = _parsed.get(key)
    if known is not None:
        return known
    try:
        # A stream reader never allocates more than asked, whatever size the zstd frame claims.
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(blob)) as reader:
            raw = reader.read(raw_size + 1)
    except zstandard.ZstdError as exc:
        raise CorruptionError(f"index does not decompress ({exc})", path=path) from None
    if len(raw) != raw_size:
        raise CorruptionError("index size disagrees with the footer", path=path)
    index = _parse_index(raw, path, data_end=off)
    _parsed.put(key, index, raw_size + len(blob))
    return index


class _ParsedIndexes:
    """Indexes already parsed and validated in this process, by their exact stored bytes.

    A command reads each container's index more than once (to choose its coder, to size
    its progress, then to restore it); an index is a function of those bytes and of the
    footer fields its checks read (where the data area ends, the index's size, the version
    and flags), so the same key gives the same :class:`Index` and only the first read
    decompresses, parses and validates them. The bytes are read and checked each
    time, so a container rewritten meanwhile is read afresh. Held to :data:`BUDGET` bytes,
    the oldest dropped first: the indexes of a folder of thousands of small containers, and
    little in a process that loads checkpoints.
    """

    BUDGET = 16 << 20

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[bytes, int, int, int, int], tuple[Index, int]] = {}
        self._bytes = 0

    def get(self, key: tuple[bytes, int, int, int, int]) -> Index | None:
        with self._lock:
            known = self._held.get(key)
        return None if known is None else known[0]

    def put(self, key: tuple[bytes, int, int, int, int], index: Index, cost: int) -> None:
        if cost > self.BUDGET:
            return
        with self._lock:
            if key in self._held:
                return
            while self._held and self._bytes + cost > self.BUDGET:
                _, dropped = self._held.pop(next(iter(self._held)))
                self._bytes -= dropped
            self._held[key] = (index, cost)
            self._bytes += cost


_parsed = _ParsedIndexes()


def _parse_index(raw: bytes, path: str, data_end: int) -> Index:
    try:
        (jsize,) = _JSON_SIZE.unpack_from(raw)
        header = json.loads(raw[4 : 4 + jsize])
        counts = header["counts"]
        n_seg, n_frame, n_chunk = (int(counts[k]) for k in ("segments", "frames", "chunks"))
        streams = tuple(
            StreamInfo(
                id=int(s["id"]),
                component=str(s["component"]),
                dtype=str(s["dtype"]),
                word=int(s["word"]),
                rotate=bool(s["rotate"]),
                frame_size=int(s["frame_size"]),
                length=int(s["length"]),
                tensors=int(s["tensors"]),
            )
            for s in header["streams"]
        )
        source_size = int(header["source"]["size"])
        digest = Digest.from_json(header["source"])
    except (struct.error, ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
        raise ContainerError(f"index header unreadable ({type(exc).__name__})", path=path) from None
    pos = 4 + jsize
    sizes = [
        n * d.itemsize for n, d in ((n_seg, SEGMENT_DTYPE), (n_frame, FRAME_DTYPE), (n_chunk, CHUNK_DTYPE))
    ]
    if min(n_seg, n_frame, n_chunk) < 0 or pos + sum(sizes) != len(raw):
        raise ContainerError("index tables do not match their counts", path=path)
    if not 0 <= source_size <= MAX_SOURCE_BYTES:
        raise ContainerError("index claims an impossible source size", path=path)
    if digest is None:
        raise ContainerError(
            "index records no whole-file digest this ckptz knows (xxh3_tree or xxh3_128)",
            path=path,
            hint="a newer ckptz may read it; upgrade ckptz",
        )
    _check_tensor_keys(header.get("tensor_keys"), n_seg, path)
    tables = []
    for nbytes, dtype in zip(sizes, (SEGMENT_DTYPE, FRAME_DTYPE, CHUNK_DTYPE), strict=True):
        tables.append(np.frombuffer(raw, dtype=dtype, count=nbytes // dtype.itemsize, offset=pos))
        pos += nbytes
    index = Index(header, streams, *tables)
    _validate(index, path, data_end)
    return index


def _check_tensor_keys(keys: Any, segments: int, path: str) -> None:
    """``tensor_keys``, where present, is what the writer makes: per segment, a list of key
    paths (strings). Readers place tensors by it, so any other shape is refused here."""
    if keys is None:
        return
    if (
        not isinstance(keys, list)
        or len(keys) > segments
        or not all(isinstance(k, list) and all(isinstance(p, str) for p in k) for k in keys)
    ):
        raise ContainerError("index header's tensor_keys are malformed", path=path)


def _validate(index: Index, path: str, data_end: int) -> None:
    """Check every cross-reference so decoding never reads or allocates out of bounds.

    Every check is a vectorised pass over one table, so a hostile index costs time linear
    in its (bounded) size. After it passes: every frame a stream needs exists and every
    frame is needed; each frame has one chunk per plane, of the size the transform implies;
    and the payloads tile ``[16, data_end)`` exactly, in 16-byte steps.
    """
    streams, seg, frames, chunks = index.streams, index.segments, index.frames, index.chunks
    n = len(streams)
    for i, s in enumerate(streams):
        if s.frame_size > MAX_FRAME_BYTES:
            raise CorruptionError(
                f"stream {i} declares frames of {s.frame_size} bytes, more than the format's"
                f" {MAX_FRAME_BYTES >> 20} MiB",
                path=path,
            )
        if (
            s.id != i
            or s.word not in (1, 2, 4, 8)
            or not 0 < s.frame_size <= MAX_FRAME_BYTES
            or s.frame_size % s.word
            or not 0 <= s.length <= index.source_size
        ):
            raise ContainerError(f"stream table is inconsistent (stream {i})", path=path)
    if len(seg) > n * (index.source_size + 1):
        raise ContainerError("more segments than bytes", path=path)
    if len(seg) and int(seg["stream"].max()) >= n:
        raise ContainerError("a segment names a missing stream", path=path)
    # Python ints: a uint64 sum of hostile lengths could wrap around to the right total.
    if sum(seg["length"].tolist()) != index.source_size:
        raise ContainerError("segments do not add up to the source size", path=path)
    lengths = np.array([s.length for s in streams], dtype=np.uint64)
    # Each segment is at most source_size < 2**53 and they add up exactly, so these are exact.
    seg_sums = np.bincount(seg["stream"], weights=seg["length"], minlength=n).astype(np.uint64)
    if n and not np.array_equal(seg_sums, lengths):
        raise ContainerError("stream lengths disagree with their segments", path=path)
    fs, fl = frames["stream"].astype(np.int64), frames["length"]
    if len(frames) and int(fs.max()) >= n:
        raise ContainerError("a frame names a missing stream", path=path)
    words = np.array([s.word for s in streams], dtype=np.uint64)[fs] if n else np.zeros(0, np.uint64)
    sizes = np.array([s.frame_size for s in streams], dtype=np.uint64)[fs] if n else np.zeros(0, np.uint64)
    if len(frames) and (
        bool(np.any(frames["reserved"]))
        or bool(np.any(fl == 0))
        or bool(np.any(fl > sizes))
        or bool(np.any(fl % words))
        or not np.array_equal(frames["chunks"].astype(np.uint64), words)
    ):
        raise ContainerError("frame table is inconsistent", path=path)
    # Only a stream's last frame may be short.
    last = np.zeros(n, dtype=np.int64) - 1
    np.maximum.at(last, fs, np.arange(len(frames), dtype=np.int64))
    short = fl != sizes
    if bool(np.any(short & (np.arange(len(frames)) != last[fs]))):
        raise ContainerError("a frame other than a stream's last is short", path=path)
    frame_sums = np.zeros(n, dtype=np.uint64)
    np.add.at(frame_sums, fs, fl)
    if n and not np.array_equal(frame_sums, lengths):
        raise ContainerError("stream lengths disagree with their frames", path=path)
    counts = frames["chunks"].astype(np.int64)
    if int(counts.sum()) != len(chunks):
        raise ContainerError("frames and chunks disagree", path=path)
    starts = frame_chunk_starts(frames)
    planes = np.arange(len(chunks), dtype=np.int64) - np.repeat(starts, counts)
    raw_sizes = np.repeat(fl // np.maximum(words, 1), counts)
    if not np.array_equal(chunks["plane"].astype(np.int64), planes) or not np.array_equal(
        chunks["raw_size"], raw_sizes
    ):
        raise ContainerError("chunk table disagrees with its frames", path=path)
    _check_tiling(chunks, path, data_end)


def _check_tiling(chunks: np.ndarray, path: str, data_end: int) -> None:
    """Payloads, sorted by offset, must each start at the first 16-byte boundary after the last."""
    off, size = chunks["offset"], chunks["size"]
    if len(chunks) == 0:
        if data_end != HEADER.size:
            raise ContainerError("bytes between the header and the index belong to no chunk", path=path)
        return
    if int(off.max()) > data_end or int(size.max()) > data_end:
        raise ContainerError("a chunk lies outside the data area", path=path)
    order = np.argsort(off, kind="stable")
    off, size = off[order], size[order]
    ends = off + size
    padded = ends + (-ends % ALIGN)
    if int(off[0]) != HEADER.size or int(padded[-1]) != data_end or not np.array_equal(off[1:], padded[:-1]):
        raise ContainerError("chunks do not tile the data area (overlap or stray bytes)", path=path)


def padded_size(size: int) -> int:
    """Bytes a payload of ``size`` occupies with its zero padding."""
    return size + (-size % ALIGN)


def frame_chunk_starts(frames: np.ndarray) -> np.ndarray:
    """Index of each frame's first chunk in the chunk table."""
    counts = frames["chunks"].astype(np.int64)
    return np.concatenate(([0], np.cumsum(counts)[:-1])) if len(counts) else counts


def stream_frame_lists(index: Index) -> list[np.ndarray]:
    """For each stream, the frame-table rows of its frames in order."""
    order = np.argsort(index.frames["stream"], kind="stable")
    bounds = np.searchsorted(index.frames["stream"][order], np.arange(len(index.streams) + 1))
    return [order[bounds[i] : bounds[i + 1]] for i in range(len(index.streams))]


def make_tables(
    segments: Sequence[tuple[int, int]],
    frames: Sequence[tuple[int, int, int, int]],
    chunks: Sequence[tuple[int, int, int, int, int, int]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pack Python rows into the three index tables.

    Args:
        segments: ``(stream, length)`` per segment.
        frames: ``(stream, chunks, length, checksum)`` per frame.
        chunks: ``(offset, size, raw_size, checksum, codec, plane)`` per chunk.
    """
    seg = np.array(segments, dtype=SEGMENT_DTYPE) if segments else np.zeros(0, SEGMENT_DTYPE)
    fr = np.zeros(len(frames), FRAME_DTYPE)
    if frames:
        cols = np.array(frames, dtype=np.uint64).T
        fr["stream"], fr["chunks"], fr["length"], fr["checksum"] = cols
    ch = np.zeros(len(chunks), CHUNK_DTYPE)
    if chunks:
        cols = np.array(chunks, dtype=np.uint64).T
        ch["offset"], ch["size"], ch["raw_size"], ch["checksum"], ch["codec"], ch["plane"] = cols
    return seg, fr, ch
