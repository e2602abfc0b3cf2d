"""The native compress plane with the GPU engine (ckptz/native_src/compress_gpu.c, gpu_engine.c):
the plane's threads read and split frames into pinned batches, nvCOMP ANS codes them (or, for
the portable bitstream, the threads plan each plane's frame and ckptz's kernels write it),
and the threads write the payloads.

On a GPU (``-m gpu``): containers byte for byte those of the Python GPU pipeline, both
bitstreams, over
files of many dtypes, constant and noisy tensors, metadata the CPU coder codes, and many
small batches (the plane's counter of chunks coded there proves it ran); they restore
byte-exact, and the CLI verifies them. Everywhere: a GPU plan on a machine without a CUDA
driver fails with one clear line, and malformed GPU settings are refused.
"""

from __future__ import annotations

import ctypes.util
import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import ckptz
from test_gpu_plane import _checkpoint as _trained

from ckptz import api
from ckptz.codecs.table import ANS, ZSTD
from ckptz.container import read_index
from ckptz.digest import TREE
from ckptz.engines.cpu import CpuEngine
from ckptz.errors import DeviceError
from ckptz.formats import read_layout
from ckptz.pipeline import native_compress
from ckptz.pipeline.native_call import Gpu
from ckptz.pipeline.plan import frame_map, plan_streams

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
gpu = pytest.mark.gpu


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _mixed(path: Path) -> Path:
    """Every dtype family: noise (stored raw), constants, integers, bools, an empty tensor
    and one of three elements."""
    g = torch.Generator().manual_seed(6)
    tensors = {
        "half": torch.randn(600_000, generator=g).half(),
        "noise32": torch.randint(-(2**31), 2**31 - 1, (400_000,), generator=g, dtype=torch.int64)
        .to(torch.int32)
        .view(torch.float32),
        "bytes": torch.randint(0, 256, (300_000,), generator=g, dtype=torch.uint8),
        "const": torch.full((200_000,), 7, dtype=torch.uint8),
        "ids": torch.arange(250_000, dtype=torch.int64),
        "mask": torch.rand(100_000, generator=g) > 0.5,
        "empty": torch.zeros(0),
        "tiny": torch.tensor([1.0, -2.0, 3.5]),
    }
    safetensors_torch.save_file(tensors, str(path), metadata={"note": "mixed"})
    return path


_INPUTS = {"trained.pt": _trained, "mixed.safetensors": _mixed}


def _coded_chunks() -> int:
    return native_compress.gpu_totals()[1]


@pytest.fixture(autouse=True)
def _plane_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU engine's compressions take the native plane here, whatever the default."""
    monkeypatch.setattr(native_compress, "GPU_PLANE", frozenset({ANS.id, ZSTD.id}))


@gpu
@pytest.mark.parametrize("codec", ["ans", "zstd"])
@pytest.mark.parametrize("name", sorted(_INPUTS))
@pytest.mark.parametrize("memory", [None, 32 << 20])
def test_the_plane_writes_the_python_gpu_pipelines_containers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, codec: str, name: str, memory: int | None
) -> None:
    """Both bitstreams the GPU writes; small budgets make batches of a frame or two: many
    batches through every slot."""
    src = _INPUTS[name](tmp_path / name)
    before = _coded_chunks()
    native = tmp_path / "native.ckptz"
    api.compress(src, native, device="cuda", codec=codec, memory=memory)
    assert _coded_chunks() > before
    monkeypatch.setattr(native_compress, "GPU_PLANE", frozenset())
    python = tmp_path / "python.ckptz"
    api.compress(src, python, device="cuda", codec=codec, memory=memory)
    assert native.read_bytes() == python.read_bytes()
    back = tmp_path / "back"
    api.decompress(native, back, device="cuda")
    assert _sha(back) == _sha(src)


@gpu
def test_what_the_plane_compresses_the_cli_verifies(tmp_path: Path) -> None:
    src = _mixed(tmp_path / "m.safetensors")
    out = tmp_path / "m.ckptz"
    before = _coded_chunks()
    api.compress(src, out, device="cuda", codec="ans")
    assert _coded_chunks() > before
    checked = ckptz("verify", str(out), "--against", str(src), "--device", "cuda")
    assert checked.returncode == 0, checked.stderr


@gpu
@pytest.mark.parametrize("codec", ["ans", "zstd"])
def test_verify_and_in_place_run_in_the_plane(tmp_path: Path, codec: str) -> None:
    """--verify decodes every frame back (nvCOMP decoding what it coded) before writing, and
    an in-place run (which verifies) replaces the file only with a container that restores
    to it."""
    src = _trained(tmp_path / "m.pt")
    original = src.read_bytes()
    before = _coded_chunks()
    api.compress(src, tmp_path / "v.ckptz", device="cuda", codec=codec, verify=True)
    api.compress(src, device="cuda", codec=codec, in_place=True)
    assert _coded_chunks() > before
    assert not src.exists()
    back = tmp_path / "back.pt"
    api.decompress(tmp_path / "m.pt.ckptz", back, device="cuda")
    assert back.read_bytes() == original
    assert (tmp_path / "v.ckptz").read_bytes() == (tmp_path / "m.pt.ckptz").read_bytes()


