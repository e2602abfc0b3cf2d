"""Series deltas: tensors coded against the same tensor of a newer checkpoint.

Consecutive snapshots of a training run differ little: XOR two of them and the exponent and
high mantissa bits mostly cancel, so the XOR codes far smaller than either. :class:`XorDelta` is the :class:`~ckptz.pipeline.transform.FrameTransform`
that does it: each *paired* tensor segment of a frame is coded against its counterpart's bytes
in the reference file (XORed, or in value: :mod:`.kinds`), before the engine codes the frame
and after it decodes it. Which tensors are paired, and how, is decided by :func:`choose_pairs`
from a sample of each (a delta only where it measures smaller than plain), and written to the
container's header::

    "reference": {"path": "../checkpoint-50/model.safetensors.ckptz", "size": N,
                  "xxh3_tree": {"leaf": 524288, "digest": "<the reference's original digest>"},
                  "pairs": [[segment index, offset of the counterpart in the reference
                             (, delta kind (, scale))], ...]}

A paired segment and its counterpart have the same length; segments not named are stored
as they are. The reference's digest is recorded in its own kind (``xxh3_128`` for a 1.0-1.3
container). See docs/FORMAT.md (1.2, 1.4).
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

import numpy as np

from ckptz.container import Index
from ckptz.dtypes import lookup
from ckptz.errors import ContainerError
from ckptz.formats.layout import FileLayout
from ckptz.pipeline.plan import Frame
from ckptz.pipeline.transform import NativeDelta
from ckptz.series.kinds import (
    ORDERED_DIFFERENCE,
    SCALED,
    SCALED_DIFFERENCE,
    SCALED_SIGN_MAGNITUDE,
    UNIT_SCALE,
    XOR,
    apply,
    coded,
    mantissa_bits,
    scale_candidates,
    valid_scale,
)
from ckptz.series.reference import (
    ContainerReference,
    PlainReference,
    ReferenceBytes,
    RefSpec,
    locate,
    open_reference,
)

#: A sample of each tensor decides XOR or plain: this many pieces of ``_PIECE`` bytes.
_PIECES = 4
_PIECE = 16 << 10
#: XOR must measure at least this much smaller than plain to be chosen.
_MARGIN = 0.98
#: Tensors smaller than this are not paired (the pair costs more header than it saves).
MIN_PAIR_BYTES = 256

#: A pair: (segment, counterpart offset, delta kind, scale bits or 0).
Pair = tuple[int, int, int, int]
#: Word sizes the ordered difference is defined for (bf16/fp16 and fp32 words).
_DIFF_WORDS = {2: np.uint16, 4: np.uint32}


def _ordered(words: np.ndarray) -> np.ndarray:
    """Float bit patterns as integers that order like the floats (negative magnitudes flipped).

    Its own inverse: the sign bit, which decides the flip, is left as it is.
    """
    bits = words.dtype.itemsize * 8
    mask = (words >> (bits - 1)) * words.dtype.type((1 << (bits - 1)) - 1)
    return words ^ mask


def diff_forward(ours: np.ndarray, theirs: np.ndarray, word: int) -> np.ndarray:
    """``ours``' words as zigzag(ordered(ours) - ordered(theirs)) mod 2^bits, as bytes.

    Nearby floats give small residuals whatever their sign, so the high byte planes are mostly zero.
    """
    kind = _DIFF_WORDS[word]
    a = _ordered(ours.view(kind))
    d = a - _ordered(theirs.view(kind))
    bits = word * 8
    return ((d << kind(1)) ^ (kind(0) - (d >> kind(bits - 1)))).view(np.uint8)


def diff_backward(coded: np.ndarray, theirs: np.ndarray, word: int) -> np.ndarray:
    """Inverse of :func:`diff_forward`: the original words, as bytes."""
    kind = _DIFF_WORDS[word]
    z = coded.view(kind)
    d = (z >> kind(1)) ^ (kind(0) - (z & kind(1)))
    return _ordered(d + _ordered(theirs.view(kind))).view(np.uint8)


@dataclass(frozen=True, slots=True)
class Tensor:
    """A tensor segment as pairing sees it: where, how long, and what it is."""

    index: int
    offset: int
    length: int
    keys: tuple[str, ...]
    dtype: str

    @property
    def key(self) -> tuple[tuple[str, ...], str, int]:
        return (self.keys, self.dtype, self.length)


def layout_tensors(layout: FileLayout) -> list[Tensor]:
    """The tensor segments of a source file's layout."""
    return [
        Tensor(i, s.offset, s.length, s.keys, lookup(s.dtype).name)
        for i, s in enumerate(layout.segments)
        if s.kind == "tensor" and s.keys
    ]


