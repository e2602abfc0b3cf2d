"""A corpus of small checkpoint files covering the edge cases of formats.md, for reader and round-trip tests.

:func:`make_corpus` writes every file under a root folder and returns them by their path relative
to it. Tensor values are seeded, so files are reproducible, except legacy-format files, whose
storage keys are memory addresses chosen by torch at save time.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pickle
import random
import shutil
import sys
import types
import warnings
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

MARKER = "PWNED"
"""File name the malicious pickles would create next to themselves (in ``edge/``) if they ever ran."""

FLOAT8 = tuple(
    getattr(torch, n)
    for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
    if hasattr(torch, n)
)


class _Exploit:
    """Pickles as ``os.system('touch <marker>')``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


@contextlib.contextmanager
def _foreign(module: str, name: str) -> Iterator[type]:
    """A class pickled as ``module.name``, whether that module is installed here or not.

    An imported module's own class is put back afterwards (transformers is installed for the
    integration tests, and its ``TrainingArguments`` must stay the real one).
    """
    cls = type(name, (), {"__module__": module, "__qualname__": name})
    parts = module.split(".")
    added = []
    for i in range(1, len(parts) + 1):
        mod = ".".join(parts[:i])
        if mod not in sys.modules:
            sys.modules[mod] = types.ModuleType(mod)
            added.append(mod)
    target = sys.modules[module]
    own = vars(target).get(name)
    setattr(target, name, cls)
    try:
        yield cls
    finally:
        if own is None:
            delattr(target, name)
        else:
            setattr(target, name, own)
        for mod in added:
            del sys.modules[mod]


def _model(gen: torch.Generator, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    return {
        "embed.weight": torch.randn(16, 8, generator=gen).to(dtype),
        "layers.0.mlp.weight": torch.randn(8, 8, generator=gen).to(dtype),
        "layers.0.mlp.bias": torch.randn(8, generator=gen).to(dtype),
        "norm.weight": torch.ones(8, dtype=dtype),
    }


def _trained(gen: torch.Generator) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    """A tiny model after two real AdamW steps, with its LambdaLR scheduler."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    opt = torch.optim.AdamW(
        [{"params": [model[0].weight, model[2].weight]}, {"params": [model[0].bias, model[2].bias]}]
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    for _ in range(2):
        model(torch.randn(4, 8, generator=gen)).square().mean().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return model, opt, sched


def _save(obj: Any, path: Path, **kw: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(obj, path, **kw)
    return path


def _save_bytesio(obj: Any, path: Path) -> Path:
    """As Lightning and DCP do: the zip's prefix becomes ``archive/``."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())
    return path


def _rng_state() -> dict[str, Any]:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    return {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}


def _dtypes(gen: torch.Generator) -> dict[str, torch.Tensor]:
    base = torch.randn(12, generator=gen)
    out = {
        str(dt).removeprefix("torch."): base.to(dt)
        for dt in (
            torch.float64,
            torch.float32,
            torch.float16,
            torch.bfloat16,
            torch.complex64,
            torch.complex128,
        )
    }
    out["bool"] = base > 0
    for dt in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
        out[str(dt).removeprefix("torch.")] = (base * 50).to(dt)
    for dt in (torch.uint16, torch.uint32, torch.uint64):
        out[str(dt).removeprefix("torch.")] = (base.abs() * 50).to(torch.int64).to(dt)
    for dt in FLOAT8:
        out[str(dt).removeprefix("torch.")] = torch.randint(
            0, 120, (12,), generator=gen, dtype=torch.uint8
        ).view(dt)
    out["complex32"] = base.to(torch.complex64).to(torch.complex32)
    out["float4_e2m1fn_x2"] = torch.randint(0, 255, (6,), generator=gen, dtype=torch.uint8).view(
        torch.float4_e2m1fn_x2
    )
    return out


def _hf(root: Path, gen: torch.Generator, files: dict[str, Path]) -> None:
    ck = root / "hf" / "checkpoint-2"
    ck.mkdir(parents=True)
    model, opt, sched = _trained(gen)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, ck / "model.safetensors", {"format": "pt"}
    )
    _save(opt.state_dict(), ck / "optimizer.pt")
    _save(sched.state_dict(), ck / "scheduler.pt")
    _save(_rng_state(), ck / "rng_state.pth")
    _save(_rng_state(), ck / "rng_state_1.pth")
    _save({"scale": torch.tensor(65536.0), "growth_factor": 2.0, "_growth_tracker": 0}, ck / "scaler.pt")
    with _foreign("transformers.training_args", "TrainingArguments") as cls:
        args = cls()
        args.__dict__.update(output_dir="out", learning_rate=5e-5, seed=42)
        _save(args, ck / "training_args.bin")
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": []}))
    (ck / "config.json").write_text(json.dumps({"model_type": "toy", "hidden_size": 8}))
    for p in sorted(ck.iterdir()):
        files[f"hf/checkpoint-2/{p.name}"] = p

    sharded = root / "hf" / "sharded"
    sharded.mkdir(parents=True)
    sd = _model(gen, torch.bfloat16)
    names = sorted(sd)
    weight_map = {}
    for i, part in enumerate((names[:2], names[2:])):
        fname = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({k: sd[k] for k in part}, sharded / fname, {"format": "pt"})
        weight_map.update(dict.fromkeys(part, fname))
        files[f"hf/sharded/{fname}"] = sharded / fname
    index = sharded / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    files["hf/sharded/model.safetensors.index.json"] = index
    files["hf/bin/pytorch_model.bin"] = _save(_model(gen), root / "hf" / "bin" / "pytorch_model.bin")


