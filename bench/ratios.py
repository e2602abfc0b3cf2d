"""Per-component ratios and CPU throughput: ckptz's frame coder against its peers.

For each component of the checkpoints from ``bench/make_checkpoints.py`` (generated into
OUTDIR first if missing), on the same tensor bytes:

* ``ckptz``: :func:`ckptz.codecs.frames.encode_frame` over frames of ``--frame`` bytes
  of each stream the pipeline would plan (float tensors grouped by value class, so fp32
  tensors holding bf16 values apart from true fp32 ones; every peer gets the same bytes
  in the same order), with the options the CPU engine uses for the component (deflate
  exponents for weights, literal zstd elsewhere), decoded into one preallocated output,
  counting payloads, their 16-byte alignment and the container's per-frame (24 B) and
  per-chunk (34 B) index records, so the ratio is what a container would really cost;
* ``zipnn``: ZipNN 0.5.4 (byte input with the component's dtype; it reorders its input in
  place, so it always gets a private copy);
* ``zstd-3`` / ``zstd-19``: one zstd frame of the whole stream (single-threaded);
* ``order0``: the global order-0 entropy bound of the byte planes (ckptz's transform).

Throughput (MB/s of original bytes, median of ``--runs`` runs, ``--threads`` workers):
ckptz through a thread pool over frames, ZipNN with its own ``threads``, the two
alternating run by run; ``(x)`` is ckptz's speed over ZipNN's, the median of the per-run
ratios. Every round trip is verified byte for byte. Usage::

    python bench/ratios.py OUTDIR [--frame BYTES] [--threads 2] [--runs 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_checkpoints import generate, load_components

from ckptz.codecs.frames import EncodedChunk, EncodeOptions, decode_frame, encode_frame
from ckptz.codecs.planes import split
from ckptz.dtypes import DTYPES, DType
from ckptz.pipeline import sampled_class

_ZIPNN_DTYPE = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def stream_bytes(tensors: list[torch.Tensor]) -> tuple[np.ndarray, DType, list[int]]:
    """The component's streams, as the pipeline plans them, concatenated.

    Tensors (one dtype) are grouped by :func:`ckptz.pipeline.sampled_class` of the same
    sample the pipeline reads, groups in order of first appearance. Returns the bytes, the
    dtype and where each stream starts (plus the end).
    """
    dtype = DTYPES[str(tensors[0].dtype).removeprefix("torch.")]
    groups: dict[int, list[np.ndarray]] = {}
    for t in tensors:
        data = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        cls = sampled_class(lambda at, n, d=data: d[at : at + n].tobytes(), data.size, dtype)
        groups.setdefault(cls, []).append(data)
    parts = [np.concatenate(g) for g in groups.values()]
    return np.concatenate(parts), dtype, [0, *np.cumsum([p.size for p in parts]).tolist()]


def order0_bits(raw: np.ndarray, dtype: DType) -> float:
    """Global order-0 entropy of the byte planes, in bits."""
    total = 0.0
    for plane in split(raw, dtype):
        counts = np.bincount(plane, minlength=256).astype(np.float64)
        p = counts[counts > 0] / plane.size
        total += float(-(p * np.log2(p)).sum()) * plane.size
    return total


def ckptz_encode(
    raw: np.ndarray, dtype: DType, bounds: list[int], frame: int, pool: ThreadPoolExecutor
) -> list[list[EncodedChunk]]:
    """Encode streams (``raw[bounds[i]:bounds[i + 1]]``) frame by frame on the pool, with
    the CPU engine's options for the component."""
    opts = EncodeOptions()
    cuts = [
        (s, min(s + frame, end))
        for start, end in itertools.pairwise(bounds)
        for s in range(start, end, frame)
    ]
    return list(pool.map(lambda c: encode_frame(raw[c[0] : c[1]], dtype, opts), cuts))


def ckptz_decode(frames: list[list[EncodedChunk]], dtype: DType, pool: ThreadPoolExecutor) -> np.ndarray:
    """Decode every frame on the pool into one output array, as a tensor's storage would be."""
    sizes = [sum(c.raw_size for c in f) for f in frames]
    starts = np.cumsum([0, *sizes])
    out = np.empty(int(starts[-1]), np.uint8)

    def one(i: int) -> None:
        chunks = [(c.codec, c.raw_size, c.payload) for c in frames[i]]
        decode_frame(chunks, dtype, out[starts[i] : starts[i + 1]])

    list(pool.map(one, range(len(frames))))
    return out


