"""The GPU engine's native planes (nvCOMP driven from C) against its Python pipeline, A/B.

Makes a checkpoint of trained-like fp32 and bf16 tensors (``--gib`` of them, half each) in
``--dir``. Compresses it on the GPU with ``ans`` and with the portable default, each through
the native plane and through the Python pipeline (writes discarded, and to a file; the two
containers must be byte for byte the same), and restores each container with each path,
writes discarded and to a file beside it: the median of ``--repeat`` runs (after one that
warms the page cache), in GB/s of original bytes.

Paths: ``python loop`` (the GPU engine's span pipeline), ``native gpu`` (the native plane,
nvCOMP decoding ``ans`` and ``zstd`` chunks), ``native gpu, zstd on cpu`` (nvCOMP decoding
``ans`` only), and ``cpu plane`` (the CPU engine, portable containers only).

    python bench/gpu_planes.py [--gib 2] [--repeat 3] [--dir /dev/shm]
"""

from __future__ import annotations

import argparse
import filecmp
import functools
import importlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ckptz import api
from ckptz.codecs.table import ANS, ZSTD
from ckptz.container import read_index
from ckptz.engines import Engine
from ckptz.engines.cpu import CpuEngine
from ckptz.engines.gpu import open_gpu_engine
from ckptz.pipeline import native_compress, native_restore
from ckptz.pipeline.restore import DiscardSink, FileSink, restore

#: The module (``ckptz.pipeline`` exports a function of its name).
restore_module = importlib.import_module("ckptz.pipeline.restore")
#: The bitstreams whose GPU compressions take the plane by default.
DEFAULT_PLANE = native_compress.GPU_PLANE


def make(root: Path, gib: float) -> Path:
    """A safetensors file of trained-like fp32 and bf16 weights, ``gib`` GiB in all (made on
    the GPU where there is one: much faster than the CPU's generator)."""
    import torch
    from safetensors.torch import save_file

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=device).manual_seed(0)
    total, per, n = int(gib * (1 << 30)), 256 << 20, 0
    tensors: dict[str, torch.Tensor] = {}
    while n * per < total:
        shape = (per // 4 if n % 2 == 0 else per // 2,)
        t = torch.randn(shape, generator=g, device=device) * 0.02
        tensors[f"layer{n}.weight"] = (t if n % 2 == 0 else t.to(torch.bfloat16)).cpu()
        n += 1
    path = root / "model.safetensors"
    save_file(tensors, str(path))
    return path


def once(container: Path, out: Path | None, engine: Engine) -> float:
    """Seconds for one restore (to ``out``, or discarded)."""
    start = time.perf_counter()
    with open(container, "rb") as c:
        if out is None:
            restore(c, "m", engine, DiscardSink())
        else:
            index = read_index(c, "m")
            with open(out, "wb+") as f:
                f.truncate(index.source_size)
                restore(c, "m", engine, FileSink(f, index.source_size), index=index)
    return time.perf_counter() - start


def compress_once(src: Path, out: Path | None, codec: str) -> float:
    """Seconds for one compression on the GPU (to ``out``, or discarded)."""
    start = time.perf_counter()
    if out is None:
        api.compress(src, device="cuda", codec=codec, discard=True)
    else:
        api.compress(src, out, device="cuda", codec=codec, force=True)
    return time.perf_counter() - start


def timed(
    label: str, run: Callable[[], float], size: int, repeat: int, totals: Callable[[], tuple[int, int, int]]
) -> tuple[str, bool]:
    """``label``'s row: GB/s of ``size`` bytes over the median of ``repeat`` timed runs (after
    one that warms the page cache, the pinned pools and the kernels), and the chunks a native
    plane's GPU ``totals`` counted meanwhile; or the error of a path that failed, so the
    others are still measured. Printed as it comes; and whether it ran."""
    before = totals()[1]
    try:
        run()
        took = statistics.median(run() for _ in range(repeat))
    except Exception as exc:  # one path failing still measures the others
        row, ok = f"{label} failed: {type(exc).__name__}: {exc}", False
    else:
        on_gpu = totals()[1] - before
        row = (
            f"{label} {size / took / 1e9:6.2f} GB/s  ({took:.3f} s, {on_gpu} chunks via the native GPU plane)"
        )
        ok = True
    print(row, flush=True)
    return row, ok


def compress_rows(src: Path, root: Path, repeat: int) -> list[str]:
    """Each bitstream's compression through each path, discarded and to a file."""
    rows = []
    size = src.stat().st_size
    for codec in ("ans", "zstd"):
        made = {}
        for sink in ("discard", "file"):
            for name, plane in (("python pipeline", False), ("native gpu", True)):
                native_compress.GPU_PLANE = frozenset({ANS.id, ZSTD.id} if plane else ())
                out = None if sink == "discard" else root / f"compressed-{plane}.ckptz"
                label = f"{codec:5s} compress {sink:8s} {name:24s}"
                run = functools.partial(compress_once, src, out, codec)
                row, ok = timed(label, run, size, repeat, native_compress.gpu_totals)
                rows.append(row)
                if ok and out is not None:
                    made[plane] = out.read_bytes()
        native_compress.GPU_PLANE = DEFAULT_PLANE
        same = len(made) == 2 and made[True] == made[False]
        rows.append(f"{codec:5s} containers of the two paths byte-identical: {same}")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/dev/shm") if os.path.isdir("/dev/shm") else None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        src = make(root, args.gib)
        size = src.stat().st_size
        rows += compress_rows(src, root, args.repeat)
        containers = {}
        for codec in ("ans", "zstd"):
            containers[codec] = root / f"{codec}.ckptz"
            api.compress(src, containers[codec], device="cuda", codec=codec)
        gpu = {codec: open_gpu_engine("cuda", codec=codec) for codec in containers}
        cpu = CpuEngine(os.cpu_count() or 1)
        for codec, container in containers.items():
            paths: list[tuple[str, Engine, bool, bool]] = [
                ("python loop", gpu[codec], False, True),
                ("native gpu", gpu[codec], True, True),
                ("native gpu, zstd on cpu", gpu[codec], True, False),
            ]
            if codec == "zstd":
                paths.append(("cpu plane", cpu, True, True))
            for sink in ("discard", "file"):
                out = None if sink == "discard" else root / "restored"
                for name, engine, native_gpu, zstd_on_gpu in paths:
                    restore_module.NATIVE_GPU, restore_module.NATIVE_GPU_ZSTD = native_gpu, zstd_on_gpu
                    label = f"{codec:5s} {sink:8s} {name:24s}"
                    run = functools.partial(once, container, out, engine)
                    row, ok = timed(label, run, size, args.repeat, native_restore.gpu_totals)
                    rows.append(row)
                    if ok and out is not None:
                        assert filecmp.cmp(out, src, shallow=False), f"{name}: not byte-exact"
        for engine in gpu.values():
            engine.close()
        sizes = ", ".join(f"{c} {p.stat().st_size / 1e9:.2f} GB" for c, p in containers.items())
    print(f"\n{size / 1e9:.2f} GB, containers: {sizes}")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
