"""Checkpoint-series benchmark (issue 18): a real training run, ``ckptz --series`` against its peers.

On the GPU machine (about 4-6 minutes at the defaults, ~20 GB of scratch disk, < 4 GiB of GPU
memory; results in ``$OUT/series.json``)::

    PYTHONPATH=. python3 bench/series.py --commit <sha>

On a CPU-only machine, as a smoke run (~2M params, well under two minutes)::

    PYTHONPATH=. python bench/series.py --small

1. Trains a GPT-style transformer (8 layers, d=512, vocab 8192, ~34M params by default;
   ``--layers``/``--d-model``/``--vocab`` scale it) on token data generated here: a fixed
   random Markov chain over the vocabulary (each token has a few Zipf-distributed successors),
   so the loss falls and rare tokens' rows see few gradients, as in real text. AdamW lr 6e-4,
   warmup then cosine, bf16 autocast on a GPU (fp32 on the CPU). Every ``--every`` steps it
   saves an HF-Trainer-style ``pretrain/checkpoint-N/``: ``model.safetensors`` (bf16 weights),
   ``optimizer.pt`` (``torch.save`` of the AdamW state dict: ``exp_avg``, ``exp_avg_sq``, plus
   the fp32 master weights under ``fp32_from_fp16``, as Apex/Megatron-style mixed precision
   keeps them) and ``trainer_state.json``. Then a fine-tune from the last pretraining
   checkpoint (fresh AdamW, lr 1e-5, another chain over a quarter of the vocabulary) saves
   ``finetune/checkpoint-N/`` the same way.
2. On each series: ``ckptz compress --series`` and plain ``ckptz compress`` (each checkpoint
   alone) of the whole run folder, timed, then their per-component and whole-run ratios
   (``ckptz inspect``); python-zstandard -3 and ZipNN (if importable) on each checkpoint file
   alone, whole files timed and each file's components coded apart for per-component ratios
   (ZipNN codes float tensors only: other bytes count at zstd -3 in its component rows);
   restores of both, timed and checked byte for byte (xxh3-128 of every file); restoring the
   oldest checkpoint alone (the longest reference chain); then the oldest series checkpoint is
   deleted and the rest must still restore.
3. Writes ``series.json`` (after each series, so a cut-short run keeps its data) and prints a
   short markdown table last, beside issue 18's goals: whole-run ratio ≥ 1.35× on the
   pretraining series, ≥ 2× on the fine-tune series, and no single checkpoint larger than its
   plain container.

Speeds are original bytes per second of the whole ``api`` call (warm page cache, scratch
folder ``--work``). ckptz runs on ``--device`` (default: ckptz's own choice: the GPU with
nvCOMP where there is one).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ckptz import api  # noqa: E402
from ckptz.formats import read_layout  # noqa: E402

#: Issue 18's goals for this benchmark.
GOALS = {"pretrain": 1.35, "finetune": 2.0}
#: A single series container may exceed its plain one by its longer header, nothing more.
SINGLE_SLACK = 1.001
#: ZipNN's dtype names, by ckptz's.
ZIPNN_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


@dataclass(frozen=True)
class Config:
    """The model, the data and both training phases."""

    layers: int = 8
    d_model: int = 512
    heads: int = 8
    vocab: int = 8192
    seq: int = 256
    batch: int = 32
    successors: int = 4
    steps: int = 2000
    every: int = 250
    lr: float = 6e-4
    warmup: int = 100
    weight_decay: float = 0.1
    ft_steps: int = 500
    ft_every: int = 100
    ft_lr: float = 1e-5
    seed: int = 0


SMALL = Config(
    layers=3, d_model=192, heads=4, vocab=2048, seq=64, batch=4, steps=50, every=10, warmup=5,
    ft_steps=30, ft_every=6,
)  # fmt: skip


# --------------------------------------------------------------------------- data and model


def markov_corpus(vocab: int, successors: int, tokens: int, seed: int, used: int | None = None) -> np.ndarray:
    """``tokens`` tokens of a fixed random Markov chain over the first ``used`` tokens.

    Each token has ``successors`` next tokens drawn Zipf-like (a few frequent tokens, a long
    tail), with fixed probabilities, so a model can learn it and rare rows see few gradients.
    """
    rng = np.random.default_rng(seed)
    used = used or vocab
    popularity = 1.0 / (np.arange(used) + 10.0) ** 1.1
    popularity /= popularity.sum()
    perm = rng.permutation(vocab)[:used]
    succ = perm[rng.choice(used, size=(vocab, successors), p=popularity)]
    probs = rng.dirichlet(np.full(successors, 0.5), size=vocab)
    cum = np.cumsum(probs, axis=1)
    chains = 256
    length = -(-tokens // chains)
    out = np.empty((chains, length), np.int64)
    cur = perm[rng.integers(0, used, chains)]
    for t in range(length):
        out[:, t] = cur
        pick = (rng.random(chains)[:, None] > cum[cur]).sum(1).clip(max=successors - 1)
        cur = succ[cur, pick]
    return out.reshape(-1)[:tokens]


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn_qkv, self.attn_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.attn_qkv(self.ln_1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.mlp_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq, cfg.d_model)
        self.h = nn.ModuleList(Block(cfg.d_model, cfg.heads) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        for name, p in self.named_parameters():
            if p.dim() > 1:
                nn.init.normal_(
                    p, 0.0, 0.02 / math.sqrt(2 * cfg.layers) if name.endswith("proj.weight") else 0.02
                )

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# --------------------------------------------------------------------------- training


def save_checkpoint(folder: Path, model: GPT, opt: torch.optim.Optimizer, step: int, log: list[dict]) -> None:
    """An HF-Trainer-style checkpoint: bf16 ``model.safetensors``, ``optimizer.pt`` with the fp32
    master weights beside the AdamW moments, ``trainer_state.json``."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    save_file(
        {k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in model.state_dict().items()},
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )
    state = opt.state_dict()
    cpu: dict[str, Any] = {
        "state": {i: {k: v.detach().cpu() for k, v in s.items()} for i, s in state["state"].items()},
        "param_groups": state["param_groups"],
        "fp32_from_fp16": [[p.detach().float().cpu() for p in g["params"]] for g in opt.param_groups],
    }
    torch.save(cpu, folder / "optimizer.pt")
    (folder / "trainer_state.json").write_text(
        json.dumps({"global_step": step, "log_history": log[-20:]}, indent=2) + "\n"
    )


