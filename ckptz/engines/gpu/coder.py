"""The frame coder on the GPU: a batch of frames, transformed and coded with few kernel launches.

A batch is laid out by :func:`plan_batch`: frames of one shape (word, rotation, length) sit
side by side, so one transform call covers them all, and every plane row starts on a 16-byte
boundary. :func:`encode_batch` splits the frames into planes (taking each plane's min/max and
a sampled byte histogram on the way), decides per chunk exactly as the CPU coder does
(constant, noise stored raw, coded, or raw when coding does not shrink it), codes the rest
with one batched nvCOMP call, and gathers every payload into one device buffer laid out as
the container stores it. :func:`decode_batch` is its inverse: nvCOMP decodes the coded
chunks, and one merge per frame shape reads each plane from wherever it lies. Both work on
a device's memory only, through an :class:`Ops`: ckptz's CUDA kernels on a GPU
(:class:`ckptz.engines.gpu.kernels.CudaOps`), the CPU transform on the host
(:class:`ckptz.engines.gpu.transform.HostOps`). The engine moves bytes between host and
device, and a caller that wants decoded bytes on the GPU keeps them there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.ma  # np.unique's lazy import of it can recurse when threads race it: import once

from ckptz import trace
from ckptz.codecs.frames import NOISE_BITS, NOISE_ZERO_SHARE
from ckptz.codecs.table import ANS, CONST, RAW, TABLE, ZSTD
from ckptz.engines.gpu.memory import Buf
from ckptz.engines.gpu.transform import ALIGN, DECODED, STATS, STORED, aligned

RAW_ID = RAW.id
CONST_ID = CONST.id
ZSTD_ID = ZSTD.id
ANS_ID = ANS.id
#: nvCOMP ANS refuses chunks above 16 MiB; larger planes go through Zstd (up to 2 GiB).
ANS_MAX_CHUNK = 16 << 20
#: Bitstreams this coder decodes: stored and constant planes itself, the rest with nvCOMP.
GPU_CODECS = frozenset(b.id for b in TABLE if b.gpu is not None)


class Ops(Protocol):
    """A device the coder runs on (:class:`ckptz.engines.gpu.kernels.CudaOps` on a GPU,
    :class:`ckptz.engines.gpu.transform.HostOps` on the host): its memory, copies of small
    tables, the three transform primitives, and the two that check bytes where they lie
    (the xxh3_64 of ranges, copies between ranges). Work is queued in order on
    one ``stream``; :meth:`download` waits for it."""

    stream: int

    def scratch(self, name: str, size: int) -> Buf: ...

    def upload(self, name: str, arr: np.ndarray) -> Buf: ...

    def download(self, buf: Buf, dtype: type | np.dtype) -> np.ndarray: ...

    def init_stats(self, stats: Buf, rows: int) -> None: ...

    def split_rows(
        self, raw: Buf, planes: Buf, stats: Buf, k: int, stride: int, word: int, rotate: bool
    ) -> None: ...

    def merge_rows(
        self, stored: Buf, decoded: Buf, offsets: Buf, sources: Buf, raw: Buf, k: int, word: int, rotate: bool
    ) -> None: ...

    def gather(
        self,
        src: Buf,
        src_offsets: Buf,
        sizes: Buf,
        dst: Buf,
        dst_offsets: Buf,
        padded: Buf,
        count: int,
        longest: int,
    ) -> None: ...

    def xxh3(self, ptrs: np.ndarray, lengths: np.ndarray) -> np.ndarray: ...

    def copy_ranges(self, src: np.ndarray, dst: np.ndarray, lengths: np.ndarray) -> None: ...


class BatchCodecs(Protocol):
    """Batched chunk codecs on one device (:class:`ckptz.engines.gpu.nvcomp_codecs.NvcompCodecs`),
    on the same stream as the coder's :class:`Ops`."""

    def max_compressed_size(self, codec_id: int, size: int) -> int: ...

    def encode(
        self,
        codec_id: int,
        src: Buf,
        offsets: Sequence[int],
        sizes: Sequence[int],
        dst: Buf,
        dst_offsets: Sequence[int],
        capacities: Sequence[int],
    ) -> list[int]: ...

    def decode(
        self,
        codec_id: int,
        src: Buf,
        offsets: Sequence[int],
        sizes: Sequence[int],
        dst: Buf,
        dst_offsets: Sequence[int],
        raw_sizes: Sequence[int],
        host: np.ndarray | None = None,
    ) -> None:
        """Decode payloads of ``src`` into ``dst``; ``host``: the same bytes on the host at the
        same offsets, where the caller has them (codecs that parse payloads there use them)."""

    def bitstreams(self) -> Sequence[int] | None:
        """The bitstream of each chunk of the last :meth:`encode`, where it chose one other
        than the one asked for for some (None: that one for all)."""


