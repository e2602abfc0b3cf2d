"""Which contexts pay on Adam moments: ideal bits of signs and exponents, and real coded sizes.

For each float component of the checkpoints from ``bench/make_checkpoints.py`` (generated
into OUTDIR first if missing), tensor by tensor with its shape (rows of its last dimension):

* **signs** (1 bit per element today: byte planes put the sign in the lowest, noisy mantissa
  byte): the adaptive code length (Krichevsky-Trofimov, per context; the model's cost
  included) of the sign alone, given the previous sign, given the signs left, up and up-left
  (the rank-1 structure ``s = left ^ up ^ upleft``), and given those plus the exponent;
* **exponents**: the same code length alone, given the left exponent (``huff1``'s context),
  and given the planar prediction ``left + up - upleft`` (``huff2d``'s);
* **coded**: the exponent plane of the component's stream, cut into the CPU coder's 4 MiB
  frames, as ``huffman`` (order-0 Huffman-coded zstd), ``huff1`` and ``huff2d`` payloads (the
  width searched by the encoder, ``-`` where it declines), in bits per element; and its
  lowest plane (sign and seven mantissa bits) stored, as level-19 ``zstd`` and as
  ``sign2d``.

A context that saves ``b`` bits per element saves about ``b / 26`` of a moment's coded bytes
(~26 bits per fp32 element). Usage::

    python bench/moment_contexts.py OUTDIR [--small]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_checkpoints import SMALL, generate, load_components
from ratios import stream_bytes

from ckptz.codecs import order1, order2d, sign2d
from ckptz.codecs.cpu import ZstdCodec
from ckptz.codecs.native import native
from ckptz.codecs.planes import split

COMPONENTS = ("weights fp32", "exp_avg", "exp_avg_sq", "ft exp_avg", "ft exp_avg_sq")
_LGAMMA = np.vectorize(math.lgamma, otypes=[np.float64])


def adaptive_bits(symbols: np.ndarray, contexts: np.ndarray, alphabet: int) -> float:
    """KT-adaptive code length in bits of ``symbols`` given ``contexts``: it depends only on
    each context's symbol counts, so no coder needs to run."""
    keys = contexts.astype(np.int64) * alphabet + symbols.astype(np.int64)
    rows = int(contexts.max()) + 1 if keys.size else 0
    counts = np.bincount(keys, minlength=rows * alphabet).reshape(rows, alphabet)
    counts = counts[counts.sum(axis=1) > 0].astype(np.float64)
    totals = counts.sum(axis=1)
    nats = _LGAMMA(totals + alphabet / 2) - math.lgamma(alphabet / 2)
    nats -= (_LGAMMA(counts + 0.5) - math.lgamma(0.5)).sum(axis=1)
    return float(nats.sum() / math.log(2))


def _shifted(grid: np.ndarray, up: int, left: int) -> np.ndarray:
    out = np.zeros_like(grid)
    out[up:, left:] = grid[: grid.shape[0] - up, : grid.shape[1] - left]
    return out


def ideal_bits(tensors: list[torch.Tensor]) -> dict[str, float]:
    """Bits per element of each context model, summed over the tensors."""
    bits: dict[str, float] = {}
    count = 0
    for t in tensors:
        words = t.detach().contiguous().numpy().view(np.uint32)
        grid = words.reshape(-1, words.shape[-1]) if words.ndim >= 2 else words.reshape(1, -1)
        sign = (grid >> 31).astype(np.int64)
        exp = ((grid >> 23) & 0xFF).astype(np.int64)
        left_s, up_s, ul_s = _shifted(sign, 0, 1), _shifted(sign, 1, 0), _shifted(sign, 1, 1)
        left_e, up_e, ul_e = _shifted(exp, 0, 1), _shifted(exp, 1, 0), _shifted(exp, 1, 1)
        rank1 = (left_s ^ up_s ^ ul_s) + 2 * left_s + 4 * up_s
        models = {
            "sign": (sign, np.zeros_like(sign), 2),
            "sign|left": (sign, left_s, 2),
            "sign|rows": (sign, rank1, 2),
            "sign|rows+exp": (sign, rank1 * 16 + np.clip(exp - 100, 0, 15), 2),
            "exp": (exp, np.zeros_like(exp), 256),
            "exp|left": (exp, left_e, 256),
            "exp|planar": (exp, np.clip(left_e + up_e - ul_e, 0, 255), 256),
        }
        for name, (symbols, context, alphabet) in models.items():
            bits[name] = bits.get(name, 0.0) + adaptive_bits(symbols.ravel(), context.ravel(), alphabet)
        count += sign.size
    return {k: v / count for k, v in bits.items()}


def coded_bits(tensors: list[torch.Tensor], frame: int = 4 << 20) -> dict[str, float | None]:
    """Bits per element of the stream's exponent plane as each bitstream codes it."""
    raw, dtype, _ = stream_bytes(tensors)
    plane = np.ascontiguousarray(split(raw, dtype)[-1])
    step = frame // dtype.word
    sizes: dict[str, float | None] = {"huffman": 0.0, "huff1": 0.0, "huff2d": 0.0}
    for at in range(0, plane.size, step):
        piece = plane[at : at + step]
        huffman = native.huffman_zstd(piece)
        ordered, rowed = order1.encode(piece), order2d.encode(piece)
        for name, payload in (("huffman", huffman), ("huff1", ordered), ("huff2d", rowed)):
            size = sizes[name]
            sizes[name] = None if payload is None or size is None else size + len(payload)
    return {k: None if v is None else v * 8 / plane.size for k, v in sizes.items()}


def lowest_plane_bits(tensors: list[torch.Tensor], frame: int = 4 << 20) -> dict[str, float | None]:
    """Bits per element of the stream's lowest plane stored, as zstd -19 and as sign2d."""
    raw, dtype, _ = stream_bytes(tensors)
    plane = np.ascontiguousarray(split(raw, dtype)[0])
    step = frame // dtype.word
    zstd = ZstdCodec(19)
    sizes: dict[str, float | None] = {"raw": float(plane.size), "zstd": 0.0, "sign2d": 0.0}
    for at in range(0, plane.size, step):
        piece = plane[at : at + step]
        signed = sign2d.encode(piece)
        sizes["zstd"] = (sizes["zstd"] or 0.0) + len(zstd.encode(piece))
        current = sizes["sign2d"]
        sizes["sign2d"] = None if signed is None or current is None else current + len(signed)
    return {k: None if v is None else v * 8 / plane.size for k, v in sizes.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--small", action="store_true", help="generate a tiny run if OUTDIR has none")
    args = parser.parse_args()
    if (args.outdir / "scratch").exists():
        comps = load_components(args.outdir)
    else:
        comps = generate(args.outdir, SMALL) if args.small else generate(args.outdir)
    for name in COMPONENTS:
        tensors = [t for t in comps[name] if t.dtype == torch.float32]
        ideal = ideal_bits(tensors)
        coded = coded_bits(tensors)
        print(f"{name}")
        print("  ideal bits/element: " + "  ".join(f"{k} {v:.3f}" for k, v in ideal.items()))
        print(
            "  coded exponent bits/element: "
            + "  ".join(f"{k} {'-' if v is None else f'{v:.3f}'}" for k, v in coded.items())
        )
        lowest = lowest_plane_bits(tensors)
        print(
            "  coded lowest plane bits/element: "
            + "  ".join(f"{k} {'-' if v is None else f'{v:.3f}'}" for k, v in lowest.items())
        )


if __name__ == "__main__":
    main()