def _frameworks(root: Path, gen: torch.Generator, files: dict[str, Path]) -> None:
    model, opt, _ = _trained(gen)
    bf16 = {k: v.to(torch.bfloat16) for k, v in _model(gen).items()}
    fp32 = [v.float().clone() for v in bf16.values()]
    rng = {
        "random_rng_state": random.getstate(),
        "np_rng_state": np.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
        "cuda_rng_state": torch.zeros(16, dtype=torch.uint8),
        "rng_tracker_states": {"model-parallel-rng": torch.get_rng_state()},
    }
    megatron = {
        "args": argparse.Namespace(num_layers=1, hidden_size=8, bf16=True),
        "checkpoint_version": 3.0,
        "iteration": 10,
        "model": {"language_model": {"encoder": bf16}},
        "optimizer": {"optimizer": opt.state_dict(), "fp32_from_fp16_params": [fp32[:2], fp32[2:]]},
        "opt_param_scheduler": {"max_lr": 1e-4, "num_steps": 10},
        "rng_state": [rng],
    }
    rel = "megatron/iter_0000010/mp_rank_00/model_optim_rng.pt"
    files[rel] = _save(megatron, root / rel)

    flat = torch.cat([v.flatten() for v in fp32])
    ds_model = {
        "module": bf16,
        "buffer_names": [],
        "param_shapes": [OrderedDict((k, v.shape) for k, v in bf16.items())],
        "ds_config": {"train_batch_size": 8, "bf16": {"enabled": True}},
        "ds_version": "0.14.0",
        "global_steps": 10,
    }
    with _foreign("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler") as scaler_cls:
        scaler = scaler_cls()
        scaler.__dict__.update(cur_scale=65536.0, cur_iter=10)
        ds_optim = {
            "optimizer_state_dict": {
                "loss_scaler": scaler,
                "dynamic_loss_scale": True,
                "base_optimizer_state": {
                    "state": {
                        0: {"step": torch.tensor(10.0), "exp_avg": flat * 0.1, "exp_avg_sq": flat.square()}
                    },
                    "param_groups": [{"lr": 1e-4, "params": [0]}],
                },
                "single_partition_of_fp32_groups": [flat.clone()],
                "zero_stage": 2,
                "partition_count": [1],
            },
            "ds_config": {"zero_optimization": {"stage": 2}},
            "ds_version": "0.14.0",
        }
        for rel, obj in (
            ("deepspeed/global_step10/mp_rank_00_model_states.pt", ds_model),
            ("deepspeed/global_step10/zero_pp_rank_0_mp_rank_00_optim_states.pt", ds_optim),
        ):
            files[rel] = _save(obj, root / rel)

    lightning = {
        "epoch": 0,
        "global_step": 10,
        "pytorch-lightning_version": "2.4.0",
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "loops": {},
        "callbacks": {},
        "optimizer_states": [opt.state_dict()],
        "lr_schedulers": [{"base_lrs": [1e-3]}],
        "hparams_name": "kwargs",
        "hyper_parameters": {"lr": 1e-3},
    }
    rel = "lightning/epoch=0-step=10.ckpt"
    files[rel] = _save_bytesio(lightning, root / rel)


