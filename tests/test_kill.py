"""SIGKILL ``ckptz compress --in-place`` and ``decompress --in-place`` at random instants.

Each round copies a folder of checkpoints, kills an in-place compress at a random instant of
its run, reruns it to completion, kills an in-place decompress at another random instant,
reruns that, and checks that every original is back byte-exact (sha256) with no leftovers.
Instants are stratified over the length of a measured full run, so they cover start-up,
writing, verifying, renaming and removing alike. Set ``CKPTZ_KILL_REPORT=path`` to get the
figures quoted in RELIABILITY.md as JSON.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import tree_digests

ROUNDS = int(os.environ.get("CKPTZ_KILL_ROUNDS", "20"))
ENV = {**os.environ, "CKPTZ_DEVICE": "cpu", "PYTHONDONTWRITEBYTECODE": "1"}


def _make_folder(root: Path) -> None:
    """Several files, enough data that a run spends most of its time working, not starting."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(5)
    root.mkdir()
    for i in range(3):
        weights = (rng.standard_normal(350_000) * 0.02).astype(np.float32)
        save_file({"w": weights, "zeros": np.zeros(20_000, np.float32)}, str(root / f"model-{i}.safetensors"))
    import torch

    torch.manual_seed(0)
    torch.save({"state": {0: {"exp_avg": torch.randn(150_000)}}}, root / "optimizer.pt")
    (root / "sub").mkdir()
    torch.save({"rng": torch.get_rng_state()}, root / "sub" / "rng_state.pth")
    (root / "config.json").write_text('{"hidden_size": 64}')


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ckptz", *args, "--device", "cpu"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_cli(*args), env=ENV, capture_output=True, text=True, timeout=120)


def _kill_at(delay: float, *args: str) -> bool:
    """Start the command, SIGKILL it after ``delay`` seconds; True if it was still running."""
    proc = subprocess.Popen(_cli(*args), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=delay)
        return False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return True


def _state(root: Path) -> str:
    """What a kill left behind, for the coverage figures."""
    names = [p.name for p in root.rglob("*") if p.is_file()]
    temps = sum(".ckptz-tmp-" in n for n in names)
    both = sum(n.endswith(".ckptz") and n.removesuffix(".ckptz") in names for n in names)
    return f"temps={temps},pairs={both}"


def _instants(full: float, rng: random.Random) -> list[float]:
    """One random instant in each of ROUNDS equal slices of a full run."""
    return [full * (i + rng.random()) / ROUNDS for i in range(ROUNDS)]


@pytest.mark.slow
def test_sigkill_in_place_at_random_instants(tmp_path: Path) -> None:
    pristine = tmp_path / "pristine"
    _make_folder(pristine)
    want = tree_digests(pristine)

    calib = tmp_path / "calib"
    shutil.copytree(pristine, calib)
    t0 = time.perf_counter()
    assert _run("compress", str(calib), "--in-place").returncode == 0
    full_compress = time.perf_counter() - t0
    t0 = time.perf_counter()
    assert _run("decompress", str(calib), "--in-place").returncode == 0
    full_decompress = time.perf_counter() - t0
    assert tree_digests(calib) == want

    rng = random.Random(int(os.environ.get("CKPTZ_KILL_SEED", "20240611")))
    kills_c, kills_d = _instants(full_compress, rng), _instants(full_decompress, rng)
    rng.shuffle(kills_d)
    states: Counter[str] = Counter()
    killed = 0
    for i, (tc, td) in enumerate(zip(kills_c, kills_d, strict=True)):
        work = tmp_path / f"round-{i}"
        shutil.copytree(pristine, work)
        killed += _kill_at(tc, "compress", str(work), "--in-place")
        states["compress " + _state(work)] += 1
        done = _run("compress", str(work), "--in-place")
        assert done.returncode == 0, done.stderr
        assert not any(p.name.endswith((".pt", ".pth", ".safetensors")) for p in work.rglob("*"))

        killed += _kill_at(td, "decompress", str(work), "--in-place")
        states["decompress " + _state(work)] += 1
        done = _run("decompress", str(work), "--in-place")
        assert done.returncode == 0, done.stderr

        assert tree_digests(work) == want, f"round {i}: killed compress at {tc:.3f}s, decompress at {td:.3f}s"
        leftovers = [p for p in work.rglob("*") if p.name.startswith(".") or p.name.endswith(".ckptz")]
        assert leftovers == []
        shutil.rmtree(work)

    report = os.environ.get("CKPTZ_KILL_REPORT")
    if report:
        Path(report).write_text(
            json.dumps(
                {
                    "rounds": ROUNDS,
                    "kill_instants": 2 * ROUNDS,
                    "processes_killed_while_running": killed,
                    "files_per_round": len(want),
                    "files_recovered": ROUNDS * len(want),
                    "full_compress_s": round(full_compress, 3),
                    "full_decompress_s": round(full_decompress, 3),
                    "states_left_by_kills": dict(sorted(states.items())),
                },
                indent=2,
            )
        )