@dataclass(frozen=True, slots=True)
class FrameShape:
    """What the transform needs to know about a frame."""

    word: int
    rotate: bool
    length: int

    @property
    def plane(self) -> int:
        """Bytes per plane."""
        return self.length // self.word

    @property
    def stride(self) -> int:
        """Bytes between plane rows on the device (16-byte aligned)."""
        return aligned(self.plane)


@dataclass(frozen=True, slots=True)
class Group:
    """Frames of one shape, contiguous on the device."""

    shape: FrameShape
    members: tuple[int, ...]
    data_offset: int
    planes_offset: int


@dataclass(frozen=True, slots=True)
class BatchLayout:
    """Where each frame of a batch lies on the device (frames in the caller's order)."""

    shapes: tuple[FrameShape, ...]
    groups: tuple[Group, ...]
    data_offsets: tuple[int, ...]
    planes_offsets: tuple[int, ...]
    flag_offsets: tuple[int, ...]
    data_bytes: int
    planes_bytes: int


def plan_batch(shapes: list[FrameShape]) -> BatchLayout:
    """Group frames by shape and give each its data and planes offsets."""
    by_shape: dict[FrameShape, list[int]] = {}
    for i, s in enumerate(shapes):
        by_shape.setdefault(s, []).append(i)
    data_off = [0] * len(shapes)
    planes_off = [0] * len(shapes)
    flag_off = [0] * len(shapes)
    groups = []
    d = p = row = 0
    for shape, members in by_shape.items():
        groups.append(Group(shape, tuple(members), d, p))
        for i in members:
            data_off[i], planes_off[i], flag_off[i] = d, p, row
            d += shape.length
            p += shape.word * shape.stride
            row += shape.word
        # Group starts stay 16-byte aligned so wide-word views of them are legal.
        d, p = aligned(d), aligned(p)
    return BatchLayout(
        tuple(shapes), tuple(groups), tuple(data_off), tuple(planes_off), tuple(flag_off), d, p
    )


def _group_planes(buf: Buf, g: Group) -> Buf:
    k, s = len(g.members), g.shape
    return buf.at(g.planes_offset, k * s.word * s.stride)


def _group_data(buf: Buf, g: Group) -> Buf:
    return buf.at(g.data_offset, len(g.members) * g.shape.length)


def _group_rows(layout: BatchLayout, g: Group) -> slice:
    """The group's rows: consecutive, from its first frame's."""
    first = layout.flag_offsets[g.members[0]]
    return slice(first, first + len(g.members) * g.shape.word)


def _noise_rows(counts: np.ndarray) -> np.ndarray:
    """Rows whose sampled byte histogram looks like noise (:data:`ckptz.codecs.frames.NOISE_BITS`).

    The CPU coder's test (:func:`ckptz.codecs.frames.looks_like_noise`): near 8 bits of
    order-0 entropy and few zeros. Such rows are stored without trying a coder, which
    would spend time to save well under 1% of them. Rows with no sample are not noise.
    """
    total = counts.sum(axis=1)
    # H = log2(T) - sum(c log2 c) / T, with c log2 c looked up rather than computed.
    weighted = _c_log2_c(int(counts.max(initial=0)))[counts].sum(axis=1)
    safe = np.maximum(total, 1)
    bits = np.log2(safe) - weighted / safe
    return (total > 0) & (bits > NOISE_BITS) & (counts[:, 0] <= NOISE_ZERO_SHARE * total)


_C_LOG2_C = np.zeros(1)


