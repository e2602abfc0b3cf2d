"""Where the native planes spend their time: each step's share of their threads' time.

Makes an optimizer-like file (fp32 first and second moments, ``--mib`` of them; ``--gib`` on
a large host) in ``--dir``, then compresses and restores it through the native planes, writes
discarded and to a file beside it: on the CPU (the portable bitstream) and, where a GPU
exists, on the GPU with ``ans`` and ``zstd`` (its compress plane switched on as
``bench/gpu_planes.py`` does). For each run, the median of ``--repeat`` (after one that warms
the page cache), and a table of that run's plane steps, from its threads' own clocks
(:mod:`ckptz.pipeline.plane_stages`): seconds summed over threads, share of the native
call's wall time times its threads, and GB/s of the file through that step on one thread;
then how much of their time the threads were on a CPU (on a shared machine, the rest they
waited for a core) and the CPU seconds per GB, the steadier measure there. Last,
``bench/cpu_scaling.py``'s bare loop (pread, xxh3, code a frame, no pipeline) on the same
file, frames and threads, with the CPU engine's options (as the plane codes) and with plain
level 3, beside the CPU plane's native call.

Run it with ``PYTHONPATH=.`` from the repository's root.

    python bench/plane_stages.py [--mib 512] [--threads N] [--repeat 3] [--dir /dev/shm]
    python bench/plane_stages.py --gib 8 [--device cpu cuda]     # on the 16-core GPU host
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from cpu_scaling import STAGES, _frames, loop

from ckptz import api
from ckptz.codecs.frames import EncodeOptions
from ckptz.codecs.table import ANS, ZSTD
from ckptz.container import read_index
from ckptz.engines import Engine
from ckptz.engines.cpu import CpuEngine
from ckptz.pipeline import native_compress, plane_stages
from ckptz.pipeline.compress import compress_file
from ckptz.pipeline.restore import DiscardSink, FileSink, restore

#: The bitstreams whose GPU compressions take the plane by default.
DEFAULT_PLANE = native_compress.GPU_PLANE


def make(root: Path, size: int) -> Path:
    """An optimizer state of ``size`` bytes of fp32 moments, as ``torch.save`` writes it
    (made on the GPU where there is one: much faster than the CPU's generator)."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=device).manual_seed(0)
    per = 32 << 20  # bytes of one tensor
    state: dict[int, dict[str, torch.Tensor]] = {}
    for n in range(max(1, size // (2 * per))):
        grad = torch.randn(per // 4, generator=g, device=device) * 1e-3
        state[n] = {
            "step": torch.tensor(1000.0),
            "exp_avg": (grad * 0.1).cpu(),
            "exp_avg_sq": (grad * grad * 1e-3).cpu(),
        }
    path = root / "optimizer.pt"
    torch.save({"state": state, "param_groups": [{"lr": 1e-4, "params": list(state)}]}, path)
    return path


def timed(run: Callable[[], object], plane: str, repeat: int) -> tuple[float, plane_stages.PlaneTotals]:
    """The median of ``repeat`` runs (after one that warms up): its seconds, and what the
    ``plane``'s threads reported in it."""
    run()
    runs = []
    for _ in range(repeat):
        before = plane_stages.totals(plane)
        start = time.perf_counter()
        run()
        runs.append((time.perf_counter() - start, plane_stages.totals(plane).since(before)))
    runs.sort(key=lambda r: r[0])
    return runs[len(runs) // 2]


def show(label: str, size: int, seconds: float, spent: plane_stages.PlaneTotals) -> tuple[float, float]:
    """Print a run's row and its steps' table; the GB/s of its native calls (bytes over
    their wall time) and their threads' CPU seconds per GB."""
    wall = spent.wall_ns / 1e9
    native = size / wall / 1e9 if wall else 0.0
    cpu = spent.cpu_ns.get(plane_stages.CPU, 0) / 1e9 / (size / 1e9)
    print(f"\n{label}: {size / seconds / 1e9:6.2f} GB/s end to end ({seconds:.3f} s),", end=" ")
    print(f"native calls {native:6.2f} GB/s ({wall:.3f} s in {spent.calls})")
    print(f"  {'step':<22} {'s':>8} {'share':>7} {'GB/s/thread':>12} {'count':>8}")
    for role in (plane_stages.CPU, plane_stages.GPU):
        capacity = spent.capacity_ns.get(role, 0)
        if not capacity:
            continue
        rows = sorted(((k[1], v) for k, v in spent.ns.items() if k[0] == role), key=lambda kv: -kv[1])
        for name, ns in rows:
            rate = size / ns if ns else float("inf")
            shown = name if role == plane_stages.CPU else f"{role}: {name}"
            print(
                f"  {shown:<22} {ns / 1e9:8.3f} {100 * ns / capacity:6.1f}% {rate:12.2f} {spent.counts[role, name]:8d}"
            )
        outside = capacity - sum(v for k, v in spent.ns.items() if k[0] == role)
        print(f"  {'(not running)':<22} {outside / 1e9:8.3f} {100 * outside / capacity:6.1f}%")
        on_cpu = spent.cpu_ns.get(role, 0)
        print(f"  {role}s on a CPU {on_cpu / 1e9:.3f} s, {100 * on_cpu / capacity:.1f}% of their time")
    print(f"  {cpu:.3f} CPU s/GB (the plane's threads)")
    return native, cpu


def compress_run(src: Path, out: Path | None, device: str, codec: str, threads: int) -> None:
    if device == "cpu":
        with open(out, "wb") if out is not None else _nothing() as f:
            compress_file(src, src.name, f, CpuEngine(threads))
    elif out is None:
        api.compress(src, device=device, codec=codec, discard=True)
    else:
        api.compress(src, out, device=device, codec=codec, force=True)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        pass


def restore_run(container: Path, out: Path | None, engine: Engine) -> None:
    with open(container, "rb") as c:
        if out is None:
            restore(c, "m", engine, DiscardSink())
            return
        index = read_index(c, "m")
        with open(out, "wb+") as f:
            f.truncate(index.source_size)
            restore(c, "m", engine, FileSink(f, index.source_size), index=index)


def frame_length(container: Path) -> int:
    """The most common frame length of a container (the bare loop codes frames of it)."""
    with open(container, "rb") as c:
        lengths = read_index(c, "m").frames["length"]
    values, counts = np.unique(lengths, return_counts=True)
    return int(values[np.argmax(counts)])


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def bare_loop(
    src: Path, frame: int, threads: int, repeat: int, options: EncodeOptions | None
) -> list[tuple[float, float]]:
    """cpu_scaling.py's bare loop on ``src`` (coding with ``options``; None: the CPU
    engine's): GB/s of each of its stages (the median of ``repeat`` runs), and CPU s/GB."""
    fd = os.open(src, os.O_RDONLY)
    try:
        frames = _frames(os.fstat(fd).st_size, frame, 4)
        coded = sum(n for _, n in frames) / 1e9
        rows = []
        for stage in range(len(STAGES)):
            loop(fd, frames, threads, stage, "float32", options)
            cpu = _cpu()
            rates = [loop(fd, frames, threads, stage, "float32", options) for _ in range(repeat)]
            rows.append((statistics.median(rates), (_cpu() - cpu) / repeat / coded))
        return rows
    finally:
        os.close(fd)


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512, help="the file's size, MiB")
    parser.add_argument("--gib", type=float, default=None, help="the file's size, GiB (wins over --mib)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--device", nargs="+", default=["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    )
    parser.add_argument("--dir", type=Path, default=Path("/dev/shm") if os.path.isdir("/dev/shm") else None)
    args = parser.parse_args()
    size_wanted = int(args.gib * (1 << 30)) if args.gib else args.mib << 20
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, {args.threads} threads")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        src = make(root, size_wanted)
        size = src.stat().st_size
        print(f"{size / 1e9:.2f} GB optimizer state in {root}")
        cpu_rate = cpu_cost = 0.0
        container_frame = 0
        for device in args.device:
            for codec in ("zstd",) if device == "cpu" else ("ans", "zstd"):
                native_compress.GPU_PLANE = frozenset({ANS.id, ZSTD.id}) if device != "cpu" else DEFAULT_PLANE
                container = root / f"{device}-{codec}.ckptz"
                for sink, out in (("discard", None), ("file", container)):
                    run = functools.partial(compress_run, src, out, device, codec, args.threads)
                    seconds, spent = timed(run, "compress", args.repeat)
                    rate, cost = show(f"{device} {codec} compress, {sink}", size, seconds, spent)
                    if device == "cpu" and sink == "discard":
                        cpu_rate, cpu_cost = rate, cost
                native_compress.GPU_PLANE = DEFAULT_PLANE
                if device == "cpu":
                    engine: Engine = CpuEngine(args.threads)
                    container_frame = frame_length(container)
                else:
                    from ckptz.engines.gpu import open_gpu_engine

                    engine = open_gpu_engine(device, codec=codec)
                restored = root / "restored"
                for sink, target in (("discard", None), ("file", restored)):
                    run = functools.partial(restore_run, container, target, engine)
                    seconds, spent = timed(run, "restore", args.repeat)
                    show(f"{device} {codec} restore, {sink}", size, seconds, spent)
                if restored.read_bytes() != src.read_bytes():
                    raise SystemExit(f"{device} {codec}: the restore is not byte-exact")
                close = getattr(engine, "close", None)
                if close is not None:
                    close()
        if "cpu" in args.device and container_frame:
            for what, options in (
                ("the CPU engine's options", None),
                ("plain level 3", EncodeOptions(level=3)),
            ):
                rows = bare_loop(src, container_frame, args.threads, args.repeat, options)
                print(f"\nbare loop (bench/cpu_scaling.py), {what}, {container_frame >> 20} MiB frames:")
                for name, (rate, cost) in zip(STAGES, rows, strict=True):
                    print(f"  {name:<20} {rate:6.2f} GB/s  {cost:.3f} CPU s/GB")
                rate, cost = rows[-1]
                print(f"cpu plane's native compress call, writes discarded: {cpu_rate:.2f} GB/s,", end=" ")
                print(
                    f"{cpu_rate / rate:.2f}x its GB/s; {cpu_cost:.3f} CPU s/GB, {cpu_cost / cost:.2f}x its CPU"
                )
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
