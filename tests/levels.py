"""Compressing a file through the CLI at one level and back: what the coders' level tests share."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from conftest import ckptz

from ckptz.container import read_index


def round_trip_at(level: str, src: Path, folder: Path) -> tuple[Path, np.ndarray]:
    """Compress ``src`` on the CPU at ``level`` (``"default"``: no ``--level``) into ``folder``,
    check that it restores byte for byte, and give the container and its index's chunks."""
    out = folder / f"{level}.ckptz"
    chosen = [] if level == "default" else ["--level", level]
    done = ckptz("compress", str(src), "-o", str(out), "--device", "cpu", *chosen)
    assert done.returncode == 0, done.stderr
    back = folder / f"{level}{src.suffix}"
    done = ckptz("decompress", str(out), "-o", str(back), "--device", "cpu")
    assert done.returncode == 0, done.stderr
    assert back.read_bytes() == src.read_bytes()
    with open(out, "rb") as f:
        return out, read_index(f, str(out)).chunks
