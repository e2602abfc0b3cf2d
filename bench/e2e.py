"""End-to-end benchmark of ckptz and its peers, in one command.

On the GPU machine (about 8 minutes at the defaults; full results go to ``$OUT/e2e.json``)::

    PYTHONPATH=. python3 bench/e2e.py --commit <sha>

On a CPU-only machine, at tiny scale (~50 MB of data, well under a minute)::

    PYTHONPATH=. python bench/e2e.py --small --devices cpu --repeats 1

1. Generates seeded, realistic data (on the GPU when torch sees one) into ``--tmpfs``: an
   HF-Trainer-style folder ``mixed/`` of at least ``--size-gb`` GB (bf16 ``model.safetensors``;
   ``optimizer.pt`` with fp32 master weights ~N(0, 0.02), AdamW ``exp_avg`` ~N(0, ~1e-4) and
   ``exp_avg_sq`` accumulated from squared gradients, zero rows for unseen vocabulary;
   ``scheduler.pt``, ``rng_state.pth``, ``trainer_state.json``, ``config.json``) and one
   ``single/optimizer.pt`` of at least ``--single-gb`` GB. Each input is copied to ``--disk``
   (default: the first of $HOME, /var/tmp, /tmp on a real disk) before its first disk row.
2. Times, warm page cache: the storage write ceilings (``os.pwrite`` from every core and from
   one thread, then ``fsync``); the ``pread`` ceiling of each input (a thread per core reads
   it from the page cache, each into a buffer of its own, reused; the median of
   ``DISCARD_RUNS`` passes), which each ckptz row is also given as a fraction of; ckptz
   start-up; ckptz in process (``api.compress`` / ``api.decompress``, file to file on tmpfs,
   and with writes discarded); the whole ``python -m ckptz`` command (``-o`` and
   ``--in-place``, tmpfs, and disk with ``sync`` inside the timed region); and the peers: ``cp -r``, python-zstandard -3 with every core (to file
   and discarded), the ``zstd -T0 -3`` CLI, and ZipNN 0.5.4 with every core. Each ckptz
   device/codec pair (``cuda ans``, ``cuda auto``, ``cpu auto``) runs on both inputs. GB/s are
   original bytes per second, decompression included. Each round trip is checked byte for
   byte once per configuration, outside the timed region.
3. Records every run, the peak RSS of each process and the peak GPU memory (torch's counter
   in process, ``nvidia-smi`` device-wide), and writes the JSON after every run, so a run cut
   short still leaves its data.
4. Prints a short markdown table (each ckptz row's GB/s also ÷ its input's ``pread`` ceiling)
   and its targets against them.

Rows run in priority order (everything on ``mixed`` first, disk rows after tmpfs rows); a
row that would not finish within ``--budget-s`` is recorded as skipped with the reason, and
one still running at the budget plus a grace period is killed (status ``timeout``). Further
repeats (``--repeats``, median reported) run in later passes over the same order while time
is left. ``--only`` picks row groups: startup, ceilings, inproc, discard, ckptz (whole
command), peers.

Notes: "discarded" rows read their input from tmpfs and write nothing (ckptz through the
api's ``discard=True``, recorded as skipped while the api lacks it, timed ``DISCARD_RUNS``
times in the process and reported by their median); ZipNN's rows time reading
and coding whole files. GPU kernels are warmed up (untimed) before the first timed GPU run;
start-up records the first GPU run apart as "cold". In-place runs on tmpfs only. The file to
file target compares compression with 0.9 × write ceiling × ratio and restores, which write
every byte, with 0.9 × write ceiling.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CORES = os.cpu_count() or 1
GB = 1e9
MIB = 1 << 20
SUFFIX = ".ckptz"
HASH_CHUNK = 32 * MIB
IO_CHUNK = 16 * MIB
MARKER = ".ckptz-e2e"
MEMORY_FS = {"tmpfs", "ramfs", "devtmpfs"}
GROUPS = ("startup", "ceilings", "inproc", "discard", "ckptz", "peers")
CONFIGS = (("cuda", "ans"), ("cuda", "auto"), ("cpu", "auto"))
INPUTS = ("mixed", "single")
#: Timed runs of each discarded row per in-process pass, and of each ``pread`` ceiling
#: (the median is reported).
DISCARD_RUNS = 3
#: Bytes each ``pread`` of the ceiling reads (into its thread's own buffer, reused).
PREAD_PIECE = 16 * MIB
# Issue 13, pipeline with writes discarded: GB/s compress, decompress.
#: Writes-discarded targets, GB/s compress / restore (the portable bitstream on the GPU).
DISCARD_TARGETS = {("cuda", "ans"): (20.0, 20.0), ("cuda", "auto"): (15.0, 20.0), ("cpu", "auto"): (3.0, 5.0)}
#: The GPU-only bitstream must reach this share of the input's ``pread`` ceiling both ways.
ANS_OF_PREAD = 0.8
CHILD_TAG = "E2E "
MIN_LEFT_S = 3.0  # a task is not started with less budget left than this


# --------------------------------------------------------------------------- helpers


def _tail(text: str, n: int = 600) -> str:
    text = text.strip()
    return text if len(text) <= n else "…" + text[-n:]


def tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def tree_files(path: Path) -> list[tuple[str, Path]]:
    """(relative name, path) of every file: the file itself for a file."""
    if path.is_file():
        return [(path.name, path)]
    return [(p.relative_to(path).as_posix(), p) for p in sorted(path.rglob("*")) if p.is_file()]


def read_all(pool: ThreadPoolExecutor, pieces: list[tuple[int, int, int]], buffers: list[bytearray]) -> float:
    """Seconds for one thread per buffer to ``pread`` every ``(fd, offset, bytes)`` piece, each
    into its own buffer (the next piece to whichever thread is free); NaN where one came back short."""
    todo = iter(pieces)
    lock = threading.Lock()

    def reader(buffer: bytearray) -> bool:
        view = memoryview(buffer)
        while True:
            with lock:
                piece = next(todo, None)
            if piece is None:
                return True
            fd, at, n = piece
            if os.preadv(fd, [view[:n]], at) != n:
                return False

    start = time.perf_counter()
    whole = all(pool.map(reader, buffers))
    seconds = time.perf_counter() - start
    return seconds if whole else math.nan


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def vm_hwm() -> int | None:
    """This process's peak RSS in bytes (VmHWM: unlike ru_maxrss, not inherited over exec)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0), so each step reports its own peak."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def fingerprint_bytes(data: bytes | bytearray | memoryview) -> list[str]:
    import xxhash

    view = memoryview(data)
    return [xxhash.xxh3_128_hexdigest(view[i : i + HASH_CHUNK]) for i in range(0, len(view), HASH_CHUNK)]


def _hash_piece(path: Path, offset: int) -> str:
    import xxhash

    with open(path, "rb") as f:
        return xxhash.xxh3_128_hexdigest(os.pread(f.fileno(), HASH_CHUNK, offset))


def fingerprint_tree(path: Path) -> dict[str, list[str]]:
    """xxh3-128 of every 32 MiB piece of every file, hashed on all cores."""
    files = tree_files(path)
    with ThreadPoolExecutor(CORES) as pool:
        futures = {
            rel: [pool.submit(_hash_piece, p, off) for off in range(0, p.stat().st_size, HASH_CHUNK)]
            for rel, p in files
        }
        return {rel: [f.result() for f in fs] for rel, fs in futures.items()}


def fs_type(path: Path) -> str:
    """The file system type of the mount holding ``path`` (longest prefix in /proc/mounts)."""
    path = path.resolve()
    best, kind = "", "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            mount = parts[1].replace("\\040", " ")
            if (str(path) == mount or str(path).startswith(mount.rstrip("/") + "/")) and len(mount) >= len(
                best
            ):
                best, kind = mount, parts[2]
    return kind


def pick_disk() -> Path:
    """A folder on a real disk: the first of $HOME, /var/tmp, /tmp not held in memory."""
    for base in (Path.home(), Path("/var/tmp"), Path("/tmp"), ROOT):
        if base.is_dir() and os.access(base, os.W_OK) and fs_type(base) not in MEMORY_FS:
            return base / "ckptz-e2e"
    return Path("/var/tmp/ckptz-e2e")


def claim(root: Path) -> None:
    """Create ``root`` for this benchmark; refuse a non-empty folder that is not ours."""
    if root.exists() and any(root.iterdir()) and not (root / MARKER).exists():
        raise SystemExit(f"{root} exists, is not empty and was not made by bench/e2e.py; pick another")
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).touch()


def gnu_time() -> str | None:
    """``/usr/bin/time`` if it is GNU time (``-v -o FILE``), else None."""
    exe = "/usr/bin/time"
    if not os.access(exe, os.X_OK):
        return None
    with tempfile.NamedTemporaryFile("r") as out:
        ok = subprocess.run([exe, "-v", "-o", out.name, "true"], capture_output=True).returncode == 0
        return exe if ok and "Maximum resident set size" in Path(out.name).read_text() else None


# --------------------------------------------------------------------------- processes


