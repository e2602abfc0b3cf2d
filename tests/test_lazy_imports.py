"""`ckptz --help`, `ckptz inspect` and single-process CPU runs must not import torch or nvCOMP."""

from __future__ import annotations

import os
import shutil
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


LOADED_PROBE = """
import os, sys
from ckptz.cli import app
try:
    app(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
watched = os.environ["WATCHED"].split(",")
print("LOADED", sorted(m for m in sys.modules if m.startswith(tuple(watched))), code)
"""


def _loaded(watched: tuple[str, ...], *args: str) -> str:
    """Which modules starting with one of ``watched`` a command in a fresh process loaded."""
    env = {**os.environ, "WATCHED": ",".join(watched)}
    out = subprocess.run([sys.executable, "-c", LOADED_PROBE, *args], capture_output=True, text=True, env=env)
    return next(ln for ln in out.stdout.splitlines() if ln.startswith("LOADED"))


def test_a_cpu_run_loads_neither_the_gpu_path_nor_the_progress_bar(
    small_checkpoint: Path, tmp_path: Path
) -> None:
    """``--device cpu`` loads no GPU module (the engine, the CUDA driver binding, nvCOMP,
    torch), and a run whose stderr is no terminal draws no bar, so it loads none of Rich's
    progress machinery."""
    gpu = ("ckptz.engines.gpu", "ckptz.cuda", "nvidia.nvcomp", "torch", "rich.progress")
    out, back = tmp_path / "out", tmp_path / "back"
    cpu = ("--device", "cpu")
    assert _loaded(gpu, "compress", str(small_checkpoint), "-o", str(out), *cpu) == "LOADED [] 0"
    assert _loaded(gpu, "decompress", str(out), "-o", str(back), *cpu) == "LOADED [] 0"
    assert _loaded(gpu, "verify", str(out), "--against", str(small_checkpoint), *cpu) == "LOADED [] 0"
    assert _loaded(gpu, "inspect", str(out)) == "LOADED [] 0"


def test_numpy_ma_is_imported_before_worker_threads_need_it() -> None:
    """``np.unique`` imports ``numpy.ma`` lazily on first use; several worker threads racing
    that import can recurse until RecursionError (seen once in the README quickstart), so
    the modules that call it from workers import it up front."""
    probe = "import sys, ckptz.accounting; print('numpy.ma' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "True"


def _help_with(tmp_path: Path, fake_torch: bool, tree: Path | None = None, **env: str) -> Path:
    """Run ``python -m ckptz --help`` (from ``tree``, default this one) where Python may not
    write bytecode; the cache folder.
    Finding that folder imports nothing heavy: numpy alone took ~0.25 s of the H100 host's
    0.47 s ``--help`` when it came with :mod:`ckptz.safeio` (BENCHMARKS.md, session 35)."""
    path = [str(tree or Path(__file__).parent.parent)]
    if fake_torch:  # a torch without bytecode beside it, found first (never imported by --help)
        (tmp_path / "site" / "torch").mkdir(parents=True)
        (tmp_path / "site" / "torch" / "__init__.py").write_text("")
        path.insert(0, str(tmp_path / "site"))
    run_env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    run_env["PYTHONPATH"] = os.pathsep.join(path)
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ckptz", "--help"],
        capture_output=True,
        env={**run_env, **env},
        check=True,
        cwd=tmp_path,  # ``-m`` looks in the working folder first
    )
    assert b"compress" in out.stdout
    imported = {line.rsplit(b"|", 1)[-1].strip() for line in out.stderr.splitlines()}
    assert b"ckptz.cli" in imported and b"numpy" not in imported
    return tmp_path / "cache" / "ckptz" / "bytecode"


def test_bytecode_is_cached_where_python_may_not_write_it(tmp_path: Path) -> None:
    cache = _help_with(tmp_path, fake_torch=True)
    assert cache.stat().st_mode & 0o777 == 0o700
    compiled = {part for p in cache.rglob("*.pyc") for part in (p.parent.name, p.name.split(".")[0])}
    assert {"cli", "typer", "rich"} <= compiled  # ckptz's modules and its libraries
    assert not list((tmp_path / "site").rglob("*.pyc"))  # nothing beside the sources


def test_bytecode_of_a_source_tree_is_cached_where_python_may_not_write_it(tmp_path: Path) -> None:
    """Run from a source tree (no bytecode beside ckptz's modules) under
    ``PYTHONDONTWRITEBYTECODE``, every command compiled all of ckptz's modules again: the
    cache keeps them, though torch has bytecode of its own (or is not installed)."""
    tree = tmp_path / "src"
    package = Path(__file__).resolve().parents[1] / "ckptz"
    shutil.copytree(package, tree / "ckptz", ignore=shutil.ignore_patterns("__pycache__", "native_src"))
    cache = _help_with(tmp_path, fake_torch=False, tree=tree)
    compiled = {
        p.name.split(".")[0] for p in (cache / str(tree.relative_to(tree.anchor)) / "ckptz").rglob("*.pyc")
    }
    assert {"cli", "settings", "devices"} <= compiled
    assert not list((tree / "ckptz").rglob("__pycache__"))  # nothing beside the sources


def test_bytecode_cache_stays_off_where_it_is_not_needed(tmp_path: Path) -> None:
    assert not _help_with(tmp_path / "a", fake_torch=True, PYTHONPYCACHEPREFIX=str(tmp_path / "own")).exists()
    assert not _help_with(tmp_path / "b", fake_torch=True, PYTHONDONTWRITEBYTECODE="").exists()


WARM_PROBE = """
import sys
import ckptz.devices
from ckptz.cli import app

seen = []
ckptz.devices.warm_context = lambda want: seen.append((want, "ckptz.api" in sys.modules))
try:
    app(sys.argv[1:])
except SystemExit:
    pass
print("WARMED", [want for want, late in seen if not late])
"""


def test_a_named_gpu_is_warmed_before_the_run_s_modules_load(small_checkpoint: Path, tmp_path: Path) -> None:
    """``compress --device cuda`` starts the CUDA context before it imports the pipeline
    (whose modules take longer to load than the context to come up), so the two overlap: a
    GPU named codes every job there, whatever its codec and size."""

    def warmed(*args: str) -> str:
        argv = ["compress", str(small_checkpoint), "-o", str(tmp_path / "out"), "-q", *args]
        out = subprocess.run([sys.executable, "-c", WARM_PROBE, *argv], capture_output=True, text=True)
        return next(ln for ln in out.stdout.splitlines() if ln.startswith("WARMED"))

    assert warmed("--device", "cuda:1", "--codec", "ans") == "WARMED ['cuda:1']"
    assert warmed("--device", "cuda", "--fast") == "WARMED ['cuda']"
    assert warmed("--device", "cuda", "--codec", "ans", "--dry-run") == "WARMED ['cuda']"  # it samples there
    assert warmed("--device", "cuda") == "WARMED ['cuda']"  # the portable bitstream too
    assert warmed("--codec", "ans") == "WARMED []"  # auto: decided by the engines, later
    assert warmed("--device", "cpu", "--codec", "ans") == "WARMED []"


def test_the_modules_a_command_needs_before_it_warms_a_gpu_are_light() -> None:
    """The CLI, the device choice and the CUDA driver binding import no numpy (nor the
    pipeline): a GPU command starts its CUDA context before those load, so they overlap."""
    probe = (
        "import sys, ckptz.cli, ckptz.devices, ckptz.cuda, ckptz.cache; "
        "print(sorted(m for m in sys.modules if m == 'numpy' or m.startswith(('ckptz.pipeline', 'ckptz.engines'))))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]"
