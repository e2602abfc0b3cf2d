"""The frame coder on the GPU: a batch of frames, transformed and coded with few kernel launches.

A batch is laid out by :func:`plan_batch`: frames of one shape (word, rotation, length) sit
side by side, so one transform call covers them all, and every plane row starts on a 16-byte
boundary. :func:`encode_batch` returns the device buffers and, per chunk, which bitstream won
(constant, coded, or raw when coding does not shrink it), exactly as the CPU coder decides;
:func:`decode_batch` is its inverse. Both work on device memory only: the engine moves bytes
between host and device, and a caller that wants decoded bytes on the GPU keeps them there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ckptz.gpu.transform import aligned, constant_rows, merge_from, split_into

RAW_ID = 0
CONST_ID = 1
ZSTD_ID = 2
ANS_ID = 3
#: nvCOMP ANS refuses chunks above 16 MiB; larger planes go through Zstd (up to 2 GiB).
ANS_MAX_CHUNK = 16 << 20
GPU_CODECS = frozenset({RAW_ID, CONST_ID, ZSTD_ID, ANS_ID})


class BatchCodecs(Protocol):
    """Batched chunk codecs on one device (:class:`ckptz.gpu.nvcomp_codecs.NvcompCodecs`)."""

    def max_compressed_size(self, codec_id: int, size: int) -> int: ...

    def encode(
        self,
        codec_id: int,
        src: torch.Tensor,
        offsets: Sequence[int],
        sizes: Sequence[int],
        dst: torch.Tensor,
        dst_offsets: Sequence[int],
        capacities: Sequence[int],
    ) -> list[int]: ...

    def decode(
        self,
        codec_id: int,
        src: torch.Tensor,
        offsets: Sequence[int],
        sizes: Sequence[int],
        dst: torch.Tensor,
        dst_offsets: Sequence[int],
        raw_sizes: Sequence[int],
    ) -> None: ...


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


@dataclass(frozen=True, slots=True)
class ChunkResult:
    """How one plane of one frame was coded; offsets point into the batch's device buffers."""

    codec: int
    raw_size: int
    planes_offset: int
    payload_offset: int
    payload_size: int
    const_value: int


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """A coded batch on the device: planes, payloads, and per frame its chunks."""

    planes: torch.Tensor
    payloads: torch.Tensor
    chunks: tuple[tuple[ChunkResult, ...], ...]


def _group_view(buf: torch.Tensor, g: Group) -> torch.Tensor:
    k, s = len(g.members), g.shape
    return buf[g.planes_offset : g.planes_offset + k * s.word * s.stride].view(k, s.word, s.stride)


def _data_view(buf: torch.Tensor, g: Group) -> torch.Tensor:
    return buf[g.data_offset : g.data_offset + len(g.members) * g.shape.length]


def _coded_with(codec_id: int, size: int) -> int:
    return ZSTD_ID if codec_id == ANS_ID and size > ANS_MAX_CHUNK else codec_id