class GpuPoller:
    """Device-wide used GPU memory from ``nvidia-smi -lms``, highest value since ``reset``."""

    def __init__(self) -> None:
        self.last = self.peak = 0
        exe = shutil.which("nvidia-smi")
        self.proc: subprocess.Popen[str] | None = None
        if exe is None:
            return
        self.proc = subprocess.Popen(
            [exe, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0", "-lms", "100"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.last = int(line.strip()) * MIB
                self.peak = max(self.peak, self.last)

    def reset(self) -> None:
        self.peak = self.last

    def peak_bytes(self) -> int | None:
        return self.peak if self.proc is not None else None

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()


@dataclass
class Proc:
    """One finished (or killed) command: wall seconds, exit code, peak RSS, output tails."""

    rc: int
    seconds: float
    peak_rss: int | None
    gpu_used_peak: int | None
    stdout: str
    stderr: str
    killed: bool


def run_measured(
    argv: list[str],
    deadline: float,
    *,
    env: dict[str, str] | None = None,
    time_exe: str | None = None,
    gpu: GpuPoller | None = None,
) -> Proc:
    """Run ``argv``, timing it from spawn to exit, killing its session at ``deadline``.

    Peak RSS comes from GNU time when present; otherwise from ``wait4``'s ru_maxrss, which
    on Linux may include this (small) parent's peak at spawn.
    """
    with tempfile.TemporaryDirectory(prefix="ckptz-e2e-") as tmp:
        time_file = Path(tmp, "time")
        full = [time_exe, "-v", "-o", str(time_file), *argv] if time_exe else argv
        killed = threading.Event()
        with open(Path(tmp, "out"), "w+") as out, open(Path(tmp, "err"), "w+") as err:
            if gpu is not None:
                gpu.reset()
            start = time.perf_counter()
            proc = subprocess.Popen(full, stdout=out, stderr=err, env=env, start_new_session=True)

            def kill() -> None:
                killed.set()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)

            timer = threading.Timer(max(0.5, deadline - time.time()), kill)
            timer.start()
            _, status, usage = os.wait4(proc.pid, 0)
            seconds = time.perf_counter() - start
            timer.cancel()
            proc.returncode = os.waitstatus_to_exitcode(status)
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
        rss: int | None = usage.ru_maxrss * 1024
        if time_exe and time_file.exists():
            for line in time_file.read_text().splitlines():
                if "Maximum resident set size" in line:
                    rss = int(line.rsplit(":", 1)[1]) * 1024
    return Proc(
        proc.returncode, seconds, rss, gpu.peak_bytes() if gpu else None, stdout, stderr, killed.is_set()
    )


# --------------------------------------------------------------------------- children


def emit(record: dict[str, Any]) -> None:
    print(CHILD_TAG + json.dumps(record, default=str), flush=True)


def child_generate(spec: dict[str, Any]) -> None:
    """Write the benchmark data (runs in its own process: torch stays out of the parent)."""
    import random

    import numpy as np
    import torch

    t0 = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(spec["seed"])
    random.seed(spec["seed"])
    np.random.seed(spec["seed"])
    torch.manual_seed(spec["seed"])
    data = Path(spec["data"])
    info: dict[str, Any] = {
        "device": device,
        "gpu_name": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "torch": torch.__version__,
        "numpy": np.__version__,
    }
    tiny = data / "tiny" / "tiny.pt"
    tiny.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"weight": torch.randn(24_000, generator=gen, device=device).mul_(0.02).cpu()}, tiny)
    _write_warm(data / "warm", gen, device)
    if spec["mixed_bytes"]:
        info["mixed"] = _write_mixed(data / "mixed", spec["mixed_bytes"], gen, device)
    if spec["single_bytes"]:
        dims = _dims(spec["single_bytes"], 12)
        state, _ = _optimizer_state(dims, gen, device, weights=False)
        folder = data / "single"
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(state, folder / "optimizer.pt")
        info["single"] = {"dims": dims}
    info["seconds"] = time.perf_counter() - t0
    emit(info)


def _dims(nbytes: int, bytes_per_param: int) -> dict[str, int]:
    """A Llama-shaped model (hidden, vocab, MLP width, layers) of at least ``nbytes``."""
    # The widest model whose embeddings take at most a quarter of the bytes.
    for hidden, vocab in ((4096, 32_000), (2048, 32_000), (1024, 32_000), (512, 8192), (256, 2048)):
        if 2 * vocab * hidden * bytes_per_param <= nbytes / 4:
            break
    ffn = 64 * math.ceil(8 * hidden / 3 / 64)
    per_layer = 4 * hidden * hidden + 3 * hidden * ffn + 2 * hidden
    fixed = 2 * vocab * hidden + hidden
    layers = max(1, math.ceil((nbytes / bytes_per_param - fixed) / per_layer))
    return {"hidden": hidden, "vocab": vocab, "ffn": ffn, "layers": layers}