def train(
    model: GPT,
    cfg: Config,
    out: Path,
    *,
    steps: int,
    every: int,
    lr: float,
    warmup: int,
    weight_decay: float,
    data: np.ndarray,
    device: torch.device,
    seed: int,
) -> dict[str, Any]:
    """Train ``steps`` AdamW steps on windows of ``data``; a checkpoint every ``every`` steps."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.from_numpy(data).to(device)
    decay = [p for p in model.parameters() if p.dim() > 1]
    other = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
        fused=device.type == "cuda",
    )

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, steps - warmup)
        return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))

    log: list[dict] = []
    losses: list[float] = []
    start = time.perf_counter()
    model.train()
    for step in range(1, steps + 1):
        at = torch.randint(0, tokens.numel() - cfg.seq - 1, (cfg.batch,), generator=gen).to(device)
        window = at[:, None] + torch.arange(cfg.seq + 1, device=device)
        batch = tokens[window]
        for g in opt.param_groups:
            g["lr"] = lr_at(step - 1)
        with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, cfg.vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % max(1, every // 10) == 0 or step == 1:
            losses.append(loss.item())
            log.append({"step": step, "loss": round(losses[-1], 4), "learning_rate": lr_at(step - 1)})
        if step % every == 0:
            save_checkpoint(out / f"checkpoint-{step}", model, opt, step, log)
    return {
        "steps": steps,
        "every": every,
        "lr": lr,
        "seconds": time.perf_counter() - start,
        "loss_first": losses[0],
        "loss_last": losses[-1],
    }


def generate(cfg: Config, work: Path, device: torch.device) -> dict[str, Any]:
    """``work/pretrain/`` and ``work/finetune/``, from one real training run."""
    torch.manual_seed(cfg.seed)
    need = max(cfg.steps, cfg.ft_steps) * cfg.batch * cfg.seq
    tokens = min(max(need // 4, 1 << 20), 16 << 20)
    t0 = time.perf_counter()
    pre_data = markov_corpus(cfg.vocab, cfg.successors, tokens, cfg.seed)
    ft_data = markov_corpus(cfg.vocab, cfg.successors, tokens, cfg.seed + 1, used=cfg.vocab // 4)
    data_s = time.perf_counter() - t0
    model = GPT(cfg).to(device)
    params = sum(p.numel() for p in model.parameters())
    pre = train(
        model, cfg, work / "pretrain", steps=cfg.steps, every=cfg.every, lr=cfg.lr, warmup=cfg.warmup,
        weight_decay=cfg.weight_decay, data=pre_data, device=device, seed=cfg.seed,
    )  # fmt: skip
    ft = train(
        model, cfg, work / "finetune", steps=cfg.ft_steps, every=cfg.ft_every, lr=cfg.ft_lr, warmup=0,
        weight_decay=0.0, data=ft_data, device=device, seed=cfg.seed + 1,
    )  # fmt: skip
    ft["from"] = f"pretrain/checkpoint-{cfg.steps // cfg.every * cfg.every}"
    del model
    if device.type == "cuda":
        torch.cuda.synchronize()
    return {
        "params": params,
        "device": str(device),
        "autocast": "bf16" if device.type == "cuda" else "none (fp32)",
        "corpus_tokens": tokens,
        "corpus_seconds": data_s,
        "pretrain": pre,
        "finetune": ft,
        "peak_gpu_bytes": torch.cuda.max_memory_allocated() if device.type == "cuda" else None,
    }


# --------------------------------------------------------------------------- measuring


def files_of(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def digest(path: Path) -> str:
    """The whole-file digest ckptz records (``xxh3_tree``, hex)."""
    from ckptz.digest import of_file

    return of_file(path).hex


def digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): digest(p) for p in files_of(root)}


def checkpoint_files(run: Path) -> list[Path]:
    """The checkpoint files of a run folder (``trainer_state.json`` is not one)."""
    return [p for p in files_of(run) if p.suffix in (".pt", ".safetensors")]


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def ckptz_sizes(out: Path, run: Path) -> dict[str, Any]:
    """What ``inspect`` says of a compressed run: whole-run and per-component sizes, per file."""
    s = api.inspect(out)
    return {
        "bytes": s.bytes,
        "compressed_bytes": s.compressed_bytes,
        "ratio": s.bytes / s.compressed_bytes if s.compressed_bytes else None,
        "components": {
            c.name: {"bytes": c.bytes, "compressed_bytes": c.compressed_bytes} for c in s.components
        },
        "overhead_bytes": s.overhead_bytes,
        "files": {f.path: {"bytes": f.bytes, "compressed_bytes": f.compressed_bytes} for f in s.files},
    }


def restore_check(
    src: Path, dst: Path, want: dict[str, str], device: str | None, threads: int | None
) -> dict:
    """Decompress ``src`` into ``dst`` (timed) and compare every file with ``want``."""
    summary, seconds = timed(api.decompress, src, dst, device=device, threads=threads)
    got = digests(dst)
    bad = sorted(k for k in want if got.get(k) != want[k])
    extra = sorted(set(got) - set(want))
    shutil.rmtree(dst)
    return {
        "seconds": seconds,
        "bytes": summary.bytes,
        "gbps": summary.bytes / seconds / 1e9,
        "files": len(want),
        "byte_exact": not bad and not extra,
        "mismatched": bad[:10],
        "unexpected": extra[:10],
    }


def component_parts(path: Path, rel: str) -> Iterator[tuple[str, str, bytes]]:
    """(component, dtype, bytes) of one file, tensor bytes grouped by component and dtype."""
    layout = read_layout(path, rel)
    groups: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
    for seg in layout.segments:
        groups[(seg.component, seg.dtype if seg.kind == "tensor" else "uint8")].append(
            (seg.offset, seg.length)
        )
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        for (comp, dtype), spans in groups.items():
            yield comp, dtype, b"".join(os.pread(fd, n, at) for at, n in spans)


class Peers:
    """python-zstandard -3 and ZipNN on each file alone, and on each file's components apart."""

    def __init__(self, threads: int) -> None:
        import zstandard

        self.threads = threads
        self.zstd = zstandard.ZstdCompressor(level=3, threads=-1 if threads > 1 else 0)
        self.unzstd = zstandard.ZstdDecompressor()
        try:
            from zipnn import ZipNN

            self.zipnn: Any = ZipNN
            self.zipnn_version: str | None = metadata.version("zipnn")
        except Exception as exc:  # ZipNN is the `bench` extra: optional
            self.zipnn, self.zipnn_version = None, None
            self.zipnn_error = repr(exc)[:200]

    def _zipnn(self, dtype: str) -> Any:
        return self.zipnn(
            input_format="byte", bytearray_dtype=ZIPNN_DTYPES.get(dtype, "float32"), threads=self.threads
        )

    def run(self, run: Path) -> dict[str, Any]:
        tools = ["zstd-3"] + (["zipnn"] if self.zipnn else [])
        out: dict[str, Any] = {
            t: {"bytes": 0, "compressed_bytes": 0, "compress_s": 0.0, "decompress_s": 0.0, "components": {}}
            for t in tools
        }
        for path in checkpoint_files(run):
            rel = path.relative_to(run).as_posix()
            data = path.read_bytes()
            # Whole file alone: timed.
            blob, c_s = timed(self.zstd.compress, data)
            back, d_s = timed(self.unzstd.decompress, blob, max_output_size=len(data))
            assert back == data, f"zstd round trip differs on {rel}"
            self._add(out["zstd-3"], len(data), len(blob), c_s, d_s)
            if self.zipnn:
                dtype = "bfloat16" if path.suffix == ".safetensors" else "float32"
                z = self._zipnn(dtype)
                blob, c_s = timed(z.compress, bytearray(data))  # a copy: it may overwrite its input
                back, d_s = timed(z.decompress, blob)
                assert bytes(back) == data, f"ZipNN round trip differs on {rel}"
                self._add(out["zipnn"], len(data), len(blob), c_s, d_s)
            del data, blob, back
            # Each component (and dtype) of the file apart: ratios only.
            for comp, dtype, part in component_parts(path, rel):
                self._component(out["zstd-3"], comp, len(part), len(self.zstd.compress(part)))
                if self.zipnn and part:
                    coded = (
                        self._zipnn(dtype).compress(bytearray(part))
                        if dtype in ZIPNN_DTYPES
                        else self.zstd.compress(part)
                    )
                    self._component(out["zipnn"], comp, len(part), len(coded))
        for t in out.values():
            t["ratio"] = t["bytes"] / t["compressed_bytes"] if t["compressed_bytes"] else None
            t["compress_gbps"] = t["bytes"] / t["compress_s"] / 1e9 if t["compress_s"] else None
            t["decompress_gbps"] = t["bytes"] / t["decompress_s"] / 1e9 if t["decompress_s"] else None
        if not self.zipnn:
            out["zipnn"] = {"skipped": f"not importable: {self.zipnn_error}"}
        return out

    @staticmethod
    def _add(acc: dict, n: int, packed: int, c_s: float, d_s: float) -> None:
        acc["bytes"] += n
        acc["compressed_bytes"] += packed
        acc["compress_s"] += c_s
        acc["decompress_s"] += d_s

    @staticmethod
    def _component(acc: dict, comp: str, n: int, packed: int) -> None:
        c = acc["components"].setdefault(comp, {"bytes": 0, "compressed_bytes": 0})
        c["bytes"] += n
        c["compressed_bytes"] += packed


