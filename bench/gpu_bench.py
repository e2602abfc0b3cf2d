"""GPU benchmark for ckptz (issue 3): run on the GPU machine, one run, results under ``OUT``.

1. Generates a realistic checkpoint folder (>= 2 GB): a byte-level GPT (~150M params)
   trained a few hundred AdamW steps on the GPU under bf16 autocast; saved as fp32 master
   weights, a bf16 copy, and the AdamW state.
2. GPU-resident (data already on the GPU, CUDA-synchronised, warm-up, median of 5), per
   component: ckptz's coder with ``ans`` and ``zstd`` (transform + batched nvCOMP), the
   blog's recipe (nvCOMP Zstd and ANS straight on the raw tensor bytes), CPU zstd -3 and
   ZipNN with every core (data in host memory).
3. End to end, file to file, warm page cache: ``ckptz compress/decompress`` on the GPU with
   each codec and on the CPU, python-zstandard -3 and ZipNN with every core, ``cp -r``;
   each in a subprocess that reports its peak host (RSS) and GPU memory.

Usage: ``PYTHONPATH=. python3 bench/gpu_bench.py OUTDIR [--work DIR] [--steps N]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

CORES = os.cpu_count() or 1
MB = 1e6


def _corpus_bytes(n: int) -> np.ndarray:
    """Python source text from the standard library, in sorted order (same on every machine)."""
    out, size = [], 0
    for p in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        b = p.read_bytes()
        out.append(b)
        size += len(b)
        if size >= n:
            break
    return np.frombuffer(b"".join(out)[:n], dtype=np.uint8)


def generate(folder: Path, steps: int) -> dict[str, float]:
    """Train the model on the GPU and save fp32 weights, a bf16 copy and the AdamW state."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    d, layers, ctx = 1024, 12, 512
    layer = torch.nn.TransformerEncoderLayer(d, 16, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
    model = torch.nn.ModuleDict(
        {
            "embed": torch.nn.Embedding(256, d),
            "pos": torch.nn.Embedding(ctx, d),
            "blocks": torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False),
            "norm": torch.nn.LayerNorm(d),
            "head": torch.nn.Linear(d, 256, bias=False),
        }
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    text = torch.from_numpy(_corpus_bytes(64 << 20).astype(np.int64)).cuda()
    mask = torch.nn.Transformer.generate_square_subsequent_mask(ctx, device="cuda")
    t0 = time.perf_counter()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        starts = torch.randint(0, text.numel() - ctx - 1, (16,), device="cuda")
        idx = starts[:, None] + torch.arange(ctx + 1, device="cuda")
        x, y = text[idx[:, :-1]], text[idx[:, 1:]]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = model["embed"](x) + model["pos"].weight[:ctx]
            h = model["norm"](model["blocks"](h, mask=mask, is_causal=True))
            loss = torch.nn.functional.cross_entropy(model["head"](h).float().flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    train_s = time.perf_counter() - t0
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, folder / "model.safetensors")
    save_file({k: v.bfloat16() for k, v in state.items()}, folder / "model_bf16.safetensors")
    torch.save(opt.state_dict(), folder / "optimizer.pt")
    (folder / "config.json").write_text(json.dumps({"d_model": d, "layers": layers, "steps": steps}))
    params = sum(p.numel() for p in model.parameters())
    return {"params": params, "steps": steps, "train_s": train_s, "final_loss": float(loss.detach())}


def components(folder: Path) -> dict[str, torch.Tensor]:
    """Raw bytes of each component, concatenated, on the GPU."""
    from safetensors.torch import load_file

    opt = torch.load(folder / "optimizer.pt", weights_only=True)["state"].values()
    parts = {
        "weights fp32": list(load_file(folder / "model.safetensors").values()),
        "weights bf16": list(load_file(folder / "model_bf16.safetensors").values()),
        "exp_avg fp32": [s["exp_avg"] for s in opt],
        "exp_avg_sq fp32": [s["exp_avg_sq"] for s in opt],
    }
    return {
        k: torch.cat([t.contiguous().view(-1).view(torch.uint8) for t in v]).cuda() for k, v in parts.items()
    }


def _median_time(fn: Any, reps: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _coder(scratch: Any = None) -> tuple[Any, Any, Any]:
    """The GPU coder's device on the current CUDA device: (ops, nvCOMP codecs, stream)."""
    from ckptz import cuda
    from ckptz.engines.gpu.kernels import CudaOps
    from ckptz.engines.gpu.memory import DeviceScratch
    from ckptz.engines.gpu.nvcomp_codecs import NvcompCodecs

    index = torch.cuda.current_device()
    cuda.use_device(index)
    stream = cuda.Stream()
    ops = CudaOps(index, stream.handle, scratch or DeviceScratch())
    return ops, NvcompCodecs(ops), stream


def _buf(t: torch.Tensor) -> Any:
    from ckptz.engines.gpu.memory import Buf

    return Buf(t.data_ptr(), t.numel())


def _const_values(ops: Any, batch: Any) -> np.ndarray:
    """Each chunk's byte if it is ``const`` (its one-byte payload in the block), else 0."""
    from ckptz.engines.gpu.coder import CONST_ID

    const = batch.codec == CONST_ID
    values = np.zeros(batch.codec.size, dtype=np.int64)
    if const.any():
        values[const] = ops.download(batch.block, np.uint8)[batch.offset[const]]
    return values


def bench_ckptz_resident(data: torch.Tensor, word: int, codec: str, frame: int) -> dict[str, float]:
    """ckptz's GPU coder on device-resident bytes: transform, const check, batched nvCOMP, and
    the gather into the container's data layout (what the engine copies back)."""
    from ckptz.engines.gpu.coder import ANS_ID, ZSTD_ID, FrameShape, decode_batch, encode_batch, plan_batch

    torch.cuda.synchronize()
    ops, codecs, stream = _coder()
    cid = ANS_ID if codec == "ans" else ZSTD_ID
    n = data.numel()
    shapes = [FrameShape(word, True, min(frame, n - o)) for o in range(0, n, frame)]
    layout = plan_batch(shapes)
    enc: dict[str, Any] = {}

    def encode() -> None:
        enc["b"] = encode_batch(codecs, ops, cid, _buf(data), layout)
        stream.synchronize()

    t_enc = _median_time(encode)
    batch = enc["b"]
    values = _const_values(ops, batch)
    payloads = torch.empty(batch.block.size, dtype=torch.uint8, device=data.device)
    from ckptz import cuda

    cuda.copy_on_device(payloads.data_ptr(), batch.block.ptr, batch.block.size, stream.handle)
    res: dict[str, Any] = {}

    def decode() -> None:
        res["d"] = decode_batch(
            codecs, ops, _buf(payloads), layout, batch.codec, batch.offset, batch.size, values
        )
        stream.synchronize()

    t_dec = _median_time(decode)
    got = ops.download(res["d"], np.uint8)
    want = data.cpu().numpy()
    ok = all(
        np.array_equal(
            got[g.data_offset : g.data_offset + len(g.members) * g.shape.length],
            want[g.members[0] * frame : g.members[0] * frame + len(g.members) * g.shape.length],
        )
        for g in layout.groups
    )
    return {
        "ratio": n / batch.block.size,
        "comp_GBps": n / t_enc / 1e9,
        "decomp_GBps": n / t_dec / 1e9,
        "exact": ok,
    }


def bench_ckptz_workers(
    data: torch.Tensor, word: int, codec: str, frame: int, batch: int = 128 << 20, workers: int = 2
) -> dict[str, float]:
    """The coder as the engine runs it: ``workers`` threads, each with its own CUDA stream and
    nvCOMP codecs, coding batches of ``batch`` bytes side by side, so one batch's host work
    overlaps another's GPU work. Bytes already on the GPU; median of 3 after a warm-up. Each
    batch keeps scratch memory of its own, so that every batch's block is there to decode."""
    import threading

    from ckptz import cuda
    from ckptz.engines.gpu.coder import ANS_ID, ZSTD_ID, FrameShape, decode_batch, encode_batch, plan_batch
    from ckptz.engines.gpu.memory import DeviceScratch

    cid = ANS_ID if codec == "ans" else ZSTD_ID
    n = data.numel()
    starts = list(range(0, n, batch))
    layouts = []
    for s in starts:
        length = min(batch, n - s)
        layouts.append(
            plan_batch([FrameShape(word, True, min(frame, length - o)) for o in range(0, length, frame)])
        )
    torch.cuda.synchronize()
    scratch = [DeviceScratch() for _ in starts]
    coders = [_coder(scratch[0]) for _ in range(workers)]
    encoded: list[Any] = [None] * len(starts)
    decoded: list[Any] = [None] * len(starts)
    values: list[Any] = [None] * len(starts)
    payloads: list[Any] = [None] * len(starts)

    def ops_for(w: int, i: int) -> tuple[Any, Any]:
        from ckptz.engines.gpu.kernels import CudaOps
        from ckptz.engines.gpu.nvcomp_codecs import NvcompCodecs

        ops = CudaOps(torch.cuda.current_device(), coders[w][2].handle, scratch[i])
        return ops, NvcompCodecs(ops)

    per = {(w, i): ops_for(w, i) for i in range(len(starts)) for w in range(workers) if i % workers == w}

    def run(job: Any) -> float:
        def worker(w: int) -> None:
            cuda.use_device(torch.cuda.current_device())
            for i in range(w, len(starts), workers):
                job(w, i)
            coders[w][2].synchronize()

        torch.cuda.synchronize()
        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def enc(w: int, i: int) -> None:
        s = starts[i]
        ops, codecs = per[(w, i)]
        encoded[i] = encode_batch(codecs, ops, cid, _buf(data[s : s + min(batch, n - s)]), layouts[i])

    def dec(w: int, i: int) -> None:
        b = encoded[i]
        ops, codecs = per[(w, i)]
        decoded[i] = decode_batch(codecs, ops, payloads[i], layouts[i], b.codec, b.offset, b.size, values[i])

    run(enc)
    t_enc = statistics.median(run(enc) for _ in range(3))
    for i, b in enumerate(encoded):
        ops = per[(i % workers, i)][0]
        values[i] = _const_values(ops, b)
        payloads[i] = ops.upload(f"payloads-{i}", ops.download(b.block, np.uint8))
    run(dec)
    t_dec = statistics.median(run(dec) for _ in range(3))
    host = data.cpu().numpy()
    ok = all(
        np.array_equal(
            per[(i % workers, i)][0].download(decoded[i], np.uint8)[: min(batch, n - s)],
            host[s : s + min(batch, n - s)],
        )
        for i, s in enumerate(starts)
        if len(layouts[i].groups) == 1
    )
    stored = sum(b.block.size for b in encoded)
    return {"ratio": n / stored, "comp_GBps": n / t_enc / 1e9, "decomp_GBps": n / t_dec / 1e9, "exact": ok}


def profile_coder(data: torch.Tensor, out: Path) -> None:
    """torch.profiler tables (CPU and CUDA time) of the ans coder on 1 MiB frames."""
    from torch.profiler import ProfilerActivity, profile

    bench_ckptz_resident(data, 4, "ans", 1 << 20)  # warm up, compile the kernels
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        bench_ckptz_resident(data, 4, "ans", 1 << 20)
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=40)
    gpu = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)
    # Host time by Python function (the coder's own bookkeeping, nvCOMP's Python layer).
    import cProfile
    import io
    import pstats

    host = cProfile.Profile()
    host.enable()
    bench_ckptz_resident(data, 4, "ans", 4 << 20)
    host.disable()
    text = io.StringIO()
    pstats.Stats(host, stream=text).sort_stats("tottime").print_stats(25)
    out.write_text(table + "\n\n" + gpu + "\n\n" + text.getvalue())
    print(gpu, flush=True)
    print(text.getvalue()[:6000], flush=True)