@gpu
@pytest.mark.parametrize("codec", ["ans", "zstd"])
def test_a_pipe_takes_the_gpus_payloads_in_order(tmp_path: Path, codec: str) -> None:
    """A container written to a pipe (``compress -c``) has a file's data area and chunks
    (a file's header also records its mode and times), and it restores."""
    from ckptz.engines.gpu import open_gpu_engine
    from ckptz.pipeline.compress import compress_file

    src = _trained(tmp_path / "m.pt")
    out = tmp_path / "m.ckptz"
    api.compress(src, out, device="cuda", codec=codec, memory=32 << 20)
    engine = open_gpu_engine("cuda", codec=codec, memory=32 << 20)
    read, write = os.pipe()
    got: list[bytes] = []

    def drain() -> None:
        with os.fdopen(read, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=drain)
    reader.start()
    before = _coded_chunks()
    try:
        with os.fdopen(write, "wb") as pipe:
            compress_file(src, "m.pt", pipe, engine)
    finally:
        engine.close()
        reader.join()
    assert _coded_chunks() > before
    piped = tmp_path / "piped.ckptz"
    piped.write_bytes(got[0])
    with open(out, "rb") as f, open(piped, "rb") as g:
        chunks, again = read_index(f, "m").chunks, read_index(g, "m").chunks
    np.testing.assert_array_equal(chunks, again)
    end = int((chunks["offset"] + chunks["size"]).max())
    assert got[0][:end] == out.read_bytes()[:end]
    api.decompress(piped, tmp_path / "back.pt", device="cuda")
    assert _sha(tmp_path / "back.pt") == _sha(src)


@gpu
@pytest.mark.parametrize("codec", ["ans", "zstd"])
def test_a_file_gives_the_same_container_every_time(tmp_path: Path, codec: str) -> None:
    """Small batches reuse the GPU's buffers many times over: what they held before never
    reaches a payload (nvCOMP leaves padding bytes unwritten)."""
    src = _trained(tmp_path / "m.pt")
    runs = []
    for k in range(3):
        api.compress(src, tmp_path / f"{k}.ckptz", device="cuda", codec=codec, memory=32 << 20)
        runs.append((tmp_path / f"{k}.ckptz").read_bytes())
    assert runs[0] == runs[1] == runs[2]


@gpu
def test_discarded_output_codes_on_the_gpu(tmp_path: Path) -> None:
    """Every plane but the constant and noisy ones (a float's low mantissa bytes: about
    half of this file) is coded on the GPU."""
    src = _trained(tmp_path / "m.pt")
    before = native_compress.gpu_totals()
    api.compress(src, device="cuda", codec="ans", discard=True)
    after = native_compress.gpu_totals()
    assert after[1] > before[1] and after[2] - before[2] > src.stat().st_size // 3


# ---------------------------------------------------------------- without a GPU


def _code_on(
    src: Path, settings: Gpu, progress: Callable[[int], None] = lambda n: None
) -> native_compress.Coded:
    """Compress ``src`` to nothing in the native plane, with ``settings`` for its GPU."""
    layout = read_layout(src, src.name)
    coder = CpuEngine(2)
    fd = os.open(src, os.O_RDONLY)
    try:
        plan = plan_streams(layout, coder.frame_size, fd, frozenset(), coder.largest_frame)
        segments = [(sid, seg.length) for seg, sid in zip(layout.segments, plan.segment_streams, strict=True)]
        frames = frame_map(segments, [s.frame_size for s in plan.streams])
        return native_compress.code(
            fd, -1, src.name, frames, plan.streams, layout.size, TREE, coder, progress, gpu=settings
        )
    finally:
        os.close(fd)


@gpu
@pytest.mark.parametrize("codec", ["ans", "zstd"])
def test_ctrl_c_stops_a_gpu_compression_between_frames(tmp_path: Path, codec: str) -> None:
    """Ctrl-C (here: the progress callback raising it) sets the plane's stop flag; the call
    returns and the interrupt reaches the caller."""
    from ckptz.engines.gpu import open_gpu_engine

    src = _trained(tmp_path / "m.pt")
    engine = open_gpu_engine("cuda", codec=codec, memory=32 << 20)
    try:
        _, settings = native_compress.coders(engine)
        assert settings is not None
        assert _code_on(src, settings).end > 0

        def interrupt(n: int) -> None:
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            _code_on(src, settings, interrupt)
    finally:
        engine.close()


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None, reason="this machine has a CUDA driver")
def test_a_gpu_compression_without_a_cuda_driver_is_one_clear_error(tmp_path: Path) -> None:
    src = _trained(tmp_path / "m.pt")
    with pytest.raises(DeviceError, match="the GPU could not code it: no CUDA driver on this machine"):
        _code_on(src, Gpu(0, "", 1 << 20))


@pytest.mark.parametrize("settings", [Gpu(0, "", 0), Gpu(0, "", 1 << 20, workers=0)])
def test_malformed_gpu_settings_are_refused(tmp_path: Path, settings: Gpu) -> None:
    src = _trained(tmp_path / "m.pt")
    with pytest.raises(ValueError, match="malformed GPU settings"):
        _code_on(src, settings)


def test_only_the_cpu_and_gpu_engines_take_the_plane() -> None:
    cpu = CpuEngine(1)
    assert native_compress.suits(cpu, [], 10, TREE, plain=True)
    assert not native_compress.suits(cpu, [], 10, TREE, plain=False)
    assert not native_compress.suits(object(), [], 10, TREE, plain=True)
    assert native_compress.coders(cpu) == (cpu, None)
