"""Shared fixtures: a small checkpoint folder, and skipping GPU tests where no GPU can run."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
#: The environment of CLI subprocesses: the tree under test, on the CPU, progress lines at once.
CLI_ENV = {
    **os.environ,
    "PYTHONPATH": str(REPO),
    "CKPTZ_DEVICE": "cpu",
    "PYTHONDONTWRITEBYTECODE": "1",
    "COLUMNS": "80",
}


def ckptz(
    *args: str,
    stdin: bytes | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ckptz ARGS`` as a user would, in a subprocess (in ``cwd``); text output."""
    return subprocess.run(
        [sys.executable, "-m", "ckptz", *args],
        capture_output=True,
        text=True,
        env={**CLI_ENV, **(env or {})},
        timeout=timeout,
        cwd=cwd,
    )


def stderr_on_a_terminal(*args: str, columns: int, timeout: float = 120) -> str:
    """Run ``python -m ckptz ARGS`` with stderr on a pty ``columns`` wide, as a user at a
    terminal sees it; the text it drew there (escape sequences removed). It must exit 0."""
    import pty
    import re

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckptz", *args],
        stdout=subprocess.DEVNULL,
        stderr=follower,
        env={**CLI_ENV, "COLUMNS": str(columns)},
    )
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    assert proc.wait(timeout=timeout) == 0
    os.close(leader)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode(errors="replace"))


def bench(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``bench/SCRIPT ARGS`` on the tree under test, in a subprocess; text output."""
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / script), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=timeout,
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    from ckptz.engines import gpu_unavailable_reason

    reason = gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"no GPU engine here: {reason}")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_digests(root: Path) -> dict[str, str]:
    """sha256 of every regular file under ``root``, by relative path."""
    return {
        p.relative_to(root).as_posix(): sha256(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


@pytest.fixture(scope="session")
def small_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face Trainer-like folder with real tensors (weights, AdamW state, RNG)."""
    import torch
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("ckpt") / "checkpoint-500"
    root.mkdir()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(300, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 300)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        x = torch.randint(0, 100, (16,))  # rows 100.. of the embedding never get gradients
        loss = model(x).logsumexp(-1).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, root / "model.safetensors")
    torch.save(opt.state_dict(), root / "optimizer.pt")
    torch.save(
        {"cpu_rng_state": torch.get_rng_state(), "numpy": np.random.get_state()}, root / "rng_state.pth"
    )
    (root / "trainer_state.json").write_text('{"global_step": 500}')
    (root / "config.json").write_text('{"hidden_size": 64}')
    return root


@pytest.fixture
def cuda_ops() -> Iterator[Any]:
    """The GPU coder's device on GPU 0 (``-m gpu`` tests): a stream of its own and scratch memory."""
    from ckptz import cuda
    from ckptz.engines.gpu.kernels import CudaOps
    from ckptz.engines.gpu.memory import DeviceScratch

    cuda.use_device(0)
    stream, scratch = cuda.Stream(), DeviceScratch()
    yield CudaOps(0, stream.handle, scratch)
    stream.synchronize()
    scratch.close()
    stream.close()


def host_build(tmp_path_factory: pytest.TempPathFactory, name: str, source: str) -> ctypes.CDLL:
    """``source`` (C++ shared with a CUDA kernel's, ``HD`` functions) built for the host, or
    the test skipped where there is no C++ compiler."""
    cxx = shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    folder = tmp_path_factory.mktemp(name)
    src, lib = folder / "harness.cpp", folder / "harness.so"
    src.write_text(source)
    subprocess.run([cxx, "-O1", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return ctypes.CDLL(str(lib))


#: Objects of a file's run (per frame or per file) that must never be left in reference cycles.
RUN_OBJECTS = (
    "_Compression",
    "_Restore",
    "FileDigest",
    "LeafJoins",
    "Future",
    "Frame",
    "Segment",
    "Condition",
)


def assert_runs_leave_no_cycles(runs: Callable[[], object]) -> None:
    """Call ``runs`` with the cyclic collector off, then collect: nothing of a file's run
    (:data:`RUN_OBJECTS`) may be found, and only a few objects in all (a run's, not a
    frame's)."""
    import gc
    from collections import Counter

    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds is kept in gc.garbage
    try:
        runs()
        gc.collect()
        left = Counter(type(o).__qualname__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not {name: n for name, n in left.items() if name in RUN_OBJECTS}, left.most_common(12)
    assert sum(left.values()) < 400, left.most_common(12)