def measure_series(
    name: str,
    run: Path,
    work: Path,
    device: str | None,
    threads: int | None,
    peers: Peers,
    keyframe_every: int,
) -> dict[str, Any]:
    """Every measurement of one run folder (module docstring, item 2)."""
    want = digests(run)
    steps = sorted(
        (int(p.name.split("-")[-1]), p.name) for p in run.iterdir() if p.name.startswith("checkpoint-")
    )
    oldest, newest = steps[0][1], steps[-1][1]
    out_p, out_s = work / f"{name}.plain.ckptz", work / f"{name}.series.ckptz"
    result: dict[str, Any] = {
        "run": name,
        "checkpoints": [s for _, s in steps],
        "bytes": sum(p.stat().st_size for p in checkpoint_files(run)),
    }

    summary, seconds = timed(api.compress, run, out_p, device=device, threads=threads)
    plain = {"compress_s": seconds, "compress_gbps": summary.bytes / seconds / 1e9, "device": summary.device}
    plain |= ckptz_sizes(out_p, run)
    summary, seconds = timed(
        api.compress, run, out_s, device=device, threads=threads, series=True, keyframe_every=keyframe_every
    )
    series = {"compress_s": seconds, "compress_gbps": summary.bytes / seconds / 1e9, "device": summary.device}
    series |= ckptz_sizes(out_s, run)

    plain["restore"] = restore_check(out_p, work / "restored", want, device, threads)
    series["restore"] = restore_check(out_s, work / "restored", want, device, threads)
    alone = {k.removeprefix(oldest + "/"): v for k, v in want.items() if k.startswith(oldest + "/")}
    plain["restore_oldest"] = restore_check(out_p / oldest, work / "restored", alone, device, threads)
    series["restore_oldest"] = restore_check(out_s / oldest, work / "restored", alone, device, threads)
    shutil.rmtree(out_s / oldest)
    rest = {k: v for k, v in want.items() if not k.startswith(oldest + "/")}
    series["restore_without_oldest"] = restore_check(out_s, work / "restored", rest, device, threads)

    # Each file: its series container against its plain one (the newest must cost the same).
    per_file = []
    for rel, p in plain["files"].items():
        s = series["files"].get(rel)
        if s and p["compressed_bytes"]:
            per_file.append(
                {
                    "file": rel,
                    "plain": p["compressed_bytes"],
                    "series": s["compressed_bytes"],
                    "series_over_plain": s["compressed_bytes"] / p["compressed_bytes"],
                }
            )
    worst = max(per_file, key=lambda f: f["series_over_plain"])
    newest_files = [f for f in per_file if f["file"].startswith(newest + "/")]
    result |= {
        "ckptz_plain": plain,
        "ckptz_series": series,
        "per_file": per_file,
        "single_checkpoints": {
            "worst_file": worst["file"],
            "worst_series_over_plain": worst["series_over_plain"],
            "newest_series_over_plain": max(f["series_over_plain"] for f in newest_files),
            "lose_nothing": worst["series_over_plain"] <= SINGLE_SLACK,
        },
        "peers": peers.run(run),
    }
    shutil.rmtree(out_p)
    shutil.rmtree(out_s)
    return result


