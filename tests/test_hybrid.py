"""The hybrid engine (portable bitstream on CPU threads and a GPU at once): what it does
when its GPU does not come up. The GPU side runs in tests/test_gpu.py."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import sha256, tree_digests

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
    assert engine.frames["gpu"] == 0 and len(written.index.frames) > 0
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


def test_a_second_coder_slower_than_the_cpu_threads_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After its first window, the joined coder's rate is held against the CPU threads' (here
    a one-thread peer against two threads): the slower one gets no more frames, and later
    engines in the process start from that verdict."""
    import numpy as np
    import torch

    from ckptz.engines import hybrid

    monkeypatch.setattr(hybrid, "_verdicts", {})
    src = tmp_path / "big.pt"
    gen = torch.Generator().manual_seed(0)
    torch.save({"w": torch.randn(12 << 20, generator=gen).mul_(0.02)}, src)  # 48 MiB of fp32

    class QueuedCpuEngine(CpuEngine):
        """The CPU coder on one thread of its own, queued like the GPU engine's work."""

        inline = False

        def __init__(self) -> None:
            super().__init__(1)
            self.pool = ThreadPoolExecutor(1)

        def encode(self, stream: Any, data: Any, checksum: int) -> Future[Any]:
            return self.pool.submit(
                lambda: super(QueuedCpuEngine, self).encode(stream, data, checksum).result()
            )

        def close(self) -> None:
            self.pool.shutdown()

    def start_peer() -> Engine:
        return QueuedCpuEngine()

    engine = HybridEngine(CpuEngine(2), start_peer, required=True)
    assert engine.wait_for_gpu()
    with open(tmp_path / "big.ckptz", "wb") as out:
        compress_file(src, "big.pt", out, engine)
    engine.close()
    lane = engine.lanes["encode"]
    assert lane.gpu_rate is not None and lane.cpu_rate is not None
    assert lane.gpu_on == (lane.gpu_rate > lane.cpu_rate)
    assert hybrid._verdicts == {("cpu", "encode"): lane.gpu_on}
    frames, total = engine.frames["gpu"], int(np.ceil(src.stat().st_size / engine.frame_size))
    assert frames > 0
    if not lane.gpu_on:  # the usual case here: one thread against two
        assert frames < total
    api.decompress(tmp_path / "big.ckptz", tmp_path / "back.pt", device="cpu")
    assert sha256(tmp_path / "back.pt") == sha256(src)


@pytest.mark.parametrize(
    ("device", "codec", "writes", "job_gib", "warmed"),
    [
        ("cuda", "auto", False, 1, True),  # a GPU named codes every job there, restores too
        ("cuda", "zstd", False, 64, True),
        ("cuda", "auto", True, 4, True),
        ("cuda:1", "zstd", True, 64, True),
        ("cuda", "auto", True, 0, True),  # ... whatever its size
        ("auto", "auto", True, 31, False),  # no GPU named: CPU threads below the join size
        ("auto", "auto", True, 32, True),  # ... the GPU writes a job that large
        ("cuda", "ans", False, 0, True),  # only a GPU codes it: up from the start
        ("auto", "ans", True, 0, True),
        ("auto", "auto", False, 64, False),  # no GPU named: the hybrid brings it up when it pays
        ("cpu", "ans", True, 64, False),
    ],
)
def test_the_gpu_is_warmed_only_where_it_codes_from_the_first_frame(
    monkeypatch: pytest.MonkeyPatch,
    device: str,
    codec: str,
    writes: bool,
    job_gib: int,
    warmed: bool,
) -> None:
    import ckptz.engines as engines

    calls: list[str] = []
    monkeypatch.setattr(engines, "warm_context", calls.append)
    monkeypatch.setattr(engines, "nvcomp_installed", lambda: True)
    engines.warm_gpu(device, codec, writes=writes, job_bytes=job_gib << 30)
    assert calls == ([device] if warmed else [])