def bench_blog(data: torch.Tensor, algorithm: str, data_type: str) -> dict[str, float]:
    """The blog's recipe: one nvCOMP codec call on the raw tensor bytes (NVCOMP_NATIVE, 64 KiB)."""
    import nvidia.nvcomp as nvc

    stream = torch.cuda.current_stream()
    kwargs = {"data_type": data_type} if algorithm == "ANS" else {}
    codec = nvc.Codec(
        algorithm=algorithm, device_id=data.device.index, cuda_stream=stream.cuda_stream, **kwargs
    )
    arr = nvc.as_array(data, stream.cuda_stream)
    box: dict[str, Any] = {}

    def encode() -> None:
        box["c"] = codec.encode(arr)
        box["n"] = box["c"].buffer_size

    t_enc = _median_time(encode)

    def decode() -> None:
        box["d"] = codec.decode(box["c"])

    t_dec = _median_time(decode)
    n = data.numel()
    return {"ratio": n / int(box["n"]), "comp_GBps": n / t_enc / 1e9, "decomp_GBps": n / t_dec / 1e9}


def bench_cpu_zstd(host: np.ndarray, chunk: int = 1 << 20) -> dict[str, float]:
    """python-zstandard level 3 on 1 MiB chunks, one thread per core (raw bytes, host memory)."""
    import zstandard

    pieces = [host[o : o + chunk] for o in range(0, host.size, chunk)]
    with ThreadPoolExecutor(CORES) as pool:
        t0 = time.perf_counter()
        comp = list(pool.map(lambda p: zstandard.ZstdCompressor(level=3).compress(p), pieces))
        t1 = time.perf_counter()
        list(pool.map(lambda c: zstandard.ZstdDecompressor().decompress(c), comp))
        t2 = time.perf_counter()
    n = host.size
    return {
        "ratio": n / sum(map(len, comp)),
        "comp_GBps": n / (t1 - t0) / 1e9,
        "decomp_GBps": n / (t2 - t1) / 1e9,
    }