def container_size(frames: list[list[EncodedChunk]]) -> int:
    """Payloads with 16-byte alignment plus the index records a container stores."""
    return sum(24 + sum(34 + -(-len(c.payload) // 16) * 16 for c in f) for f in frames)


def timed(fn: Callable[..., object], *args: object) -> tuple[float, object]:
    """Wall time of one call ``fn(*args)`` and its result."""
    t0 = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - t0, result


def bench_component(
    raw: np.ndarray, dtype: DType, bounds: list[int], args: argparse.Namespace, name: str
) -> dict[str, float]:
    """Ratios and throughputs of every method on one stream.

    ckptz and ZipNN run alternately (ckptz compress, ZipNN compress, ckptz decompress,
    ZipNN decompress, ``--runs`` times), so both see the same machine load; speeds are
    medians, and ``*_vs_zipnn`` the median of the per-run speed ratios.
    """
    import zipnn

    zdt = _ZIPNN_DTYPE.get(dtype.name)
    z = zipnn.ZipNN(input_format="byte", bytearray_dtype=zdt, threads=args.threads) if zdt else None
    original = raw.tobytes()

    n = raw.size
    res: dict[str, float] = {"bytes": n, "order0": n * 8 / order0_bits(raw, dtype)}
    times: dict[str, list[float]] = {"c": [], "d": [], "zc": [], "zd": []}
    frames: list[list[EncodedChunk]] = []
    comp = b""
    with ThreadPoolExecutor(args.threads) as pool:
        for _ in range(args.runs):
            t, frames = timed(ckptz_encode, raw, dtype, bounds, args.frame, pool)  # type: ignore[assignment]
            times["c"].append(t)
            if z is not None:
                private = bytearray(original)  # ZipNN reorders its input in place
                t, comp = timed(z.compress, private)  # type: ignore[assignment]
                times["zc"].append(t)
            t, back = timed(ckptz_decode, frames, dtype, pool)
            times["d"].append(t)
            assert np.array_equal(back, raw), "ckptz round trip failed"  # type: ignore[arg-type]
            if z is not None:
                t, zback = timed(z.decompress, comp)
                times["zd"].append(t)
                assert bytes(zback) == original, "zipnn round trip failed"  # type: ignore[call-overload]
    res |= {
        "ckptz": n / container_size(frames),
        "ckptz_c_MBs": n / statistics.median(times["c"]) / 1e6,
        "ckptz_d_MBs": n / statistics.median(times["d"]) / 1e6,
    }
    if z is not None:
        res |= {
            "zipnn": n / len(comp),
            "zipnn_c_MBs": n / statistics.median(times["zc"]) / 1e6,
            "zipnn_d_MBs": n / statistics.median(times["zd"]) / 1e6,
            "c_vs_zipnn": statistics.median(zt / ct for ct, zt in zip(times["c"], times["zc"], strict=True)),
            "d_vs_zipnn": statistics.median(zt / dt for dt, zt in zip(times["d"], times["zd"], strict=True)),
        }
    for level in (3, 19):
        zcomp = zstandard.ZstdCompressor(level=level).compress(raw)
        assert zstandard.ZstdDecompressor().decompress(zcomp) == original, "zstd round trip failed"
        res[f"zstd-{level}"] = n / len(zcomp)
    return res


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--frame", type=int, default=1 << 20, help="frame size in bytes")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", default=None, help="comma-separated component names")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    comps = load_components(args.outdir) if (args.outdir / "scratch").exists() else generate(args.outdir)
    # torch's ~130 K objects would otherwise be traversed by every full collection that
    # either tool's allocations trigger; the ckptz CLI never imports torch.
    gc.freeze()
    wanted = set(args.only.split(",")) if args.only else None
    results: dict[str, dict[str, float]] = {}
    cols = ["order0", "ckptz", "zipnn", "zstd-3", "zstd-19"]
    speeds = ["ckptz_c_MBs", "zipnn_c_MBs", "c_vs_zipnn", "ckptz_d_MBs", "zipnn_d_MBs", "d_vs_zipnn"]
    print(
        f"{'component':26s} {'MB':>6s} "
        + " ".join(f"{c:>7s}" for c in cols)
        + "   c MB/s ckptz/zipnn (x)     d MB/s ckptz/zipnn (x)"
    )
    for name, tensors in comps.items():
        if wanted and name not in wanted:
            continue
        raw, dtype, bounds = stream_bytes(tensors)
        r = bench_component(raw, dtype, bounds, args, name)
        results[name] = r
        ratios = " ".join(f"{r.get(c, float('nan')):7.3f}" for c in cols)
        sp = [r.get(s, float("nan")) for s in speeds]
        print(
            f"{name:26s} {raw.size / 1e6:6.1f} {ratios}   {sp[0]:6.0f} / {sp[1]:6.0f} ({sp[2]:4.2f})"
            f"   {sp[3]:6.0f} / {sp[4]:6.0f} ({sp[5]:4.2f})",
            flush=True,
        )
    if args.json:
        meta = {"frame": args.frame, "threads": args.threads, "runs": args.runs}
        args.json.write_text(json.dumps({"config": meta, "components": results}, indent=2))


if __name__ == "__main__":
    main()
