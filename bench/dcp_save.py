"""DCP save and load of a GPU-resident training state: ckptz's writer against torch's (issue 16).

On the H100 host (one process, about 8 minutes at the defaults; JSON to ``$OUT/dcp_save.json``)::

    PYTHONPATH=. python3 bench/dcp_save.py --dir /var/tmp/ckptz-dcp --budget-s 500

On a CPU-only machine (~40 MB of state, well under a minute)::

    PYTHONPATH=. python bench/dcp_save.py --small

1. Builds a mixed-precision state of at least ``--size-gb`` GB on the GPU (on the CPU where
   there is none): a Llama-shaped model's bf16 weights, and AdamW state per parameter (fp32
   master weights ~N(0, 0.02), ``exp_avg`` ~N(0, s) with a log-normal scale s ~1e-4 per
   tensor, ``exp_avg_sq`` accumulated from four squared gradients, zero rows for the 5% of the
   vocabulary never seen), 14 bytes per parameter.
2. For each writer, in one process: ``dcp.save`` (``sync_files`` on, as by default), the
   bytes it left on disk, ``dcp.load`` with the matching reader into a GPU-resident copy of
   the state after dropping the files from the page cache (``posix_fadvise(DONTNEED)``; the
   first load is also checked tensor for tensor), and ``dcp.async_save``: the stall (until it
   returns) and the time until its future is done. Writers: ``plain`` (``FileSystemWriter``),
   ``zstd`` (``FileSystemWriter(_extensions=[ZStandard()])``), ``ckptz-cuda-ans``,
   ``ckptz-cuda-auto`` and ``ckptz-cpu`` (``CompressedWriter`` with that device and codec,
   read back by ``CompressedReader`` on the same device).
3. Every writer first saves and loads a small state untimed (kernels compiled, pinned
   buffers made). Further repeats (``--repeats``, medians reported) run in later passes while
   ``--budget-s`` allows; a writer whose pass would not fit is recorded as skipped with the
   reason, as is one that cannot run here (no GPU, no zstandard) or that fails (its error
   recorded). The budget is checked between steps: one step is never interrupted.
4. Writes the JSON after every step and prints a markdown table and the issue's goals last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GB = 1e9
BYTES_PER_PARAM = 14  # bf16 weight + fp32 master, exp_avg, exp_avg_sq
WRITERS = ("plain", "zstd", "ckptz-cuda-ans", "ckptz-cpu", "ckptz-cuda-auto")


class Skip(Exception):
    """A writer that cannot run here; the message says why."""


# -- the state ----------------------------------------------------------------------------


def _shapes(nbytes: int) -> list[tuple[str, tuple[int, ...]]]:
    """A Llama-shaped model of at least ``nbytes / BYTES_PER_PARAM`` parameters (the e2e
    benchmark's shapes)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from e2e import _dims
    from e2e import _shapes as llama_shapes

    return llama_shapes(_dims(nbytes, BYTES_PER_PARAM))


def make_state(nbytes: int, device: str, seed: int) -> dict[str, Any]:
    """The model and AdamW state of step 1000, every tensor on ``device``."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    model: dict[str, Any] = {}
    optim: dict[str, Any] = {}
    for name, shape in _shapes(nbytes):

        def randn(scale: float, shape: tuple[int, ...] = shape) -> Any:
            return torch.randn(shape, generator=gen, device=device).mul_(scale)

        master = randn(0.02).add_(1.0) if len(shape) == 1 else randn(0.02)
        scale = 1e-4 * math.exp(0.5 * torch.randn((), generator=gen, device=device).item())
        exp_avg, exp_avg_sq = randn(scale), torch.zeros(shape, device=device)
        for _ in range(4):
            g = randn(scale)
            exp_avg_sq.mul_(0.999).addcmul_(g, g, value=0.001)
        if "embed_tokens" in name or "lm_head" in name:
            exp_avg[shape[0] - shape[0] // 20 :] = 0
            exp_avg_sq[shape[0] - shape[0] // 20 :] = 0
        model[name] = master.to(torch.bfloat16)
        optim[name] = {
            "step": torch.tensor(1000.0),
            "exp_avg": exp_avg,
            "exp_avg_sq": exp_avg_sq,
            "master_weight": master,
        }
    groups = [{"lr": 3e-5, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01, "params": list(model)}]
    return {"model": model, "optim": {"state": optim, "param_groups": groups}, "step": 1000}


def _map(state: dict[str, Any], fn: Callable[[Any], Any]) -> dict[str, Any]:
    return {k: _map(v, fn) if isinstance(v, dict) else fn(v) for k, v in state.items()}


def _tensors(state: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    import torch

    out = []
    for k, v in state.items():
        if isinstance(v, dict):
            out += _tensors(v, f"{prefix}{k}.")
        elif isinstance(v, torch.Tensor):
            out.append((prefix + k, v))
    return out


def blank_like(state: dict[str, Any]) -> dict[str, Any]:
    """Same structure, tensors allocated (and overwritten with a pattern) on the same device."""
    import torch

    return _map(state, lambda v: torch.full_like(v, 7) if isinstance(v, torch.Tensor) else v)


def mismatches(got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    import torch

    have = dict(_tensors(got))
    return [k for k, v in _tensors(want) if k not in have or not torch.equal(have[k], v)]


# -- writers ------------------------------------------------------------------------------


def _gpu_reason() -> str | None:
    from ckptz.engines import gpu_unavailable_reason

    return gpu_unavailable_reason()


def storage(name: str, path: Path) -> tuple[Any, Callable[[], Any]]:
    """The writer for ``path`` and a maker of the matching reader; :class:`Skip` if none here."""
    import torch.distributed.checkpoint as dcp

    if name in ("plain", "zstd"):
        ext = []
        if name == "zstd":
            try:
                from torch.distributed.checkpoint._extension import ZStandard
            except ImportError as exc:
                raise Skip(f"this torch has no DCP ZStandard extension ({exc})") from None
            if not ZStandard.is_available():
                raise Skip("DCP's ZStandard needs zstandard or pyzstd installed")
            ext = [ZStandard()]
        writer = dcp.FileSystemWriter(path, _extensions=ext) if ext else dcp.FileSystemWriter(path)
        return writer, lambda: dcp.FileSystemReader(path)
    from ckptz.dcp import CompressedReader, CompressedWriter

    _, device, *rest = name.split("-")
    codec = rest[0] if rest else "auto"
    if device == "cuda" and (reason := _gpu_reason()) is not None:
        raise Skip(f"no GPU engine here: {reason}")
    # The reader decodes each file into a temporary one beside the checkpoint: the same file
    # system as the plain reader reads from, whatever /tmp is.
    return (
        CompressedWriter(path, device=device, codec=codec),
        lambda: CompressedReader(path, device=device, tmp_dir=path.parent),
    )


# -- measuring ----------------------------------------------------------------------------


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def files(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()] if path.exists() else []


def drop_cache(path: Path) -> None:
    """Write back, then drop ``path``'s files from the page cache (reads then come from disk)."""
    os.sync()
    for p in files(path):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(step: Callable[[], Any]) -> float:
    _sync()
    t = time.perf_counter()
    step()
    _sync()
    return time.perf_counter() - t


@dataclass
class Row:
    writer: str
    status: str = "pending"
    reason: str = ""
    save_s: list[float] = field(default_factory=list)
    load_s: list[float] = field(default_factory=list)
    async_stall_s: list[float] = field(default_factory=list)
    async_total_s: list[float] = field(default_factory=list)
    bytes: int | None = None
    files: int | None = None
    roundtrip: str = "not checked"
    pass_s: list[float] = field(default_factory=list)

    def median(self, key: str) -> float | None:
        values = getattr(self, key)
        return statistics.median(values) if values else None

    def to_json(self, state_bytes: int) -> dict[str, Any]:
        keys = ("save_s", "load_s", "async_stall_s", "async_total_s")
        return {
            **{k: v for k, v in vars(self).items() if k != "pass_s"},
            **{f"{k}_median": self.median(k) for k in keys},
            "ratio": state_bytes / self.bytes if self.bytes else None,
        }


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.start = time.monotonic()
        self.rows = {w: Row(w) for w in args.writers}
        self.meta: dict[str, Any] = {}
        self.state_bytes = 0

    def left(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.start)

    def log(self, text: str) -> None:
        print(f"[{time.monotonic() - self.start:7.1f}s] {text}", file=sys.stderr, flush=True)

    def save_json(self) -> None:
        doc = {
            "meta": self.meta,
            "state_bytes": self.state_bytes,
            "rows": [r.to_json(self.state_bytes) for r in self.rows.values()],
            "goals": self.goals(),
        }
        self.args.json.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.args.json.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(self.args.json)

    def collect_meta(self, device: str) -> None:
        import torch

        from ckptz._version import __version__

        git = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        self.meta = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "commit": git.stdout.strip() or None,
            "ckptz": __version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "state_device": device,
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            "dir": str(self.args.dir),
            "fs": _fs_type(self.args.dir),
            "args": {k: str(v) for k, v in vars(self.args).items()},
        }

    def run(self) -> None:
        import torch
        import torch.distributed as dist

        device = self.args.state_device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.collect_meta(device)
        self.args.dir.mkdir(parents=True, exist_ok=True)
        store = tempfile.mkdtemp(prefix="ckptz-dcp-store-")
        # One rank over gloo: async_save needs a process group.
        dist.init_process_group("gloo", store=dist.FileStore(f"{store}/store", 1), rank=0, world_size=1)
        try:
            self.log(f"building a {self.args.size_gb:g} GB state on {device} …")
            t = time.perf_counter()
            state = make_state(int(self.args.size_gb * GB), device, self.args.seed)
            _sync()
            self.state_bytes = sum(v.numel() * v.element_size() for _, v in _tensors(state))
            self.meta["state_build_s"] = time.perf_counter() - t
            self.log(f"state: {self.state_bytes / GB:.2f} GB in {len(_tensors(state))} tensors")
            warm = make_state(8_000_000, device, self.args.seed + 1)
            target = blank_like(state)
            for n in range(self.args.repeats):
                for row in self.rows.values():
                    if row.status in ("skipped", "failed"):
                        continue
                    self.one_pass(row, n, state, target, warm)
                    self.save_json()
        finally:
            dist.destroy_process_group()
            shutil.rmtree(store, ignore_errors=True)
        self.save_json()

    def one_pass(
        self, row: Row, n: int, state: dict[str, Any], target: dict[str, Any], warm: dict[str, Any]
    ) -> None:
        import torch.distributed.checkpoint as dcp

        need = max((p for r in self.rows.values() for p in r.pass_s), default=0.0)
        need = max(row.pass_s, default=need)
        if need > self.left():
            if n == 0:
                row.status, row.reason = "skipped", f"budget: ~{need:.0f} s needed, {self.left():.0f} s left"
            self.log(f"{row.writer}: pass {n + 1} does not fit the budget")
            return
        where = self.args.dir / f"dcp-{row.writer}"
        began = time.monotonic()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if n == 0:  # untimed: kernels, pinned buffers and threads come up
                    shutil.rmtree(where, ignore_errors=True)
                    writer, reader = storage(row.writer, where / "warm")
                    dcp.save(warm, storage_writer=writer)
                    dcp.load(blank_like(warm), storage_reader=reader())
                    shutil.rmtree(where, ignore_errors=True)
                path = where / "sync"
                writer, reader = storage(row.writer, path)
                row.save_s.append(timed(lambda: dcp.save(state, storage_writer=writer)))
                row.bytes = sum(p.stat().st_size for p in files(path))
                row.files = len(files(path))
                self.log(f"{row.writer}: save {row.save_s[-1]:.2f} s, {row.bytes / GB:.3f} GB")
                self.save_json()
                drop_cache(path)
                row.load_s.append(timed(lambda: dcp.load(target, storage_reader=reader())))
                if n == 0:
                    bad = mismatches(target, state)
                    row.roundtrip = "ok" if not bad else f"{len(bad)} tensors differ, e.g. {bad[0]}"
                self.log(f"{row.writer}: load {row.load_s[-1]:.2f} s, round trip {row.roundtrip}")
                shutil.rmtree(path)
                if not self.args.no_async:
                    self.async_save(row, where / "async", state)
                    shutil.rmtree(where / "async", ignore_errors=True)
            row.status = "ok"
        except Skip as exc:
            row.status, row.reason = "skipped", str(exc)
            self.log(f"{row.writer}: skipped: {exc}")
        except Exception as exc:
            row.status, row.reason = "failed", f"{type(exc).__name__}: {exc}"
            row.reason += "\n" + traceback.format_exc()[-3000:]
            self.log(f"{row.writer}: FAILED: {type(exc).__name__}: {exc}")
        finally:
            shutil.rmtree(where, ignore_errors=True)
            row.pass_s.append(time.monotonic() - began)

    def async_save(self, row: Row, path: Path, state: dict[str, Any]) -> None:
        import torch.distributed.checkpoint as dcp

        writer, _ = storage(row.writer, path)
        _sync()
        t = time.perf_counter()
        future = dcp.async_save(state, storage_writer=writer)
        stall = time.perf_counter() - t
        # An AsyncSaveResponse where the stager stages asynchronously: wait for the upload.
        done: Any = getattr(future, "upload_completion", future)
        done.result()
        total = time.perf_counter() - t
        row.async_stall_s.append(stall)
        row.async_total_s.append(total)
        self.log(f"{row.writer}: async_save stall {stall:.2f} s, done after {total:.2f} s")

    def goals(self) -> dict[str, Any]:
        """The issue's goals for each ckptz writer that ran, against plain and zstd."""
        plain, zstd = self.rows.get("plain"), self.rows.get("zstd")
        out: dict[str, Any] = {}
        for r in self.rows.values():
            if not r.writer.startswith("ckptz") or not r.save_s:
                continue
            g: dict[str, Any] = {}
            if zstd and zstd.bytes and r.bytes:
                g["bytes <= 0.9 x zstd"] = {"value": r.bytes / zstd.bytes, "met": r.bytes <= 0.9 * zstd.bytes}
            for key, label in (("save_s", "save"), ("load_s", "load")):
                mine, theirs = r.median(key), plain.median(key) if plain else None
                if mine and theirs:
                    g[f"{label} <= plain"] = {"value": mine / theirs, "met": mine <= theirs}
            mine, theirs = r.median("save_s"), zstd.median("save_s") if zstd else None
            if mine and theirs:
                g["save >= 5x faster than zstd"] = {"value": theirs / mine, "met": theirs >= 5 * mine}
            out[r.writer] = g
        return out

    def table(self) -> str:
        def s(v: float | None) -> str:
            return "–" if v is None else f"{v:.2f}"

        lines = [
            f"DCP, {self.state_bytes / GB:.2f} GB state on {self.meta.get('state_device')}"
            f" ({self.meta.get('gpu') or 'no GPU'}), files on {self.meta.get('fs')} ({self.args.dir});"
            " medians, seconds",
            "",
            "| writer | save | async stall | async done | load | GB on disk | ratio | round trip | status |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in self.rows.values():
            ratio = f"{self.state_bytes / r.bytes:.3f}" if r.bytes else "–"
            size = f"{r.bytes / GB:.3f}" if r.bytes else "–"
            status = (
                r.status
                if r.status == "ok"
                else f"{r.status}: {r.reason.splitlines()[0] if r.reason else ''}"
            )
            lines.append(
                f"| {r.writer} | {s(r.median('save_s'))} | {s(r.median('async_stall_s'))} |"
                f" {s(r.median('async_total_s'))} | {s(r.median('load_s'))} | {size} | {ratio} |"
                f" {r.roundtrip} | {status} |"
            )
        for writer, goals in self.goals().items():
            for name, g in goals.items():
                lines.append(f"- {writer}: {name}: {g['value']:.3f} ({'met' if g['met'] else 'missed'})")
        return "\n".join(lines)


def _fs_type(path: Path) -> str:
    """The file system type of the mount holding ``path`` (longest prefix in /proc/mounts)."""
    path = path.resolve()
    best, kind = "", "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            mount, fs = line.split()[1].replace("\\040", " "), line.split()[2]
            if (str(path) == mount or str(path).startswith(mount.rstrip("/") + "/")) and len(mount) >= len(
                best
            ):
                best, kind = mount, fs
    return kind


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "bench" / "out"
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--size-gb", type=float, default=5.5, help="state size (default 5.5)")
    p.add_argument("--small", action="store_true", help="a 40 MB state: a smoke run on any machine")
    p.add_argument("--dir", type=Path, help="where checkpoints go (default: a new folder in /var/tmp)")
    p.add_argument(
        "--writers", default=",".join(WRITERS), help=f"comma-separated subset of {','.join(WRITERS)}"
    )
    p.add_argument("--repeats", type=int, default=2, help="passes over the writers (medians reported)")
    p.add_argument("--budget-s", type=float, default=500, help="no pass starts that would end past this")
    p.add_argument("--no-async", action="store_true", help="skip the async_save rows")
    p.add_argument("--state-device", help="cuda or cpu (default: cuda where there is one)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=out / "dcp_save.json")
    args = p.parse_args(argv)
    if args.small:
        args.size_gb = min(args.size_gb, 0.04)
    args.writers = [w.strip() for w in args.writers.split(",") if w.strip()]
    unknown = set(args.writers) - set(WRITERS)
    if unknown:
        p.error(f"unknown writers: {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    made = args.dir is None
    if made:
        args.dir = Path(
            tempfile.mkdtemp(prefix="ckptz-dcp-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
        )
    bench = Bench(args)
    try:
        bench.run()
    finally:
        if made:
            shutil.rmtree(args.dir, ignore_errors=True)
        print(bench.table(), flush=True)
        print(f"\nJSON: {args.json}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
