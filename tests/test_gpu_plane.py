"""The native restore plane with the GPU engine (ckptz/native_src/plane_gpu.c, gpu_engine.c):
nvCOMP decodes batches of chunks from pinned memory, driven from C, and the native threads
do everything else as on the CPU.

On a GPU (``-m gpu``): byte-exact restores of ``ans`` and portable containers through the
native GPU path (its counter of chunks decoded there proves it ran), verify and compare,
corruption worded as the other paths word it, and the stop flag. Everywhere: a GPU plan on a
machine without a CUDA driver fails with one clear line, and malformed GPU settings are refused.
"""

from __future__ import annotations

import ctypes.util
import hashlib
import importlib
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ckptz

from ckptz import api
from ckptz.codecs.native import native
from ckptz.codecs.table import ANS, ZSTD
from ckptz.container import read_index
from ckptz.engines.cpu import CpuEngine
from ckptz.errors import CorruptionError, DeviceError
from ckptz.pipeline import native_restore
from ckptz.pipeline.decoder import FrameDecoder
from ckptz.pipeline.restore import DiscardSink, restore

torch = pytest.importorskip("torch")

#: The module (``ckptz.pipeline`` exports a function of its name).
restore_module = importlib.import_module("ckptz.pipeline.restore")
gpu = pytest.mark.gpu


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _checkpoint(path: Path) -> Path:
    """Trained-like fp32 and bf16 tensors and a zero tensor, a few MiB: several frames."""
    g = torch.Generator().manual_seed(3)
    torch.save(
        {
            "w": torch.randn(2_500_000, generator=g) * 0.02,
            "h": (torch.randn(1_300_001, generator=g) * 0.02).bfloat16(),
            "z": torch.zeros(70_000),
            "step": 7,
        },
        path,
    )
    return path


def _gpu_chunks() -> int:
    return native_restore.gpu_totals()[1]


@pytest.fixture(autouse=True)
def _native_gpu_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU engine's restores take the native plane here, whatever the default."""
    monkeypatch.setattr(restore_module, "NATIVE_GPU", True)