# --------------------------------------------------------------------------- report


def _r(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}×"


def table(results: dict[str, Any]) -> str:
    """The markdown summary: per series, whole-run and per-component ratios, speeds, goals."""
    lines = []
    for name in ("pretrain", "finetune"):
        r = results["series"].get(name)
        if not r:
            continue
        s, p, peers = r["ckptz_series"], r["ckptz_plain"], r["peers"]
        zipnn = peers.get("zipnn", {})
        lines += [
            f"### {name}: {len(r['checkpoints'])} checkpoints, {r['bytes'] / 1e6:.1f} MB",
            "",
            "| component | MB | ckptz --series | ckptz plain | ZipNN (each file) | zstd -3 (each file) |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for comp, c in s["components"].items():
            pc = p["components"].get(comp, {})
            zc = zipnn.get("components", {}).get(comp, {}) if "skipped" not in zipnn else {}
            sc = peers["zstd-3"]["components"].get(comp, {})
            ratio = lambda d: d["bytes"] / d["compressed_bytes"] if d.get("compressed_bytes") else None  # noqa: E731
            lines.append(
                f"| {comp} | {c['bytes'] / 1e6:.1f} | {_r(ratio(c))} | {_r(ratio(pc))} | {_r(ratio(zc))} | {_r(ratio(sc))} |"
            )
        lines.append(
            f"| **whole run** | {s['bytes'] / 1e6:.1f} | **{_r(s['ratio'])}** | {_r(p['ratio'])} | "
            f"{_r(zipnn.get('ratio'))} | {_r(peers['zstd-3']['ratio'])} |"
        )
        lines += [
            "",
            f"compress GB/s: series {s['compress_gbps']:.3g}, plain {p['compress_gbps']:.3g} ({s['device']}); "
            f"restore GB/s: series {s['restore']['gbps']:.3g}, plain {p['restore']['gbps']:.3g}; "
            f"oldest checkpoint alone: series {s['restore_oldest']['seconds']:.2f} s, plain {p['restore_oldest']['seconds']:.2f} s",
            "",
        ]
    lines += ["### Goals (issue 18)", "", "| goal | measured | met |", "|---|---:|---|"]
    for goal in results["goals"]:
        lines.append(f"| {goal['goal']} | {goal['measured']} | {'yes' if goal['met'] else '**no**'} |")
    return "\n".join(lines)


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for name, target in GOALS.items():
        r = results["series"].get(name)
        if r:
            ratio = r["ckptz_series"]["ratio"]
            out.append(
                {
                    "goal": f"{name}: whole-run ratio ≥ {target}×",
                    "measured": _r(ratio),
                    "met": ratio >= target,
                }
            )
    for name, r in results["series"].items():
        single = r["single_checkpoints"]
        out.append(
            {
                "goal": f"{name}: no checkpoint larger than plain (≤ {SINGLE_SLACK}×)",
                "measured": f"worst {single['worst_series_over_plain']:.4f}× ({single['worst_file']})",
                "met": single["lose_nothing"],
            }
        )
        ok = all(
            r["ckptz_series"][k]["byte_exact"]
            for k in ("restore", "restore_oldest", "restore_without_oldest")
        )
        out.append(
            {
                "goal": f"{name}: every checkpoint byte-exact, also without the oldest",
                "measured": "checked",
                "met": ok,
            }
        )
    return out


# --------------------------------------------------------------------------- main


def environment(args: argparse.Namespace) -> dict[str, Any]:
    commit = args.commit
    if commit is None:
        try:
            commit = subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
            ).stdout.strip()
        except Exception:
            commit = None
    versions = {}
    for dist in ("torch", "zstandard", "zipnn", "safetensors", "nvidia-nvcomp-cu12", "xxhash"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return {
        "commit": commit,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "versions": versions,
        "argv": sys.argv[1:],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="CPU smoke run: ~2M params, few steps")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--d-model", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--steps", type=int, help="pretraining steps")
    ap.add_argument("--every", type=int, help="pretraining steps between checkpoints")
    ap.add_argument("--ft-steps", type=int, help="fine-tuning steps")
    ap.add_argument("--ft-every", type=int, help="fine-tuning steps between checkpoints")
    ap.add_argument("--ft-lr", type=float)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--train-device", help="where to train (default: cuda if available, else cpu)")
    ap.add_argument("--device", help="ckptz --device (default: ckptz's choice)")
    ap.add_argument("--threads", type=int, help="CPU threads for ckptz, zstd and ZipNN (default: all cores)")
    ap.add_argument("--keyframe-every", type=int, default=8)
    ap.add_argument("--work", type=Path, help="scratch folder (default: a new one under $TMPDIR)")
    ap.add_argument("--keep", action="store_true", help="keep the generated runs in --work")
    ap.add_argument("--commit", help="commit measured (default: git rev-parse HEAD)")
    ap.add_argument(
        "--json", type=Path, help="results file (default $OUT/series.json, else bench/out/series.json)"
    )
    args = ap.parse_args()

    cfg = SMALL if args.small else Config()
    overrides = {
        k: getattr(args, k)
        for k in (
            "layers",
            "d_model",
            "heads",
            "vocab",
            "seq",
            "batch",
            "steps",
            "every",
            "ft_steps",
            "ft_every",
            "ft_lr",
            "seed",
        )
        if getattr(args, k) is not None
    }
    cfg = replace(cfg, **overrides)
    if cfg.steps // cfg.every < 5 or cfg.ft_steps // cfg.ft_every < 5:
        ap.error("each series needs at least 5 checkpoints (steps // every ≥ 5)")
    json_path = args.json or (
        Path(os.environ["OUT"], "series.json")
        if os.environ.get("OUT")
        else ROOT / "bench" / "out" / "series.json"
    )
    json_path.parent.mkdir(parents=True, exist_ok=True)
    threads = args.threads or os.cpu_count() or 1
    train_device = torch.device(args.train_device or ("cuda" if torch.cuda.is_available() else "cpu"))
    work = args.work or Path(tempfile.mkdtemp(prefix="ckptz-series-"))
    work.mkdir(parents=True, exist_ok=True)
    if any(work.iterdir()):
        ap.error(f"--work {work} is not empty")

    results: dict[str, Any] = {
        "benchmark": "bench/series.py (issue 18)",
        "small": args.small,
        "config": asdict(cfg),
        "environment": environment(args),
        "goals_wanted": {
            "pretrain_whole_run_ratio": GOALS["pretrain"],
            "finetune_whole_run_ratio": GOALS["finetune"],
            "single_checkpoint_vs_plain": f"≤ {SINGLE_SLACK}× (no loss beyond its header)",
        },
        "series": {},
    }

    def write() -> None:
        results["goals"] = goals(results)
        json_path.write_text(json.dumps(results, indent=2, default=str) + "\n")

    start = time.perf_counter()
    try:
        print(f"training on {train_device} into {work} ...", file=sys.stderr, flush=True)
        results["training"] = generate(cfg, work / "runs", train_device)
        t = results["training"]
        print(
            f"  {t['params'] / 1e6:.1f}M params; pretrain loss {t['pretrain']['loss_first']:.3f} → "
            f"{t['pretrain']['loss_last']:.3f} in {t['pretrain']['seconds']:.1f} s; fine-tune "
            f"{t['finetune']['loss_first']:.3f} → {t['finetune']['loss_last']:.3f}",
            file=sys.stderr,
            flush=True,
        )
        write()
        peers = Peers(threads)
        for name in ("pretrain", "finetune"):
            print(f"measuring {name} ...", file=sys.stderr, flush=True)
            results["series"][name] = measure_series(
                name, work / "runs" / name, work, args.device, args.threads, peers, args.keyframe_every
            )
            write()
    finally:
        results["seconds"] = time.perf_counter() - start
        write()
        if not args.keep and not args.work:
            shutil.rmtree(work, ignore_errors=True)
        elif not args.keep:
            shutil.rmtree(work / "runs", ignore_errors=True)
    print(f"results: {json_path}", file=sys.stderr)
    if args.small:
        print("**CPU smoke run (--small): not the target measurement.**\n")
    print(table(results))


if __name__ == "__main__":
    main()
