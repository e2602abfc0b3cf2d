"""Deterministic, realistic training checkpoints for ckptz's benchmarks and examples.

Two checkpoints of a small byte-level GPT trained on Python source text (the standard
library's own ``.py`` files, read in sorted order, so every machine builds the same corpus):

* ``OUTDIR/scratch/``: trained from scratch with AdamW; ``model.safetensors`` (fp32),
  ``model_bf16.safetensors`` (bf16 copy), ``optimizer.pt`` (``exp_avg``, ``exp_avg_sq``) and
  ``gradients.pt`` (``{"fp32": {...}, "bf16": {...}}``, the last step's gradients).
* ``OUTDIR/finetune/checkpoint-N/``: a fine-tune of it in the layout of a Hugging Face
  Trainer checkpoint (``model.safetensors``, ``optimizer.pt``, ``scheduler.pt``,
  ``rng_state.pth``, ``trainer_state.json``, ``training_args.bin``, ``config.json``). Its
  data use a restricted alphabet, so the input-embedding rows of unseen bytes never get a
  gradient (exact zeros in both moments, unchanged weights: no decay on embeddings), and
  the first half of the layers is frozen (absent from the optimizer, unchanged weights).

Mixed precision: this CPU has no fast bf16 matmul (autocast runs ~100x slower than fp32),
so linear layers emulate ``torch.autocast(dtype=bfloat16)`` exactly in value: inputs,
weights, outputs and all three gradients are rounded to bf16, while the matmuls run in
fp32. Parameters' ``.grad`` therefore hold bf16-exact values in fp32, as under autocast.

Usage::

    python bench/make_checkpoints.py OUTDIR [--steps N] [--small]

Importable: :func:`generate` trains and saves, :func:`load_components` reads a saved
``OUTDIR`` back as ``{component: [tensor, ...]}`` for benchmarks that feed tensor bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class Config:
    """Model and run sizes."""

    layers: int = 4
    d_model: int = 256
    heads: int = 4
    seq: int = 128
    batch: int = 16
    steps: int = 300
    ft_steps: int = 100
    lr: float = 1e-3
    seed: int = 1234


SMALL = Config(layers=2, d_model=64, heads=2, seq=32, batch=4, steps=20, ft_steps=10)


@dataclass
class TrainingArguments:
    """Stand-in for ``transformers.TrainingArguments``, pickled as ``training_args.bin``."""

    output_dir: str
    learning_rate: float
    max_steps: int
    per_device_train_batch_size: int
    weight_decay: float = 0.1
    bf16: bool = True
    seed: int = 1234


class _Bf16Linear(torch.autograd.Function):
    """``x @ w.T + b`` with autocast's bf16 rounding of inputs, output and gradients."""

    @staticmethod
    def forward(ctx, x, w, b):  # type: ignore[no-untyped-def]
        xb, wb = _bf(x), _bf(w)
        ctx.save_for_backward(xb, wb)
        y = xb @ wb.T
        return _bf(y if b is None else y + _bf(b))

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        xb, wb = ctx.saved_tensors
        gb = _bf(g)
        g2 = gb.reshape(-1, gb.shape[-1])
        gw = _bf(g2.T @ xb.reshape(-1, xb.shape[-1]))
        return _bf(gb @ wb), gw, _bf(g2.sum(0)) if ctx.needs_input_grad[2] else None


def _bf(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(torch.float32)


class Linear(nn.Linear):
    """A linear layer computed as under bf16 autocast."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Bf16Linear.apply(x, self.weight, self.bias)  # type: ignore[no-any-return]


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        d = cfg.d_model
        self.heads = cfg.heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = Linear(d, 3 * d), Linear(d, d)
        self.fc, self.out = Linear(d, 4 * d), Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Byte-level GPT with an untied output head."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.tok = nn.Embedding(256, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = Linear(cfg.d_model, 256, bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(
                    p,
                    std=0.02 / math.sqrt(2 * cfg.layers)
                    if name.endswith(("proj.weight", "out.weight"))
                    else 0.02,
                )

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def corpus(limit: int) -> bytes:
    """Up to ``limit`` bytes of the standard library's Python sources, in sorted path order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out, total = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        out.append(data)
        total += len(data)
        if total >= limit:
            break
    return b"".join(out)[:limit]


def restrict(text: bytes) -> bytes:
    """The fine-tune's alphabet: lower-case letters, digits, space, newline and a few signs."""
    keep = set(b"abcdefghijklmnopqrstuvwxyz0123456789 \n.,:()=_")
    return bytes(c for c in text.lower() if c in keep)


def _batches(data: np.ndarray, cfg: Config, rng: np.random.Generator) -> torch.Tensor:
    starts = rng.integers(0, data.size - cfg.seq - 1, cfg.batch)
    return torch.from_numpy(np.stack([data[s : s + cfg.seq + 1] for s in starts]).astype(np.int64))


def _optimizer(
    model: GPT, cfg: Config, steps: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in trainable if p.dim() == 2 and not n.startswith(("tok", "pos"))]
    rest = [p for n, p in trainable if not (p.dim() == 2 and not n.startswith(("tok", "pos")))]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
    )
    warm = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    return opt, sched


