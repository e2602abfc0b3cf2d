"""The package as users get it: ``python -m build`` makes an sdist and a wheel, and each
installs into a fresh virtual environment where the quickstart runs from outside the
repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: The environment of the installed package: nothing pointing back at the source tree.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CKPTZ_DEVICE")}


def _run(*args: str | Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=CLEAN_ENV, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{args}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _quickstart(venv: Path, src: Path, work: Path) -> None:
    """Compress ``src`` and verify the result against it with the ``ckptz`` the environment
    installed, from a folder outside the repository."""
    ckptz = venv / "bin" / "ckptz"
    info = json.loads(_run(ckptz, "env", "--json", cwd=work).stdout)
    assert Path(info["ckptz_path"]).is_relative_to(venv), info["ckptz_path"]
    assert info["native"]["loaded"], "the C extension did not build or load"
    _run(ckptz, "compress", src, "-o", work / "compressed/", "--device", "cpu", "-q", cwd=work)
    assert (work / "compressed" / "model.pt.ckptz").is_file()
    _run(ckptz, "verify", work / "compressed", "--against", src, "-q", cwd=work)


@pytest.mark.slow
def test_sdist_and_wheel_install_and_run_the_quickstart(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # From the sdist, as ``python -m build`` does by default: the wheel is built from it, so a
    # file missing from the sdist fails here. No isolation: the build needs no network.
    _run(
        sys.executable,
        "-m",
        "build",
        "--no-isolation",
        "--skip-dependency-check",
        "--outdir",
        dist,
        REPO,
        cwd=tmp_path,
    )
    (sdist,) = dist.glob("ckptz-*.tar.gz")
    (wheel,) = dist.glob("ckptz-*.whl")
    src = tmp_path / "checkpoint"
    src.mkdir()
    import torch

    g = torch.Generator().manual_seed(0)
    torch.save({"w": torch.randn(256, 64, generator=g) * 0.02, "step": 3}, src / "model.pt")
    for name, artifact in (("wheel", wheel), ("sdist", sdist)):
        venv = tmp_path / f"venv-{name}"
        # The system's site-packages provide torch and the other dependencies, already
        # installed; this interpreter's pip installs into the venv (which has none of its own,
        # nor an old setuptools to build the sdist with).
        _run(sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv, cwd=tmp_path)
        _run(
            sys.executable,
            "-m",
            "pip",
            "--python",
            venv / "bin" / "python",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            artifact,
            cwd=tmp_path,
        )
        work = tmp_path / f"work-{name}"
        work.mkdir()
        _quickstart(venv, src, work)
        _kernels_ship(venv, work)


def _kernels_ship(venv: Path, work: Path) -> None:
    """The installed package holds every CUDA kernel file the GPU engine compiles."""
    from ckptz.engines.gpu import cuda_src

    probe = (
        "import json; from ckptz.engines.gpu import cuda_src, kernels; "
        "print(json.dumps([cuda_src.__file__, {n: len(cuda_src.read(n)) for n in cuda_src.FILES}]))"
    )
    where, sizes = json.loads(_run(venv / "bin" / "python", "-c", probe, cwd=work).stdout)
    assert Path(where).is_relative_to(venv), where
    assert sizes == {n: len(cuda_src.read(n)) for n in cuda_src.FILES}
