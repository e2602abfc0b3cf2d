"""Which series delta codes a checkpoint's tensors smallest against the next newer one, per component.

For each consecutive pair of checkpoints of a run folder (``checkpoint-N/`` with
``model.safetensors`` and ``optimizer.pt``, as ``bench/series.py`` and ``tests/series_run.py``
write them), every float tensor is coded against its counterpart in the newer checkpoint by:

* ``plain``: no delta;
* ``xor``: the bytes XORed (series delta kind 0);
* ``diff``: the ordered integer difference, zigzagged (kind 1);
* ``scaled``: against the prediction ``c · reference``, one scale ``c`` per tensor (for the
  moments of rows that saw no gradient, ``β^-k`` over ``k`` steps; for weights, their decay),
  the best of kind 2 (ordered difference) and kind 3 (sign and magnitude) at the candidate
  scales :func:`ckptz.series.kinds.scale_candidates` finds;
* ``best``: per tensor, the smallest of all of them (what ckptz chooses, up to its margins).

Cost is the order-0 entropy of the byte planes (what ckptz's plane coders approach), summed
per component; the ratio is original bytes over that. Usage::

    PYTHONPATH=. python bench/series_deltas.py RUN_FOLDER
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from ckptz.series.delta import diff_forward, plane_cost, scaled_costs

KINDS = ("plain", "xor", "diff", "scaled", "best")


#: Mantissa bits by element size: the runs this reads hold float32 and bfloat16 tensors.
MANTISSA = {4: 23, 2: 7}


def tensors_of(folder: Path) -> dict[str, tuple[str, np.ndarray, int]]:
    """``{name: (component, uint8 bytes, word)}`` of a checkpoint's float tensors of 2 or 4 bytes."""
    out: dict[str, tuple[str, np.ndarray, int]] = {}
    model = folder / "model.safetensors"
    if model.exists():
        for k, v in load_file(str(model)).items():
            if v.is_floating_point() and v.element_size() in (2, 4):
                comp = f"weights {v.element_size() * 8}-bit"
                out[f"model.{k}"] = (
                    comp,
                    v.contiguous().reshape(-1).view(torch.uint8).numpy(),
                    v.element_size(),
                )
    opt = folder / "optimizer.pt"
    if opt.exists():
        state = torch.load(opt, map_location="cpu", weights_only=True)

        def walk(obj: object, path: str) -> None:
            if isinstance(obj, torch.Tensor):
                if obj.is_floating_point() and obj.element_size() in (2, 4) and obj.numel() > 64:
                    leaf = path.rsplit(".", 1)[-1]
                    comp = leaf if leaf in ("exp_avg", "exp_avg_sq") else "master weights"
                    raw = obj.contiguous().reshape(-1).view(torch.uint8).numpy()
                    out[f"opt.{path}"] = (comp, raw, obj.element_size())
            elif isinstance(obj, dict):
                for k, v in obj.items():
                    walk(v, f"{path}.{k}")
            elif isinstance(obj, list | tuple):
                for i, v in enumerate(obj):
                    walk(v, f"{path}.{i}")

        walk(state, "state")
    return out


def costs(ours: np.ndarray, theirs: np.ndarray, word: int) -> dict[str, float]:
    """Order-0 plane cost of each delta of one tensor."""
    c = {
        "plain": plane_cost(ours, word),
        "xor": plane_cost(ours ^ theirs, word),
        "diff": plane_cost(diff_forward(ours, theirs, word), word),
        "scaled": min(scaled_costs(ours.tobytes(), theirs.tobytes(), word, MANTISSA[word]).values()),
    }
    c["best"] = min(c.values())
    return c


def main() -> None:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    args = ap.parse_args()
    folders = sorted(
        (p for p in args.run.iterdir() if re.fullmatch(r"checkpoint-\d+", p.name)),
        key=lambda p: int(p.name.split("-")[1]),
    )
    size: dict[str, int] = defaultdict(int)
    cost: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(KINDS, 0.0))
    newer = tensors_of(folders[-1])
    for folder in reversed(folders[:-1]):
        ours = tensors_of(folder)
        for name, (comp, data, word) in ours.items():
            if name not in newer or newer[name][1].size != data.size:
                continue
            size[comp] += data.size
            for k, v in costs(data, newer[name][1], word).items():
                cost[comp][k] += v
        newer = ours
    print(f"{'component':18s} {'MB':>7s} " + " ".join(f"{k:>7s}" for k in KINDS))
    for comp in sorted(size):
        print(
            f"{comp:18s} {size[comp] / 1e6:7.2f} "
            + " ".join(f"{size[comp] / max(cost[comp][k], 1):7.3f}" for k in KINDS)
        )


if __name__ == "__main__":
    main()
