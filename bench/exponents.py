"""Exponent planes: ckptz's Huffman frames, decoded by libzstd and by ckptz's own decoder.

For each component of the checkpoints from ``bench/make_checkpoints.py`` (generated into
OUTDIR first if missing), the top byte plane of its stream (the exponents, after ckptz's
sign rotation) is cut into the CPU coder's frame-sized pieces and written by
``ckptz._native.huffman_zstd`` (zstd frames of Huffman-coded literal blocks). Then, one
thread, alternating run by run so both see the same machine load:

* ``libzstd``: the zstandard binding's one-shot decompression (a new bytes object each);
* ``ckptz``: ``ckptz._native.literals_decode`` into preallocated arrays (multi-symbol
  lookups, four streams in lockstep).

Every decode is checked byte for byte. MB/s are exponent bytes per second, the best of
``--runs`` runs (the least disturbed on a shared machine), and ``(x)`` ckptz's speed over
libzstd's. Usage::

    python bench/exponents.py OUTDIR [--runs 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_checkpoints import generate, load_components
from ratios import stream_bytes

from ckptz.codecs.native import native
from ckptz.codecs.planes import split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--frame", type=int, default=1 << 20, help="frame size in bytes")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    comps = load_components(args.outdir) if (args.outdir / "scratch").exists() else generate(args.outdir)
    dctx = zstandard.ZstdDecompressor()
    results: dict[str, dict[str, float]] = {}
    print(f"{'component':26s} {'MB':>6s} {'bytes':>9s}  libzstd MB/s  ckptz MB/s   (x)")
    for name, tensors in comps.items():
        raw, dtype, _ = stream_bytes(tensors)
        plane = np.ascontiguousarray(split(raw, dtype)[-1])
        step = args.frame // dtype.word
        pieces = [plane[s : s + step] for s in range(0, plane.size, step)]
        frames = [native.huffman_zstd(p) for p in pieces]
        if any(f is None for f in frames):
            print(f"{name:26s} a table could not be described: skipped")
            continue
        outs = [np.empty(p.size, np.uint8) for p in pieces]
        ours, theirs = [], []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            decoded = [dctx.decompress(f) for f in frames]
            theirs.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            done = [native.literals_decode(f, o) for f, o in zip(frames, outs, strict=True)]
            ours.append(time.perf_counter() - t0)
        assert all(done), "ckptz's decoder declined its own frame"
        for p, o, d in zip(pieces, outs, decoded, strict=True):
            assert np.array_equal(p, o) and d == p.tobytes(), "decode mismatch"
        r = {
            "bytes": plane.size,
            "coded": sum(len(f) for f in frames),
            "libzstd_MBs": plane.size / min(theirs) / 1e6,
            "ckptz_MBs": plane.size / min(ours) / 1e6,
        }
        r["x"] = r["ckptz_MBs"] / r["libzstd_MBs"]
        results[name] = r
        print(
            f"{name:26s} {plane.size / 1e6:6.2f} {r['coded']:9d}  {r['libzstd_MBs']:12.0f}"
            f"  {r['ckptz_MBs']:10.0f}  ({r['x']:4.2f})",
            flush=True,
        )
    if args.json:
        meta = {"frame": args.frame, "runs": args.runs}
        args.json.write_text(json.dumps({"config": meta, "components": results}, indent=2))


if __name__ == "__main__":
    main()