def test_the_cli_s_early_warm_starts_only_contexts_the_run_would_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """:func:`ckptz.devices.warm_named_gpu` (before the modules load) warms exactly where
    :func:`ckptz.engines.warm_gpu` warms a compression of any size on a GPU named, never where
    it would not, and not for a device name that is not one."""
    import ckptz.devices as devices
    import ckptz.engines as engines

    early: list[str] = []
    late: list[str] = []
    monkeypatch.setattr(devices, "warm_context", early.append)
    monkeypatch.setattr(engines, "warm_context", late.append)
    monkeypatch.setattr(engines, "nvcomp_installed", lambda: True)
    codecs = {*engines.CODECS_CPU, *engines.GPU_ONLY_CODECS, *engines.PORTABLE_CODECS, "ANS"}
    for device in ("cuda", "cuda:1", "auto", "cpu", "gpu"):
        for codec in sorted(codecs):
            early.clear()
            devices.warm_named_gpu(device, codec)
            for job_bytes in (0, 1 << 20, 64 << 30):
                late.clear()
                engines.warm_gpu(device, codec, writes=True, job_bytes=job_bytes)
                assert set(early) <= set(late), (device, codec, job_bytes)
            on_gpu_from_the_start = device.startswith("cuda")
            assert early == ([device] if on_gpu_from_the_start else []), (device, codec)


def test_a_restore_s_dry_run_warms_no_gpu(
    small_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``decompress --dry-run`` reads the containers' indexes and opens no engine, so it
    starts no CUDA context, where the same restore run for real warms the GPU it names."""
    from ckptz import api

    packed = tmp_path / "packed"
    api.compress(small_checkpoint, packed, device="cpu")
    warmed: list[tuple[str | None, str]] = []
    monkeypatch.setattr(api, "warm_gpu", lambda device, codec="auto", **kw: warmed.append((device, codec)))
    summary = api.decompress(packed, tmp_path / "dry", device="cuda", dry_run=True)
    assert summary.files and warmed == [] and not (tmp_path / "dry").exists()
    api.decompress(packed, tmp_path / "real", device="cpu")
    assert warmed == [("cpu", "auto")]


@pytest.mark.parametrize(
    ("job_bytes", "available", "gpu"),
    [(32 << 30, True, True), (32 << 30, False, False), (1 << 30, True, False)],
)
def test_auto_writes_a_large_job_on_the_gpu_where_there_is_one(
    monkeypatch: pytest.MonkeyPatch, job_bytes: int, available: bool, gpu: bool
) -> None:
    import ckptz.engines as engines

    opened: list[str] = []

    def open_gpu(want: str, **kw: object) -> CpuEngine:
        opened.append(f"{want} {kw['codec']}")
        return CpuEngine(1)

    monkeypatch.setattr(engines, "open_gpu", open_gpu)
    monkeypatch.setattr(engines, "nvcomp_installed", lambda: True)
    monkeypatch.setattr(engines, "gpu_unavailable_reason", lambda: None if available else "no GPU here")
    engine, _ = engines.open_engine("auto", writes=True, job_bytes=job_bytes)
    engine.close()
    assert opened == (["auto zstd"] if gpu else [])
    assert isinstance(engine, CpuEngine if gpu else HybridEngine)
    restore, _ = engines.open_engine("auto", job_bytes=job_bytes)  # restores: the CPU threads first
    restore.close()
    assert isinstance(restore, HybridEngine) and len(opened) == int(gpu)


def test_a_gpu_named_writes_and_restores_the_portable_bitstream_of_a_small_job_there(
    monkeypatch: pytest.MonkeyPatch, small_checkpoint: Path, tmp_path: Path
) -> None:
    """``--device cuda`` with the portable bitstream: a compression of a small job and its
    restore both open the GPU engine (here a CPU engine standing in for it, on a machine
    without a GPU) and warm its context; neither settles on the CPU threads."""
    import ckptz.engines as engines

    warmed: list[str] = []
    opened: list[str] = []

    def open_gpu(want: str, **kw: object) -> CpuEngine:
        opened.append(f"{want} {kw['codec']}")
        return CpuEngine(2)

    monkeypatch.setattr(engines, "warm_context", warmed.append)
    monkeypatch.setattr(engines, "open_gpu", open_gpu)
    monkeypatch.setattr(engines, "nvcomp_installed", lambda: True)
    monkeypatch.setattr(engines, "gpu_setup_reason", lambda: None)
    monkeypatch.setattr(engines, "gpu_unavailable_reason", lambda: None)
    out = tmp_path / "packed"
    api.compress(small_checkpoint, out, device="cuda")  # a small job: still the GPU
    assert (set(warmed), opened) == ({"cuda"}, ["cuda zstd"])  # (warming twice is once)
    warmed.clear()
    api.decompress(out, tmp_path / "back", device="cuda")
    assert (set(warmed), opened) == ({"cuda"}, ["cuda zstd", "cuda zstd"])
    assert tree_digests(tmp_path / "back") == tree_digests(small_checkpoint)
