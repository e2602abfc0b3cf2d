"""An engine in a process of its own (:mod:`ckptz.engines.process`).

On any machine the child runs the CPU engine: the calls, the shared buffers the caller's
readers fill, the results and errors all cross the real wire, so containers must come out
byte-identical to those the same engine makes in process, and restores byte-exact. On the
GPU machine (``-m gpu``) the child runs the GPU engine, whose results (coded blocks) lie in
its own shared pinned memory and come back as references.
"""

from __future__ import annotations

import io
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import sha256, tree_digests

from ckptz import api
from ckptz.engines import open_engine, process, runs_apart
from ckptz.engines.base import Engine
from ckptz.engines.cpu import CpuEngine
from ckptz.errors import CorruptionError, DeviceError
from ckptz.pipeline import compress_file, restore


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``torch.save`` file of fp32 and bf16 tensors, several frames long."""
    path = tmp_path_factory.mktemp("apart") / "optimizer.pt"
    g = torch.Generator().manual_seed(0)
    torch.save(
        {
            "exp_avg": torch.randn(3_000_000, generator=g) * 1e-3,
            "weight": torch.randn(1_500_000, generator=g).bfloat16(),
            "step": torch.tensor(12.0),
            "meta": {"lr": 1e-4, "names": [f"layer.{i}" for i in range(50)]},
        },
        path,
    )
    return path


def _compress(engine: Engine, path: Path) -> bytes:
    out = io.BytesIO()
    compress_file(path, path.name, out, engine)
    return out.getvalue()


def _restore(engine: Engine, container: Path) -> bytes:
    parts: list[bytes] = []
    with open(container, "rb") as f:
        restore(f, container.name, engine, lambda view: parts.append(bytes(view)))
    return b"".join(parts)


@pytest.fixture(scope="module")
def cpu_apart() -> Iterator[process.ProcessEngine]:
    engine = process.start("cpu").open(threads=2, level=3, codec="auto")
    yield engine
    engine.close()
    engine.end()


def test_a_cpu_engine_in_its_own_process_writes_the_same_container(
    cpu_apart: process.ProcessEngine, checkpoint: Path, tmp_path: Path
) -> None:
    assert cpu_apart.device == "cpu" and not cpu_apart.inline
    made = _compress(cpu_apart, checkpoint)
    with CpuEngine(2) as here:
        assert made == _compress(here, checkpoint)
    container = tmp_path / "optimizer.pt.ckptz"
    container.write_bytes(made)
    assert _restore(cpu_apart, container) == checkpoint.read_bytes()
    counts = cpu_apart.stats()  # the CPU engine's results are its own: nothing held
    assert counts["held"] == 0 and counts["theirs"] >= 1, counts


def test_a_damaged_payload_fails_with_the_error_the_engine_raised(
    cpu_apart: process.ProcessEngine, checkpoint: Path, tmp_path: Path
) -> None:
    from ckptz.container import read_index

    container = tmp_path / "bad.ckptz"
    container.write_bytes(_compress(cpu_apart, checkpoint))
    with open(container, "rb") as f:
        index = read_index(f, "x")
    chunk = index.chunks[np.argmax(index.chunks["size"])]
    made = bytearray(container.read_bytes())
    made[int(chunk["offset"]) + 100] ^= 0xFF
    container.write_bytes(bytes(made))
    with pytest.raises(CorruptionError) as caught:
        _restore(cpu_apart, container)
    assert "checksum" in str(caught.value) or "decode" in str(caught.value)


def test_a_closed_engine_keeps_its_process_for_the_next_run(checkpoint: Path, tmp_path: Path) -> None:
    process.end_all()
    first = process.open_apart("cpu", threads=1, level=3, codec="auto")
    made = _compress(first, checkpoint)
    first.close()
    again = process.open_apart("cpu", threads=2, level=5, codec="auto")  # a new engine, same process
    try:
        assert again is first and again.alive()
        container = tmp_path / "c.ckptz"
        container.write_bytes(made)
        assert _restore(again, container) == checkpoint.read_bytes()
    finally:
        again.close()
        process.end_all()
    assert not again.alive() and again._child.returncode == 0


def test_the_wire_passes_shared_arrays_as_the_same_memory_and_holds_them_until_dropped() -> None:
    a, b = socket.socketpair()
    caller = process._Wire(process.CALLER, a, pin=False)
    engine = process._Wire(process.ENGINE, b, pin=False)
    try:
        from ckptz import children

        # The caller's buffer reaches the engine's side as a view of the same memory.
        buf = caller.pool.take(1 << 20)
        buf[:] = 7
        held = caller.send(("call",), {"frames": [buf[:4096], buf[8192:]], "small": buf[:10].copy()})
        assert len(held) == 2
        fds: list[int] = []
        message = children.receive(b, fds)
        engine.map_new(message[-2], fds)
        got = engine.load(message[-1])
        got["frames"][1][:] = 3  # the engine decodes into the caller's buffer
        assert (buf[8192:] == 3).all() and (got["frames"][0] == 7).all()
        assert got["small"].base is None or got["small"].base.size == 10  # copied: too small to share

        # The engine's result comes back as a reference, held until every view is dropped.
        block = engine.pool.take(1 << 20)
        block[:] = 5
        tail = memoryview(block)[8192:]  # type: ignore[arg-type]
        held = engine.send(("done", 1, True), [block[:5000], tail])
        assert len(held) == 2
        fds = []
        message = children.receive(a, fds)
        caller.map_new(message[-2], fds)
        result = caller.load(message[-1], drop=1)
        assert bytes(result[1][:3]) == b"\x05\x05\x05"
        block[8192] = 9
        assert result[1][0] == 9  # not a copy
        del result, tail
        note = children.receive(b)
        assert note[0] == "notes" and note[1] == [("drop", 1)]
    finally:
        caller.close_outbox()
        engine.close_outbox()
        a.close()
        b.close()


def test_a_dead_engine_process_fails_the_calls_in_flight(checkpoint: Path) -> None:
    engine = process.start("cpu").open(threads=1, level=3, codec="auto")
    try:
        os.kill(engine._child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while engine._dead is None and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(process.EngineDiedError):
            _compress(engine, checkpoint)
    finally:
        engine.close()


def test_an_engine_that_cannot_open_there_raises_its_own_error() -> None:
    with pytest.raises(DeviceError) as caught:
        process.start("cuda:99").open(threads=1, level=3, codec="ans")
    assert "cuda:99" in str(caught.value)


def test_which_jobs_run_their_engine_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CKPTZ_ENGINE_PROCESS", raising=False)
    assert not runs_apart()  # off unless asked for: it measured no faster (BENCHMARKS.md)
    monkeypatch.setenv("CKPTZ_ENGINE_PROCESS", "1")
    assert runs_apart()
    monkeypatch.setenv("CKPTZ_ENGINE_PROCESS", "0")
    assert not runs_apart()
    # Only where the GPU engine itself is opened: never the CPU engine, nor the hybrid.
    import ckptz.engines as engines

    asked: list[tuple[str, object]] = []

    def open_apart(want: str, **options: object) -> CpuEngine:
        asked.append((want, options["codec"]))
        return CpuEngine(1)

    monkeypatch.setenv("CKPTZ_ENGINE_PROCESS", "1")
    monkeypatch.setattr(process, "open_apart", open_apart)
    monkeypatch.setattr(engines, "nvcomp_installed", lambda: True)
    monkeypatch.setattr(engines, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setattr(engines, "write_bytes", lambda: 1 << 30)
    for device, codec, writes, size in [
        ("cuda", "ans", False, 0),
        ("auto", "ans", True, 0),
        ("cuda", "zstd", True, 1 << 40),  # the portable bitstream written on the GPU
        ("cpu", "zstd", True, 1 << 40),
        ("cuda", "zstd", False, 1 << 40),  # portable restores: the CPU threads (the hybrid)
    ]:
        engine, _ = open_engine(device, codec=codec, writes=writes, job_bytes=size)
        engine.close()
    assert asked == [("cuda", "ans"), ("auto", "ans"), ("cuda", "zstd")]


def test_a_cpu_run_never_starts_an_engine_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTZ_ENGINE_PROCESS", "1")
    monkeypatch.setattr(process, "start", lambda want: pytest.fail("started a process"))
    engine, _ = open_engine("cpu", codec="zstd", writes=True, job_bytes=1 << 40)
    assert isinstance(engine, CpuEngine)
    engine.close()


# -- on the GPU machine ---------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("codec", ["ans", "zstd"])
def test_the_gpu_engine_in_its_own_process_writes_the_same_container(
    checkpoint: Path, tmp_path: Path, codec: str
) -> None:
    options = dict(threads=4, level=3, codec=codec, writes=True, job_bytes=1 << 40)
    here, _ = open_engine("cuda", apart=False, **options)  # type: ignore[arg-type]
    try:
        expected = _compress(here, checkpoint)
    finally:
        here.close()
    engine, _ = open_engine("cuda", apart=True, **options)  # type: ignore[arg-type]
    assert isinstance(engine, process.ProcessEngine) and engine.device.startswith("cuda")
    try:
        made = _compress(engine, checkpoint)
        assert made == expected
        container = tmp_path / "optimizer.pt.ckptz"
        container.write_bytes(made)
        assert _restore(engine, container) == checkpoint.read_bytes()
        # Every coded block came back as shared memory, and was let go once written; both
        # processes' buffers are pinned where the GPU copies them.
        time.sleep(0.5)  # the drops are mailed by a thread of their own
        counts = engine.stats()
        assert counts["held"] == 0, counts
        assert counts["own"] and counts["own_pinned"] == counts["own"], counts
        assert counts["theirs"] and counts["theirs_pinned"] == counts["theirs"], counts
    finally:
        engine.close()


@pytest.mark.gpu
def test_a_gpu_run_apart_compresses_in_place_and_restores_byte_exact(
    small_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    monkeypatch.setenv("CKPTZ_ENGINE_PROCESS", "1")
    work = tmp_path / "ckpt"
    shutil.copytree(small_checkpoint, work)
    before = tree_digests(work)
    api.compress(work, None, in_place=True, device="cuda", codec="ans")  # decoded back before removal
    assert all(p.suffix == ".ckptz" for p in work.rglob("*.pt*"))
    api.decompress(work, None, in_place=True, device="cuda")
    assert tree_digests(work) == before
    process.end_all()
    assert sha256(work / "optimizer.pt") == sha256(small_checkpoint / "optimizer.pt")
