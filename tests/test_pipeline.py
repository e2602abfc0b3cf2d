"""Stream planning: which tensors share frames, and that any grouping restores exactly."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_runs_leave_no_cycles, sha256
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from ckptz import api
from ckptz.codecs import codec_name
from ckptz.container import frame_chunk_starts, read_index
from ckptz.formats import read_layout
from ckptz.pipeline import plan_streams, value_class


def _bytes(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy()


def test_value_class_counts_zero_low_bytes() -> None:
    g = torch.Generator().manual_seed(0)
    fp32 = torch.randn(4096, generator=g)
    assert value_class(_bytes(fp32), 4) == 0
    assert value_class(_bytes(fp32.bfloat16().float()), 4) == 2
    assert value_class(_bytes(fp32.double()), 8) == 3  # 29 zero mantissa bits
    # Values whose bf16 mantissa is empty too (powers of two, zeros): every byte but the top.
    assert value_class(_bytes(torch.zeros(64)), 4) == 3
    assert value_class(_bytes(torch.full((64,), 0.5)), 4) == 3
    assert value_class(np.zeros(0, np.uint8), 4) == 3
    # One true fp32 value among bf16 ones is enough.
    mixed = fp32.bfloat16().float()
    mixed[77] = 0.1
    assert value_class(_bytes(mixed), 4) == 0


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_classes_of_many_segments_are_each_ones_value_class(data: st.DataObject) -> None:
    """The plan judges all segments' samples at once; each gets the class its own samples
    give (every dtype, empty and tiny tensors, bf16-exact fp32, fp32-exact fp64, reads cut
    short by a file that shrank)."""
    from ckptz.dtypes import DTYPES, lookup
    from ckptz.formats.layout import Segment
    from ckptz.pipeline.plan import _class_of, _classes, _dtype, _sample_spans, _sampled

    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    segments, blob = [], bytearray()
    for _ in range(data.draw(st.integers(0, 12))):
        dt = lookup(data.draw(st.sampled_from(sorted(DTYPES))))
        n = data.draw(st.sampled_from([0, 1, 3, 100, 600, 5000])) * dt.word
        words = (
            rng.integers(0, 256, n, dtype=np.uint8).reshape(-1, dt.word) if n else np.zeros((0, 1), np.uint8)
        )
        words[:, : data.draw(st.integers(0, dt.word))] = 0  # low bytes zero in every word
        segments.append(Segment(len(blob), n, "tensor", dt.name, ("t",), "weights"))
        blob += words.tobytes()
    cut = data.draw(st.integers(0, len(blob)))  # the file, as read now

    def read(spans: list[tuple[int, int]]) -> list[bytes]:
        return [bytes(blob[:cut][at : at + n]) for at, n in spans]

    types = [_dtype(seg) for seg in segments]
    want = [
        _class_of(read([(seg.offset + at, n) for at, n in _sample_spans(seg.length, dt.word)]), dt)
        if _sampled(dt)
        else 0
        for seg, dt in zip(segments, types, strict=True)
    ]
    assert _classes(segments, types, read) == want


def _mixed_file(path: Path) -> dict[str, torch.Tensor]:
    """fp32 weights: bf16-exact matrices with true fp32 norms between them."""
    g = torch.Generator().manual_seed(1)
    tensors = {}
    for i in range(3):
        w = torch.randn(256, 512, generator=g).bfloat16().float()
        w[0] = 0  # a padding row of zeros where sampling starts
        tensors[f"layers.{i}.attn.weight"] = w
        norm = torch.randn(4096, generator=g)
        norm[:1024] = 0  # a true fp32 tensor whose first 4 KB look bf16-exact
        tensors[f"layers.{i}.norm.weight"] = norm
    save_file(tensors, str(path))
    return tensors


def test_plan_separates_bf16_exact_fp32_tensors(tmp_path: Path) -> None:
    src = tmp_path / "model.safetensors"
    tensors = _mixed_file(src)
    layout = read_layout(src, src.name)

    mixed = plan_streams(layout)
    split = plan_streams(layout, source=src)
    fp32 = [s for s in split.streams if s.dtype == "float32"]
    assert len([s for s in mixed.streams if s.dtype == "float32"]) == 1
    assert len(fp32) == 2
    assert {s.component for s in fp32} == {"weights"}
    assert sum(s.length for s in fp32) == sum(t.numel() * 4 for t in tensors.values())
    by_key = {
        seg.keys[0]: split.streams[sid].id
        for seg, sid in zip(layout.segments, split.segment_streams, strict=True)
        if seg.kind == "tensor"
    }
    matrices = {by_key[k] for k in tensors if k.endswith("attn.weight")}
    norms = {by_key[k] for k in tensors if k.endswith("norm.weight")}
    assert len(matrices) == 1 and len(norms) == 1 and matrices != norms
    # The samples read from a path, an open descriptor or a read function, one at a time or
    # all at once: one plan.
    fd = os.open(src, os.O_RDONLY)
    try:
        assert plan_streams(layout, source=fd) == split
        assert plan_streams(layout, source=lambda at, n: os.pread(fd, n, at)) == split
    finally:
        os.close(fd)


def test_split_streams_restore_exactly_and_keep_constant_planes(tmp_path: Path) -> None:
    src = tmp_path / "model.safetensors"
    _mixed_file(src)
    digest = sha256(src)
    container = tmp_path / "model.safetensors.ckptz"
    api.compress(src, container, threads=2)
    with open(container, "rb") as f:
        index = read_index(f, container.name)
    fp32 = [s.id for s in index.streams if s.dtype == "float32"]
    assert len(fp32) == 2
    # Only the bf16-exact stream's second-lowest plane is zero throughout: one constant
    # chunk per frame.
    frames, chunks = index.frames, index.chunks
    first = frame_chunk_starts(frames)
    plane1 = [
        {codec_name(int(chunks["codec"][first[k] + 1])) for k in np.flatnonzero(frames["stream"] == sid)}
        for sid in fp32
    ]
    assert sorted(p == {"const"} for p in plane1) == [False, True]

    restored = tmp_path / "restored.safetensors"
    api.decompress(container, restored)
    assert sha256(restored) == digest
    assert sha256(src) == digest


@pytest.mark.parametrize("shrink", [0, 100])
def test_sampling_a_short_file_is_not_an_error_in_planning(tmp_path: Path, shrink: int) -> None:
    src = tmp_path / "model.safetensors"
    _mixed_file(src)
    layout = read_layout(src, src.name)
    data = src.read_bytes()
    src.write_bytes(data[: len(data) - shrink])
    plan = plan_streams(layout, source=src)
    assert len(plan.segment_streams) == len(layout.segments)


def test_runs_pause_the_collector_and_give_the_settings_back() -> None:
    import gc
    import sys
    import threading

    from ckptz.pipeline.workers import SWITCH_INTERVAL_S, tuned_interpreter

    before = sys.getswitchinterval()
    assert gc.isenabled()
    inside = threading.Event()
    leave = threading.Event()

    def other_run() -> None:
        with tuned_interpreter():
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=other_run)
    with tuned_interpreter():
        assert not gc.isenabled() and sys.getswitchinterval() == pytest.approx(min(before, SWITCH_INTERVAL_S))
        t.start()
        inside.wait(10)
    assert not gc.isenabled()  # the other run still goes on
    leave.set()
    t.join()
    assert gc.isenabled() and sys.getswitchinterval() == before
    gc.disable()  # a caller that keeps the collector off keeps it off
    try:
        with tuned_interpreter():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_file_s_run_is_freed_without_the_cycle_collector(small_checkpoint: Path, tmp_path: Path) -> None:
    """Runs pause the cyclic collector (above), so whatever a file's run leaves in
    reference cycles stays in memory until a later collection: a pipeline's per-frame
    futures, records and digest state held for every file until the run's end (~6,400
    objects per GB converted). Each file's run is freed by reference counting once it is
    over: compressing, restoring, verifying, in place and back, nothing of a run is left for
    the collector to find."""
    import shutil

    api.compress(small_checkpoint, tmp_path / "warm", device="cpu")  # imports and caches first
    work = tmp_path / "ckpt"
    shutil.copytree(small_checkpoint, work)

    def runs() -> None:
        api.compress(work, tmp_path / "packed", device="cpu")
        api.decompress(tmp_path / "packed", tmp_path / "back", device="cpu")
        api.verify(tmp_path / "packed", device="cpu")
        api.compress(work, in_place=True, device="cpu")
        api.decompress(work, in_place=True, device="cpu")

    assert_runs_leave_no_cycles(runs)


def test_large_streams_get_larger_frames_up_to_the_engines_largest() -> None:
    from ckptz.formats.layout import FileLayout, Segment
    from ckptz.pipeline.plan import MIN_FRAMES, frame_size_for

    base, largest = 4 << 20, 16 << 20
    assert frame_size_for(MIN_FRAMES * 8 << 20, base, largest) == 8 << 20
    assert frame_size_for((MIN_FRAMES * 8 << 20) - 1, base, largest) == base
    assert frame_size_for(1 << 40, base, largest) == largest
    assert frame_size_for(1 << 40, base, 0) == base  # an engine with one size
    big, small = 1 << 30, 10 << 20
    layout = FileLayout(
        "safetensors",
        big + small + 100,
        (
            Segment(0, 100, "meta"),
            Segment(100, big, "tensor", "float32", ("w",), "weights"),
            Segment(100 + big, small, "tensor", "bfloat16", ("b",), "weights"),
        ),
    )
    sizes = {s.dtype: s.frame_size for s in plan_streams(layout, base, largest_frame=largest).streams}
    assert sizes == {"uint8": 4 << 20, "float32": 16 << 20, "bfloat16": base}
    assert {s.frame_size for s in plan_streams(layout, base).streams if s.dtype != "uint8"} == {base}


def test_grown_frames_restore_exactly(tmp_path: Path) -> None:
    from ckptz.engines.cpu import CpuEngine
    from ckptz.pipeline import FileSink, compress_file, restore

    class Small(CpuEngine):
        frame_size = 64 << 10
        largest_frame = 256 << 10

    src = tmp_path / "model.safetensors"
    g = torch.Generator().manual_seed(4)
    save_file({"big": torch.randn(3 << 20, generator=g), "small": torch.randn(1000, generator=g)}, str(src))
    out, back = tmp_path / "model.ckptz", tmp_path / "back.safetensors"
    with open(out, "wb") as f, Small(threads=2) as engine:
        compress_file(src, src.name, f, engine)
    with open(out, "rb") as f, open(back, "wb") as sink, Small(threads=2) as engine:
        index = read_index(f, str(out))
        assert {s.frame_size for s in index.streams if s.dtype == "float32"} == {256 << 10}
        sink.truncate(index.source_size)
        restore(f, str(out), engine, FileSink(sink), index=index)
    assert sha256(back) == sha256(src)


def test_library_saves_keep_small_frames_where_the_cli_grows_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ckptz.save``'s containers are loaded by ``ckptz.load``, which decodes CPU frames
    faster when they are small; ``compress`` grows the frames of large streams."""
    import ckptz
    from ckptz.engines.cpu import CpuEngine

    monkeypatch.setattr(CpuEngine, "frame_size", 64 << 10)
    monkeypatch.setattr(CpuEngine, "largest_frame", 256 << 10)
    state = {"big": torch.randn(3 << 20, generator=torch.Generator().manual_seed(6))}

    def float_frames(path: Path) -> set[int]:
        with open(path, "rb") as f:
            return {s.frame_size for s in read_index(f, str(path)).streams if s.dtype == "float32"}

    ckptz.save(state, tmp_path / "lib.pt.ckptz", device="cpu")
    torch.save(state, tmp_path / "plain.pt")
    api.compress(tmp_path / "plain.pt", tmp_path / "cli.pt.ckptz", device="cpu")
    assert float_frames(tmp_path / "lib.pt.ckptz") == {64 << 10}
    assert float_frames(tmp_path / "cli.pt.ckptz") == {256 << 10}
    assert torch.equal(ckptz.load(tmp_path / "lib.pt.ckptz")["big"], state["big"])