def _shapes(dims: dict[str, int]) -> list[tuple[str, tuple[int, ...]]]:
    d, f = dims["hidden"], dims["ffn"]
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (dims["vocab"], d))]
    for i in range(dims["layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (d,)),
            (p + "self_attn.qkv_proj.weight", (3 * d, d)),
            (p + "self_attn.o_proj.weight", (d, d)),
            (p + "post_attention_layernorm.weight", (d,)),
            (p + "mlp.gate_proj.weight", (f, d)),
            (p + "mlp.up_proj.weight", (f, d)),
            (p + "mlp.down_proj.weight", (d, f)),
        ]
    return [*out, ("model.norm.weight", (d,)), ("lm_head.weight", (dims["vocab"], d))]


def _optimizer_state(
    dims: dict[str, int], gen: Any, device: str, weights: bool = True
) -> tuple[dict[str, Any], dict[str, Any]]:
    """AdamW state with fp32 master weights after ~1000 steps; also the bf16 weights."""
    import torch

    beta2, step = 0.999, 1000
    state: dict[int, dict[str, Any]] = {}
    bf16: dict[str, Any] = {}
    decay: list[int] = []
    no_decay: list[int] = []
    for i, (name, shape) in enumerate(_shapes(dims)):

        def randn(scale: float, shape: tuple[int, ...] = shape) -> Any:
            return torch.randn(shape, generator=gen, device=device).mul_(scale)

        is_norm = len(shape) == 1
        master = randn(0.02).add_(1.0) if is_norm else randn(0.02)
        # Per-tensor gradient scale: moments of different layers sit at different exponents.
        scale = 1e-4 * math.exp(0.5 * torch.randn((), generator=gen, device=device).item())
        exp_avg = randn(scale)
        exp_avg_sq = torch.zeros(shape, device=device)
        for _ in range(4):
            g = randn(scale)
            exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        if "embed_tokens" in name or "lm_head" in name:
            unseen = shape[0] - shape[0] // 20  # the last 5% of the vocabulary never occurred
            exp_avg[unseen:] = 0
            exp_avg_sq[unseen:] = 0
        if weights:
            bf16[name] = master.to(torch.bfloat16).cpu()
        state[i] = {
            "step": torch.tensor(float(step)),
            "exp_avg": exp_avg.cpu(),
            "exp_avg_sq": exp_avg_sq.cpu(),
            "master_weight": master.cpu(),
        }
        (no_decay if is_norm else decay).append(i)
        del master, exp_avg, exp_avg_sq
    group = {
        "lr": 3e-5,
        "betas": (0.9, beta2),
        "eps": 1e-8,
        "amsgrad": False,
        "foreach": None,
        "maximize": False,
        "capturable": False,
        "differentiable": False,
        "fused": None,
        "initial_lr": 5e-5,
    }
    groups = [
        {**group, "weight_decay": 0.01, "params": decay},
        {**group, "weight_decay": 0.0, "params": no_decay},
    ]
    return {"state": state, "param_groups": groups}, bf16


def _write_warm(folder: Path, gen: Any, device: str) -> None:
    """~1.5 MB with bf16 and fp32 tensors: warm-up runs compile every kernel the data needs."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    w = torch.randn(512, 512, generator=gen, device=device).mul_(0.02)
    save_file({"w": w.to(torch.bfloat16).cpu()}, str(folder / "model.safetensors"))
    m = torch.randn(512, 512, generator=gen, device=device).mul_(1e-4)
    torch.save(
        {"state": {0: {"exp_avg": m.cpu(), "exp_avg_sq": (m * m).cpu(), "master_weight": w.cpu()}}},
        folder / "optimizer.pt",
    )


def _write_mixed(folder: Path, nbytes: int, gen: Any, device: str) -> dict[str, Any]:
    import random

    import numpy as np
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    dims = _dims(nbytes, 14)
    state, weights = _optimizer_state(dims, gen, device)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    del weights
    torch.save(state, folder / "optimizer.pt")
    del state
    torch.save(
        {
            "base_lrs": [5e-5, 5e-5],
            "last_epoch": 1000,
            "verbose": False,
            "_step_count": 1001,
            "_get_lr_called_within_step": False,
            "_last_lr": [3e-5, 3e-5],
            "lr_lambdas": [None, None],
        },
        folder / "scheduler.pt",
    )
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    if device == "cuda":
        rng["cuda"] = torch.cuda.random.get_rng_state_all()
    torch.save(rng, folder / "rng_state.pth")
    log = [
        {
            "epoch": s / 4000,
            "grad_norm": 1.0 + 0.1 * math.sin(s),
            "learning_rate": 5e-5 * (1 - s / 4000),
            "loss": 3.0 - s / 1000,
            "step": s,
        }
        for s in range(10, 1001, 10)
    ]
    trainer = {"best_metric": None, "epoch": 0.25, "global_step": 1000, "log_history": log, "max_steps": 4000}
    (folder / "trainer_state.json").write_text(json.dumps(trainer, indent=2))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": dims["hidden"],
        "intermediate_size": dims["ffn"],
        "num_hidden_layers": dims["layers"],
        "num_attention_heads": dims["hidden"] // 64,
        "vocab_size": dims["vocab"],
        "torch_dtype": "bfloat16",
        "model_type": "llama",
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return {"dims": dims}


def _step_memory(gpu: GpuPoller | None) -> Callable[[], dict[str, Any]]:
    """Reset the peak counters now; the returned function reads them."""
    hwm_reset = reset_hwm()
    # ckptz may be importing torch in a thread (its GPU bring-up): import waits for that to
    # finish, where sys.modules could hand back a half-initialised module.
    torch = importlib.import_module("torch") if "torch" in sys.modules else None
    cuda = torch is not None and torch.cuda.is_initialized()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    # ckptz's own GPU memory (its engine allocates through the CUDA driver, not torch:
    # ckptz.cuda, or ckptz.engines.gpu.driver in older trees).
    driver = sys.modules.get("ckptz.cuda") or sys.modules.get("ckptz.engines.gpu.driver")
    own = driver is not None and hasattr(driver, "peak")
    if own:
        driver.peak(reset=True)  # type: ignore[union-attr]
    if gpu is not None:
        gpu.reset()

    def read() -> dict[str, Any]:
        torch_peak = torch.cuda.max_memory_allocated() if cuda else 0
        ckptz_peak = driver.peak() if own else 0  # type: ignore[union-attr]
        return {
            "peak_rss": vm_hwm(),
            "peak_rss_is_step_only": hwm_reset,
            "gpu_peak": (torch_peak + ckptz_peak) if (cuda or own) else None,
            "gpu_used_peak": gpu.peak_bytes() if gpu else None,
        }

    return read


def child_inproc(spec: dict[str, Any]) -> None:
    """ckptz in process: one device/codec, one input, the steps asked for, one line each."""
    import inspect

    from ckptz import api

    device, steps = spec["device"], spec["steps"]
    ckw: dict[str, Any] = {"device": device, "codec": spec["codec"], "force": True}
    dkw: dict[str, Any] = {"device": device, "force": True}
    if spec.get("memory"):
        if "memory" in inspect.signature(api.compress).parameters:
            ckw["memory"] = spec["memory"]
        if "memory" in inspect.signature(api.decompress).parameters:
            dkw["memory"] = spec["memory"]
    warm = Path(spec["warm"])
    try:  # CUDA, nvCOMP and kernel start-up stay out of the timed steps
        api.compress(spec["warm_src"], warm / ("warm" + SUFFIX), **ckw)
        api.decompress(warm / ("warm" + SUFFIX), warm / "warm", **dkw)
    except Exception as e:
        for step in steps:
            emit({"op": step["op"], "error": f"warm-up failed: {e!r}"[:800]})
        return
    gpu = GpuPoller() if device.startswith("cuda") else None
    calls: dict[str, Callable[[], Any]] = {
        "compress": lambda: api.compress(spec["src"], spec["packed"], **ckw),
        "decompress": lambda: api.decompress(spec["packed"], spec["restored"], **dkw),
        "discard-compress": lambda: api.compress(spec["src"], None, discard=True, **ckw),
        "discard-decompress": lambda: api.decompress(spec["packed"], None, discard=True, **dkw),
    }
    for step in steps:
        op = step["op"]
        if time.time() > spec["deadline"]:
            emit({"op": op, "skipped": "budget exhausted"})
            continue
        memory = _step_memory(gpu)
        start = time.perf_counter()
        try:
            summary = calls[op]()
        except TypeError as e:
            if "discard" in str(e):
                emit({"op": op, "skipped": f"api has no discard keyword yet ({e})"})
            else:
                emit({"op": op, "error": repr(e)[:800]})
            continue
        except Exception as e:
            emit({"op": op, "error": repr(e)[:800]})
            continue
        seconds = time.perf_counter() - start
        emit(
            {
                "op": op,
                "seconds": seconds,
                "timed": step.get("timed", True),
                "summary_seconds": getattr(summary, "seconds", None),
                "bytes": getattr(summary, "bytes", None),
                "compressed_bytes": getattr(summary, "compressed_bytes", None),
                "ratio": getattr(summary, "ratio", None),
                "engine": getattr(summary, "device", None),
                "threads": getattr(summary, "threads", None),
                "notices": list(getattr(summary, "notices", ())),
                "memory_budget": ckw.get("memory") if "compress" in op else dkw.get("memory"),
                **memory(),
            }
        )
    if gpu is not None:
        gpu.close()


def read_bytearray(path: str) -> bytearray:
    """A file's bytes in a mutable buffer, read without an intermediate copy."""
    buf = bytearray(os.path.getsize(path))
    with open(path, "rb", buffering=0) as f:
        view, done = memoryview(buf), 0
        while done < len(buf):
            n = f.readinto(view[done:])
            if not n:
                raise OSError(f"{path} shrank while being read")
            done += n
    return buf


class _Discard:
    """A file-like sink that drops what it is given."""

    def write(self, data: bytes) -> int:
        return len(data)


@contextlib.contextmanager
def _sink(path: str | None) -> Iterator[Any]:
    """A new file at ``path``, or a sink that drops everything when ``path`` is None."""
    if path is None:
        yield _Discard()
        return
    with open(path, "wb") as f:
        yield f


def child_peer(spec: dict[str, Any]) -> None:
    """python-zstandard (-3, threads=-1) or ZipNN (threads = cores) over a list of files."""
    tool = spec["tool"]
    try:
        import zstandard

        if tool == "zipnn":
            from zipnn import ZipNN
    except Exception as e:
        for step in spec["steps"]:
            emit({"op": step["op"], "skipped": f"import failed: {e!r}"})
        return
    for step in spec["steps"]:
        op, files = step["op"], step["files"]
        memory = _step_memory(None)
        seconds, out_bytes, prints = 0.0, 0, {}
        try:
            if tool == "pyzstd":
                start = time.perf_counter()
                for src, dst in files:
                    coder: Any = (
                        zstandard.ZstdCompressor(level=3, threads=-1)
                        if op == "compress"
                        else zstandard.ZstdDecompressor()
                    )
                    with open(src, "rb") as fin, _sink(dst) as fout:
                        coder.copy_stream(fin, fout, read_size=IO_CHUNK, write_size=IO_CHUNK)
                        if dst and step.get("fsync"):
                            fout.flush()
                            os.fsync(fout.fileno())
                seconds = time.perf_counter() - start
            else:  # ZipNN holds whole files: read + code is timed, writing its output is not
                for src, dst, dtype in files:
                    z = ZipNN(input_format="byte", bytearray_dtype=dtype, threads=CORES)
                    start = time.perf_counter()
                    data = read_bytearray(src) if op == "compress" else Path(src).read_bytes()
                    out = z.compress(data) if op == "compress" else z.decompress(data)
                    seconds += time.perf_counter() - start
                    out_bytes += len(out)
                    if op == "compress":
                        Path(dst).write_bytes(out)
                    else:
                        prints[dst] = fingerprint_bytes(out)
                    del data, out
        except Exception as e:
            emit({"op": op, "error": repr(e)[:800]})
            continue
        emit({"op": op, "seconds": seconds, "out_bytes": out_bytes, "fingerprints": prints, **memory()})


CHILDREN: dict[str, Callable[[dict[str, Any]], None]] = {
    "generate": child_generate,
    "inproc": child_inproc,
    "peer": child_peer,
}


# --------------------------------------------------------------------------- results


@dataclass
class Row:
    """One measured quantity (e.g. ckptz cuda ans, CLI -o, tmpfs, mixed, compress)."""

    group: str
    tool: str
    mode: str
    op: str
    input: str | None = None
    root: str | None = None
    device: str | None = None
    codec: str | None = None
    bytes: int = 0
    out_bytes: int | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)
    status: str = "pending"
    reason: str | None = None
    roundtrip: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        parts = (self.tool, self.device, self.codec, self.mode, self.root, self.input, self.op)
        return "/".join(p for p in parts if p)

    @property
    def times(self) -> list[float]:
        return [r["seconds"] for r in self.runs if not r.get("killed")]

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times else None

    @property
    def gbps(self) -> float | None:
        m = self.median
        return self.bytes / m / GB if m and self.bytes else None

    @property
    def ratio(self) -> float | None:
        if self.out_bytes:
            return self.bytes / self.out_bytes
        return self.extra.get("ratio")

    def peak(self, key: str) -> int | None:
        values = [r[key] for r in self.runs if r.get(key)]
        return max(values) if values else None

    def add(self, run: dict[str, Any]) -> None:
        self.runs.append(run)
        self.status = "ok"

    def fail(self, status: str, reason: str) -> None:
        """Record a failure; a row that already has good runs keeps them and notes it."""
        if self.runs and status != "timeout":
            self.extra.setdefault("later_failures", []).append(reason)
            return
        self.status, self.reason = status, reason

    def skip(self, reason: str) -> None:
        if self.status == "pending":
            self.status, self.reason = "skipped", reason

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        times = self.times
        out.update(
            key=self.key,
            seconds={"min": min(times), "median": self.median, "max": max(times)} if times else None,
            GBps=self.gbps,
            ratio=self.ratio,
            peak_rss=self.peak("peak_rss"),
            gpu_peak=self.peak("gpu_peak"),
            gpu_used_peak=self.peak("gpu_used_peak"),
        )
        return out


class Skip(Exception):
    """A task cannot run (missing tool, no space): its rows are recorded as skipped."""


@dataclass
class Task:
    name: str
    rows: list[Row]
    run: Callable[[], None]
    kind: str
    bytes: int = 0
    repeatable: bool = True
    duration: float | None = None


