"""The hybrid engine (portable bitstream on CPU threads and a GPU at once): what it does
when its GPU does not come up. The GPU side runs in tests/test_gpu.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import sha256

from ckptz import api
from ckptz.engines.base import Engine
from ckptz.engines.cpu import CpuEngine
from ckptz.engines.hybrid import HybridEngine, bring_up_pending
from ckptz.errors import DeviceError
from ckptz.pipeline.compress import compress_file


def _no_gpu() -> Engine:
    raise DeviceError("cannot use cuda: no CUDA device is visible", hint="use --device cpu")


def test_a_gpu_that_was_asked_for_and_fails_is_one_clear_error(
    small_checkpoint: Path, tmp_path: Path
) -> None:
    engine = HybridEngine(CpuEngine(2), _no_gpu, required=True)
    with pytest.raises(DeviceError, match="no CUDA device"):
        engine.wait_for_gpu()
    with open(tmp_path / "out.ckptz", "wb") as out, pytest.raises(DeviceError, match="no CUDA device"):
        compress_file(small_checkpoint / "optimizer.pt", "optimizer.pt", out, engine)
    engine.close()
    assert not bring_up_pending()


def test_without_its_gpu_the_hybrid_engine_codes_everything_on_the_cpu(
    small_checkpoint: Path, tmp_path: Path
) -> None:
    src = small_checkpoint / "optimizer.pt"
    engine = HybridEngine(CpuEngine(2), _no_gpu, required=False)
    assert engine.wait_for_gpu() is False
    with open(tmp_path / "out.ckptz", "wb") as out:
        written = compress_file(src, "optimizer.pt", out, engine)
    engine.close()
    assert engine.frames["gpu"] == 0 and engine.frames["cpu"] == len(written.index.frames) > 0
    assert written.index.header["device"] == "cpu"
    api.decompress(tmp_path / "out.ckptz", tmp_path / "back.pt", device="cpu")
    assert sha256(tmp_path / "back.pt") == sha256(src)


def test_the_second_coder_joins_only_after_join_after_bytes(small_checkpoint: Path, tmp_path: Path) -> None:
    """The hybrid engine's routing with a real peer engine standing where the GPU goes: it is
    started only once the job has coded ``join_after`` bytes, gets frames once it is up, and
    frames from both coders restore byte-exact."""
    src = small_checkpoint / "optimizer.pt"
    started: list[CpuEngine] = []

    def start_peer() -> Engine:
        started.append(CpuEngine(1))
        return started[-1]

    lazy = HybridEngine(CpuEngine(2), start_peer, required=True)
    with open(tmp_path / "cpu.ckptz", "wb") as out:
        compress_file(src, "optimizer.pt", out, lazy)
    lazy.close()
    assert started == [] and lazy.frames["gpu"] == 0  # a small job never brings it up

    eager = HybridEngine(CpuEngine(2), start_peer, required=True)
    eager.join_after = 1  # the first frame's bytes start it
    with open(tmp_path / "eager.ckptz", "wb") as out:
        compress_file(src, "optimizer.pt", out, eager)
    eager.close()
    assert len(started) == 1

    engine = HybridEngine(CpuEngine(2), start_peer, required=True)
    assert engine.wait_for_gpu()  # up before the first frame: it gets frames from the start
    with open(tmp_path / "both.ckptz", "wb") as out:
        written = compress_file(src, "optimizer.pt", out, engine)
    engine.close()
    assert len(started) == 2 and engine.frames["gpu"] > 0
    assert engine.frames["cpu"] + engine.frames["gpu"] == len(written.index.frames)
    api.decompress(tmp_path / "both.ckptz", tmp_path / "back.pt", device="cpu")
    assert sha256(tmp_path / "back.pt") == sha256(src)
