"""`ckptz --help`, `ckptz inspect` and single-process CPU runs must not import torch or nvCOMP."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from ckptz.cli import app

PROBE = """
import sys
from ckptz.cli import app
try:
    app(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
heavy = sorted(m for m in ("torch", "nvidia.nvcomp", "safetensors") if m in sys.modules)
print("HEAVY", heavy, code)
"""


def _heavy(*args: str, **env: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    )
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("HEAVY"))
    return line


def test_help_is_light() -> None:
    assert _heavy("--help") == "HEAVY [] 0"


def test_inspect_of_container_is_light(small_checkpoint: Path, tmp_path: Path) -> None:
    packed = tmp_path / "c.ckptz"
    assert CliRunner().invoke(app, ["compress", str(small_checkpoint), "-o", str(packed)]).exit_code == 0
    assert _heavy("inspect", str(packed)) == "HEAVY [] 0"
    assert _heavy("inspect", str(small_checkpoint)) == "HEAVY [] 0"


def test_a_single_process_cpu_run_imports_no_torch(small_checkpoint: Path, tmp_path: Path) -> None:
    """Outside torchrun, the ranks' machinery (torch.distributed) stays unimported."""
    out = tmp_path / "out"
    env = {"CKPTZ_DEVICE": "cpu"}
    assert _heavy("compress", str(small_checkpoint), "-o", str(out), "-q", **env) == "HEAVY [] 0"
    assert _heavy("verify", str(out), "--against", str(small_checkpoint), "-q", **env) == "HEAVY [] 0"


def test_numpy_ma_is_imported_before_worker_threads_need_it() -> None:
    """``np.unique`` imports ``numpy.ma`` lazily on first use; several worker threads racing
    that import can recurse until RecursionError (seen once in the README quickstart), so
    the modules that call it from workers import it up front."""
    probe = "import sys, ckptz.accounting; print('numpy.ma' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "True"