# --------------------------------------------------------------------------- the benchmark


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.start = time.time()
        self.deadline = self.start + args.budget_s
        self.hard_deadline = self.deadline + min(45.0, 0.25 * args.budget_s)
        self.groups = set(args.only.split(",")) if args.only else set(GROUPS)
        self.devices = [d for d in args.devices.split(",") if d]
        self.tmpfs: Path = args.tmpfs.resolve()
        self.disk: Path = (args.disk or pick_disk()).resolve()
        self.time_exe = gnu_time()
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        self.rows: list[Row] = []
        self.meta: dict[str, Any] = {}
        self.data: dict[str, Any] = {"files": {}}
        self.fingerprints: dict[str, dict[str, list[str]]] = {}
        self.on_disk: set[str] = set()
        self.rates: dict[str, float] = {}
        self.cuda = False
        self.gpu: GpuPoller | None = None
        self.cli_memory: dict[str, bool] = {}
        self.warmed: set[tuple[str, str]] = set()
        self._buffer: bytes | None = None

    # ---- bookkeeping

    def row(self, group: str, tool: str, mode: str, op: str, **kw: Any) -> Row:
        r = Row(group, tool, mode, op, **kw)
        self.rows.append(r)
        return r

    def time_left(self, hard: bool = False) -> float:
        return max(1.0, (self.hard_deadline if hard else self.deadline) - time.time())

    def save(self) -> None:
        rows = [{**r.to_json(), "of_pread_ceiling": self.pread_ratio(r)} for r in self.rows]
        doc = {"meta": self.meta, "data": self.data, "rows": rows}
        path: Path = self.args.json
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        os.replace(tmp, path)

    def log(self, text: str) -> None:
        print(f"[{time.time() - self.start:6.1f}s] {text}", flush=True)

    def record(self, row: Row, proc: Proc, extra: dict[str, Any] | None = None) -> bool:
        """Store a finished command's run in ``row``; False (and the reason) if it failed."""
        if proc.killed:
            row.fail("timeout", f"killed after {proc.seconds:.0f} s at the budget's hard limit")
            row.runs.append({"seconds": proc.seconds, "killed": True})
        elif proc.rc != 0:
            row.fail("error", f"rc {proc.rc}: {_tail(proc.stderr or proc.stdout)}")
        else:
            run = {"seconds": proc.seconds, "peak_rss": proc.peak_rss, "gpu_used_peak": proc.gpu_used_peak}
            row.add({**run, **(extra or {})})
            gbps = f" {row.bytes / proc.seconds / GB:.2f} GB/s" if row.bytes else ""
            self.log(f"{row.key}: {proc.seconds:.2f} s{gbps}")
        self.save()
        return proc.rc == 0 and not proc.killed

    def run(self, argv: list[str], gpu: bool = False) -> Proc:
        return run_measured(
            argv, self.hard_deadline, env=self.env, time_exe=self.time_exe, gpu=self.gpu if gpu else None
        )

    def child(self, kind: str, spec: dict[str, Any]) -> tuple[Proc, list[dict[str, Any]]]:
        proc = self.run([sys.executable, str(Path(__file__).resolve()), "--child", kind, json.dumps(spec)])
        lines = [json.loads(x[len(CHILD_TAG) :]) for x in proc.stdout.splitlines() if x.startswith(CHILD_TAG)]
        return proc, lines

    def check(self, row: Row, path: Path, inp: str) -> None:
        """Compare ``path`` with the generated input, byte for byte (once per row)."""
        if row.roundtrip is not None:
            return
        got = fingerprint_tree(path) if path.exists() else {}
        row.roundtrip = self.compare(got, inp)
        self.log(f"{row.key}: round trip {row.roundtrip}")

    def compare(self, got: dict[str, list[str]], inp: str) -> str:
        want = self.fingerprints[inp]
        bad = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        return "ok" if not bad else "MISMATCH: " + ", ".join(bad)[:300]

    def work(self, root: str, name: str) -> Path:
        path = (self.tmpfs if root == "tmpfs" else self.disk) / "work" / name
        remove(path)
        path.mkdir(parents=True)
        return path

    def inputs(self) -> list[str]:
        """The inputs asked for: ``--size-gb 0`` or ``--single-gb 0`` leaves one out."""
        sizes = {"mixed": self.args.size_gb, "single": self.args.single_gb}
        return [inp for inp in INPUTS if sizes[inp] > 0]

    def src(self, root: str, inp: str) -> Path:
        base = self.tmpfs / "data"
        if root == "disk":
            self.copy_to_disk(inp)
            base = self.disk / "data"
        return base / "mixed" if inp == "mixed" else base / "single" / "optimizer.pt"

    def size(self, inp: str) -> int:
        return int(self.data.get(f"{inp}_bytes", 0))

    # ---- set-up

    def collect_meta(self) -> None:
        def version(dist: str) -> str | None:
            try:
                return metadata.version(dist)
            except metadata.PackageNotFoundError:
                return None

        commit = self.args.commit
        if not commit:
            git = subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
            )
            commit = git.stdout.strip() if git.returncode == 0 else None
        smi = shutil.which("nvidia-smi")
        gpu_name = None
        if smi:
            q = subprocess.run(
                [smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True
            )
            gpu_name = q.stdout.strip().splitlines()[0] if q.returncode == 0 and q.stdout.strip() else None
        zstd = shutil.which("zstd")
        self.meta = {
            "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "hostname": socket.gethostname(),
            "cpus": CORES,
            "gpu": gpu_name,
            "python": platform.python_version(),
            "versions": {d: version(d) for d in ("zstandard", "zipnn", "nvidia-nvcomp-cu12", "xxhash")},
            "zstd_cli": subprocess.run([zstd, "--version"], capture_output=True, text=True).stdout.strip()
            if zstd
            else None,
            "peak_rss_source": "GNU time -v" if self.time_exe else "wait4 ru_maxrss",
            "args": {k: str(v) for k, v in vars(self.args).items()},
            "budget_s": self.args.budget_s,
            "tmpfs": {"path": str(self.tmpfs), "fs": fs_type(self.tmpfs.parent)},
            "disk": {"path": str(self.disk), "fs": fs_type(self.disk.parent)},
        }

    def setup(self) -> None:
        self.collect_meta()
        claim(self.tmpfs)
        claim(self.disk)
        self.meta["tmpfs"]["fs"], self.meta["disk"]["fs"] = fs_type(self.tmpfs), fs_type(self.disk)
        df = subprocess.run(
            ["df", "-hT", str(self.tmpfs), str(self.disk)], capture_output=True, text=True
        ).stdout
        self.meta["df"] = df
        print(df, end="", flush=True)
        for root in (self.tmpfs, self.disk):
            remove(root / "work")
            remove(root / "data")
        self.save()
        need_data = bool(self.groups & {"inproc", "discard", "ckptz", "peers"})
        if need_data:  # inputs, plus a container and a restore of the larger one at a time
            need = (
                self.args.size_gb + self.args.single_gb + 1.9 * max(self.args.single_gb, self.args.size_gb)
            ) * GB
            free = shutil.disk_usage(self.tmpfs).free
            if free < need:
                raise RuntimeError(
                    f"{self.tmpfs} has {free / GB:.1f} GB free, ~{need / GB:.1f} GB needed: "
                    "pass a larger --tmpfs, or smaller --size-gb/--single-gb"
                )
        spec = {
            "data": str(self.tmpfs / "data"),
            "seed": self.args.seed,
            "mixed_bytes": int(self.args.size_gb * GB) if need_data else 0,
            "single_bytes": int(self.args.single_gb * GB) if need_data else 0,
        }
        self.log(f"generating data into {self.tmpfs / 'data'} …")
        proc, lines = self.child("generate", spec)
        if proc.rc != 0 or not lines:
            raise RuntimeError(f"data generation failed: {_tail(proc.stderr, 2000)}")
        self.data["generation"] = {**lines[-1], "process_seconds": proc.seconds, "peak_rss": proc.peak_rss}
        self.cuda = lines[-1]["device"] == "cuda"
        self.meta["gpu"] = self.meta["gpu"] or lines[-1].get("gpu_name")
        self.meta["versions"]["torch"] = lines[-1].get("torch")
        for inp in self.inputs() if need_data else ():
            path = self.src("tmpfs", inp)
            self.data[f"{inp}_bytes"] = tree_size(path)
            self.data["files"][inp] = {rel: p.stat().st_size for rel, p in tree_files(path)}
            start = time.perf_counter()
            self.fingerprints[inp] = fingerprint_tree(path)
            self.data[f"{inp}_fingerprint_s"] = time.perf_counter() - start
        self.log(
            "generated: mixed {:.2f} GB, single {:.2f} GB in {:.1f} s".format(
                self.size("mixed") / GB, self.size("single") / GB, proc.seconds
            )
        )
        if self.cuda and "cuda" in self.devices:
            self.gpu = GpuPoller()
            time.sleep(0.3)
            self.meta["gpu_used_at_start"] = self.gpu.last
        if "ckptz" in self.groups:
            for op in ("compress", "decompress"):
                helptext = subprocess.run(
                    [sys.executable, "-m", "ckptz", op, "--help"],
                    capture_output=True,
                    text=True,
                    env={**self.env, "COLUMNS": "200"},
                ).stdout
                self.cli_memory[op] = "--memory" in helptext
        self.meta["cli_memory_option"] = self.cli_memory
        self.save()

    def copy_to_disk(self, inp: str) -> None:
        """Copy one input to the disk root (untimed for the rows; recorded in ``data``)."""
        if inp in self.on_disk:
            return
        free = shutil.disk_usage(self.disk).free
        need = int(2.6 * self.size(inp))
        if free < need:
            raise Skip(
                f"not enough space on {self.disk}: {free / GB:.1f} GB free, ~{need / GB:.1f} GB needed"
            )
        src = self.src("tmpfs", inp)
        dst = self.disk / "data" / src.relative_to(self.tmpfs / "data")
        dst.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        subprocess.run(["cp", "-r", str(src), str(dst)], check=True, timeout=self.time_left(hard=True))
        subprocess.run(["sync"], check=True, timeout=self.time_left(hard=True))
        self.data[f"{inp}_disk_copy_s"] = time.perf_counter() - start
        self.on_disk.add(inp)
        self.log(f"copied {inp} to {dst} in {self.data[f'{inp}_disk_copy_s']:.1f} s")

    # ---- tasks

    def plan(self) -> list[Task]:
        g = self.groups
        tasks: list[Task] = []
        if "ceilings" in g:
            tasks.append(self.ceiling_task("tmpfs"))
        if "startup" in g:
            tasks.append(self.startup_task())
        configs = [c for c in CONFIGS if c[0] in self.devices]
        for inp in self.inputs() if g & {"inproc", "discard", "ckptz", "peers"} else ():
            tasks.append(self.pread_task(inp))  # what every ckptz row of the input is held against
            if g & {"inproc", "discard"}:
                tasks += [self.inproc_task(c, inp) for c in configs]
            if "peers" in g:
                tasks += [self.cp_task(inp, "tmpfs"), self.zipnn_task(inp), self.pyzstd_task(inp, "tmpfs")]
            if "ckptz" in g:
                tasks += [self.cli_task(c, inp, "tmpfs") for c in configs]
            if "peers" in g:
                tasks.append(self.zstd_cli_task(inp))
            if inp == "mixed" and "ceilings" in g:
                tasks.append(self.ceiling_task("disk"))
            if "peers" in g:
                tasks.append(self.cp_task(inp, "disk"))
            if "ckptz" in g:
                tasks += [self.cli_task(c, inp, "disk") for c in configs]
            if "peers" in g:
                tasks.append(self.pyzstd_task(inp, "disk"))
        return tasks

    def schedule(self, tasks: list[Task]) -> None:
        """Pass 1 runs every task that fits the budget; later passes add repeats."""
        for attempt in range(max(1, self.args.repeats)):
            for task in tasks:
                if attempt and (not task.repeatable or task.duration is None):
                    continue
                left = self.deadline - time.time()
                estimate = task.duration if attempt else self.rates.get(task.kind, 0.0) * task.bytes
                if left < MIN_LEFT_S or estimate > left:
                    if not attempt:
                        budget = f"--budget-s {self.args.budget_s:g}"
                        reason = (
                            f"budget: {max(left, 0):.0f} s left ({budget})"
                            if left < MIN_LEFT_S
                            else f"budget: ~{estimate:.0f} s needed, {left:.0f} s left ({budget})"
                        )
                        for r in task.rows:
                            r.skip(reason)
                    continue
                start = time.time()
                try:
                    task.run()
                except Skip as e:
                    for r in task.rows:
                        r.skip(str(e))
                except Exception as e:
                    for r in task.rows:
                        r.fail("error", f"{task.name}: {e!r}"[:800])
                seconds = time.time() - start
                if not attempt:
                    task.duration = seconds
                    if task.bytes and any(r.runs for r in task.rows):
                        self.rates[task.kind] = max(self.rates.get(task.kind, 0.0), seconds / task.bytes)
                self.save()
        for r in self.rows:
            r.skip(f"budget exhausted (--budget-s {self.args.budget_s:g})")

    def ceiling_task(self, root: str) -> Task:
        size = int(self.args.ceiling_gb * GB)
        rows = [
            self.row(
                "ceilings", "pwrite", f"{n} threads", "write", root=root, bytes=size, extra={"threads": n}
            )
            for n in sorted({CORES, 1}, reverse=True)
        ]

        def run() -> None:
            if root == "disk" and shutil.disk_usage(self.disk).free < 2 * size:
                raise Skip(f"not enough space on {self.disk}")
            for r in rows:
                self.ceiling(r, self.work(root, "ceiling") / "ceiling.bin", size, r.extra["threads"])
            remove(self.work(root, "ceiling"))

        return Task(f"ceilings {root}", rows, run, "ceilings", repeatable=False)

    def ceiling(self, row: Row, path: Path, size: int, threads: int) -> None:
        """``threads`` threads ``os.pwrite`` 64 MiB pieces of plain memory into a new file, then fsync."""
        if self._buffer is None:
            self._buffer = os.urandom(64 * MIB)
        view = memoryview(self._buffer)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

        def put(offset: int) -> None:
            piece = view[: min(len(view), size - offset)]
            while piece:
                n = os.pwrite(fd, piece, offset)
                piece, offset = piece[n:], offset + n

        try:
            start = time.perf_counter()
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(put, range(0, size, len(view))))
            written = time.perf_counter()
            os.fsync(fd)
            end = time.perf_counter()
        finally:
            os.close(fd)
            path.unlink()
        row.add({"seconds": end - start, "write_s": written - start, "fsync_s": end - written})
        self.log(
            f"{row.key}: {size / (end - start) / GB:.2f} GB/s with fsync ({size / (written - start) / GB:.2f} without)"
        )
        self.save()

    def pread_task(self, inp: str) -> Task:
        """The input's ``pread`` ceiling from the page cache (module docstring, step 2)."""
        size = self.size(inp)
        row = self.row("ceilings", "pread", f"{CORES} threads", "read", input=inp, root="tmpfs", bytes=size)
        row.extra["threads"] = CORES

        def run() -> None:
            files = [p for _, p in tree_files(self.src("tmpfs", inp))]
            fds = [os.open(p, os.O_RDONLY) for p in files]
            try:
                pieces = [
                    (fd, at, min(PREAD_PIECE, n - at))
                    for fd, p in zip(fds, files, strict=True)
                    for n in [p.stat().st_size]
                    for at in range(0, n, PREAD_PIECE)
                ]
                buffers = [bytearray(PREAD_PIECE) for _ in range(CORES)]
                with ThreadPoolExecutor(CORES) as pool:
                    read_all(pool, pieces, buffers)  # untimed: the cache warm and the buffers faulted in
                    for _ in range(DISCARD_RUNS):
                        seconds = read_all(pool, pieces, buffers)
                        if seconds != seconds:  # NaN: a file was cut short
                            raise RuntimeError(f"{inp} changed while it was read")
                        row.add({"seconds": seconds})
            finally:
                for fd in fds:
                    os.close(fd)
            self.log(f"{row.key}: {row.gbps or 0:.2f} GB/s (median of {len(row.runs)})")

        return Task(f"pread {inp}", [row], run, "pread", size, repeatable=False)

    def pread_ratio(self, row: Row) -> float | None:
        """A ckptz row's GB/s ÷ the ``pread`` ceiling of its input (None where either is missing)."""
        if row.tool != "ckptz" or row.input is None or not row.gbps:
            return None
        ceiling = self.find(tool="pread", input=row.input)
        return row.gbps / ceiling.gbps if ceiling and ceiling.gbps else None

    def startup_task(self) -> Task:
        tiny = self.tmpfs / "data" / "tiny" / "tiny.pt"
        # On cuda the GPU-only bitstream (ans), whose run cannot go on without the GPU.
        rows = {
            dev: self.row(
                "startup",
                "ckptz",
                "startup",
                "compress-tiny",
                device=dev,
                codec="ans" if dev == "cuda" else None,
            )
            for dev in self.devices
            if dev in ("cpu", "cuda")
        }
        rows["help"] = self.row("startup", "ckptz", "startup", "help")

        def argv(name: str, out: Path) -> list[str]:
            if name == "help":
                return [sys.executable, "-m", "ckptz", "--help"]
            return [
                sys.executable,
                "-m",
                "ckptz",
                "compress",
                str(tiny),
                "-o",
                str(out),
                "--device",
                name,
                "--codec",
                rows[name].codec or "auto",
                "--force",
            ]

        def run() -> None:
            out = self.work("tmpfs", "startup") / ("tiny.pt" + SUFFIX)
            if "cuda" in rows and not self.cuda:
                rows.pop("cuda").skip("no CUDA device (torch.cuda.is_available() is False)")
            if "cuda" in rows:  # first GPU run: kernels compiled and cached, recorded apart
                cold = self.run(argv("cuda", out), gpu=True)
                rows["cuda"].extra["cold_seconds"] = cold.seconds
                remove(out)
                self.log(f"start-up cuda, cold: {cold.seconds:.2f} s (rc {cold.rc})")
            for _ in range(max(1, self.args.repeats)):
                for name, row in rows.items():
                    self.record(row, self.run(argv(name, out), gpu=name == "cuda"))
                    remove(out)

        return Task("startup", list(rows.values()), run, "startup", repeatable=False)

    def inproc_task(self, config: tuple[str, str], inp: str) -> Task:
        dev, codec = config
        common = {"input": inp, "device": dev, "codec": codec, "bytes": self.size(inp)}
        rows: dict[str, Row] = {}
        if "discard" in self.groups:
            rows["discard-compress"] = self.row("discard", "ckptz", "discard", "compress", **common)
        if "inproc" in self.groups:
            rows["compress"] = self.row("inproc", "ckptz", "inproc", "compress", root="tmpfs", **common)
        if "discard" in self.groups:
            rows["discard-decompress"] = self.row("discard", "ckptz", "discard", "decompress", **common)
        if "inproc" in self.groups:
            rows["decompress"] = self.row("inproc", "ckptz", "inproc", "decompress", root="tmpfs", **common)

        def run() -> None:
            if dev == "cuda" and not self.cuda:
                raise Skip("no CUDA device (torch.cuda.is_available() is False)")
            work = self.work("tmpfs", f"inproc-{dev}-{codec}-{inp}")
            src = self.src("tmpfs", inp)
            # Discarded runs are short and the host noisy: each is timed DISCARD_RUNS times in
            # the process, and its row gives their median.
            steps = [
                {"op": op} for op in rows for _ in range(DISCARD_RUNS if op.startswith("discard") else 1)
            ]
            if "compress" not in rows:  # discarded restore needs a container
                steps.insert(1, {"op": "compress", "timed": False})
            spec = {
                "device": dev,
                "codec": codec,
                "src": str(src),
                "packed": str(work / "o" / (src.name + SUFFIX)),
                "restored": str(work / "r" / src.name),
                "warm_src": str(self.tmpfs / "data" / "warm"),
                "warm": str(work / "warm"),
                "memory": self.args.memory_bytes,
                "steps": steps,
                "deadline": self.deadline,
            }
            for key in ("packed", "restored", "warm"):
                Path(spec[key]).parent.mkdir(parents=True, exist_ok=True)
            Path(spec["warm"]).mkdir(exist_ok=True)
            proc, lines = self.child("inproc", spec)
            if any("seconds" in line for line in lines):
                self.warmed.add(config)
            for line in lines:
                row = rows.get(line["op"]) if line.get("timed", True) else None
                if row is None:
                    continue
                if "skipped" in line:
                    row.skip(line["skipped"])
                elif "error" in line:
                    row.fail("error", line["error"])
                else:
                    row.add({k: v for k, v in line.items() if k != "op"})
                    row.extra["ratio"] = line.get("ratio")
                    self.log(
                        f"{row.key}: {line['seconds']:.2f} s {row.bytes / line['seconds'] / GB:.2f} GB/s"
                    )
            seen = {line["op"] for line in lines}
            for op, row in rows.items():
                if op not in seen:
                    why = "killed at the budget's hard limit" if proc.killed else f"rc {proc.rc}"
                    row.fail(
                        "timeout" if proc.killed else "error",
                        f"child ended early ({why}): {_tail(proc.stderr)}",
                    )
            packed = Path(spec["packed"])
            if "compress" in rows and packed.exists():
                rows["compress"].out_bytes = tree_size(packed)
            if "decompress" in rows and rows["decompress"].runs:
                self.check(rows["decompress"], Path(spec["restored"]), inp)
            remove(work)

        return Task(
            f"inproc {dev} {codec} {inp}", list(rows.values()), run, f"inproc {dev} {codec}", self.size(inp)
        )

    def ckptz_argv(self, op: str, src: Path, dst: Path | None, config: tuple[str, str]) -> list[str]:
        argv = [sys.executable, "-m", "ckptz", op, str(src)]
        argv += ["--in-place"] if dst is None else ["-o", str(dst), "--force"]
        argv += ["--device", config[0]]
        if op == "compress":
            argv += ["--codec", config[1]]
        if self.args.memory and self.cli_memory.get(op):
            argv += ["--memory", self.args.memory]
        return argv

    def timed_cli(self, row: Row, argv: list[str], root: str) -> bool:
        """One whole-command run; on the disk, ``sync`` is part of the timed region."""
        proc = self.run(argv, gpu=row.device == "cuda")
        extra: dict[str, Any] = {"argv": argv[1:]}
        if proc.rc == 0 and not proc.killed and root == "disk":
            sync = self.run(["sync"])
            proc.seconds += sync.seconds
            extra["sync_s"] = sync.seconds
        if self.args.memory and self.cli_memory.get(row.op):
            extra["memory_budget"] = self.args.memory_bytes
        return self.record(row, proc, extra)

    def cli_task(self, config: tuple[str, str], inp: str, root: str) -> Task:
        dev, codec = config
        common = {"input": inp, "root": root, "device": dev, "codec": codec, "bytes": self.size(inp)}
        co = self.row("ckptz", "ckptz", "cli -o", "compress", **common)
        do = self.row("ckptz", "ckptz", "cli -o", "decompress", **common)
        # In place is judged on tmpfs; on the disk it would only cost budget.
        ci = self.row("ckptz", "ckptz", "cli in-place", "compress", **common) if root == "tmpfs" else None
        di = self.row("ckptz", "ckptz", "cli in-place", "decompress", **common) if root == "tmpfs" else None

        def run() -> None:
            if dev == "cuda" and not self.cuda:
                raise Skip("no CUDA device (torch.cuda.is_available() is False)")
            self.warm_cli(config)
            src = self.src(root, inp)
            work = self.work(root, f"cli-{dev}-{codec}-{inp}")
            packed, restored = work / "o" / (src.name + SUFFIX), work / "r" / src.name
            packed.parent.mkdir()
            restored.parent.mkdir()
            fresh = False
            if self.timed_cli(co, self.ckptz_argv("compress", src, packed, config), root):
                co.out_bytes = tree_size(packed)
                if self.timed_cli(do, self.ckptz_argv("decompress", packed, restored, config), root):
                    self.check(do, restored, inp)
                    fresh = do.roundtrip == "ok"
            else:
                do.skip("compress -o failed")
            remove(packed)
            if ci is not None and di is not None:
                self.in_place(config, inp, src, restored, fresh, ci, di)
            remove(work)

        rows = [r for r in (co, do, ci, di) if r is not None]
        return Task(f"cli {dev} {codec} {inp} {root}", rows, run, f"cli {dev} {codec} {root}", self.size(inp))

    def warm_cli(self, config: tuple[str, str]) -> None:
        """Once per GPU configuration: an untimed round trip of the warm-up folder, so that
        kernels are compiled and cached (~/.cache/ckptz/kernels) before a timed whole command."""
        if config[0] != "cuda" or config in self.warmed:
            return
        work = self.work("tmpfs", "warm")
        start = time.perf_counter()
        packed = work / ("warm" + SUFFIX)
        self.run(self.ckptz_argv("compress", self.tmpfs / "data" / "warm", packed, config))
        self.run(self.ckptz_argv("decompress", packed, work / "warm", config))
        self.data.setdefault("cli_warmup_s", {})[" ".join(config)] = time.perf_counter() - start
        self.warmed.add(config)
        remove(work)

    def in_place(
        self, config: tuple[str, str], inp: str, src: Path, copy: Path, fresh: bool, ci: Row, di: Row
    ) -> None:
        """In-place compress, then in-place restore, of a fresh copy: the verified ``-o`` restore
        when there is one, else an (untimed) ``cp -r`` of the input."""
        if not fresh:
            remove(copy)
            subprocess.run(["cp", "-r", str(src), str(copy)], check=True, timeout=self.time_left(hard=True))
        target = copy if copy.is_dir() else copy.with_name(copy.name + SUFFIX)
        if not self.timed_cli(ci, self.ckptz_argv("compress", copy, None, config), "tmpfs"):
            di.skip("compress --in-place failed")
            return
        ci.out_bytes = tree_size(target)
        if self.timed_cli(di, self.ckptz_argv("decompress", target, None, config), "tmpfs"):
            self.check(di, copy, inp)
            ci.roundtrip = ci.roundtrip or di.roundtrip

    def cp_task(self, inp: str, root: str) -> Task:
        size = self.size(inp)
        rows = [self.row("peers", "cp", "cp -r", "copy", input=inp, root=root, bytes=size)]
        if root == "disk":
            rows.append(self.row("peers", "cp", "cp -r && sync", "copy", input=inp, root=root, bytes=size))
        else:
            # What an in-place run pays that a -o run does not: the originals' pages freed.
            rows.append(self.row("peers", "rm", "rm -r", "remove", input=inp, root=root, bytes=size))

        def run() -> None:
            src = self.src(root, inp)
            dst = self.work(root, f"cp-{inp}") / src.name
            proc = self.run(["cp", "-r", str(src), str(dst)])
            if self.record(rows[0], proc) and root == "disk":
                sync = self.run(["sync"])
                proc.seconds += sync.seconds
                self.record(rows[1], proc, {"sync_s": sync.seconds})
            elif proc.rc == 0 and root == "tmpfs":
                self.record(rows[1], self.run(["rm", "-r", str(dst)]))
            remove(dst.parent)

        return Task(f"cp {inp} {root}", rows, run, f"cp-{root}", size)

    def pyzstd_task(self, inp: str, root: str) -> Task:
        size = self.size(inp)
        common = {"input": inp, "root": root, "codec": "zstd -3", "bytes": size}
        rows = {
            "compress": self.row("peers", "python-zstandard", "file", "compress", **common),
            "decompress": self.row("peers", "python-zstandard", "file", "decompress", **common),
        }
        if root == "tmpfs":
            common["root"] = None
            rows["discard-compress"] = self.row("peers", "python-zstandard", "discard", "compress", **common)
            rows["discard-decompress"] = self.row(
                "peers", "python-zstandard", "discard", "decompress", **common
            )

        def run() -> None:
            src = self.src(root, inp)
            work = self.work(root, f"pyzstd-{inp}")
            files = tree_files(src)
            packed = [(str(p), str(work / "o" / (rel + ".zst"))) for rel, p in files]
            back = [(z, str(work / "r" / rel)) for (rel, _), (_, z) in zip(files, packed, strict=True)]
            for _, dst in packed + back:
                Path(dst).parent.mkdir(parents=True, exist_ok=True)
            fsync = root == "disk"
            steps = [
                {"op": "compress", "files": packed, "fsync": fsync},
                {"op": "decompress", "files": back, "fsync": fsync},
            ]
            if root == "tmpfs":  # the same work with the output dropped
                steps += [
                    {"op": "compress", "files": [(s, None) for s, _ in packed]},
                    {"op": "decompress", "files": [(z, None) for z, _ in back]},
                ]
            self.peer_child("pyzstd", rows, steps)
            if rows["compress"].runs:
                rows["compress"].out_bytes = tree_size(work / "o")
                if "discard-compress" in rows:
                    rows["discard-compress"].out_bytes = rows["compress"].out_bytes
            if rows["decompress"].runs:
                self.check(rows["decompress"], work / "r" if src.is_dir() else work / "r" / src.name, inp)
            remove(work)

        return Task(f"python-zstandard {inp} {root}", list(rows.values()), run, f"pyzstd-{root}", size)

    def peer_child(
        self, tool: str, rows: dict[str, Row], steps: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Run the steps in one child; the i-th line fills the i-th row."""
        proc, lines = self.child("peer", {"tool": tool, "steps": steps})
        for row, line in zip(rows.values(), lines, strict=False):
            if "skipped" in line:
                row.skip(line["skipped"])
            elif "error" in line:
                row.fail("error", line["error"])
            else:
                row.add({k: v for k, v in line.items() if k not in ("op", "fingerprints")})
                self.log(f"{row.key}: {line['seconds']:.2f} s {row.bytes / line['seconds'] / GB:.2f} GB/s")
        for row in list(rows.values())[len(lines) :]:
            why = "killed at the budget's hard limit" if proc.killed else f"rc {proc.rc}"
            row.fail(
                "timeout" if proc.killed else "error", f"child ended early ({why}): {_tail(proc.stderr)}"
            )
        return lines

    def zipnn_task(self, inp: str) -> Task:
        size = self.size(inp)
        common = {"input": inp, "codec": "zipnn", "bytes": size}
        rows = {op: self.row("peers", "zipnn", "discard", op, **common) for op in ("compress", "decompress")}

        def run() -> None:
            src = self.src("tmpfs", inp)
            work = self.work("tmpfs", f"zipnn-{inp}")
            files = tree_files(src)

            def dtype(rel: str) -> str:
                return "bfloat16" if rel.endswith(".safetensors") else "float32"

            packed = [(str(p), str(work / f"{i}.znn"), dtype(rel)) for i, (rel, p) in enumerate(files)]
            back = [(z, rel, dtype(rel)) for (rel, _), (_, z, _) in zip(files, packed, strict=True)]
            steps = [{"op": "compress", "files": packed}, {"op": "decompress", "files": back}]
            lines = self.peer_child("zipnn", rows, steps)
            if rows["compress"].runs:
                rows["compress"].out_bytes = tree_size(work)
            if len(lines) > 1 and "fingerprints" in lines[1]:
                rows["decompress"].roundtrip = self.compare(lines[1]["fingerprints"], inp)
            remove(work)

        return Task(f"zipnn {inp}", list(rows.values()), run, "zipnn", size)

    def zstd_cli_task(self, inp: str) -> Task:
        size = self.size(inp)
        common = {"input": inp, "root": "tmpfs", "codec": "zstd -T0 -3", "bytes": size}
        rows = [self.row("peers", "zstd-cli", "file", op, **common) for op in ("compress", "decompress")]

        def run() -> None:
            exe = shutil.which("zstd")
            if exe is None:
                raise Skip("no zstd CLI on PATH")
            src = self.src("tmpfs", inp)
            work = self.work("tmpfs", f"zstd-{inp}")
            for row, decompress in zip(rows, (False, True), strict=True):
                total = Proc(0, 0.0, 0, None, "", "", False)
                for rel, path in tree_files(src):
                    z, out = work / "o" / (rel + ".zst"), work / "r" / rel
                    (out if decompress else z).parent.mkdir(parents=True, exist_ok=True)
                    cmd = (
                        [exe, "-d", "-q", "-f", str(z), "-o", str(out)]
                        if decompress
                        else [exe, "-T0", "-3", "-q", "-f", str(path), "-o", str(z)]
                    )
                    p = self.run(cmd)
                    total = Proc(
                        p.rc or total.rc,
                        total.seconds + p.seconds,
                        max(total.peak_rss or 0, p.peak_rss or 0),
                        None,
                        "",
                        p.stderr or total.stderr,
                        p.killed or total.killed,
                    )
                    if p.rc or p.killed:
                        break
                if not self.record(row, total):
                    break
            if rows[0].runs:
                rows[0].out_bytes = tree_size(work / "o")
            if rows[1].runs:
                self.check(rows[1], work / "r" if src.is_dir() else work / "r" / src.name, inp)
            remove(work)

        return Task(f"zstd CLI {inp}", rows, run, "zstd-cli", size)

    # ---- report

    def find(self, **kw: Any) -> Row | None:
        for r in self.rows:
            if all(getattr(r, k) == v for k, v in kw.items()):
                return r
        return None

    def report(self) -> str:
        """The short markdown summary: a table of configurations and the issue's targets."""
        m = self.meta
        lines = [
            f"## ckptz e2e · {m['date']} · {m['hostname']} · {m.get('gpu') or 'no GPU'} · {CORES} cores · commit {(m.get('commit') or '?')[:12]}",
            f"data: mixed {self.size('mixed') / GB:.2f} GB, single {self.size('single') / GB:.2f} GB · tmpfs {self.tmpfs} ({m['tmpfs']['fs']}) · disk {self.disk} ({m['disk']['fs']}) · JSON {self.args.json}",
        ]
        ceil = []
        for root in ("tmpfs", "disk"):
            many = self.find(tool="pwrite", root=root, mode=f"{CORES} threads")
            one = self.find(tool="pwrite", root=root, mode="1 threads")
            if many and many.gbps:
                ceil.append(
                    f"{root} {many.gbps:.2f} ({CORES} thr) / {one.gbps if one and one.gbps else 0:.2f} (1 thr)"
                )

        starts = []
        for name in ("cuda", "cpu", "help"):
            r = self.find(tool="ckptz", mode="startup", device=None if name == "help" else name)
            if r and r.median is not None:
                cold = r.extra.get("cold_seconds")
                starts.append(f"{name} {r.median:.2f} s" + (f" (cold {cold:.1f} s)" if cold else ""))
        lines.append(
            "write ceilings, GB/s incl. fsync: "
            + (" · ".join(ceil) or "not measured")
            + " · start-up, median: "
            + (" · ".join(starts) or "not measured")
        )
        preads = [
            f"{inp} {r.gbps:.2f}" for inp in INPUTS if (r := self.find(tool="pread", input=inp)) and r.gbps
        ]
        lines.append(
            f"pread ceilings ({CORES} threads, page cache), GB/s: " + (" · ".join(preads) or "not measured")
        )
        lines += [
            "",
            "| configuration | compress GB/s mixed / single | decompress GB/s | compress ÷ pread | decompress ÷ pread | ratio | peak RSS GB | GPU GB (smi) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for label, rows in self.table_groups():
            lines.append(
                f"| {label} | {self.cells(rows, 'compress')} | {self.cells(rows, 'decompress')} | {self.of_ceiling(rows, 'compress')} | {self.of_ceiling(rows, 'decompress')} | {self.ratios(rows)} | {self.peak(rows, 'peak_rss')} | {self.peak(rows, 'gpu_used_peak') if self.cuda else '–'} |"
            )
        lines += ["", "targets:", *self.targets()]
        return "\n".join(lines)

    def table_groups(self) -> Iterator[tuple[str, list[Row]]]:
        """Rows of one configuration (both inputs, both directions), with the table's label."""
        seen: dict[tuple[Any, ...], list[Row]] = {}
        for r in self.rows:
            if r.group in ("startup", "ceilings") or (
                r.tool == "cp" and r.mode == "cp -r" and r.root == "disk"
            ):
                continue
            seen.setdefault((r.tool, r.device, r.codec, r.mode, r.root), []).append(r)
        modes = {
            "discard": "writes discarded",
            "inproc": "in process",
            "file": "file",
        }
        roots = {"tmpfs": "tmpfs", "disk": "disk+sync", None: ""}
        tools = {
            "python-zstandard": f"python-zstandard -3 ×{CORES}",
            "zstd-cli": "zstd -T0 -3 CLI",
            "zipnn": f"ZipNN ×{CORES}",
        }
        order = [
            "discard",
            "inproc",
            "cli -o",
            "cli in-place",
            "cp -r",
            "cp -r && sync",
            "rm -r",
            "file",
        ]
        peers = ["ckptz", "cp", "rm", "python-zstandard", "zstd-cli", "zipnn"]

        def rank(key: tuple[Any, ...]) -> tuple[int, int, bool, int]:
            tool, dev, codec, mode, root = key
            config = CONFIGS.index((dev, codec)) if (dev, codec) in CONFIGS else len(CONFIGS)
            return (peers.index(tool), config, root == "disk", order.index(mode) if mode in order else 99)

        for (tool, dev, codec, mode, root), rows in sorted(seen.items(), key=lambda kv: rank(kv[0])):
            where = f"{modes.get(mode, mode)} {roots[root]}".strip()
            if tool == "ckptz":
                label = f"ckptz {dev} {'zstd (auto)' if codec == 'auto' else codec} · {where}"
            elif tool in ("cp", "rm"):
                label = f"{mode} · {root}"
            else:
                label = f"{tools.get(tool, tool)} · {where}"
            yield label, rows

    @staticmethod
    def cells(rows: list[Row], op: str) -> str:
        out = []
        for inp in INPUTS:
            r = next(
                (
                    r
                    for r in rows
                    if r.input == inp and r.op in ((op, "copy", "remove") if op == "compress" else (op,))
                ),
                None,
            )
            if r is None:
                out.append("–")
            elif r.gbps is not None:
                flag = "" if r.roundtrip in (None, "ok") else " ✗"
                out.append((f"{r.gbps:.2f}" if r.gbps < 10 else f"{r.gbps:.1f}") + flag)
            else:
                out.append({"skipped": "skip", "timeout": "t/o", "error": "err"}.get(r.status, "–"))
        return " / ".join(out)

    def of_ceiling(self, rows: list[Row], op: str) -> str:
        """The ckptz rows' GB/s for ``op`` ÷ their input's ``pread`` ceiling, mixed / single."""
        out = []
        for inp in INPUTS:
            r = next((r for r in rows if r.input == inp and r.op == op), None)
            ratio = self.pread_ratio(r) if r is not None else None
            out.append("–" if ratio is None else f"{ratio:.2f}")
        return " / ".join(out)

    @staticmethod
    def ratios(rows: list[Row]) -> str:
        out = []
        for inp in INPUTS:
            r = next((r for r in rows if r.input == inp and r.op == "compress" and r.ratio), None)
            out.append(f"{r.ratio:.3f}" if r and r.ratio else "–")
        return " / ".join(out)

    @staticmethod
    def peak(rows: list[Row], key: str) -> str:
        values = [v for r in rows if (v := r.peak(key))]
        return f"{max(values) / GB:.1f}" if values else "–"

    def targets(self) -> list[str]:
        out = []

        def verdict(got: float | None, want: float) -> str:
            if got is None:
                return "n/a"
            return "PASS" if got >= want else f"MISS ({got / want:.2f}× target)"

        def worst(rows: list[Row | None], fn: Callable[[Row], float | None]) -> float | None:
            values = [fn(r) for r in rows if r is not None]
            return min(v for v in values if v is not None) if any(v is not None for v in values) else None

        def gbps(**kw: Any) -> float | None:
            return worst([self.find(input=i, **kw) for i in INPUTS], lambda r: r.gbps)

        def vs(op: str, dev: str, codec: str, tool: str) -> float | None:
            pairs = [
                (
                    self.find(tool="ckptz", mode="discard", device=dev, codec=codec, op=op, input=i),
                    self.find(tool=tool, mode="discard", op=op, input=i),
                )
                for i in INPUTS
            ]
            values = [a.gbps / b.gbps for a, b in pairs if a and b and a.gbps and b.gbps]
            return min(values) if values else None

        def num(x: float | None, digits: int = 2) -> str:
            return "–" if x is None else f"{x:.{digits}f}"

        for (dev, codec), (tc, td) in DISCARD_TARGETS.items():
            if dev not in self.devices:
                continue
            c = gbps(tool="ckptz", mode="discard", device=dev, codec=codec, op="compress")
            dd = gbps(tool="ckptz", mode="discard", device=dev, codec=codec, op="decompress")
            peers = [
                vs(op, dev, codec, t)
                for t in ("python-zstandard", "zipnn")
                for op in ("compress", "decompress")
            ]
            present = [p for p in peers if p is not None]
            out.append(
                f"- discarded {dev} {codec}: {num(c)} / {num(dd)} GB/s vs ≥ {tc:g} / {td:g}: {verdict(c, tc)} / {verdict(dd, td)}"
                f"; × python-zstandard {num(peers[0], 1)} / {num(peers[1], 1)}, × ZipNN {num(peers[2], 1)} / {num(peers[3], 1)} vs ≥ 5: {verdict(min(present) if present else None, 5)}"
            )
        if "cuda" in self.devices:
            shares = [
                self.pread_ratio(r)
                for op in ("compress", "decompress")
                for i in INPUTS
                if (r := self.find(tool="ckptz", mode="discard", device="cuda", codec="ans", op=op, input=i))
            ]
            least = min((x for x in shares if x is not None), default=None)
            out.append(
                f"- discarded cuda ans ÷ pread ceiling (least of both ways, both inputs): {num(least)} vs ≥ {ANS_OF_PREAD}: {verdict(least, ANS_OF_PREAD)}"
            )
        for root in ("tmpfs", "disk"):
            ceiling = self.find(tool="pwrite", root=root, mode=f"{CORES} threads")
            w = ceiling.gbps if ceiling else None
            parts = []
            for dev, codec in (c for c in CONFIGS if c[0] in self.devices):
                rows = {
                    op: [
                        self.find(
                            tool="ckptz", mode="cli -o", root=root, device=dev, codec=codec, op=op, input=i
                        )
                        for i in INPUTS
                    ]
                    for op in ("compress", "decompress")
                }
                # compress writes 1/ratio of the bytes; a restore writes them all.
                c = worst(
                    rows["compress"],
                    lambda r, w=w: r.gbps / (0.9 * w * r.ratio) if r.gbps and r.ratio and w else None,
                )
                dd = worst(rows["decompress"], lambda r, w=w: r.gbps / (0.9 * w) if r.gbps and w else None)
                parts.append(f"{dev} {codec} {num(c)} / {num(dd)}")
            out.append(
                f"- file to file {root} (W = {num(w)} GB/s), GB/s ÷ target [0.9·W·ratio / 0.9·W], ≥ 1 passes: "
                + " · ".join(parts)
            )
        gpu_vs_cpu = []
        for root in ("tmpfs", "disk"):
            for codec in ("auto", "ans"):
                for op in ("compress", "decompress"):
                    g = gbps(tool="ckptz", mode="cli -o", root=root, device="cuda", codec=codec, op=op)
                    c = gbps(tool="ckptz", mode="cli -o", root=root, device="cpu", codec="auto", op=op)
                    if g and c:
                        gpu_vs_cpu.append(f"{root} {codec} {op[0]} {g / c:.2f}")
        out.append("- GPU ÷ CPU, CLI -o (≥ 1): " + (" · ".join(gpu_vs_cpu) or "n/a"))
        s = self.find(tool="ckptz", mode="startup", device="cuda")
        c = self.find(tool="ckptz", mode="startup", device="cpu")
        out.append(
            f"- start-up ≤ 2 s: cuda {num(s.median if s else None)} s {verdict(2 / s.median if s and s.median else None, 1)}"
            f" · cpu {num(c.median if c else None)} s {verdict(2 / c.median if c and c.median else None, 1)}"
        )
        for op in ("compress", "decompress"):
            inplace = []
            for dev, codec in (c for c in CONFIGS if c[0] in self.devices):
                for inp in INPUTS:
                    common = {"tool": "ckptz", "device": dev, "codec": codec, "op": op, "input": inp}
                    a = self.find(mode="cli in-place", **common)
                    b = self.find(mode="cli -o", root="tmpfs", **common)
                    # What in place pays that -o does not: the originals removed (for a
                    # compression; a restore removes the smaller containers).
                    rm = (
                        self.find(tool="rm", mode="rm -r", root="tmpfs", input=inp)
                        if op == "compress"
                        else None
                    )
                    if a and b and a.median and b.median:
                        also = (
                            f" (÷ -o + rm -r {a.median / (b.median + rm.median):.2f})"
                            if rm and rm.median
                            else ""
                        )
                        inplace.append(f"{dev} {codec} {inp} {a.median / b.median:.2f}{also}")
            out.append(f"- in-place ÷ -o, {op}, tmpfs (≤ 1.3): " + (" · ".join(inplace) or "n/a"))
        mem = []
        for dev, codec in (c for c in CONFIGS if c[0] in self.devices):
            rows = [
                r
                for r in self.rows
                if r.tool == "ckptz" and r.input == "single" and r.device == dev and r.codec == codec
            ]
            rss = [v for r in rows if (v := r.peak("peak_rss"))]
            if rss:
                mem.append(f"{dev} {codec} {max(rss) / GB:.1f} GB")
        out.append(
            f"- peak RSS on the single file (--memory {self.args.memory or 'unset'}): "
            + (" · ".join(mem) or "n/a")
        )
        checked = [r for r in self.rows if r.roundtrip]
        bad = [r.key for r in checked if r.roundtrip != "ok"]
        out.append(
            f"- round trips checked: {len(checked)}, "
            + ("all byte-exact" if not bad else "MISMATCH: " + ", ".join(bad))
        )
        return out

    def cleanup(self) -> None:
        if self.gpu is not None:
            self.gpu.close()
        for root in (self.tmpfs, self.disk):
            remove(root / "work")
            if not self.args.keep:
                remove(root / "data")
                remove(root / MARKER)
                with contextlib.suppress(OSError):
                    root.rmdir()


def parse_size(text: str) -> int:
    units = {
        "": 1,
        "B": 1,
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
        "KIB": 1 << 10,
        "MIB": 1 << 20,
        "GIB": 1 << 30,
    }
    text = text.strip().upper()
    number = text.rstrip("KMGIB")
    return int(float(number) * units[text[len(number) :]])


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--small", action="store_true", help="tiny scale for a CPU machine (~50 MB of data)")
    ap.add_argument("--size-gb", type=float, help="mixed folder size (default 5; 0.025 with --small)")
    ap.add_argument("--single-gb", type=float, help="single file size (default 8; 0.02 with --small)")
    ap.add_argument(
        "--ceiling-gb",
        type=float,
        help="bytes written per ceiling measurement (default 2; 0.064 with --small)",
    )
    ap.add_argument(
        "--tmpfs",
        type=Path,
        default=Path("/dev/shm/ckptz-e2e"),
        help="memory-backed root (default /dev/shm/ckptz-e2e)",
    )
    ap.add_argument("--disk", type=Path, help="disk root (default: $HOME, /var/tmp or /tmp, on a real disk)")
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs per row where the budget allows; the median is reported (default 3)",
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=480,
        help="seconds from start after which rows are skipped (default 480)",
    )
    ap.add_argument("--devices", default="cpu,cuda", help="comma list of ckptz devices (default cpu,cuda)")
    ap.add_argument("--only", help="comma list of row groups: " + ",".join(GROUPS))
    ap.add_argument("--memory", default="4GiB", help="ckptz --memory budget where supported ('' for none)")
    ap.add_argument("--json", type=Path, help="results file (default $OUT/e2e.json, else bench/out/e2e.json)")
    ap.add_argument("--commit", help="commit to record when git is not available")
    ap.add_argument("--seed", type=int, default=0, help="data generator seed (default 0)")
    ap.add_argument("--keep", action="store_true", help="keep the generated data")
    a = ap.parse_args(argv)
    a.size_gb = a.size_gb if a.size_gb is not None else 0.025 if a.small else 5.0
    a.single_gb = a.single_gb if a.single_gb is not None else 0.02 if a.small else 8.0
    a.ceiling_gb = a.ceiling_gb if a.ceiling_gb is not None else 0.064 if a.small else 2.0
    a.memory_bytes = parse_size(a.memory) if a.memory else None
    if a.json is None:
        a.json = (
            Path(os.environ["OUT"], "e2e.json")
            if os.environ.get("OUT")
            else ROOT / "bench" / "out" / "e2e.json"
        )
    if a.only and (bad := set(a.only.split(",")) - set(GROUPS)):
        ap.error(f"unknown groups {sorted(bad)}; choose from {', '.join(GROUPS)}")
    return a


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        CHILDREN[argv[1]](json.loads(argv[2]))
        return 0
    bench = Bench(parse_args(argv))
    rc = 0
    try:
        bench.setup()
        bench.schedule(bench.plan())
    except (Exception, KeyboardInterrupt) as e:
        bench.log(f"stopped: {e!r}")
        bench.meta["error"] = repr(e)
        rc = 1
    finally:
        bench.meta["seconds"] = time.time() - bench.start
        bench.save()
        bench.cleanup()
    print(bench.report(), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
