"""Does ``ckptz bench`` predict what ``compress`` achieves? Per component, on one checkpoint.

Runs :func:`ckptz.bench.benchmark.bench` with one configuration over whole components (no
sampling), then compresses the checkpoint with the same engine and prints both ratios per
component with their difference. Both count payloads only: the container's own header,
index and footer are reported apart, as overhead.

Usage::

    python bench/agree.py CHECKPOINT OUTDIR [--codec ckptz-auto] [--device cpu]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from ckptz import api
from ckptz.bench.benchmark import bench


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("outdir", type=Path, help="scratch folder for the compressed copy (replaced)")
    parser.add_argument("--codec", default="ckptz-auto", help="a bench configuration that compress can write")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    result = bench(
        args.checkpoint, device=args.device, codecs=[args.codec], sample_bytes=1 << 40, storage_gbps=1.0
    )
    shutil.rmtree(args.outdir, ignore_errors=True)
    codec = args.codec.removeprefix("ckptz-").removesuffix("-gpu")
    packed = api.compress(args.checkpoint, args.outdir, device=args.device, codec=codec)
    achieved = {c.name: c.ratio for c in packed.components}
    print("| component | bench ratio | compress ratio | difference |\n|---|---:|---:|---:|")
    for r in result.rows:
        got = achieved.get(r.component)
        if got is None:
            continue
        print(f"| {r.component} | {r.ratio:.4f} | {got:.4f} | {100 * (r.ratio / got - 1):+.2f}% |")


if __name__ == "__main__":
    main()