def _train(
    model: GPT, data: np.ndarray, cfg: Config, steps: int, seed: int
) -> tuple[torch.optim.AdamW, object]:
    opt, sched = _optimizer(model, cfg, steps)
    rng = np.random.default_rng(seed)
    for step in range(steps):
        xy = _batches(data, cfg, rng)
        loss = F.cross_entropy(model(xy[:, :-1]).reshape(-1, 256), xy[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step < steps - 1:  # keep the last step's gradients for the gradients file
            opt.zero_grad(set_to_none=True)
    print(f"  {steps} steps, final loss {loss.item():.3f}")
    return opt, sched


def _fp32_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def generate(outdir: Path, cfg: Config = Config()) -> dict[str, list[torch.Tensor]]:
    """Train both checkpoints, save them under ``outdir``, return their components."""
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    torch.set_num_threads(2)  # fixed so the float reductions, hence the bytes, are reproducible
    text = corpus(4 << 20 if cfg != SMALL else 256 << 10)
    t0 = time.time()
    model = GPT(cfg)
    opt, _ = _train(model, np.frombuffer(text, np.uint8), cfg, cfg.steps, cfg.seed)
    scratch = outdir / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    save_file(_fp32_state(model), str(scratch / "model.safetensors"))
    save_file(
        {k: v.to(torch.bfloat16) for k, v in _fp32_state(model).items()},
        str(scratch / "model_bf16.safetensors"),
    )
    torch.save(opt.state_dict(), scratch / "optimizer.pt")
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    torch.save(
        {"fp32": grads, "bf16": {n: g.to(torch.bfloat16) for n, g in grads.items()}}, scratch / "gradients.pt"
    )
    print(f"  scratch saved in {time.time() - t0:.0f} s")

    for i, block in enumerate(model.blocks):
        if i < cfg.layers // 2:
            block.requires_grad_(False)
    model.pos.requires_grad_(False)
    ft_text = restrict(text)
    opt, sched = _train(model, np.frombuffer(ft_text, np.uint8), cfg, cfg.ft_steps, cfg.seed + 1)
    ft = outdir / "finetune" / f"checkpoint-{cfg.ft_steps}"
    ft.mkdir(parents=True, exist_ok=True)
    save_file(_fp32_state(model), str(ft / "model.safetensors"), metadata={"format": "pt"})
    torch.save(opt.state_dict(), ft / "optimizer.pt")
    torch.save(sched.state_dict(), ft / "scheduler.pt")  # type: ignore[attr-defined]
    torch.save(
        {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()},
        ft / "rng_state.pth",
    )
    args = TrainingArguments(str(outdir / "finetune"), cfg.lr, cfg.ft_steps, cfg.batch)
    torch.save(args, ft / "training_args.bin")
    state = {"global_step": cfg.ft_steps, "max_steps": cfg.ft_steps, "log_history": [], "best_metric": None}
    (ft / "trainer_state.json").write_text(json.dumps(state, indent=2))
    config = {"model_type": "byte-gpt", **asdict(cfg), "vocab_size": 256, "torch_dtype": "float32"}
    (ft / "config.json").write_text(json.dumps(config, indent=2))
    print(f"  fine-tune saved in {time.time() - t0:.0f} s total")
    return load_components(outdir)


def _moments(path: Path) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    state = torch.load(path, weights_only=True)["state"]
    ids = sorted(state)
    return [state[i]["exp_avg"] for i in ids], [state[i]["exp_avg_sq"] for i in ids]


def load_components(outdir: Path) -> dict[str, list[torch.Tensor]]:
    """Read a saved ``outdir`` back as ``{component: [tensor, ...]}`` in file order."""
    scratch = outdir / "scratch"
    ft = next((outdir / "finetune").glob("checkpoint-*"))
    grads = torch.load(scratch / "gradients.pt", weights_only=True)
    m, v = _moments(scratch / "optimizer.pt")
    ft_m, ft_v = _moments(ft / "optimizer.pt")
    return {
        "weights fp32": list(load_file(str(scratch / "model.safetensors")).values()),
        "weights bf16": list(load_file(str(scratch / "model_bf16.safetensors")).values()),
        "exp_avg": m,
        "exp_avg_sq": v,
        "grads fp32 (bf16 values)": list(grads["fp32"].values()),
        "grads bf16": list(grads["bf16"].values()),
        "ft weights fp32": list(load_file(str(ft / "model.safetensors")).values()),
        "ft exp_avg": ft_m,
        "ft exp_avg_sq": ft_v,
    }


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--steps", type=int, default=None, help="from-scratch AdamW steps")
    parser.add_argument("--small", action="store_true", help="a tiny, seconds-fast checkpoint")
    ns = parser.parse_args()
    cfg = SMALL if ns.small else Config()
    if ns.steps is not None:
        cfg = Config(**{**asdict(cfg), "steps": ns.steps})
    comps = generate(ns.outdir, cfg)
    for name, tensors in comps.items():
        print(f"  {name:26s} {sum(t.numel() for t in tensors):>10,d} elements")


if __name__ == "__main__":
    main()