def _c_log2_c(largest: int) -> np.ndarray:
    """``c * log2(c)`` for every count ``c`` up to ``largest`` (0 for 0), grown on demand."""
    global _C_LOG2_C
    if _C_LOG2_C.size <= largest:
        c = np.arange(max(largest + 1, 2 * _C_LOG2_C.size), dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            _C_LOG2_C = np.where(c > 0, c * np.log2(c), 0.0)
    return _C_LOG2_C


@dataclass(frozen=True, slots=True)
class ChunkTable:
    """Every chunk of a batch, frame by frame and plane by plane (one entry per plane).

    Attributes:
        starts: index of each frame's first chunk (frame ``f`` has ``shape.word`` chunks).
        raw_size: bytes of each chunk's plane.
        plane_offset: where each plane lies in the batch's planes buffer.
        row: each plane's row in the planes buffer (``BatchLayout.flag_offsets`` + plane).
    """

    starts: np.ndarray
    raw_size: np.ndarray
    plane_offset: np.ndarray
    row: np.ndarray


def chunk_table(layout: BatchLayout) -> ChunkTable:
    """The chunks of ``layout`` in frame-then-plane order."""
    words = np.array([s.word for s in layout.shapes], dtype=np.int64)
    starts = np.cumsum(words) - words
    plane = np.repeat(np.array([s.plane for s in layout.shapes], dtype=np.int64), words)
    stride = np.repeat(np.array([s.stride for s in layout.shapes], dtype=np.int64), words)
    p = np.arange(int(words.sum()), dtype=np.int64) - np.repeat(starts, words)
    offset = np.repeat(np.array(layout.planes_offsets, dtype=np.int64), words) + p * stride
    row = np.repeat(np.array(layout.flag_offsets, dtype=np.int64), words) + p
    return ChunkTable(starts, plane, offset, row)


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """A coded batch: the container's data area for its chunks, and what each chunk is.

    ``block`` holds every chunk's payload in frame-then-plane order, each at a 16-byte
    boundary and zero-padded to the next: written as it is, it is exactly what
    :class:`ckptz.container.ContainerWriter` would write chunk by chunk.

    Attributes:
        block: the bytes, in the coder's scratch memory (valid until its next batch).
        table: the chunks (see :class:`ChunkTable`).
        codec: bitstream id of each chunk.
        size: payload bytes of each chunk.
        offset: where each payload starts in ``block``.
    """

    block: Buf
    table: ChunkTable
    codec: np.ndarray
    size: np.ndarray
    offset: np.ndarray


def _upload(ops: Ops, name: str, *columns: np.ndarray) -> list[Buf]:
    """int64 columns on the device in one copy; each column's buffer."""
    table = np.stack([np.asarray(c, dtype=np.int64) for c in columns])
    buf = ops.upload(name, table)
    row = table.shape[1] * 8
    return [buf.at(i * row, row) for i in range(len(columns))]


def padded_sizes(sizes: np.ndarray) -> np.ndarray:
    """Payload sizes rounded up to the container's 16-byte alignment."""
    return sizes + (-sizes % ALIGN)


def encode_batch(
    codecs: BatchCodecs, ops: Ops, codec_id: int, data: Buf, layout: BatchLayout
) -> EncodedBatch:
    """Transform and code a batch already on the device, waiting for it twice (flags, sizes).

    Per chunk, as the CPU coder decides: a constant plane becomes ``const`` (its byte), a
    plane that codes smaller gets ``codec_id`` (``zstd`` for planes above nvCOMP ANS's
    16 MiB), and any other is stored ``raw``.

    Args:
        codecs: nvCOMP codecs of the device, on ``ops``' stream.
        ops: the device.
        codec_id: the bitstream to try on every plane (zstd or ans).
        data: the frames, laid out as ``layout.data_offsets`` says.
        layout: from :func:`plan_batch`.
    """
    table = chunk_table(layout)
    n = table.raw_size.size
    stats = ops.scratch("stats", n * STATS * 4)
    ops.init_stats(stats, n)
    planes_bytes = aligned(layout.planes_bytes)
    # Planes then payloads in one buffer, so one gather reads both.
    sizes = table.raw_size
    ids = np.where((codec_id == ANS_ID) & (sizes > ANS_MAX_CHUNK), ZSTD_ID, codec_id)
    bounds = np.zeros(n, dtype=np.int64)
    for cid in np.unique(ids).tolist():
        for size in np.unique(sizes[ids == cid]).tolist():
            bounds[(ids == cid) & (sizes == size)] = aligned(codecs.max_compressed_size(cid, size))
    payload_at = planes_bytes + np.cumsum(bounds) - bounds
    work = ops.scratch("work", planes_bytes + max(int(bounds.sum()), ALIGN))
    with trace.span("split"):
        for g in layout.groups:
            rows = _group_rows(layout, g)
            ops.split_rows(
                _group_data(data, g),
                _group_planes(work, g),
                stats.at(rows.start * STATS * 4, (rows.stop - rows.start) * STATS * 4),
                len(g.members),
                g.shape.stride,
                g.shape.word,
                g.shape.rotate,
            )
        flags = ops.download(stats, np.int32).reshape(n, STATS)[table.row]
    const = (flags[:, 0] == flags[:, 1]) & (sizes > 0)
    noise = _noise_rows(flags[:, 2:])
    got = np.full(n, -1, dtype=np.int64)
    for cid in np.unique(ids).tolist():
        todo = np.flatnonzero((ids == cid) & ~const & ~noise & (sizes > 0))
        if todo.size:
            with trace.span("nvcomp"):
                got[todo] = codecs.encode(
                    cid,
                    work,
                    table.plane_offset[todo].tolist(),
                    sizes[todo].tolist(),
                    work,
                    payload_at[todo].tolist(),
                    bounds[todo].tolist(),
                )
            chosen = codecs.bitstreams()
            if chosen is not None:
                ids[todo] = chosen
    coded = (got >= 0) & (got < sizes)
    codec = np.where(const, CONST_ID, np.where(coded, ids, RAW_ID))
    size = np.where(const, 1, np.where(coded, got, sizes))
    src = np.where(coded, payload_at, table.plane_offset)
    padded = padded_sizes(size)
    offset = np.cumsum(padded) - padded
    block = ops.scratch("block", max(int(padded.sum()), ALIGN))
    src_at, size_dev, offset_at, padded_dev = _upload(
        ops, "gather", src // ALIGN, size, offset // ALIGN, padded
    )
    ops.gather(work, src_at, size_dev, block, offset_at, padded_dev, n, int(padded.max(initial=0)))
    return EncodedBatch(block.at(0, int(padded.sum())), table, codec, size, offset)


def decode_batch(
    codecs: BatchCodecs,
    ops: Ops,
    payloads: Buf,
    layout: BatchLayout,
    codec: np.ndarray,
    offset: np.ndarray,
    size: np.ndarray,
    const_value: np.ndarray,
    host: np.ndarray | None = None,
) -> Buf:
    """Decode a batch whose payloads are on the device (``host``: a copy of them, where the
    caller has one); return the frames' bytes (queued, no wait; in the coder's scratch
    memory, valid until its next batch).

    The arrays describe every chunk in frame-then-plane order (:func:`chunk_table`): its
    bitstream, where its payload starts in ``payloads`` (16-byte aligned), the payload's
    size, and for ``const`` chunks their byte. Every codec must be in :data:`GPU_CODECS`,
    every payload must have passed its checksum, and raw payloads must be their plane's size.

    Raises:
        CodecError: nvCOMP rejected a payload.
    """
    table = chunk_table(layout)
    raw = table.raw_size
    coded = (codec != RAW_ID) & (codec != CONST_ID)
    room = np.where(coded, padded_sizes(raw), 0)
    at = np.cumsum(room) - room
    decoded = ops.scratch("decoded", max(int(room.sum()), 1))
    for cid in np.unique(codec[coded]).tolist():
        todo = np.flatnonzero(codec == cid)
        with trace.span("nvcomp"):
            codecs.decode(
                cid,
                payloads,
                offset[todo].tolist(),
                size[todo].tolist(),
                decoded,
                at[todo].tolist(),
                raw[todo].tolist(),
                host=host,
            )
    source = np.where(codec == CONST_ID, const_value, np.where(coded, DECODED, STORED))
    where = np.where(coded, at, offset) // ALIGN
    # The kernels index rows group by group, in the planes buffer's row order.
    by_row = np.empty_like(where)
    by_row[table.row] = where
    source_by_row = np.empty_like(source)
    source_by_row[table.row] = source
    where_dev, source_dev = _upload(ops, "merge", by_row, source_by_row)
    data = ops.scratch("data", max(layout.data_bytes, 1)).at(0, layout.data_bytes)
    for g in layout.groups:
        rows = _group_rows(layout, g)
        ops.merge_rows(
            payloads,
            decoded,
            where_dev.at(rows.start * 8, (rows.stop - rows.start) * 8),
            source_dev.at(rows.start * 8, (rows.stop - rows.start) * 8),
            _group_data(data, g),
            len(g.members),
            g.shape.word,
            g.shape.rotate,
        )
    return data


__all__ = [
    "ANS_ID",
    "ANS_MAX_CHUNK",
    "CONST_ID",
    "GPU_CODECS",
    "RAW_ID",
    "ZSTD_ID",
    "BatchCodecs",
    "BatchLayout",
    "ChunkTable",
    "EncodedBatch",
    "FrameShape",
    "Ops",
    "chunk_table",
    "decode_batch",
    "encode_batch",
    "padded_sizes",
    "plan_batch",
]