def bench_zipnn(host: np.ndarray, dtype: str) -> dict[str, float] | str:
    """ZipNN 0.5.4 with every core (its compress may write into its input: give it a copy)."""
    try:
        from zipnn import ZipNN
    except ImportError as exc:
        return f"zipnn not installed ({exc})"
    z = ZipNN(input_format="byte", bytearray_dtype=dtype, threads=CORES)
    src = host.tobytes()
    t0 = time.perf_counter()
    comp = z.compress(bytearray(src))
    t1 = time.perf_counter()
    back = z.decompress(comp)
    t2 = time.perf_counter()
    n = host.size
    return {
        "ratio": n / len(comp),
        "comp_GBps": n / (t1 - t0) / 1e9,
        "decomp_GBps": n / (t2 - t1) / 1e9,
        "exact": bytes(back) == src,
    }


def e2e_child(argv: list[str]) -> None:
    """One end-to-end run in this process; prints seconds and peak memory as JSON."""
    op, src, dst = argv[0], Path(argv[1]), Path(argv[2])
    extra = argv[3:]
    t0 = time.perf_counter()
    if op in ("compress", "decompress"):
        from ckptz import api

        device, codec = extra[0], extra[1]
        profile_to = os.environ.get("CKPTZ_BENCH_PROFILE")
        if profile_to:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        if op == "compress":
            api.compress(src, dst, device=device, codec=codec, verify=False)
        else:
            api.decompress(src, dst, device=device)
        if profile_to:
            import io
            import pstats

            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(35)
            Path(profile_to, f"{op}-{device}-{codec}.prof.txt").write_text(text.getvalue())
    elif op in ("zstd", "unzstd", "zipnn", "unzipnn"):
        _file_codec(op, src, dst)
    gpu_peak = torch.cuda.max_memory_allocated() if torch.cuda.is_initialized() else 0
    secs = time.perf_counter() - t0
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over fork+exec (every child reported
    # at least its parent's peak), while the high-water mark belongs to this image.
    status = Path("/proc/self/status").read_text()
    rss = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:"))
    print(json.dumps({"seconds": secs, "host_peak": rss, "gpu_peak": gpu_peak}))


def _file_codec(op: str, src: Path, dst: Path) -> None:
    """Folder to folder with python-zstandard -3 (multi-threaded frames) or ZipNN, every core."""
    import zstandard

    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(p for p in src.iterdir() if p.is_file()):
        data = f.read_bytes()
        if op == "zstd":
            out = zstandard.ZstdCompressor(level=3, threads=CORES).compress(data)
        elif op == "unzstd":
            out = zstandard.ZstdDecompressor().decompressobj().decompress(data)
        else:
            from zipnn import ZipNN

            z = ZipNN(input_format="byte", bytearray_dtype="float32", threads=CORES)
            out = bytes(z.compress(bytearray(data)) if op == "zipnn" else z.decompress(data))
        (dst / f.name).write_bytes(out)


def e2e(name: str, args: list[str], size: int) -> dict[str, Any]:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-X", "faulthandler", __file__, "--e2e", *args],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
    )
    process_seconds = time.perf_counter() - started
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"name": name, "error": f"rc {proc.returncode}: {proc.stderr[-2000:]}"}
    r = json.loads(lines[-1])
    # GBps: the work in a started process (CUDA, nvCOMP and kernel start-up included);
    # process_GBps: the whole command, interpreter and imports too.
    r.update(
        name=name,
        GBps=size / r["seconds"] / 1e9,
        process_GBps=size / process_seconds / 1e9,
        rc=proc.returncode,
        stderr=proc.stderr[-1500:],
    )
    print(json.dumps({k: v for k, v in r.items() if k != "stderr"}), flush=True)
    return r


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--e2e":
        e2e_child(sys.argv[2:])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--work", type=Path, default=Path("/tmp/ckptz-bench"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--skip", default="", help="comma list: resident,e2e,cpu,peers (zstd/ZipNN end to end)")
    ap.add_argument("--profile", action="store_true", help="torch.profiler tables of the ans coder")
    a = ap.parse_args()
    skip = set(a.skip.split(","))
    a.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "machine": torch.cuda.get_device_name(0),
        "cores": CORES,
        "date": time.strftime("%F"),
    }
    folder = a.work / "ckpt"
    shutil.rmtree(a.work, ignore_errors=True)
    results["train"] = generate(folder, a.steps)
    size = sum(p.stat().st_size for p in folder.iterdir())
    results["folder_bytes"] = size
    print(f"generated {size / 1e9:.2f} GB in {folder}: {results['train']}", flush=True)
    rows: list[dict[str, Any]] = []
    if a.profile:
        profile_coder(next(iter(components(folder).values())), a.out / "profile.txt")
    if "resident" not in skip:
        for comp, data in components(folder).items():
            word = 2 if "bf16" in comp else 4
            for codec in ("ans", "zstd"):
                for frame in (1 << 20, 4 << 20):
                    r = bench_ckptz_resident(data, word, codec, frame)
                    rows.append(
                        {"component": comp, "method": f"ckptz {codec} ({frame >> 20} MiB frames)", **r}
                    )
            for codec, frame in (("ans", 4 << 20), ("zstd", 1 << 20)):
                r = bench_ckptz_workers(data, word, codec, frame)
                rows.append(
                    {
                        "component": comp,
                        "method": f"ckptz {codec} ({frame >> 20} MiB frames, 2 workers x 128 MB batches)",
                        **r,
                    }
                )
            rows.append({"component": comp, "method": "blog nvCOMP Zstd", **bench_blog(data, "Zstd", "")})
            dt = "<f2" if word == 2 else "<f4"
            rows.append({"component": comp, "method": f"blog nvCOMP ANS {dt}", **bench_blog(data, "ANS", dt)})
            if "cpu" not in skip:
                host = data.cpu().numpy()
                rows.append({"component": comp, "method": f"CPU zstd -3 x{CORES}", **bench_cpu_zstd(host)})
                z = bench_zipnn(host, "bfloat16" if word == 2 else "float32")
                rows.append(
                    {"component": comp, "method": f"ZipNN x{CORES}", **z} if isinstance(z, dict) else {}
                )
                if not isinstance(z, dict):
                    results["zipnn_skipped"] = z
            print(json.dumps(rows[-1]), flush=True)
            del data
            torch.cuda.empty_cache()
    results["resident"] = [r for r in rows if r]
    if "e2e" not in skip:
        for f in folder.iterdir():  # warm the page cache
            f.read_bytes()
        w = a.work
        runs: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        subprocess.run(["cp", "-r", str(folder), str(w / "cp")], check=True)
        runs.append({"name": "cp -r", "seconds": time.perf_counter() - t0})
        runs[-1]["GBps"] = size / runs[-1]["seconds"] / 1e9
        # ckptz fsyncs every file it writes (safe writes): the like-for-like copy syncs too.
        subprocess.run(["sync"], check=True)
        t0 = time.perf_counter()
        subprocess.run(["cp", "-r", str(folder), str(w / "cp-sync")], check=True)
        subprocess.run(["sync"], check=True)
        runs.append({"name": "cp -r && sync", "seconds": time.perf_counter() - t0})
        runs[-1]["GBps"] = size / runs[-1]["seconds"] / 1e9
        for dev, codec in (("cuda", "ans"), ("cuda", "zstd"), ("cpu", "zstd")):
            tag = f"{dev}-{codec}"
            runs.append(
                e2e(f"ckptz compress {tag}", ["compress", str(folder), str(w / tag), dev, codec], size)
            )
            packed = sum(p.stat().st_size for p in (w / tag).rglob("*") if p.is_file())
            runs[-1]["ratio"] = size / max(packed, 1)
            runs.append(
                e2e(
                    f"ckptz decompress {tag}",
                    ["decompress", str(w / tag), str(w / f"{tag}-back"), dev, codec],
                    size,
                )
            )
            shutil.rmtree(w / f"{tag}-back", ignore_errors=True)
        for op, back in (("zstd", "unzstd"), ("zipnn", "unzipnn")):
            if "peers" in skip or (op == "zipnn" and "zipnn_skipped" in results):
                continue
            runs.append(e2e(f"{op} compress", [op, str(folder), str(w / op)], size))
            runs.append(e2e(f"{op} decompress", [back, str(w / op), str(w / f"{op}-back")], size))
        results["e2e"] = runs
    (a.out / "gpu_bench.json").write_text(json.dumps(results, indent=1, default=str))
    print("\n| component | method | ratio | comp GB/s | decomp GB/s |\n|---|---|---|---|---|")
    for r in results.get("resident", []):
        if "ratio" in r:
            print(
                f"| {r['component']} | {r['method']} | {r['ratio']:.3f} | {r['comp_GBps']:.1f} | {r['decomp_GBps']:.1f} |"
            )
    print(
        "\n| end to end | GB/s | process GB/s | ratio | host peak GB | GPU peak GB |\n|---|---|---|---|---|---|"
    )
    for r in results.get("e2e", []):
        if "error" in r:
            print(f"| {r['name']} | error: {r['error'][-300:]!r} |")
            continue
        ratio = f"{r['ratio']:.3f}" if "ratio" in r else ""
        hp, gp = r.get("host_peak", 0) / 1e9, r.get("gpu_peak", 0) / 1e9
        proc = f"{r['process_GBps']:.2f}" if "process_GBps" in r else ""
        print(f"| {r['name']} | {r['GBps']:.2f} | {proc} | {ratio} | {hp:.2f} | {gp:.2f} |")


if __name__ == "__main__":
    main()
