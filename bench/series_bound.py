"""How far a checkpoint series can shrink: ideal bits per element given the previous snapshot.

For a run that ``bench/series.py --keep`` wrote (``RUN`` holds ``checkpoint-N/optimizer.pt``),
each pair of consecutive checkpoints is measured component by component, all tensors of a
component as one stream:

* **moments** (``exp_avg``, ``exp_avg_sq``): the empirical entropy of each fp32 field, alone
  and with the previous snapshot's element as context: sign and exponent (9 bits) given the
  reference's; the top seven mantissa bits given this element's sign and exponent; the low
  two mantissa bytes alone and given the reference's byte. A coder with these contexts cannot
  do better than the sum (up to the model's own cost), and the low bytes show what no
  reference can predict;
* **master weights** (``fp32_from_fp16``): the ordered-integer difference from the reference
  coded as its bit length and sign (entropy) plus the bits below its leading one (stored).

The last lines combine these ideal ratios with the bytes of each component into a whole-run
bound. Usage::

    python bench/series.py --small --keep --work /tmp/series --train-device cpu
    python bench/series_bound.py /tmp/series/runs/finetune
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np
import torch


def entropy(counts: np.ndarray) -> float:
    """Bits per symbol of a histogram."""
    c = counts[counts > 0].astype(np.float64)
    n = c.sum()
    return float(-(c * np.log2(c / n)).sum() / n)


def conditional_entropy(symbols: np.ndarray, context: np.ndarray, symbol_count: int) -> float:
    """Bits per symbol of ``symbols`` with a static model per ``context`` value."""
    joint = np.bincount(context.astype(np.int64) * symbol_count + symbols)
    joint = np.pad(joint, (0, -len(joint) % symbol_count)).reshape(-1, symbol_count)
    total = joint.sum()
    return float(sum(row.sum() * entropy(row) for row in joint if row.sum()) / total)


def moments(path: Path, key: str) -> np.ndarray:
    state = torch.load(path / "optimizer.pt", weights_only=True)["state"]
    return np.concatenate([state[p][key].numpy().ravel() for p in sorted(state)]).view(np.uint32)


def masters(path: Path) -> np.ndarray:
    groups = torch.load(path / "optimizer.pt", weights_only=True)["fp32_from_fp16"]
    return np.concatenate([t.numpy().ravel() for group in groups for t in group]).view(np.uint32)


def moment_bits(current: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    """Ideal bits per element of ``current``'s fields, alone and given ``reference``."""
    head, head_ref = current >> 23, reference >> 23
    top = (current >> 16) & 127
    low = [(current >> s) & 255 for s in (8, 0)]
    low_ref = [(reference >> s) & 255 for s in (8, 0)]
    return {
        "sign+exponent": entropy(np.bincount(head)),
        "sign+exponent | reference": conditional_entropy(head, head_ref, 512),
        "top mantissa | sign+exponent": conditional_entropy(top, head, 128),
        "low mantissa bytes": sum(entropy(np.bincount(b, minlength=256)) for b in low),
        "low mantissa bytes | reference": sum(
            conditional_entropy(b, r, 256) for b, r in zip(low, low_ref, strict=True)
        ),
        "zeros": float((current == 0).mean()),
    }


def difference_bits(current: np.ndarray, reference: np.ndarray) -> float:
    """Bits per element of the ordered-integer difference: length and sign coded, rest stored."""

    def ordered(u: np.ndarray) -> np.ndarray:
        u = u.astype(np.int64)
        return np.where(u & 0x80000000, -(u & 0x7FFFFFFF), u)

    d = ordered(current) - ordered(reference)
    length = np.zeros_like(d)
    nonzero = d != 0
    length[nonzero] = np.floor(np.log2(np.abs(d[nonzero]))).astype(np.int64) + 1
    return entropy(np.bincount(length * 2 + (d < 0))) + float(np.maximum(length - 1, 0).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a run folder of checkpoint-N/ from bench/series.py --keep")
    ap.add_argument(
        "--weights-ratio", type=float, help="the bf16 weights' measured series ratio, for the bound"
    )
    args = ap.parse_args()
    checkpoints = sorted(args.run.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    best: dict[str, float] = {}
    for key in ("exp_avg", "exp_avg_sq"):
        for reference, current in itertools.pairwise(checkpoints):
            b = moment_bits(moments(current, key), moments(reference, key))
            alone = b["sign+exponent"] + b["top mantissa | sign+exponent"] + b["low mantissa bytes"]
            given = (
                b["sign+exponent | reference"]
                + b["top mantissa | sign+exponent"]
                + b["low mantissa bytes | reference"]
            )
            best[key] = max(best.get(key, 0.0), 32 / given)
            print(
                f"{key:10s} {current.name:16s} alone {alone:5.2f} bits ({32 / alone:.3f}x), "
                f"given the reference {given:5.2f} bits ({32 / given:.3f}x); of which low mantissa "
                f"{b['low mantissa bytes | reference']:.2f} of 16; zeros {b['zeros']:.1%}"
            )
    for reference, current in itertools.pairwise(checkpoints):
        bits = difference_bits(masters(current), masters(reference))
        best["master"] = max(best.get("master", 0.0), 32 / bits)
        print(f"{'master':10s} {current.name:16s} ordered difference {bits:5.2f} bits ({32 / bits:.3f}x)")
    if args.weights_ratio:
        params = masters(checkpoints[-1]).size
        raw = {"weights": 2 * params, "master": 4 * params, "exp_avg": 4 * params, "exp_avg_sq": 4 * params}
        ratio = {**best, "weights": args.weights_ratio}
        coded = sum(raw[k] / ratio[k] for k in raw)
        print(f"whole-run bound with each component at its best pair: {sum(raw.values()) / coded:.3f}x")


if __name__ == "__main__":
    main()
