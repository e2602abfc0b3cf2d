"""Issue 15's benchmark: loading and saving a checkpoint from Python, ckptz against torch.

One command, on the GPU machine (or ``--small`` on a CPU one):

    PYTHONPATH=. python3 bench/load.py [--size-gb 5] [--repeats 3]

It writes an HF-Trainer-style ``optimizer.pt`` of ``--size-gb`` GB with the e2e benchmark's
generator (fp32 master weights and AdamW moments), compresses it with ``ckptz.save``, and
times in this process, median of ``--repeats``:

- **load, warm page cache:** ``torch.load(plain, map_location=DEV)`` against
  ``ckptz.load(container, map_location=DEV)``;
- **load, cold cache:** the same after ``posix_fadvise(DONTNEED)`` on the file;
- **save:** ``torch.save`` against ``ckptz.save`` with each of ``--codecs`` (the time until
  the call returns, which is the stall a training loop sees: both take the state from
  memory and return once the file is on its way to storage).

Every load is compared with the original state tensor by tensor. JSON goes to
``$OUT/load.json`` (else ``bench/out/load.json``); a markdown table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

GB = 1e9


def evict(path: Path) -> bool:
    """Drop ``path`` from the page cache (after syncing it); whether the kernel allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def same(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def timed(fn: Any, repeats: int, before: Any = None) -> list[float]:
    out = []
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter()
        result = fn()
        if hasattr(result, "is_cuda") or isinstance(result, dict):
            _sync()
        out.append(time.perf_counter() - start)
        del result
    return out


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gb", type=float, default=5.0)
    ap.add_argument("--small", action="store_true", help="0.1 GB on the CPU")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/dev/shm/ckptz-load"))
    ap.add_argument("--disk", type=Path, default=Path.home() / "ckptz-load", help="folder for the cold rows")
    ap.add_argument("--codecs", default="auto,ans", help="ckptz.save codecs, comma-separated (ans: GPU only)")
    a = ap.parse_args(argv)
    import torch
    from e2e import _dims, _optimizer_state  # the e2e benchmark's generator

    import ckptz

    dev = "cuda" if torch.cuda.is_available() and not a.small else "cpu"
    size = 0.1 if a.small else a.size_gb
    a.dir.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device=dev).manual_seed(0)
    state, _ = _optimizer_state(_dims(int(size * GB), 12), gen, dev, weights=False)
    plain = a.dir / "optimizer.pt"
    codecs = [c for c in a.codecs.split(",") if c and (dev == "cuda" or c in ("auto", "zstd"))]
    rows: dict[str, Any] = {"device": dev, "torch": torch.__version__, "repeats": a.repeats, "codecs": codecs}
    rows["torch.save"] = timed(lambda: torch.save(state, plain), a.repeats)
    rows["bytes"] = {"plain": plain.stat().st_size}
    want = torch.load(plain, map_location="cpu", weights_only=True)
    loads = {"torch.load": (plain, lambda p: torch.load(p, map_location=dev, weights_only=True))}
    for codec in codecs:
        packed = a.dir / f"optimizer.pt.{codec}.ckptz"
        rows[f"ckptz.save {codec}"] = timed(
            lambda p=packed, c=codec: ckptz.save(state, p, codec=c), a.repeats
        )
        rows["bytes"][codec] = packed.stat().st_size
        loads[f"ckptz.load {codec}"] = (packed, lambda p: ckptz.load(p, map_location=dev))
    rows["correct"] = all(same(want, fn(path)) for path, fn in loads.values())
    for name, (path, fn) in loads.items():
        rows[f"{name} warm"] = timed(lambda f=fn, p=path: f(p), a.repeats)
    a.disk.mkdir(parents=True, exist_ok=True)
    for name, (path, fn) in loads.items():
        cold = a.disk / path.name
        cold.write_bytes(path.read_bytes())
        if evict(cold):
            rows[f"{name} cold"] = timed(lambda f=fn, p=cold: f(p), a.repeats, lambda p=cold: evict(p))
        cold.unlink()
    out = Path(os.environ.get("OUT") or Path(__file__).parent / "out")
    out.mkdir(parents=True, exist_ok=True)
    (out / "load.json").write_text(json.dumps(rows, indent=1))
    n = rows["bytes"]["plain"]
    print(f"\n{size:g} GB optimizer.pt, map_location={dev}, median of {a.repeats} (GB/s of the plain file)")
    print("| operation | seconds | GB/s | vs torch | ratio |\n|---|---:|---:|---:|---:|")
    for op in ("save", "load warm", "load cold"):
        ref = rows.get(f"torch.{op}")
        for lib in ("torch", *(f"ckptz.{op.split()[0]} {c}" for c in codecs)):
            key = f"torch.{op}" if lib == "torch" else f"{lib}{op[4:]}"
            got = rows.get(key)
            if got:
                med = statistics.median(got)
                vs = statistics.median(ref) / med if ref else float("nan")
                codec = key.split()[1] if lib != "torch" else ""
                ratio = f"{n / rows['bytes'][codec]:.3f}" if codec else ""
                print(f"| {key} | {med:.2f} | {n / med / GB:.2f} | {vs:.2f}× | {ratio} |")
    print(f"every load equal to the original: {rows['correct']}")
    return 0 if rows["correct"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
