"""Issue 15's benchmark: the step-time overhead of ``CkptzCallback`` in a real HF ``Trainer``.

One command, on the GPU machine (or ``--small`` on a CPU one, in seconds)::

    PYTHONPATH=. python3 bench/hf_callback.py [--steps 300] [--save-steps 50]

The target: the training loop's step-time overhead, with checkpoints every N steps, against
no callback.

1. Builds a Llama model from a config (nothing is downloaded): ``--hidden``, ``--layers`` and
   ``--vocab`` size it, by default ~58M parameters, whose checkpoint (fp32 weights and AdamW
   state) is ~0.7 GB. It trains on fixed random tokens (``--batch`` × ``--seq``) on
   ``--device`` (``auto``: CUDA where there is one, in bf16 autocast there), from the same
   seed for every configuration.
2. Runs ``--steps`` steps in each configuration, in one process, one after the other:
   ``plain`` (``save_steps=N``, the ``Trainer``'s own checkpoints), ``ckptz`` (the same, with
   ``CkptzCallback(device=--ckptz-device)``, which compresses each folder in place on a worker
   thread while training goes on) and ``none`` (no checkpoints: the floor). A first, short,
   untimed run with the callback warms up CUDA, the kernels and ckptz. ``save_total_limit``
   (``--keep``) rotates old folders, as long runs do. With ``--repeats``, the three run again
   (each first in turn) and each number is the median over the repeats.
3. A callback, registered before ``CkptzCallback``, takes the time at every ``on_step_end``
   (after a CUDA synchronise, so that the step's GPU work is in it) and at ``on_save``.
   The save of step k, and ``CkptzCallback``'s wait for an earlier compression, land in the
   interval of step k + 1; the last save comes after the last step and is in ``tail``.
   Reported per configuration: median, mean, p95 and max step time (the first step, warm-up,
   left out), the mean of the steps that hold a save, the loop's time (first step's end to
   the last's), the whole ``trainer.train()`` and the ``Trainer``'s own write of each folder.
   The overhead of ``ckptz`` against ``plain`` is the difference of their totals, in % and
   per save, and the same for the loop alone (which leaves out the last save: ``CkptzCallback``
   compresses that one before ``on_save`` returns).
4. Checks the compressed checkpoints: each remaining ``checkpoint-N`` of the ``ckptz`` run
   holds only containers (and JSON); ``ckptz.load_file``/``ckptz.load`` read the model and the
   optimizer state from the containers; ``ckptz decompress --in-place`` restores the folder; the restored files
   load with safetensors and torch to the same tensors, and are compared byte for byte with
   the ``plain`` run's (equal on the CPU; on CUDA, where training is not bitwise
   deterministic, the comparison is recorded, not required).

JSON goes to ``$OUT/hf_callback.json`` (else ``bench/out/hf_callback.json``); a markdown
table is printed last.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers reads it: nothing is downloaded
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse
import filecmp
import itertools
import json
import math
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

MB = 1e6
CONFIGS = ("plain", "ckptz", "none")
#: The files of a checkpoint folder that CkptzCallback compresses, and those it leaves plain.
COMPRESSED = ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin")
#: Restored files expected equal to the plain run's (``training_args.bin`` names the folder).
SAME = ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth")


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def clock() -> Any:
    """A ``TrainerCallback`` that records when each step ends and each save is on disk."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.begin = 0.0
            self.steps: list[tuple[int, float]] = []
            self.saves: list[tuple[int, float]] = []
            self.end = 0.0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            _sync()
            self.begin = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            _sync()
            self.steps.append((state.global_step, time.perf_counter()))

        def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.saves.append((state.global_step, time.perf_counter()))

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.end = time.perf_counter()

    return Clock()