def test_a_restore_keeps_the_engines_restore_ahead_in_flight(tmp_path: Path) -> None:
    """A restore holds at most ``engine.restore_ahead`` frames between reading and writing
    them (a GPU engine asks for more than its compressions' look-ahead), and the file is
    exact."""
    import threading
    import time

    from ckptz.engines.cpu import CpuEngine
    from ckptz.pipeline import compress_file, restore
    from ckptz.pipeline.restore import FileSink

    class Counting(CpuEngine):
        frame_size = 64 << 10
        largest_frame = 64 << 10
        restore_ahead = 5  # type: ignore[assignment]

        def __init__(self) -> None:
            super().__init__(threads=8)
            self.look_ahead = 64  # a compression's: not what bounds a restore
            self.held = self.most = 0
            self.lock = threading.Lock()

        def decode(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            with self.lock:
                self.held += 1
                self.most = max(self.most, self.held)
            return super().decode(*args, **kwargs)

    class Slow(FileSink):
        def __init__(self, f, engine: Counting) -> None:  # type: ignore[no-untyped-def]
            super().__init__(f)
            self.engine = engine

        def put(self, frame, data) -> None:  # type: ignore[no-untyped-def]
            time.sleep(0.002)
            super().put(frame, data)
            with self.engine.lock:
                self.engine.held -= 1

    src = tmp_path / "model.safetensors"
    save_file({"w": torch.randn(1 << 20, generator=torch.Generator().manual_seed(9))}, str(src))
    out, back = tmp_path / "model.ckptz", tmp_path / "back.safetensors"
    with open(out, "wb") as f, Counting() as engine:
        compress_file(src, src.name, f, engine)
    with open(out, "rb") as f, open(back, "wb") as sink, Counting() as engine:
        index = read_index(f, str(out))
        sink.truncate(index.source_size)
        restore(f, str(out), engine, Slow(sink, engine), index=index)
        assert 2 <= engine.most <= 5
    assert sha256(back) == sha256(src)
