"""Verdicts on a machine without a GPU, with and without nvCOMP installed (issue 58, points 1-2, 6).

nvCOMP's wheels are large and CUDA-only; what ckptz sees of an install is an importable
``nvidia.libnvcomp`` package (:func:`ckptz.devices.nvcomp_installed`). An empty package of
that name on the CLI's ``PYTHONPATH`` is that install, as a machine without a GPU sees it.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, ckptz

from ckptz.codecs.frames import EncodedChunk
from ckptz.codecs.table import by_name
from ckptz.container import StreamInfo
from ckptz.engines.base import EncodedFrame
from ckptz.engines.cpu import CpuEngine


def _no_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return True
    return False


pytestmark = pytest.mark.skipif(not _no_driver(), reason="a CUDA driver is installed here")


class _AnsWriter(CpuEngine):
    """Writes the top plane of every frame as an ``ans`` chunk, as a GPU machine would."""

    def _encode(self, stream: StreamInfo, data: np.ndarray, checksum: int) -> EncodedFrame:
        frame = super()._encode(stream, data, checksum)
        top = frame.chunks[-1]
        ans = by_name("ans")
        assert ans is not None
        frame.chunks[-1] = EncodedChunk(ans.id, top.raw_size, b"\x00" * 16)
        return frame


@pytest.fixture
def nvcomp_env(tmp_path: Path) -> dict[str, str]:
    """The CLI's environment with nvCOMP installed (as ckptz detects it) and no GPU."""
    site = tmp_path / "site"
    (site / "nvidia" / "libnvcomp").mkdir(parents=True)
    (site / "nvidia" / "libnvcomp" / "__init__.py").write_text("")
    return {"PYTHONPATH": f"{REPO}:{site}", "CKPTZ_DEVICE": "auto"}


@pytest.fixture
def ans_container(small_checkpoint: Path, tmp_path: Path) -> Path:
    from ckptz.pipeline import compress_file

    out = tmp_path / "m.ckptz"
    with open(out, "wb") as f, _AnsWriter(2) as engine:
        compress_file(small_checkpoint / "model.safetensors", "model.safetensors", f, engine)
    return out


@pytest.mark.parametrize("nvcomp", [False, True], ids=["no-nvcomp", "nvcomp"])
def test_a_healthy_ans_container_is_undecodable_here_never_damaged(
    ans_container: Path, tmp_path: Path, nvcomp_env: dict[str, str], nvcomp: bool
) -> None:
    env = nvcomp_env if nvcomp else {"CKPTZ_DEVICE": "auto"}
    checked = ckptz("verify", str(ans_container), "--json", env=env)
    assert checked.returncode == 1
    (verdict,) = json.loads(checked.stdout)["files"]
    assert verdict["status"] == "undecodable", verdict
    assert "codec ans: this bitstream has no CPU decoder" in verdict["error"], verdict
    restored = ckptz("decompress", str(ans_container), "-o", str(tmp_path / "back"), env=env)
    assert restored.returncode == 1 and "Traceback" not in restored.stderr
    assert "no CPU decoder" in restored.stderr and "codec 'zstd'" not in restored.stderr, restored.stderr
    assert not (tmp_path / "back").exists()


@pytest.mark.parametrize("against", [False, True], ids=["alone", "against"])
def test_a_damaged_ans_container_is_damaged_here_not_undecodable(
    ans_container: Path, small_checkpoint: Path, tmp_path: Path, against: bool
) -> None:
    """A bit flipped in any payload of a container holding a GPU-only bitstream (every
    frame's top plane here): a CPU machine cannot decode it, but can check every payload's
    checksum, so the verdict is ``damaged``, never "needs a GPU" (which would send the user
    to a GPU only to learn it there)."""
    from ckptz.container import read_index

    with open(ans_container, "rb") as f:
        chunks = read_index(f, "m").chunks
    raw = ans_container.read_bytes()
    extra = ["--against", str(small_checkpoint / "model.safetensors")] if against else []
    for k, chunk in enumerate(chunks):
        damaged = bytearray(raw)
        damaged[int(chunk["offset"]) + int(chunk["size"]) // 2] ^= 0x08
        flipped = tmp_path / f"flip-{k}.ckptz"
        flipped.write_bytes(damaged)
        checked = ckptz("verify", str(flipped), *extra, "--json")
        assert checked.returncode == 1, checked.stderr
        (verdict,) = json.loads(checked.stdout)["files"]
        assert verdict["status"] == "damaged", (k, verdict)
        assert "fail their checksum" in verdict["error"], (k, verdict)


@pytest.mark.parametrize("nvcomp", [False, True], ids=["no-nvcomp", "nvcomp"])
@pytest.mark.parametrize("command", ["compress", "decompress"])
def test_device_cuda_without_a_gpu_fails_at_once_and_blames_the_missing_driver(
    small_checkpoint: Path, tmp_path: Path, nvcomp_env: dict[str, str], nvcomp: bool, command: str
) -> None:
    """A small job used to finish on the CPU with exit 0 where nvCOMP was installed."""
    env = nvcomp_env if nvcomp else {}
    source = small_checkpoint
    if command == "decompress":
        source = tmp_path / "packed"
        assert ckptz("compress", str(small_checkpoint), "-o", str(source), "--device", "cpu").returncode == 0
    out = tmp_path / "out" / "here"
    result = ckptz(command, str(source), "-o", f"{out}/", "--device", "cuda", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        "ckptz: error: cannot use cuda: no CUDA driver on this machine (use --device cpu or --device auto)"
    ]
    assert not (tmp_path / "out").exists()  # point 6: nothing was created


@pytest.mark.parametrize("nvcomp", [False, True], ids=["no-nvcomp", "nvcomp"])
def test_a_gpu_only_codec_on_a_cpu_creates_no_output_folder(
    small_checkpoint: Path, tmp_path: Path, nvcomp_env: dict[str, str], nvcomp: bool
) -> None:
    env = nvcomp_env if nvcomp else {"CKPTZ_DEVICE": "auto"}
    out = tmp_path / "out" / "nested"
    result = ckptz("compress", str(small_checkpoint), "-o", f"{out}/", "--codec", "ans", env=env)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "ckptz: error: codec 'ans' runs only on a GPU: no CUDA driver on this machine (use --codec zstd)"
    )
    assert not (tmp_path / "out").exists()


def test_device_auto_states_its_rule_in_help() -> None:
    text = " ".join(ckptz("compress", "--help").stdout.split())
    assert "cuda[:N] codes every job on that GPU, compressing and restoring, or fails" in text
    assert (
        "auto codes on the CPU threads, with the first GPU (nvCOMP installed) joining jobs of 32 GiB"
        " and more, and a GPU-only codec uses the GPU"
    ) in text