def _edge_cases(root: Path, gen: torch.Generator, files: dict[str, Path]) -> None:
    e = root / "edge"
    sd = _model(gen)
    for proto in (0, 2, 4, 5):
        files[f"edge/proto{proto}.pt"] = _save(
            {**sd, "tags": {1, 2}}, e / f"proto{proto}.pt", pickle_protocol=proto
        )
    files["edge/bytesio.pt"] = _save_bytesio(sd, e / "bytesio.pt")
    w = torch.randn(10, 4, generator=gen)
    files["edge/tied.pt"] = _save({"emb.weight": w, "lm_head.weight": w, "same": [w, w]}, e / "tied.pt")
    base = torch.arange(40, dtype=torch.float32)
    files["edge/views.pt"] = _save(
        {"a": base[5:10], "b": base[12:30].view(3, 6), "c": base[::2]}, e / "views.pt"
    )
    files["edge/noncontig.pt"] = _save({"t": torch.randn(5, 3, generator=gen).t()}, e / "noncontig.pt")
    files["edge/zero_size.pt"] = _save(
        {"empty": torch.zeros(0), "empty2d": torch.zeros(3, 0, dtype=torch.float16), "one": torch.ones(1)},
        e / "zero_size.pt",
    )
    files["edge/scalar.pt"] = _save({"step": torch.tensor(3.0), "i": torch.tensor(7)}, e / "scalar.pt")
    files["edge/dtypes.pt"] = _save(_dtypes(gen), e / "dtypes.pt")
    with _foreign("deepspeed.runtime.engine", "DeepSpeedConfig") as cls:
        files["edge/foreign_classes.pt"] = _save(
            {"args": argparse.Namespace(lr=0.1), "cfg": cls(), "w": torch.ones(3)}, e / "foreign_classes.pt"
        )
    files["edge/numpy_rng.pt"] = _save({"np": np.random.get_state(), "arr": np.arange(5)}, e / "numpy_rng.pt")
    files["edge/parameter.pt"] = _save(
        {"p": torch.nn.Parameter(torch.randn(3, generator=gen))}, e / "parameter.pt"
    )
    files["edge/module.pt"] = _save(torch.nn.Linear(3, 2), e / "module.pt")
    q = torch.quantize_per_tensor(torch.randn(6, generator=gen), 0.1, 0, torch.qint8)
    qc = torch.quantize_per_channel(
        torch.randn(2, 3, generator=gen), torch.tensor([0.1, 0.2]), torch.tensor([0, 1]), 0, torch.quint8
    )
    files["edge/quantized.pt"] = _save({"q": q, "qc": qc}, e / "quantized.pt")
    files["edge/storage.pt"] = _save(
        {"s": torch.arange(6, dtype=torch.uint8).untyped_storage()}, e / "storage.pt"
    )
    inner = io.BytesIO()
    torch.save({"w": torch.ones(2)}, inner)
    files["edge/nested_zip.pt"] = _save(
        {"layer._extra_state": inner, "w": torch.zeros(4)}, e / "nested_zip.pt"
    )
    files["edge/legacy.pt"] = _save(
        {**sd, "tied": sd["norm.weight"]}, e / "legacy.pt", _use_new_zipfile_serialization=False
    )
    torch.serialization.set_crc32_options(False)
    try:
        files["edge/crc_off.pt"] = _save(sd, e / "crc_off.pt")
    finally:
        torch.serialization.set_crc32_options(True)
    files["edge/exp_avg_names.pt"] = _save(
        {
            "state": {
                0: {
                    "max_exp_avg_sq": torch.ones(2),
                    "momentum_buffer": torch.ones(2),
                    "exp_avg_sq_row": torch.ones(2),
                }
            },
            "grads": {"w": torch.ones(2)},
        },
        e / "exp_avg_names.pt",
    )
    files["edge/malicious.pt"] = _save({"x": _Exploit(e / MARKER), "w": torch.ones(2)}, e / "malicious.pt")
    files["edge/malicious_legacy.pt"] = _save(
        {"x": _Exploit(e / MARKER)}, e / "malicious_legacy.pt", _use_new_zipfile_serialization=False
    )
    (e / "malicious.pkl").write_bytes(pickle.dumps(_Exploit(e / MARKER)))
    files["edge/malicious.pkl"] = e / "malicious.pkl"
    (e / "random.bin").write_bytes(np.random.default_rng(0).bytes(4096))
    files["edge/random.bin"] = e / "random.bin"
    whole = (e / "proto2.pt").read_bytes()
    (e / "truncated.pt").write_bytes(whole[: len(whole) // 2])
    files["edge/truncated.pt"] = e / "truncated.pt"
    (e / "empty.pt").write_bytes(b"")
    files["edge/empty.pt"] = e / "empty.pt"


def _dcp(root: Path, gen: torch.Generator, files: dict[str, Path]) -> None:
    import torch.distributed.checkpoint as dcp

    d = root / "dcp" / "step-10"
    state = {
        "model": _model(gen),
        "optim": {"state": {"embed.weight": {"exp_avg": torch.randn(16, 8, generator=gen)}}},
        "train_state": {"step": 10},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=d)
    for p in sorted(d.iterdir()):
        files[f"dcp/step-10/{p.name}"] = p


def _large(root: Path, files: dict[str, Path]) -> None:
    need = (4 << 30) + (1 << 30)
    if shutil.disk_usage(root).free < need:
        return
    files["large/zip64.pt"] = _save(
        {"big": torch.zeros((4 << 30) + 1000, dtype=torch.uint8), "w": torch.ones(3)},
        root / "large" / "zip64.pt",
    )


def make_corpus(root: Path, large: bool = False) -> dict[str, Path]:
    """Write the corpus under ``root`` and return its files by path relative to ``root``.

    Args:
        root: an empty (or missing) folder.
        large: also write a > 4 GiB ZIP64 file when the disk has room (slow).

    Returns:
        Every file written (checkpoints and side files such as JSON), keyed by relative path.
    """
    root.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    files: dict[str, Path] = {}
    _hf(root, gen, files)
    _frameworks(root, gen, files)
    _edge_cases(root, gen, files)
    _dcp(root, gen, files)
    if large:
        _large(root, files)
    return files