@pytest.fixture(scope="module")
def containers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same checkpoint compressed on the GPU with ``ans`` and the portable default, and
    on the CPU."""
    root = tmp_path_factory.mktemp("gpu-plane")
    src = _checkpoint(root / "m.pt")
    made = {"src": src}
    for name, device, codec in (("ans", "cuda", "ans"), ("zstd", "cuda", "auto"), ("cpu", "cpu", "auto")):
        made[name] = root / f"{name}.ckptz"
        api.compress(src, made[name], device=device, codec=codec)
    return made


@gpu
@pytest.mark.parametrize(
    ("name", "device"), [("ans", "cuda"), ("zstd", "cuda"), ("cpu", "cuda"), ("ans", None), ("ans", "auto")]
)
def test_restores_on_the_gpu_are_byte_exact(
    containers: dict[str, Path], tmp_path: Path, name: str, device: str | None
) -> None:
    before = _gpu_chunks()
    out = tmp_path / "back.pt"
    api.decompress(containers[name], out, device=device)
    assert _sha(out) == _sha(containers["src"])
    assert _gpu_chunks() > before  # decoded by nvCOMP through the native plane


@gpu
def test_the_cli_restores_and_verifies_on_the_gpu(containers: dict[str, Path], tmp_path: Path) -> None:
    """Through the CLI as a user runs it (on whichever path the default takes)."""
    out = tmp_path / "back.pt"
    done = ckptz("decompress", str(containers["ans"]), "-o", str(out), "--device", "cuda", "-q")
    assert done.returncode == 0, done.stderr
    assert _sha(out) == _sha(containers["src"])
    checked = ckptz("verify", str(containers["ans"]), "--against", str(containers["src"]), "--device", "cuda")
    assert checked.returncode == 0, checked.stderr


@gpu
@pytest.mark.parametrize("name", ["ans", "zstd"])
def test_verify_and_discard_decode_on_the_gpu(containers: dict[str, Path], name: str) -> None:
    before = _gpu_chunks()
    assert api.verify(containers[name], containers["src"], device="cuda").ok
    assert api.verify(containers[name], device="cuda").ok
    api.decompress(containers[name], discard=True, device="cuda")
    assert _gpu_chunks() > before


@gpu
def test_a_compare_that_differs_is_a_mismatch(containers: dict[str, Path], tmp_path: Path) -> None:
    other = tmp_path / "m.pt"
    data = bytearray(containers["src"].read_bytes())
    data[len(data) // 2] ^= 1
    other.write_bytes(bytes(data))
    assert not api.verify(containers["ans"], other, device="cuda").ok


def _flipped(container: Path, tmp_path: Path, codec: int) -> Path:
    """``container`` with one byte flipped in the middle of its largest ``codec`` payload."""
    with open(container, "rb") as f:
        index = read_index(f, "m")
    chunks = index.chunks[index.chunks["codec"] == codec]
    c = chunks[int(np.argmax(chunks["size"]))]
    data = bytearray(container.read_bytes())
    data[int(c["offset"]) + int(c["size"]) // 2] ^= 0x10
    bad = tmp_path / container.name
    bad.write_bytes(bytes(data))
    return bad


def _error(container: Path, tmp_path: Path, device: str) -> str:
    with pytest.raises(CorruptionError) as caught:
        api.decompress(container, tmp_path / "out.pt", device=device, force=True)
    assert not (tmp_path / "out.pt").exists()
    return str(caught.value)


@gpu
def test_a_flipped_ans_payload_byte_reads_as_on_the_python_path(
    containers: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = _flipped(containers["ans"], tmp_path, ANS.id)
    native_message = _error(bad, tmp_path, "cuda")
    monkeypatch.setattr(restore_module, "NATIVE_GPU", False)
    assert native_message == _error(bad, tmp_path, "cuda")
    assert "fail their checksum" in native_message


@gpu
def test_a_flipped_portable_payload_byte_reads_as_on_the_cpu(
    containers: dict[str, Path], tmp_path: Path
) -> None:
    bad = _flipped(containers["zstd"], tmp_path, ZSTD.id)
    assert _error(bad, tmp_path, "cuda") == _error(bad, tmp_path, "cpu")


def _gpu_plan(container: Path) -> tuple[Any, Any, native_restore.Plan, native_restore.Gpu]:
    from ckptz.engines.gpu.nvcomp_codecs import library_path

    f = open(container, "rb")  # noqa: SIM115 - closed by the caller
    index = read_index(f, "m")
    tables = native_restore.plan(FrameDecoder(f.fileno(), "m", index, CpuEngine(1)), True)
    assert tables is not None
    # Small batches: many of them in flight through every slot.
    return f, index, tables, native_restore.Gpu(0, library_path() or "", 1 << 18)


def _call(
    f: Any, index: Any, tables: native_restore.Plan, settings: native_restore.Gpu, stop: np.ndarray
) -> tuple[int, np.ndarray, np.ndarray]:
    assert native is not None
    counter, error, stats = np.zeros(1, np.int64), np.zeros(3, np.int64), np.zeros(3, np.int64)
    leaf = index.source_digest.kind.leaf
    hashes = np.zeros(-(-index.source_size // leaf), "<u8")
    gpu_settings = (
        settings.library,
        settings.device,
        settings.batch_bytes,
        settings.workers,
        ANS.id,
        ZSTD.id,
        stats,
        bytearray(256),
    )
    kind = native.restore_plan(
        f.fileno(), -1, -1, np.empty(0, np.uint8), tables.frames, tables.chunks, tables.pieces, index.source_size, leaf,
        hashes, 4, counter, stop, error, gpu_settings,
    )  # fmt: skip
    return kind, counter, stats


@gpu
def test_the_stop_flag_ends_a_gpu_restore(containers: dict[str, Path]) -> None:
    f, index, tables, settings = _gpu_plan(containers["ans"])
    with f:
        kind, counter, stats = _call(f, index, tables, settings, np.zeros(1, np.uint8))
        assert kind == 0 and counter[0] == index.source_size and stats[0] > 1
        kind, counter, _ = _call(f, index, tables, settings, np.ones(1, np.uint8))
        assert kind == 9 and counter[0] == 0
        # Set while batches are in flight: the call ends early, between frames.
        stop = np.zeros(1, np.uint8)
        timer = threading.Timer(0.001, lambda: stop.__setitem__(0, 1))
        timer.start()
        kind, counter, _ = _call(f, index, tables, settings, stop)
        timer.join()
        assert kind in (0, 9) and (kind == 0) == (counter[0] == index.source_size)


@gpu
def test_many_small_batches_restore_byte_exact(containers: dict[str, Path]) -> None:
    f, index, tables, settings = _gpu_plan(containers["ans"])
    with f:
        memory = np.zeros(index.source_size, np.uint8)
        decoder = FrameDecoder(f.fileno(), "m", index, CpuEngine(1))
        digest = native_restore.run(
            f.fileno(),
            "m",
            decoder,
            tables,
            native_restore.Target(memory=memory),
            4,
            lambda n: None,
            settings,
        )
    assert digest == index.source_digest
    assert memory.tobytes() == containers["src"].read_bytes()


# ---------------------------------------------------------------- without a GPU


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None, reason="this machine has a CUDA driver")
def test_a_gpu_plan_without_a_cuda_driver_is_one_clear_error(tmp_path: Path) -> None:
    src = _checkpoint(tmp_path / "m.pt")
    container = tmp_path / "m.ckptz"
    api.compress(src, container, device="cpu")
    with open(container, "rb") as f:
        index = read_index(f, "m")
        decoder = FrameDecoder(f.fileno(), "m", index, CpuEngine(1))
        tables = native_restore.plan(decoder, True)
        assert tables is not None
        settings = native_restore.Gpu(0, "", 1 << 20)
        with pytest.raises(DeviceError, match="no CUDA driver on this machine"):
            native_restore.run(
                f.fileno(), "m", decoder, tables, native_restore.Target(), 2, lambda n: None, settings
            )


def test_malformed_gpu_settings_are_refused(tmp_path: Path) -> None:
    src = _checkpoint(tmp_path / "m.pt")
    container = tmp_path / "m.ckptz"
    api.compress(src, container, device="cpu")
    with open(container, "rb") as f:
        index = read_index(f, "m")
        tables = native_restore.plan(FrameDecoder(f.fileno(), "m", index, CpuEngine(1)), True)
        assert tables is not None
        for bad in (native_restore.Gpu(0, "", 0), native_restore.Gpu(0, "", 1 << 20, workers=0)):
            with pytest.raises(ValueError, match="malformed GPU settings"):
                _call(f, index, tables, bad, np.zeros(1, np.uint8))


def test_a_restore_without_a_gpu_engine_stays_on_the_cpu(tmp_path: Path) -> None:
    src = _checkpoint(tmp_path / "m.pt")
    container = tmp_path / "m.ckptz"
    api.compress(src, container, device="cpu")
    before = native_restore.gpu_totals()
    with open(container, "rb") as f:
        restore(f, "m", CpuEngine(2), DiscardSink())
    assert native_restore.gpu_totals() == before
