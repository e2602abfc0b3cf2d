"""Series delta kinds that code float words against the reference's words in value.

Kind 1 stores each word's ordered-integer difference from the reference word. Kinds 2 and 3
first predict the word as ``scale * reference`` (FORMAT.md "Scaled prediction"): between two
snapshots an AdamW moment of a parameter that saw no gradient decays by a power of its beta,
and a weight by its weight decay, so one scale per tensor predicts many words to the last
bit. Kind 2 stores the ordered difference from the prediction; kind 3 stores whether the
signs agree and the magnitudes' difference, which suits first moments, whose signs flip.
Both store the coded words of each frame's part of a tensor grouped by the reference word's
exponent: residuals of one magnitude then sit together, and the block-adaptive coders that
follow code each group by its own, narrower, statistics.

The words are coded by ``ckptz._native.series_delta``; this module plans: it finds a
tensor's candidate scales and what each kind costs on a sample of it.
"""

from __future__ import annotations

import numpy as np

from ckptz.codecs.native import native
from ckptz.dtypes import DType

#: Delta kinds (FORMAT.md "Delta kinds").
XOR, ORDERED_DIFFERENCE, SCALED_DIFFERENCE, SCALED_SIGN_MAGNITUDE = 0, 1, 2, 3
#: Kinds whose pairs carry a scale.
SCALED = frozenset({SCALED_DIFFERENCE, SCALED_SIGN_MAGNITUDE})
#: The scale 1.0 as a float32 bit pattern: kind 3 unscaled.
UNIT_SCALE = 0x3F800000
#: A scale that this many of a sample's ratios share (to 12 bits) is a candidate of its own.
_MODE_SHARE = 0.01


def mantissa_bits(dt: DType) -> int | None:
    """The mantissa width of a float dtype whose words kinds 1-3 code (2 or 4 bytes), else None."""
    if not dt.is_float or dt.word not in (2, 4) or not dt.exponent_bits:
        return None
    return dt.word * 8 - 1 - dt.exponent_bits


def valid_scale(bits: int) -> bool:
    """Whether ``bits`` is a positive normal float32's bit pattern, as kinds 2 and 3 require."""
    return 0 <= bits <= 0x7FFFFFFF and 0 < (bits >> 23) < 0xFF


def apply(
    data: np.ndarray, ref: np.ndarray, kind: int, word: int, mant: int, scale: int, forward: bool
) -> None:
    """Code (``forward``) or restore ``data``'s words in place against ``ref``'s (uint8 arrays
    of equal, whole-word size: one frame's part of a tensor) as delta kind 1, 2 or 3."""
    native.series_delta(data, ref, word, kind, mant, scale if kind in SCALED else UNIT_SCALE, forward)


def coded(ours: np.ndarray, theirs: np.ndarray, kind: int, word: int, mant: int, scale: int) -> np.ndarray:
    """``ours`` coded against ``theirs`` as kind 1, 2 or 3, as a new array."""
    out = np.array(ours, dtype=np.uint8, copy=True)
    apply(out, theirs, kind, word, mant, scale, True)
    return out


def _as_float64(data: np.ndarray, word: int, mant: int) -> np.ndarray:
    if word == 4:
        return data.view(np.float32).astype(np.float64)
    if mant == 10:
        return data.view(np.float16).astype(np.float64)
    return (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def scale_candidates(ours: np.ndarray, theirs: np.ndarray, word: int, mant: int) -> list[int]:
    """Scales (float32 bit patterns) worth trying for a sample: the median ratio of its words to
    the reference's, and the ratio most of them share where one does (words that only decayed)."""
    n = min(ours.size, theirs.size) // word * word
    with np.errstate(all="ignore"):
        ratios = _as_float64(ours[:n], word, mant) / _as_float64(theirs[:n], word, mant)
    ratios = ratios[np.isfinite(ratios) & (ratios > 0)]
    if not ratios.size:
        return []
    found = [float(np.median(ratios))]
    bins = np.round(np.log2(ratios) * 4096).astype(np.int64)
    values, counts = np.unique(bins, return_counts=True)
    top = int(counts.argmax())
    if counts[top] >= _MODE_SHARE * ratios.size:
        found.append(float(np.median(ratios[bins == values[top]])))
    out = []
    for f in found:
        with np.errstate(over="ignore"):
            bits = int(np.float32(f).view(np.uint32))
        if valid_scale(bits) and bits not in out:
            out.append(bits)
    return out


__all__ = [
    "ORDERED_DIFFERENCE",
    "SCALED",
    "SCALED_DIFFERENCE",
    "SCALED_SIGN_MAGNITUDE",
    "UNIT_SCALE",
    "XOR",
    "apply",
    "coded",
    "mantissa_bits",
    "scale_candidates",
    "valid_scale",
]