def build(a: argparse.Namespace) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(a.seed)
    heads = max(1, a.hidden // 64)
    config = LlamaConfig(
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        intermediate_size=64 * math.ceil(8 * a.hidden / 3 / 64),
        num_hidden_layers=a.layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=a.seq,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


class Tokens:
    """Fixed random token sequences, their own labels (a map-style dataset)."""

    def __init__(self, n: int, seq: int, vocab: int, seed: int) -> None:
        import torch

        self.ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def train(a: argparse.Namespace, config: str, folder: Path, steps: int, device: str) -> dict[str, Any]:
    """One configuration: train ``steps`` steps and return its timings."""
    import torch
    from transformers import PrinterCallback, Trainer, TrainingArguments

    from ckptz.integrations.transformers import CkptzCallback

    saving = config != "none"
    args = TrainingArguments(
        output_dir=str(folder),
        max_steps=steps,
        save_strategy="steps" if saving else "no",
        save_steps=a.save_steps,
        save_total_limit=a.keep,
        logging_strategy="no",
        per_device_train_batch_size=a.batch,
        learning_rate=1e-4,
        use_cpu=device == "cpu",
        bf16=device == "cuda" and torch.cuda.is_bf16_supported(),
        report_to=[],
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=a.seed,
    )
    timer = clock()
    callbacks = [timer]
    if config == "ckptz":
        callbacks.append(CkptzCallback(device=a.ckptz_device))
    data = Tokens(max(64, a.batch * 16), a.seq, a.vocab, a.seed)
    trainer = Trainer(model=build(a), args=args, train_dataset=data, callbacks=callbacks)
    trainer.remove_callback(PrinterCallback)  # the end-of-training metrics, on stdout
    _sync()
    start = time.perf_counter()
    trainer.train()
    _sync()
    total = time.perf_counter() - start
    del trainer
    return timings(timer, total, a.save_steps if saving else 0)


def timings(timer: Any, total: float, every: int) -> dict[str, Any]:
    marks = [timer.begin, *(t for _, t in timer.steps)]
    steps = [b - a for a, b in itertools.pairwise(marks)]  # steps[i]: step i + 1
    # Step k + 1 holds the save of step k (and the wait for an earlier compression).
    holds_save = [every > 0 and i > 0 and i % every == 0 for i in range(len(steps))]
    timed = steps[1:]  # the first step warms up
    saving = [s for s, held in zip(steps, holds_save, strict=True) if held]
    other = [s for s, held in zip(steps[1:], holds_save[1:], strict=True) if not held]
    ends = dict(timer.steps)
    writes = [t - ends[k] for k, t in timer.saves if k in ends]
    return {
        "steps": len(steps),
        "step_s": steps,
        "median_step_s": statistics.median(timed),
        "mean_step_s": statistics.fmean(timed),
        "p95_step_s": sorted(timed)[min(len(timed) - 1, math.ceil(0.95 * len(timed)) - 1)],
        "max_step_s": max(timed),
        "median_other_step_s": statistics.median(other) if other else None,
        "mean_save_step_s": statistics.fmean(saving) if saving else None,
        "saves": len(timer.saves),
        "saves_in_loop": len(saving),
        "trainer_write_s": writes,
        "loop_s": marks[-1] - marks[1],
        "tail_s": timer.end - marks[-1],
        "total_s": total,
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each number's median over the repeats (lists: the first repeat's)."""
    out = dict(runs[0])
    for key, value in out.items():
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = statistics.median_low(r[key] for r in runs)
        elif isinstance(value, float):
            out[key] = statistics.median(r[key] for r in runs)
    return out


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def check(plain: Path, packed: Path, device: str) -> dict[str, Any]:
    """Every remaining checkpoint of the ckptz run: containers only, readable through ckptz's
    API, restored in place to files equal to what ckptz read (and compared with the
    plain run's)."""
    import torch
    from safetensors.torch import load_file as safetensors_load

    import ckptz
    from ckptz import api

    out: dict[str, Any] = {"folders": {}}
    folders = sorted(packed.glob("checkpoint-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
    for folder in folders:
        names = {p.name for p in folder.iterdir()}
        row: dict[str, Any] = {
            "compressed": all(f"{n}.ckptz" in names and n not in names for n in COMPRESSED),
            "bytes": folder_bytes(folder),
            "plain_bytes": folder_bytes(plain / folder.name) if (plain / folder.name).is_dir() else None,
        }
        weights = ckptz.load_file(folder / "model.safetensors.ckptz")
        optimizer = ckptz.load(folder / "optimizer.pt.ckptz", weights_only=True)
        api.decompress(folder, in_place=True)
        restored = folder
        row["restored"] = not any(p.suffix == ".ckptz" for p in restored.iterdir())
        row["same_as_ckptz_read"] = _same(
            weights, safetensors_load(restored / "model.safetensors")
        ) and _same(optimizer, torch.load(restored / "optimizer.pt", weights_only=True))
        if (plain / folder.name).is_dir():
            row["same_as_plain_run"] = {
                n: filecmp.cmp(restored / n, plain / folder.name / n, shallow=False) for n in SAME
            }
        out["folders"][folder.name] = row
    rows = out["folders"].values()
    out["ok"] = bool(rows) and all(
        r["compressed"] and r["restored"] and r["same_as_ckptz_read"] for r in rows
    )
    out["bitwise_as_plain_run"] = all(all(r.get("same_as_plain_run", {}).values()) for r in rows)
    out["bitwise_required"] = device == "cpu"
    return out


def _same(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="a ~4 MB checkpoint, 12 steps, on the CPU")
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument(
        "--ckptz-device", default="cpu", help="CkptzCallback(device=...): cpu leaves the GPU to training"
    )
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--save-steps", type=int, default=50)
    ap.add_argument("--keep", type=int, default=2, help="save_total_limit")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32_000)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1, help="medians over this many runs of each")
    ap.add_argument("--dir", type=Path, default=None, help="checkpoints go here (default: on a real disk)")
    ap.add_argument("--keep-files", action="store_true", help="leave the checkpoints in --dir")
    ap.add_argument("--json", type=Path, default=None, help="default: $OUT/hf_callback.json")
    a = ap.parse_args(argv)
    if a.small:
        a.device = "cpu" if a.device == "auto" else a.device
        a.steps, a.save_steps, a.hidden, a.layers, a.vocab, a.batch, a.seq = 12, 4, 64, 2, 4096, 4, 32
    if a.dir is None:
        from e2e import pick_disk

        a.dir = pick_disk().parent / "ckptz-hf-callback"
    return a


def main(argv: list[str]) -> int:
    a = parse(argv)
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()  # "Writing model shards" at every save
    device = a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if a.dir.exists():
        shutil.rmtree(a.dir)
    a.dir.mkdir(parents=True)
    doc: dict[str, Any] = {
        "device": device,
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "host": platform.node(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dir": str(a.dir),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
        "parameters": sum(p.numel() for p in build(a).parameters()),
    }
    try:
        start = time.perf_counter()
        train(a, "ckptz", a.dir / "warmup", min(a.steps, 2 * a.save_steps), device)
        doc["warmup_s"] = time.perf_counter() - start
        repeats: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
        for r in range(a.repeats):
            for c in CONFIGS[r % len(CONFIGS) :] + CONFIGS[: r % len(CONFIGS)]:  # each goes first in turn
                last = r == a.repeats - 1
                folder = a.dir / c
                shutil.rmtree(folder, ignore_errors=True)
                repeats[c].append(train(a, c, folder, a.steps, device))
                if not last:
                    shutil.rmtree(folder, ignore_errors=True)
        doc["repeats"] = repeats
        doc["runs"] = {c: median_run(runs) for c, runs in repeats.items()}
        doc["check"] = check(a.dir / "plain", a.dir / "ckptz", device)
    finally:
        if not a.keep_files:
            shutil.rmtree(a.dir, ignore_errors=True)
    runs = doc["runs"]
    plain, packed = runs["plain"], runs["ckptz"]
    doc["overhead"] = {
        "total_s": packed["total_s"] - plain["total_s"],
        "total_pct": 100 * (packed["total_s"] / plain["total_s"] - 1),
        "per_save_s": (packed["total_s"] - plain["total_s"]) / max(1, packed["saves"]),
        "loop_s": packed["loop_s"] - plain["loop_s"],
        "loop_pct": 100 * (packed["loop_s"] / plain["loop_s"] - 1),
        "loop_per_save_s": (packed["loop_s"] - plain["loop_s"]) / max(1, packed["saves_in_loop"]),
        "plain_saving_per_save_s": (plain["total_s"] - runs["none"]["total_s"]) / max(1, plain["saves"]),
    }
    out = a.json or Path(os.environ.get("OUT") or Path(__file__).parent / "out") / "hf_callback.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    report(doc)
    ok = doc["check"]["ok"] and (doc["check"]["bitwise_as_plain_run"] or not doc["check"]["bitwise_required"])
    return 0 if ok else 1


def report(doc: dict[str, Any]) -> None:
    s, check = doc["settings"], doc["check"]
    sizes = [(r["plain_bytes"], r["bytes"]) for r in check["folders"].values() if r["plain_bytes"]]
    plain_mb = statistics.fmean(p for p, _ in sizes) / MB if sizes else float("nan")
    packed_mb = statistics.fmean(c for _, c in sizes) / MB if sizes else float("nan")
    print(
        f"\n## HF Trainer, {doc['parameters'] / 1e6:.1f}M-parameter Llama on {doc['gpu'] or doc['device']}: "
        f"{s['steps']} steps, a checkpoint every {s['save_steps']} ({plain_mb:.0f} MB plain, "
        f"{packed_mb:.0f} MB compressed by CkptzCallback(device={s['ckptz_device']!r}))"
    )
    print(
        "| configuration | median step ms | mean ms | p95 ms | max ms | save step ms | Trainer write ms "
        "| loop s | tail s | total s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in doc["runs"].items():
        save = f"{r['mean_save_step_s'] * 1e3:.0f}" if r["mean_save_step_s"] is not None else "-"
        write = f"{statistics.fmean(r['trainer_write_s']) * 1e3:.0f}" if r["trainer_write_s"] else "-"
        print(
            f"| {name} | {r['median_step_s'] * 1e3:.1f} | {r['mean_step_s'] * 1e3:.1f} | "
            f"{r['p95_step_s'] * 1e3:.1f} | {r['max_step_s'] * 1e3:.1f} | {save} | {write} | "
            f"{r['loop_s']:.2f} | {r['tail_s']:.2f} | {r['total_s']:.2f} |"
        )
    o = doc["overhead"]
    print(
        f"ckptz vs plain: total {o['total_s']:+.2f} s ({o['total_pct']:+.1f}%), {o['per_save_s'] * 1e3:+.0f} ms "
        f"per save; loop without the last save {o['loop_s']:+.2f} s ({o['loop_pct']:+.1f}%), "
        f"{o['loop_per_save_s'] * 1e3:+.0f} ms per save. Plain saving itself costs "
        f"{o['plain_saving_per_save_s'] * 1e3:.0f} ms per save against none."
    )
    print(
        f"check: {len(check['folders'])} compressed folders read by ckptz and restored in place: "
        f"{check['ok']}; restored bytes equal to the plain run's: {check['bitwise_as_plain_run']}"
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
