"""What a format reader produces: a file as consecutive segments that cover it exactly."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

SegmentKind = Literal["tensor", "meta"]


@dataclass(frozen=True, slots=True)
class Segment:
    """A byte range of a source file.

    Attributes:
        offset: first byte in the file.
        length: number of bytes.
        kind: ``tensor`` for the raw bytes of one storage, ``meta`` for everything else.
        dtype: element type name (see :mod:`ckptz.dtypes`); ``uint8`` for meta segments.
        keys: key paths that reach this storage (``state.3.exp_avg``), empty for meta.
        component: the component this range is charged to (see :mod:`ckptz.components`).
    """

    offset: int
    length: int
    kind: SegmentKind
    dtype: str = "uint8"
    keys: tuple[str, ...] = ()
    component: str = "metadata"

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True, slots=True)
class FileLayout:
    """A source file cut into segments.

    Attributes:
        format: ``torch-zip``, ``torch-legacy``, ``safetensors`` or ``opaque``.
        size: the file's size in bytes; the segments' lengths add up to it.
        segments: consecutive segments in file order.
        notes: reader remarks worth showing (e.g. why a file was treated as opaque).
    """

    format: str
    size: int
    segments: tuple[Segment, ...]
    notes: tuple[str, ...] = field(default=())


def fill_gaps(size: int, tensors: Iterable[Segment]) -> tuple[Segment, ...]:
    """Return ``tensors`` sorted by offset with meta segments filling every gap up to ``size``.

    Overlapping or out-of-range tensor segments are a reader bug and raise ``ValueError``;
    zero-length tensor segments are dropped (they carry no bytes).
    """
    out: list[Segment] = []
    cursor = 0
    for seg in sorted(tensors, key=lambda s: s.offset):
        if seg.length == 0:
            continue
        if seg.offset < cursor or seg.end > size:
            raise ValueError(f"segment {seg.offset}+{seg.length} overlaps or exceeds {size}")
        if seg.offset > cursor:
            out.append(Segment(cursor, seg.offset - cursor, "meta"))
        out.append(seg)
        cursor = seg.end
    if cursor < size:
        out.append(Segment(cursor, size - cursor, "meta"))
    return tuple(out)
