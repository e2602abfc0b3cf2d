"""Exponent context coding (``huff1``) against block-adaptive Huffman (``zstd``), per component.

For each component of the checkpoints from ``bench/make_checkpoints.py`` (generated into
OUTDIR first if missing), the component's streams (as the pipeline plans them) are cut into
the CPU engine's 4 MiB frames. Reported per component:

* ``order0`` / ``order1``: bits per exponent byte of the global order-0 entropy of the
  exponent plane and of its entropy given the preceding byte (the bounds);
* ``zstd`` / ``huff1``: the exponent plane's payload bytes coded by
  :class:`~ckptz.codecs.cpu.HuffmanZstd` and by :class:`~ckptz.codecs.order1.Order1Codec`,
  as bits per exponent byte;
* ``frame: off / on``: the whole component through :func:`~ckptz.codecs.frames.encode_frame`
  with the CPU engine's options for it, ``context_exponents`` off and on (``on`` keeps the
  smaller exponent payload), in container bytes (payloads, 16-byte alignment and index
  records, as bench/ratios.py counts them); ``gain`` is on's ratio over off's, minus 1;
* single-thread MB/s, median of ``--runs`` runs, the two alternating: of the exponent plane
  alone (plane bytes: encode and decode by each coder), and of whole frames (original bytes:
  ``encode_frame`` off and on, and ``decode_frame`` of each result).

Every decode is checked byte for byte. Usage::

    python bench/context.py OUTDIR [--runs 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import itertools

from make_checkpoints import _moments, generate
from ratios import container_size, stream_bytes
from safetensors.torch import load_file

from ckptz.codecs.cpu import HuffmanZstd
from ckptz.codecs.frames import EncodedChunk, EncodeOptions, decode_frame, encode_frame
from ckptz.codecs.native import native
from ckptz.codecs.order1 import Order1Codec
from ckptz.codecs.planes import split
from ckptz.engines.cpu import CPU_FRAME_SIZE

#: bench names -> the component the pipeline would assign (for the engine's options).
COMPONENTS = {
    "weights fp32": "weights",
    "weights bf16": "weights",
    "exp_avg": "optimizer.exp_avg",
    "exp_avg_sq": "optimizer.exp_avg_sq",
    "ft weights fp32": "weights",
    "ft exp_avg": "optimizer.exp_avg",
    "ft exp_avg_sq": "optimizer.exp_avg_sq",
}


def components(outdir: Path) -> dict[str, list[torch.Tensor]]:
    """The benchmarked components of OUTDIR, in file order (the fine-tune's if present)."""
    scratch = outdir / "scratch"
    m, v = _moments(scratch / "optimizer.pt")
    found = {
        "weights fp32": list(load_file(str(scratch / "model.safetensors")).values()),
        "weights bf16": list(load_file(str(scratch / "model_bf16.safetensors")).values()),
        "exp_avg": m,
        "exp_avg_sq": v,
    }
    ft = next((outdir / "finetune").glob("checkpoint-*"), None)
    if ft is not None:
        ft_m, ft_v = _moments(ft / "optimizer.pt")
        found["ft weights fp32"] = list(load_file(str(ft / "model.safetensors")).values())
        found["ft exp_avg"], found["ft exp_avg_sq"] = ft_m, ft_v
    return found


def entropy(counts: np.ndarray) -> float:
    """Bits of a histogram's order-0 code (total, not per symbol)."""
    c = counts[counts > 0].astype(np.float64)
    return float(c.sum() * np.log2(c.sum()) - (c * np.log2(c)).sum())


def bounds(plane: np.ndarray) -> tuple[float, float]:
    """Order-0 and order-1 (given the preceding byte) entropy, bits per byte."""
    order0 = entropy(np.bincount(plane, minlength=256)) / plane.size
    prev = np.concatenate(([0], plane[:-1])).astype(np.int64)
    pairs = np.bincount(prev * 256 + plane, minlength=65536).reshape(256, 256)
    order1 = sum(entropy(row) for row in pairs if row.any()) / plane.size
    return order0, order1


def local_bounds(plane: np.ndarray, block: int = 1 << 16) -> tuple[float, float, float]:
    """Order-0, order-1 and order-2 entropy (bits per byte) with one model per ``block`` bytes
    (model costs left out: what adaptive context coders aim at)."""
    prev = np.concatenate(([0], plane[:-1])).astype(np.int64)
    prev2 = np.concatenate(([0, 0], plane[:-2])).astype(np.int64)
    total = [0.0, 0.0, 0.0]
    for at in range(0, plane.size, block):
        x = plane[at : at + block].astype(np.int64)
        p1, p2 = prev[at : at + block], prev2[at : at + block]
        for k, ctx in enumerate((np.zeros_like(x), p1, p1 * 256 + p2)):
            _, joint = np.unique(ctx * 256 + x, return_counts=True)
            _, alone = np.unique(ctx, return_counts=True)
            total[k] += entropy(joint) - entropy(alone)  # H(byte | context), in bits
    return total[0] / plane.size, total[1] / plane.size, total[2] / plane.size


def cond_bits(ctx: np.ndarray, x: np.ndarray) -> float:
    """Bits of ``x`` given ``ctx`` (one model for all: no model costs)."""
    _, joint = np.unique(ctx * 256 + x, return_counts=True)
    _, alone = np.unique(ctx, return_counts=True)
    return entropy(joint) - entropy(alone)


def row_bounds(tensors: list[torch.Tensor]) -> tuple[float, float, float, float] | None:
    """Over the 2-D float tensors, one model per tensor, bits per exponent: order-0, given
    the left neighbour, given the one above (previous row), given both. What a coder that
    knew tensor shapes could aim at (ckptz's frame coder does not know them)."""
    totals = [0.0, 0.0, 0.0, 0.0]
    n = 0
    for t in tensors:
        if t.dim() != 2 or t.dtype != torch.float32:
            continue
        e = (t.contiguous().view(torch.int32).numpy() >> 23 & 255).astype(np.int64)
        left = np.zeros_like(e)
        left[:, 1:] = e[:, :-1]
        left[1:, 0] = e[:-1, -1]
        up = np.zeros_like(e)
        up[1:] = e[:-1]
        x, left, up = e.ravel(), left.ravel(), up.ravel()
        for k, ctx in enumerate((np.zeros_like(x), left, up, left * 256 + up)):
            totals[k] += cond_bits(ctx, x)
        n += x.size
    if not n:
        return None
    return totals[0] / n, totals[1] / n, totals[2] / n, totals[3] / n


def median_time(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def frames_of(raw: np.ndarray, starts: list[int], word: int) -> list[np.ndarray]:
    """Each stream cut into frames of CPU_FRAME_SIZE bytes (whole words)."""
    step = CPU_FRAME_SIZE // word * word
    return [raw[a:b][k : k + step] for a, b in itertools.pairwise(starts) for k in range(0, b - a, step)]


def bench_component(name: str, tensors: list[torch.Tensor], runs: int) -> dict[str, object]:
    raw, dtype, starts = stream_bytes(tensors)
    frames = frames_of(raw, starts, dtype.word)
    off = EncodeOptions()
    on = replace(off, context_exponents=True)
    planes = [split(f, dtype)[-1].copy() for f in frames]
    exp = np.concatenate(planes)
    order0, order1 = bounds(exp)
    local = local_bounds(exp)
    rows = row_bounds(tensors)
    huff, ctx = HuffmanZstd(), Order1Codec()
    huff_payloads = [huff.encode(p) for p in planes]
    ctx_payloads = [ctx.encode(p) for p in planes]
    outs = [np.empty_like(p) for p in planes]

    def decode_planes(payloads: list[bytes], fn: Callable[[bytes, np.ndarray], bool]) -> None:
        for payload, out in zip(payloads, outs, strict=True):
            assert fn(payload, out)

    decode_planes(huff_payloads, native.literals_decode)
    assert all(np.array_equal(o, p) for o, p in zip(outs, planes, strict=True))
    decode_planes(ctx_payloads, native.order1_decode)
    assert all(np.array_equal(o, p) for o, p in zip(outs, planes, strict=True))
    coded = {
        "off": [encode_frame(f, dtype, off) for f in frames],
        "on": [encode_frame(f, dtype, on) for f in frames],
    }
    out = np.empty(raw.size, np.uint8)

    def decode_all(chunks: list[list[EncodedChunk]]) -> None:
        at = 0
        for f, cs in zip(frames, chunks, strict=True):
            decode_frame([(c.codec, c.raw_size, c.payload) for c in cs], dtype, out[at : at + f.size])
            at += f.size

    for mode in coded:
        decode_all(coded[mode])
        assert np.array_equal(out, np.concatenate(frames)), mode
    times: dict[str, list[float]] = {}
    jobs: dict[str, Callable[[], object]] = {
        "plane encode zstd": lambda: [huff.encode(p) for p in planes],
        "plane encode huff1": lambda: [ctx.encode(p) for p in planes],
        "plane decode zstd": lambda: decode_planes(huff_payloads, native.literals_decode),
        "plane decode huff1": lambda: decode_planes(ctx_payloads, native.order1_decode),
        "frame encode off": lambda: [encode_frame(f, dtype, off) for f in frames],
        "frame encode on": lambda: [encode_frame(f, dtype, on) for f in frames],
        "frame decode off": lambda: decode_all(coded["off"]),
        "frame decode on": lambda: decode_all(coded["on"]),
    }
    for _ in range(runs):  # alternate, so both coders see the same machine load
        for key, job in jobs.items():
            times.setdefault(key, []).append(median_time(job, 1))
    mb = {
        key: (exp.size if key.startswith("plane") else raw.size) / statistics.median(t) / 1e6
        for key, t in times.items()
    }
    size_off, size_on = container_size(coded["off"]), container_size(coded["on"])
    chosen = sum(cs[-1].codec == ctx.id for cs in coded["on"])
    return {
        "component": name,
        "bytes": int(raw.size),
        "frames": len(frames),
        "huff1_frames": chosen,
        "order0_bits": order0,
        "order1_bits": order1,
        "local_bits": local,
        "row_bits": rows,
        "zstd_bits": 8 * sum(map(len, huff_payloads)) / exp.size,
        "huff1_bits": 8 * sum(map(len, ctx_payloads)) / exp.size,
        "size_off": size_off,
        "size_on": size_on,
        "ratio_off": raw.size / size_off,
        "ratio_on": raw.size / size_on,
        "gain": size_off / size_on - 1,
        "mb_s": mb,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not (args.outdir / "scratch").exists():
        generate(args.outdir)
    results = []
    for name, tensors in components(args.outdir).items():
        r = bench_component(name, tensors, args.runs)
        results.append(r)
        s = r["mb_s"]
        assert isinstance(s, dict)
        local, rows = r["local_bits"], r["row_bits"]
        assert isinstance(local, tuple)
        lines = [
            f"{name:16} {r['bytes'] / 1e6:6.1f} MB  bits/exp: order0 {r['order0_bits']:.3f} order1 "
            f"{r['order1_bits']:.3f} zstd {r['zstd_bits']:.3f} huff1 {r['huff1_bits']:.3f}  "
            f"ratio {r['ratio_off']:.4f} -> {r['ratio_on']:.4f} ({100 * r['gain']:+.2f}%, "
            f"huff1 in {r['huff1_frames']}/{r['frames']} frames)",
            f"{'':16} per 64 KiB: order0 {local[0]:.3f} order1 {local[1]:.3f} order2 {local[2]:.3f}",
            f"{'':16} plane MB/s enc zstd {s['plane encode zstd']:.0f} huff1 {s['plane encode huff1']:.0f}, "
            f"dec zstd {s['plane decode zstd']:.0f} huff1 {s['plane decode huff1']:.0f};  frame MB/s enc "
            f"off {s['frame encode off']:.0f} on {s['frame encode on']:.0f}, dec off {s['frame decode off']:.0f} "
            f"on {s['frame decode on']:.0f}",
        ]
        if isinstance(rows, tuple):
            lines[1] += (
                f"; per 2-D tensor: order0 {rows[0]:.3f} left {rows[1]:.3f} up {rows[2]:.3f} both {rows[3]:.3f}"
            )
        print("\n".join(lines), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
