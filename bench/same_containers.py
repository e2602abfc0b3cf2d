"""Write the containers a refactoring must keep byte-identical, for ``cmp`` against another tree's.

Makes deterministic sources once (the fixtures' sources and a few generated torch checkpoints:
fp32 and bf16 weights, an optimizer state, a mixed folder), then compresses each with
``--device cpu`` under a few option sets into ``OUTDIR``. Run it from two trees on the same
``SRCDIR`` and compare the two ``OUTDIR``s file by file::

    python bench/same_containers.py SRCDIR OUTDIR_BEFORE      # in the old tree
    python bench/same_containers.py SRCDIR OUTDIR_AFTER       # in the new tree
    diff -r OUTDIR_BEFORE OUTDIR_AFTER      # binary files are compared byte for byte
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures"))
from make_fixtures import sources as fixture_sources

#: Option sets each source is compressed under (the default, a high level, the level from
#: which Adam's second moments try order-1 exponents, a coder on one thread, a pipe).
OPTIONS: dict[str, list[str]] = {
    "default": [],
    "level9": ["--level", "9"],
    "level19": ["--level", "19"],
    "threads1": ["-T", "1"],
    "stdout": ["-c"],
}


def make_sources(root: Path) -> list[Path]:
    """Deterministic sources under ``root`` (made once; later runs reuse them)."""
    root.mkdir(parents=True, exist_ok=True)
    done = root / ".done"
    if not done.exists():
        fixture_sources(root)
        g = torch.Generator().manual_seed(57)
        weights = {f"layer{i}.weight": torch.randn(256, 192, generator=g) * 0.02 for i in range(6)}
        weights["embed"] = torch.randn(1000, 64, generator=g)
        save_file(weights, root / "fp32.safetensors")
        save_file({k: v.bfloat16() for k, v in weights.items()}, root / "bf16.safetensors")
        moments = {
            i: {
                "step": torch.tensor(10.0),
                "exp_avg": (w * 1e-2).bfloat16().float(),
                "exp_avg_sq": (w * 1e-2) ** 2 + torch.rand(w.shape, generator=g) * 1e-9,
            }
            for i, w in enumerate(weights.values())
        }
        torch.save(
            {"state": moments, "param_groups": [{"lr": 3e-4, "params": list(moments)}]}, root / "optim.pt"
        )
        torch.save({k: v.half() for k, v in weights.items()}, root / "fp16.pt")
        folder = root / "folder"
        folder.mkdir()
        for name in ("fp32.safetensors", "optim.pt", "rng_state.pth"):
            shutil.copy(root / name, folder / name)
        (folder / "config.json").write_text('{"hidden": 192, "layers": 6}\n')
        done.touch()
    return sorted(p for p in root.iterdir() if not p.name.startswith("."))


def main() -> None:
    src_root, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    for src in make_sources(src_root):
        for tag, options in OPTIONS.items():
            # A folder becomes a folder of containers (compare those with ``diff -r``).
            dest = f"{out / src.name}.{tag}/" if src.is_dir() else str(out / f"{src.name}.{tag}.ckptz")
            if tag == "stdout" and src.is_dir():
                continue  # a folder does not go to a stream
            cmd = [sys.executable, "-m", "ckptz", "compress", str(src), "--device", "cpu", *options]
            if tag == "stdout":
                with open(dest, "wb") as piped:  # through a pipe, as `ckptz compress -c | ...` writes
                    run = subprocess.Popen(cmd, stdout=subprocess.PIPE)
                    assert run.stdout is not None
                    while block := run.stdout.read(1 << 20):
                        piped.write(block)
                    if run.wait():
                        raise subprocess.CalledProcessError(run.returncode, cmd)
                continue
            subprocess.run([*cmd, "-o", dest], check=True, stdout=subprocess.DEVNULL)
    print(f"wrote {len(list(out.iterdir()))} containers to {out}")


if __name__ == "__main__":
    main()