def index_tensors(index: Index) -> list[Tensor]:
    """The tensor segments of a container's original file, from its index alone."""
    keys = index.header.get("tensor_keys", [])
    lengths = index.segments["length"].tolist()
    streams = index.segments["stream"].tolist()
    starts = [0, *accumulate(lengths)]
    out = []
    for i, (n, sid) in enumerate(zip(lengths, streams, strict=True)):
        k = keys[i] if isinstance(keys, list) and i < len(keys) and isinstance(keys[i], list) else []
        if k:
            out.append(Tensor(i, starts[i], n, tuple(str(x) for x in k), index.streams[sid].dtype))
    return out


def plane_cost(data: np.ndarray, word: int) -> float:
    """Order-0 entropy, in bytes, of ``data``'s byte planes (``word`` bytes per element)."""
    n = data.size // word * word
    planes = data[:n].reshape(-1, word)
    total = 0.0
    for p in range(word):
        counts = np.bincount(planes[:, p], minlength=256)
        probs = counts[counts > 0] / planes.shape[0]
        total += float(-(probs * np.log2(probs)).sum()) * planes.shape[0] / 8
    return total


def _spans(length: int, word: int) -> list[tuple[int, int]]:
    if length <= _PIECES * _PIECE:
        return [(0, length)]
    step = (length - _PIECE) // (_PIECES - 1)
    return [(i * step // word * word, _PIECE) for i in range(_PIECES)]


def xor_gain(ours: bytes, theirs: bytes, word: int) -> tuple[float, float]:
    """(plain, XOR) order-0 cost in bytes of a sample and its counterpart."""
    a = np.frombuffer(ours, np.uint8)
    b = np.frombuffer(theirs, np.uint8)[: a.size]
    return plane_cost(a, word), plane_cost(a ^ b, word)


def scaled_costs(ours: bytes, theirs: bytes, word: int, mant: int) -> dict[tuple[int, int], float]:
    """Order-0 cost in bytes of a sample as each scaled kind with each candidate scale, keyed
    by ``(kind, scale bits)``."""
    a = np.frombuffer(ours, np.uint8)
    b = np.frombuffer(theirs, np.uint8)[: a.size]
    if a.size % word or b.size != a.size:
        return {}
    scales = scale_candidates(a, b, word, mant)
    # Unscaled, kind 2 is kind 1 grouped by exponent, and kind 3 codes a flipped sign in one bit.
    options = [(k, c) for c in [*scales, UNIT_SCALE] for k in sorted(SCALED)]
    return {(k, c): plane_cost(coded(a, b, k, word, mant, c), word) for k, c in dict.fromkeys(options)}


def delta_costs(ours: bytes, theirs: bytes, word: int, is_float: bool) -> dict[int, float]:
    """Order-0 cost in bytes of a sample as plain (key -1), XOR and (float words) kind 1."""
    a = np.frombuffer(ours, np.uint8)
    b = np.frombuffer(theirs, np.uint8)[: a.size]
    costs = {-1: plane_cost(a, word), XOR: plane_cost(a ^ b, word)}
    if is_float and word in _DIFF_WORDS and a.size % word == 0:
        costs[ORDERED_DIFFERENCE] = plane_cost(diff_forward(a, b, word), word)
    return costs


def choose_pairs(
    ours: Sequence[Tensor],
    theirs: Iterable[Tensor],
    read_ours: Callable[[int, int], bytes],
    read_theirs: Callable[[int, int], bytes],
) -> list[Pair]:
    """``(segment, counterpart offset, delta kind, scale)`` for each tensor worth coding as a delta.

    A counterpart has the same key paths, dtype and length. Each pair is judged on a sample
    (:data:`_PIECES` pieces): the kind of least order-0 cost (XOR; for float words the
    ordered difference, or a scaled kind at the best of the sample's candidate scales), kept
    only where it is below plain's. The scaled kinds win ties with kind 1: they store words
    grouped by exponent, which the order-0 cost of a sample cannot see but a block-adaptive
    coder does.
    """
    by_key: dict[tuple[tuple[str, ...], str, int], Tensor] = {}
    for t in theirs:
        by_key.setdefault(t.key, t)
    pairs = []
    for t in ours:
        other = by_key.get(t.key)
        if other is None or t.length < MIN_PAIR_BYTES:
            continue
        dt = lookup(t.dtype)
        word = dt.word if t.length % dt.word == 0 else 1
        mant = mantissa_bits(dt) if word > 1 else None
        ours_parts, theirs_parts = [], []
        for at, n in _spans(t.length, word):
            a, b = read_ours(t.offset + at, n), read_theirs(other.offset + at, n)
            if len(a) != n or len(b) != n:
                break
            ours_parts.append(a)
            theirs_parts.append(b)
        else:
            a, b = b"".join(ours_parts), b"".join(theirs_parts)
            totals = {(k, 0): c for k, c in delta_costs(a, b, word, dt.is_float and word > 1).items()}
            plain = totals.pop((-1, 0))
            # Ties go to XOR, the kind every 1.2 reader knows.
            kind, scale = min(totals, key=lambda k: (totals[k], k))
            if mant is not None:
                scaled = scaled_costs(a, b, word, mant)
                best = min(scaled, key=lambda k: (scaled[k], k), default=None)
                # Ties against kind 1, not XOR: grouping pays where residuals vary in magnitude.
                if best is not None and (
                    scaled[best] < totals[(kind, scale)]
                    or (kind == ORDERED_DIFFERENCE and scaled[best] <= totals[(kind, scale)])
                ):
                    totals[best] = scaled[best]
                    kind, scale = best
            if totals[(kind, scale)] < plain * _MARGIN:
                pairs.append((t.index, other.offset, kind, scale))
    return pairs


class XorDelta:
    """Paired segments coded against their counterparts (a :class:`FrameTransform`): XORed
    with them, or their words coded in value (:mod:`.kinds`).

    Args:
        starts: the file offset of every segment of the original file, and its end.
        pairs: ``(segment, counterpart offset, delta kind, scale)``.
        spec: the reference, as the header names it.
        source: its original bytes.
        formats: ``(word size, mantissa bits)`` of each segment with a pair of kind 1-3.
    """

    def __init__(
        self,
        starts: Sequence[int],
        pairs: Sequence[Pair],
        spec: RefSpec,
        source: ReferenceBytes,
        formats: dict[int, tuple[int, int]] | None = None,
    ) -> None:
        self.spec, self.source = spec, source
        self.pairs = sorted(pairs)
        self.apart = frozenset(p[0] for p in self.pairs)
        formats = formats or {}
        # (start, end, counterpart start, kind, scale, word, mantissa bits) of every paired
        # range, in file order.
        self._ranges = [
            (starts[s], starts[s + 1], r, k, c, *formats.get(s, (1, 0))) for s, r, k, c in self.pairs
        ]
        self._lo = [r[0] for r in self._ranges]

    def _apply(self, frame: Frame, data: np.ndarray, forward: bool) -> None:
        for at, within, n in frame.pieces:
            j = max(0, bisect.bisect_right(self._lo, at) - 1)
            while j < len(self._ranges) and self._ranges[j][0] < at + n:
                lo_seg, hi_seg, ref, kind, scale, word, mant = self._ranges[j]
                lo, hi = max(at, lo_seg), min(at + n, hi_seg)
                if lo < hi:
                    theirs = self.source.read(ref + lo - lo_seg, hi - lo)
                    if len(theirs) != hi - lo:
                        raise ContainerError(f"reference {self.spec.path} ended early (truncated?)")
                    part = data[within + lo - at : within + hi - at]
                    ref_bytes = np.frombuffer(theirs, np.uint8)
                    if kind == XOR:
                        np.bitwise_xor(part, ref_bytes, out=part)
                    elif (lo - lo_seg) % word or (hi - lo) % word:
                        # Frames hold whole words of a tensor; a cut word means a damaged index.
                        raise ContainerError("a frame cuts a word of a tensor coded in value (damaged)")
                    elif kind in SCALED and not (
                        (lo == lo_seg or within + lo - at == 0)
                        and (hi == hi_seg or within + hi - at == frame.length)
                    ):
                        # Grouped words are placed within the frame's whole part of the tensor.
                        raise ValueError("a grouped series delta needs its frame's whole part of the tensor")
                    else:
                        apply(part, ref_bytes, kind, word, mant, scale, forward)
                j += 1

    def _touches(self, frame: Frame) -> bool:
        """Whether any paired range overlaps the frame (ranges are disjoint and sorted)."""
        for at, _, n in frame.pieces:
            j = bisect.bisect_right(self._lo, at) - 1
            if j >= 0 and self._ranges[j][1] > at:
                return True
            if j + 1 < len(self._ranges) and self._ranges[j + 1][0] < at + n:
                return True
        return False

    def forward(self, frame: Frame, data: np.ndarray) -> np.ndarray:
        if not self._touches(frame):
            return data
        out = data.copy()
        self._apply(frame, out, forward=True)
        return out

    def backward(self, frame: Frame, data: np.ndarray) -> np.ndarray:
        if not self._touches(frame):
            return data
        if not data.flags.writeable:
            data = data.copy()
        self._apply(frame, data, forward=False)
        return data

    def native(self) -> NativeDelta | None:
        # A word format the planes do not take stays in Python, which words its refusal.
        if any(
            k != XOR and not (w in _DIFF_WORDS and w * 8 - 9 <= m <= w * 8 - 3)
            for *_, k, _, w, m in self._ranges
        ):
            return None
        ranges = np.array(self._ranges, np.int64).reshape(-1, 7)
        if isinstance(self.source, PlainReference):
            return NativeDelta(ranges, self.spec.size, self.source.fileno())
        if isinstance(self.source, ContainerReference):
            return NativeDelta(ranges, self.spec.size, container=self.source.reader.decoder)
        return None

    def header(self) -> dict[str, object]:
        # An XOR pair stays [segment, offset], so a series that uses XOR only reads as before;
        # only the scaled kinds carry a fourth element.
        pairs = [
            [s, r] if k == XOR else [s, r, k, c] if k in SCALED else [s, r, k] for s, r, k, c in self.pairs
        ]
        return {"reference": {**self.spec.to_json(), "pairs": pairs}}

    def close(self) -> None:
        self.source.close()


def open_delta(index: Index, fd: int, path: str) -> XorDelta:
    """The delta of the open container ``fd`` (shown as ``path``), its reference opened and checked.

    Raises:
        ContainerError: the header's reference is malformed.
        ReferenceMissingError: the reference is missing or changed.
    """
    raw = index.header["reference"]
    spec = RefSpec.from_json(raw, path)
    lengths = index.segments["length"].tolist()
    starts = [0, *accumulate(lengths)]
    pairs = _parse_pairs(raw, lengths, spec.size, path)
    stream_of = index.segments["stream"].tolist()
    formats = {}
    for s, _, kind, _ in pairs:
        if kind != XOR:
            dt = lookup(index.streams[stream_of[s]].dtype)
            mant = mantissa_bits(dt)
            if dt.word not in _DIFF_WORDS or lengths[s] % dt.word or (kind in SCALED and mant is None):
                raise ContainerError(f"a kind-{kind} pair names a segment of no float words", path=path)
            formats[s] = (dt.word, mant or 0)
    source = open_reference(locate(fd, path), spec, path)
    return XorDelta(starts, pairs, spec, source, formats)


def _parse_pairs(raw: Any, lengths: list[int], ref_size: int, path: str) -> list[Pair]:
    try:
        items = raw["pairs"]
        pairs = [
            (int(p[0]), int(p[1]), int(p[2]) if len(p) >= 3 else XOR, int(p[3]) if len(p) == 4 else 0)
            for p in items
            if 2 <= len(p) <= 4
        ]
        if len(pairs) != len(items):
            raise ValueError
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ContainerError(f"reference pairs unreadable ({type(exc).__name__})", path=path) from None
    seen = set()
    for (s, r, kind, scale), item in zip(pairs, items, strict=True):
        if kind not in (XOR, ORDERED_DIFFERENCE, *SCALED):
            raise ContainerError(f"unknown series delta kind {kind} (a newer ckptz wrote it)", path=path)
        if (len(item) == 4) != (kind in SCALED):
            raise ContainerError(
                f"reference pairs unreadable (a kind-{kind} pair of {len(item)} elements)", path=path
            )
        if kind in SCALED and not valid_scale(scale):
            raise ContainerError(
                f"a kind-{kind} pair's scale {scale} is no positive normal float32", path=path
            )
        if not 0 <= s < len(lengths) or s in seen or not 0 <= r <= ref_size - lengths[s]:
            raise ContainerError("reference pairs name impossible segments or offsets", path=path)
        seen.add(s)
    return pairs


class Keyframe:
    """No change: a series member coded self-contained on purpose (a chain's end), so that later
    ``--series`` runs leave it as it is. Only its header mark differs from a plain container."""

    apart: frozenset[int] = frozenset()

    def forward(self, frame: Frame, data: np.ndarray) -> np.ndarray:
        return data

    def backward(self, frame: Frame, data: np.ndarray) -> np.ndarray:
        return data

    def header(self) -> dict[str, object]:
        return {"series": {"keyframe": True}}

    def native(self) -> NativeDelta:
        return NativeDelta(np.zeros((0, 7), np.int64))


def delta_for(
    layout: FileLayout, src: Path, spec: RefSpec, source: ReferenceBytes, theirs: list[Tensor]
) -> XorDelta | None:
    """The delta to compress ``src`` (of ``layout``) against ``source``, whose tensors are
    ``theirs``; None (and ``source`` closed) when no tensor measures smaller as an XOR."""
    with open(src, "rb", buffering=0) as f:
        fd = f.fileno()
        pairs = choose_pairs(layout_tensors(layout), theirs, lambda at, n: os.pread(fd, n, at), source.read)
    if not pairs:
        source.close()
        return None
    starts = [s.offset for s in layout.segments] + [layout.size]
    formats = {}
    for s, _, kind, _ in pairs:
        if kind != XOR:
            dt = lookup(layout.segments[s].dtype)
            formats[s] = (dt.word, mantissa_bits(dt) or 0)
    return XorDelta(starts, pairs, spec, source, formats)


__all__ = [
    "MIN_PAIR_BYTES",
    "ORDERED_DIFFERENCE",
    "SCALED_DIFFERENCE",
    "SCALED_SIGN_MAGNITUDE",
    "XOR",
    "Keyframe",
    "Pair",
    "Tensor",
    "XorDelta",
    "choose_pairs",
    "delta_costs",
    "delta_for",
    "diff_backward",
    "diff_forward",
    "index_tensors",
    "layout_tensors",
    "open_delta",
    "plane_cost",
    "scaled_costs",
    "xor_gain",
]
