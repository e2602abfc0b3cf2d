"""How fast host memory gets page-locked on this machine: torch's pinned allocator
(``cudaHostAlloc``), torch with ``pinned_use_cuda_host_register``, and ckptz's pool
(:mod:`ckptz.engines.gpu.pinned`: huge-page mappings, touched, then ``cudaHostRegister``).
Each way runs in a fresh process (pinned memory is cached per process).

    PYTHONPATH=. python3 bench/pinning.py [--mib 680]

Prints one line per way: seconds and GB/s for ``--mib`` MiB in 85 MiB buffers (the GPU
engine's span buffer at its default budget). JSON goes to ``$OUT/pinning.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PIECE = 85 << 20


def child(way: str, total: int) -> float:
    import torch

    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    n = max(1, total // PIECE)
    if way == "torch-register":
        torch.cuda.memory._set_allocator_settings(
            "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"
        )
    start = time.perf_counter()
    if way == "ckptz":
        from ckptz.engines.gpu.pinned import PinnedPool

        pool = PinnedPool()
        held = [pool.take(PIECE) for _ in range(n)]
    else:
        held = [torch.empty(PIECE, dtype=torch.uint8, pin_memory=True) for _ in range(n)]
    seconds = time.perf_counter() - start
    assert len(held) == n
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=680)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    total = a.mib << 20
    if a.child:
        print(json.dumps({"way": a.child, "seconds": child(a.child, total)}))
        return 0
    rows = []
    for way in ("torch-cudaHostAlloc", "torch-register", "ckptz"):
        out = subprocess.run(
            [sys.executable, __file__, "--mib", str(a.mib), "--child", way],
            capture_output=True,
            text=True,
            check=False,
        )
        try:
            row = json.loads(out.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            row = {"way": way, "error": out.stderr.strip()[-300:]}
        rows.append(row)
    outdir = Path(os.environ.get("OUT", Path(__file__).parent / "out"))
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "pinning.json").write_text(json.dumps(rows, indent=1))
    for r in rows:
        if "seconds" in r:
            print(f"{r['way']:22s} {r['seconds']:.3f} s  {total / r['seconds'] / 1e9:.2f} GB/s")
        else:
            print(f"{r['way']:22s} error: {r['error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