def encode_batch(codecs: BatchCodecs, codec_id: int, data: torch.Tensor, layout: BatchLayout) -> EncodedBatch:
    """Transform and code a batch already on the device; waits for the GPU once, for the sizes.

    Args:
        codecs: nvCOMP codecs of the device, bound to the current stream.
        codec_id: the bitstream to try on every plane (zstd or ans).
        data: flat uint8 device tensor laid out as ``layout.data_offsets`` says.
        layout: from :func:`plan_batch`.
    """
    dev = data.device
    planes = torch.empty(layout.planes_bytes, dtype=torch.uint8, device=dev)
    flags, values = [], []
    for g in layout.groups:
        view = _group_view(planes, g)
        split_into(_data_view(data, g), view, g.shape.word, g.shape.rotate)
        same, first = constant_rows(view, g.shape.plane)
        flags.append(same.reshape(-1))
        values.append(first.reshape(-1))
    # Per codec: (frame, plane) of each chunk, and where its input and output lie.
    jobs: dict[int, list[tuple[int, int]]] = {}
    for f, s in enumerate(layout.shapes):
        for p in range(s.word):
            jobs.setdefault(_coded_with(codec_id, s.plane), []).append((f, p))
    sizes_at: dict[tuple[int, int], tuple[int, int]] = {}
    total = 0
    placed: dict[int, tuple[list[int], list[int], list[int], list[int]]] = {}
    for cid, members in jobs.items():
        src, size, dst, cap = [], [], [], []
        for f, p in members:
            s = layout.shapes[f]
            bound = aligned(codecs.max_compressed_size(cid, s.plane))
            src.append(layout.planes_offsets[f] + p * s.stride)
            size.append(s.plane)
            dst.append(total)
            cap.append(bound)
            total += bound
        placed[cid] = (src, size, dst, cap)
    payloads = torch.empty(max(total, 1), dtype=torch.uint8, device=dev)
    for cid, (src, size, dst, cap) in placed.items():
        got = codecs.encode(cid, planes, src, size, payloads, dst, cap)
        for (f, p), o, n in zip(jobs[cid], dst, got, strict=True):
            sizes_at[(f, p)] = (o, n)
    # Read back after the encodes are queued: their size read-back already waited for the GPU.
    flag_host = torch.cat(flags).cpu().tolist()
    value_host = torch.cat(values).cpu().tolist()
    frames = []
    for f, s in enumerate(layout.shapes):
        row = []
        for p in range(s.word):
            plane_off = layout.planes_offsets[f] + p * s.stride
            idx = layout.flag_offsets[f] + p
            off, n = sizes_at[(f, p)]
            if flag_host[idx]:
                row.append(ChunkResult(CONST_ID, s.plane, plane_off, 0, 1, int(value_host[idx])))
            elif n < s.plane:
                row.append(ChunkResult(_coded_with(codec_id, s.plane), s.plane, plane_off, off, n, 0))
            else:
                row.append(ChunkResult(RAW_ID, s.plane, plane_off, plane_off, s.plane, 0))
        frames.append(tuple(row))
    return EncodedBatch(planes, payloads, tuple(frames))


@dataclass(frozen=True, slots=True)
class StoredPlane:
    """One chunk to decode: its bitstream, size, and where its payload lies on the device."""

    codec: int
    raw_size: int
    offset: int
    size: int
    const_value: int = 0


def decode_batch(
    codecs: BatchCodecs, payloads: torch.Tensor, layout: BatchLayout, frames: list[list[StoredPlane]]
) -> torch.Tensor:
    """Decode a batch whose payloads are on the device; return the frames' bytes (queued, no wait).

    Every chunk's codec must be in :data:`GPU_CODECS`, and its payload must have passed its
    checksum already.

    Raises:
        CodecError: nvCOMP rejected a payload.
    """
    dev = payloads.device
    planes = torch.empty(max(layout.planes_bytes, 1), dtype=torch.uint8, device=dev)
    coded: dict[int, tuple[list[int], list[int], list[int], list[int]]] = {}
    for f, chunks in enumerate(frames):
        s = layout.shapes[f]
        for p, c in enumerate(chunks):
            dst = layout.planes_offsets[f] + p * s.stride
            if c.codec == RAW_ID:
                planes[dst : dst + c.raw_size].copy_(payloads[c.offset : c.offset + c.size])
            elif c.codec == CONST_ID:
                planes[dst : dst + c.raw_size].fill_(c.const_value)
            else:
                src, size, out, raw = coded.setdefault(c.codec, ([], [], [], []))
                src.append(c.offset)
                size.append(c.size)
                out.append(dst)
                raw.append(c.raw_size)
    for cid, (src, size, out, raw) in coded.items():
        codecs.decode(cid, payloads, src, size, planes, out, raw)
    data = torch.empty(max(layout.data_bytes, 1), dtype=torch.uint8, device=dev)
    for g in layout.groups:
        merge_from(_group_view(planes, g), _data_view(data, g), g.shape.word, g.shape.rotate)
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
    "ChunkResult",
    "EncodedBatch",
    "FrameShape",
    "StoredPlane",
    "decode_batch",
    "encode_batch",
    "plan_batch",
]
