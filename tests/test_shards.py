"""A file restored by several processes, each a range of its bytes (ckptz.pipeline.shards)."""

from __future__ import annotations

import itertools
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptz import api
from ckptz.container import read_index
from ckptz.digest import Digest, LeafHashes, leaf_count
from ckptz.engines.cpu import CpuEngine
from ckptz.errors import CorruptionError, MismatchError
from ckptz.formats.layout import FileLayout, Segment
from ckptz.pipeline import Comparer, DiscardSink, FileSink, compress_file
from ckptz.pipeline import shards as shards_module
from ckptz.pipeline.plan import frame_map, plan_streams, split_plan
from ckptz.pipeline.restore import restore_range
from ckptz.pipeline.shards import EngineSpec, Shards, ranges, restore_with
from ckptz.runs import run as run_module
from ckptz.runs.results import SilentReporter
from ckptz.runs.run import split_processes


class SmallFrames(CpuEngine):
    """The CPU engine with 64 KiB frames: many frames cross every cut."""

    frame_size = 64 << 10


@pytest.fixture
def packed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    monkeypatch.setattr(shards_module, "MIN_RANGE", 1 << 20)
    monkeypatch.setattr(
        shards_module, "RANGES_PER_PROCESS", 2
    )  # more cuts, each frame across one decoded twice
    gen = torch.Generator().manual_seed(5)
    state = {
        "w": torch.randn(1_500_000, generator=gen),
        "m": (torch.randn(900_000, generator=gen) * 1e-3).to(torch.bfloat16),
        "v": torch.rand(700_000, generator=gen) ** 4,
        "zeros": torch.zeros(200_000),
        "step": 11,
    }
    src = tmp_path / "optimizer.pt"
    torch.save(state, src)
    out = tmp_path / "optimizer.pt.ckptz"
    with open(out, "wb") as f, SmallFrames(threads=2) as engine:
        compress_file(src, "optimizer.pt", f, engine)
    return src, out


@pytest.fixture
def shards() -> Iterator[Shards]:
    with Shards(EngineSpec("cpu", 2, 3, "auto", None), 2) as s:
        assert s.wait_started() == 2
        yield s


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 1 << 34), st.sampled_from([1 << 12, 1 << 19, 1 << 20]), st.integers(1, 9))
def test_ranges_tile_the_file_in_whole_leaves(size: int, leaf: int, parts: int) -> None:
    cuts = ranges(size, leaf, parts)
    if size == 0:
        assert cuts == []
        return
    assert cuts[0][0] == 0 and cuts[-1][1] == size
    assert all(a[1] == b[0] for a, b in itertools.pairwise(cuts))
    assert all(lo % leaf == 0 and lo < hi for lo, hi in cuts)
    assert len(cuts) <= max(1, min(parts, size // shards_module.MIN_RANGE))
    if len(cuts) > 1:
        assert min(hi - lo for lo, hi in cuts) >= shards_module.MIN_RANGE - leaf


def test_ranges_restored_apart_give_the_file_and_its_digest(
    packed: tuple[Path, Path], tmp_path: Path
) -> None:
    src, out = packed
    back = tmp_path / "back.pt"
    rng = np.random.default_rng(0)
    with open(out, "rb") as c, open(back, "w+b") as f, SmallFrames(threads=2) as engine:
        index = read_index(c, "optimizer.pt")
        leaf, size = index.source_digest.kind.leaf, index.source_size
        for _ in range(3):
            inner = sorted(set(rng.integers(1, leaf_count(size, leaf), 4).tolist()))
            cuts = [0, *(k * leaf for k in inner), size]
            f.truncate(0)
            f.truncate(size)
            hashes = LeafHashes(leaf_count(size, leaf))
            for lo, hi in itertools.pairwise(cuts):
                got: list[int] = []
                h = restore_range(
                    c, "x", engine, FileSink(f, size), (lo, hi), index=index, progress=got.append
                )
                assert h.size == leaf_count(hi, leaf) - lo // leaf
                hashes.set_many(np.arange(lo // leaf, lo // leaf + h.size), h)
                assert sum(got) == hi - lo  # progress counts the range's bytes, not whole frames
            assert Digest(index.source_digest.kind, hashes.hexdigest()) == index.source_digest
            assert back.read_bytes() == src.read_bytes()


def test_a_range_must_be_whole_leaves(packed: tuple[Path, Path]) -> None:
    _, out = packed
    with open(out, "rb") as c, SmallFrames(threads=2) as engine:
        index = read_index(c, "x")
        with pytest.raises(ValueError, match="whole leaves"):
            restore_range(c, "x", engine, DiscardSink(), (100, index.source_size), index=index)


def test_helpers_restore_ranges_into_the_callers_file(
    packed: tuple[Path, Path], tmp_path: Path, shards: Shards
) -> None:
    src, out = packed
    back = tmp_path / "back.pt"
    with open(out, "rb") as c, open(back, "w+b") as f, SmallFrames(threads=2) as engine:
        index = read_index(c, "x")
        ticks: list[int] = []
        restore_with(
            shards, c, "x", engine, FileSink(f, index.source_size), index=index, progress=ticks.append
        )
    assert back.read_bytes() == src.read_bytes()
    assert shards.helped_bytes > 0  # not all restored by the caller
    assert sum(ticks) == index.source_size
    with open(out, "rb") as c, open(src, "rb") as o, SmallFrames(threads=2) as engine:
        restore_with(shards, c, "x", engine, Comparer(o, "x"))
        restore_with(shards, c, "x", engine, DiscardSink())


def test_a_difference_found_by_a_helper_is_named(
    packed: tuple[Path, Path], tmp_path: Path, shards: Shards
) -> None:
    src, out = packed
    changed = tmp_path / "changed.pt"
    data = bytearray(src.read_bytes())
    for at in (len(data) // 5, len(data) - 1000):  # one in each half: whoever holds it says so
        data[at] ^= 0x40
    changed.write_bytes(data)
    with (
        open(out, "rb") as c,
        open(changed, "rb") as o,
        SmallFrames(threads=2) as engine,
        pytest.raises(MismatchError, match="differs from the original at byte"),
    ):
        restore_with(shards, c, "x", engine, Comparer(o, "x"))


@pytest.mark.parametrize("where", [0.3, 0.9])
def test_damage_in_any_range_is_caught(
    packed: tuple[Path, Path], tmp_path: Path, shards: Shards, where: float
) -> None:
    _, out = packed
    bad = tmp_path / "bad.ckptz"
    data = bytearray(out.read_bytes())
    with open(out, "rb") as c:
        index = read_index(c, "x")
    chunks = index.chunks[index.chunks["size"] > 1000]
    chunk = chunks[int(where * (len(chunks) - 1))]
    data[int(chunk["offset"]) + int(chunk["size"]) // 2] ^= 0x01
    bad.write_bytes(data)
    with (
        open(bad, "rb") as c,
        SmallFrames(threads=2) as engine,
        pytest.raises(CorruptionError, match="fail their checksum") as caught,
    ):
        restore_with(shards, c, "bad", engine, DiscardSink())
    assert caught.value.path == "bad" and caught.value.chunk is not None


def test_a_helper_that_dies_leaves_its_ranges_to_the_caller(
    packed: tuple[Path, Path], tmp_path: Path, shards: Shards
) -> None:
    src, out = packed
    for child in shards._children:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    back = tmp_path / "back.pt"
    with open(out, "rb") as c, open(back, "w+b") as f, SmallFrames(threads=2) as engine:
        index = read_index(c, "x")
        restore_with(shards, c, "x", engine, FileSink(f, index.source_size), index=index)
    assert back.read_bytes() == src.read_bytes()


def test_decompress_splits_large_files_across_processes(
    packed: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, out = packed
    os.chmod(out, 0o640)
    made: list[Shards] = []
    real = Shards.restore

    def spy(self: Shards, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.wait_started()  # the helpers take ranges (else the caller may take them all)
        made.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Shards, "restore", spy)
    dst = tmp_path / "restored"
    api.decompress(out, dst / "optimizer.pt", processes=3, device="cpu")
    assert (dst / "optimizer.pt").read_bytes() == src.read_bytes()
    assert made and made[0].processes == 3 and made[0].helped_bytes > 0
    assert api.decompress(out, None, discard=True, processes=2, device="cpu").files


def test_helpers_read_back_what_they_restore_in_place(
    packed: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In place, the container goes away: each helper's sink reads back every frame it
    writes, as the caller's does (``_sink_of`` passes that on)."""
    src, out = packed
    with open(tmp_path / "f", "w+b") as f:
        assert shards_module._sink_of(FileSink(f, 10, read_back=True))[0] == "file read back"  # type: ignore[index]
        assert shards_module._sink_of(FileSink(f, 10))[0] == "file"  # type: ignore[index]
    made: list[Shards] = []
    real = Shards.restore

    def spy(self: Shards, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.wait_started()
        made.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Shards, "restore", spy)
    alone = tmp_path / "alone" / out.name
    alone.parent.mkdir()
    out.rename(alone)
    api.decompress(alone, in_place=True, processes=3, device="cpu")
    assert not alone.exists() and alone.with_suffix("").read_bytes() == src.read_bytes()
    assert made and made[0].helped_bytes > 0


def test_processes_by_default(monkeypatch: pytest.MonkeyPatch, packed: tuple[Path, Path]) -> None:
    from ckptz.runs.plan import Job
    from ckptz.runs.tree import Entry

    big = Job("convert", Entry(Path("x"), "x", "file", 8 << 30, (0, 0), 1), Path("x"), "x")  # type: ignore[arg-type]
    small = Job("convert", Entry(Path("y"), "y", "file", 1 << 20, (0, 0), 1), Path("y"), "y")  # type: ignore[arg-type]
    monkeypatch.setattr(run_module.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(shards_module, "helpers_running", lambda: False)
    huge = Job("convert", Entry(Path("z"), "z", "file", 40 << 30, (0, 0), 1), Path("z"), "z")  # type: ignore[arg-type]
    assert split_processes([big], "ans", None) == 1  # helper start-up would not pay back
    assert split_processes([huge], "ans", None) == run_module.SPLIT_PROCESSES
    assert split_processes([big] * 5, "ans", None) == run_module.SPLIT_PROCESSES
    monkeypatch.setattr(shards_module, "helpers_running", lambda: True)  # a library converted before
    assert split_processes([big], "ans", None) == run_module.SPLIT_PROCESSES
    assert split_processes([small], "ans", None) == 1
    assert split_processes([big], "auto", None) == 1  # CPU decoding is bound by its cores
    monkeypatch.setattr(run_module, "writes_portable_on_gpu", lambda want, codec, writes, n: False)
    assert split_processes([big], "auto", None, "cuda", True) == 1  # the CPU threads code it
    monkeypatch.setattr(run_module, "writes_portable_on_gpu", lambda want, codec, writes, n: writes)
    assert split_processes([big], "auto", None, "cuda", True) == run_module.SPLIT_PROCESSES
    assert split_processes([big], "auto", None, "cuda") == 1  # its restores: one process
    assert split_processes([big], "auto", 3) == 3
    monkeypatch.setattr(run_module.os, "cpu_count", lambda: 2)
    assert split_processes([big], "ans", None) == 1


def test_a_file_too_small_to_split_goes_whole_to_a_free_helper(
    packed: tuple[Path, Path], tmp_path: Path, shards: Shards, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, out = packed
    monkeypatch.setattr(shards_module, "MIN_RANGE", 1 << 30)
    monkeypatch.setattr(shards_module, "MIN_WHOLE", 1 << 20)
    back = tmp_path / "back.pt"
    with open(out, "rb") as c, open(back, "w+b") as f, SmallFrames(threads=2) as engine:
        index = read_index(c, "x")
        restore_with(shards, c, "x", engine, FileSink(f, index.source_size), index=index)
    assert back.read_bytes() == src.read_bytes()
    assert shards.helped_bytes == index.source_size


def test_a_series_delta_is_restored_whole_by_the_caller(packed: tuple[Path, Path], shards: Shards) -> None:
    _, out = packed
    with open(out, "rb") as c, SmallFrames(threads=2) as engine:
        index = read_index(c, "x")
        index.header["reference"] = {"digest": "0" * 32}  # what a delta's header names
        assert not shards.restore(c, "x", engine, DiscardSink(), index, lambda _: None)
    assert shards.helped_bytes == 0


# -- a large file compressed by several processes, each the streams of a part of its bytes ---------


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 5000), st.sampled_from(["float32", "bfloat16", "uint8"]), st.booleans()),
        min_size=1,
        max_size=40,
    ),
    st.integers(1, 5),
    st.integers(1, 20000),
)
def test_split_plan_keeps_every_frame_in_one_part(
    specs: list[tuple[int, str, bool]], parts: int, least: int
) -> None:
    segments, at = [], 0
    for n, dtype, tensor in specs:
        word = 2 if dtype == "bfloat16" else 4 if dtype == "float32" else 1
        n = max(word, n // word * word)
        kind = "tensor" if tensor else "meta"
        segments.append(
            Segment(
                at,
                n,
                kind,
                dtype if tensor else "uint8",
                ("k",) if tensor else (),
                "weights" if tensor else "metadata",
            )
        )  # type: ignore[arg-type]
        at += n
    layout = FileLayout("opaque", at, tuple(segments))
    plan = plan_streams(layout, 256)
    split, cut = split_plan(plan, layout, parts, least)
    windows = [p.window for p in cut]
    assert windows[0][0] == 0 and windows[-1][1] == layout.size
    assert all(a[1] == b[0] for a, b in itertools.pairwise(windows))
    assert len(cut) <= parts
    if len(cut) == 1:
        assert split == plan
        return
    assert all(hi - lo >= least for lo, hi in windows)
    assert {w[0] for w in windows[1:]} <= {s.offset for s in segments}  # no segment is cut
    assert [s.id for s in split.streams] == list(range(len(split.streams)))
    assert sorted(sid for p in cut for sid in p.streams) == list(range(len(split.streams)))
    # Each stream keeps what it was, and counts its own part's bytes.
    for seg, old, new in zip(segments, plan.segment_streams, split.segment_streams, strict=True):
        a, b = plan.streams[old], split.streams[new]
        assert (a.component, a.dtype, a.word, a.rotate, a.frame_size) == (
            b.component,
            b.dtype,
            b.word,
            b.rotate,
            b.frame_size,
        )
        assert any(new in p.streams and p.window[0] <= seg.offset < p.window[1] for p in cut)
    for sid, s in enumerate(split.streams):
        assert s.length == sum(
            seg.length for seg, x in zip(segments, split.segment_streams, strict=True) if x == sid
        )
    for f in frame_map(
        [(sid, seg.length) for seg, sid in zip(segments, split.segment_streams, strict=True)],
        [s.frame_size for s in split.streams],
    ):
        (owner,) = [p for p in cut if f.stream in p.streams]
        assert all(owner.window[0] <= at and at + n <= owner.window[1] for at, _, n in f.pieces)


@pytest.fixture
def many(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An optimizer-like file of many tensors (boundaries everywhere, none on a leaf)."""
    monkeypatch.setattr(shards_module, "MIN_RANGE", 1 << 20)
    gen = torch.Generator().manual_seed(7)
    state = {f"exp_avg.{i}": torch.randn(60_000 + 37 * i, generator=gen) * 1e-3 for i in range(30)}
    state |= {f"exp_avg_sq.{i}": torch.rand(60_000 + 41 * i, generator=gen) ** 4 for i in range(30)}
    state |= {"master": torch.randn(700_000, generator=gen).to(torch.bfloat16).float(), "step": 11}
    src = tmp_path / "optimizer.pt"
    torch.save(state, src)
    return src


def _packed(
    src: Path, out: Path | None, helpers: Shards | None, verify: bool = False
) -> tuple[object, bytes]:
    with SmallFrames(threads=2) as engine:
        if out is None:
            w = compress_file(src, "optimizer.pt", None, engine, helpers=helpers)
        else:
            with open(out, "w+b") as f:
                w = compress_file(src, "optimizer.pt", f, engine, helpers=helpers, verify=verify)
    return w, out.read_bytes() if out is not None else b""


@pytest.mark.parametrize("verify", [False, True])
def test_helpers_code_parts_of_a_file_into_one_container(
    many: Path, tmp_path: Path, shards: Shards, verify: bool
) -> None:
    whole, _ = _packed(many, tmp_path / "whole.ckptz", None)
    split, _ = _packed(many, tmp_path / "split.ckptz", shards, verify)
    assert shards.helped_bytes > 0  # a helper coded a part
    # The same file and digest; streams apart by part, so a few more of them.
    assert split.index.source_digest == whole.index.source_digest  # type: ignore[attr-defined]
    assert len(split.index.streams) > len(whole.index.streams)  # type: ignore[attr-defined]
    back = tmp_path / "back.pt"
    api.decompress(tmp_path / "split.ckptz", back, device="cpu", processes=1)
    assert back.read_bytes() == many.read_bytes()
    assert api.verify(tmp_path / "split.ckptz").ok
    # Writes discarded: the same index, nothing written.
    discarded, _ = _packed(many, None, shards)
    assert discarded.index.source_digest == whole.index.source_digest  # type: ignore[attr-defined]


def test_compress_splits_large_files_across_processes(
    many: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[Shards] = []
    real = Shards.code_parts

    def spy(self: Shards, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.wait_started()  # a helper takes the part (else the caller may code it first)
        made.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Shards, "code_parts", spy)
    os.chmod(many, 0o640)
    original = many.read_bytes()
    api.compress(many, in_place=True, device="cpu", processes=2)
    packed = many.with_name("optimizer.pt.ckptz")
    assert not many.exists() and packed.stat().st_mode & 0o777 == 0o640
    assert made and made[0].helped_bytes > 0
    api.decompress(packed, tmp_path / "back.pt", device="cpu", processes=1)
    assert (tmp_path / "back.pt").read_bytes() == original


class Counting(SilentReporter):
    def __init__(self) -> None:
        self.bytes = 0
        self._lock = threading.Lock()

    def advance(self, nbytes: int) -> None:
        with self._lock:
            self.bytes += nbytes


def test_a_helper_that_dies_while_coding_leaves_the_file_to_the_caller(
    many: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A helper gone after taking places in the container: the file is compressed again,
    whole, by the caller (the first output is dropped), and is exact."""
    real, share = Shards._run, Shards.code_parts
    died: list[int] = []

    def dies(self: Shards, sock, task):  # type: ignore[no-untyped-def]
        if task.places is None:
            return real(self, sock, task)
        task.placed = True
        died.append(1)
        raise EOFError  # as when its socket closes

    def ready(self: Shards, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.wait_started()
        return share(self, *args, **kwargs)

    monkeypatch.setattr(Shards, "_run", dies)
    monkeypatch.setattr(Shards, "code_parts", ready)
    original = many.read_bytes()
    out = tmp_path / "out"
    counted = Counting()
    api.compress(many, out / "optimizer.pt.ckptz", device="cpu", processes=2, reporter=counted)
    assert died  # a helper took the part, and died
    assert counted.bytes == len(original)  # the bytes coded twice are counted once
    assert [p.name for p in out.iterdir()] == ["optimizer.pt.ckptz"]  # no temp left
    api.decompress(out / "optimizer.pt.ckptz", tmp_path / "back.pt", device="cpu", processes=1)
    assert (tmp_path / "back.pt").read_bytes() == original


def test_a_file_whose_only_cuts_are_lopsided_stays_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shards: Shards
) -> None:
    """One large tensor in the middle: the boundaries nearest the middle would leave one
    part a tenth of the file, so it is coded whole (no more streams than unsplit)."""
    monkeypatch.setattr(shards_module, "MIN_RANGE", 1 << 20)
    gen = torch.Generator().manual_seed(3)
    state = {"a": torch.randn(100_000, generator=gen), "big": torch.randn(2_000_000, generator=gen)}
    state["b"] = torch.randn(100_000, generator=gen)
    src = tmp_path / "lopsided.pt"
    torch.save(state, src)
    whole, _ = _packed(src, tmp_path / "whole.ckptz", None)
    split, _ = _packed(src, tmp_path / "split.ckptz", shards)
    assert shards.helped_bytes == 0
    assert len(split.index.streams) == len(whole.index.streams)  # type: ignore[attr-defined]


def test_a_file_that_is_not_split_when_written_to_a_pipe(many: Path, shards: Shards) -> None:
    r, w = os.pipe()
    with os.fdopen(w, "wb") as f, SmallFrames(threads=2) as engine:
        import threading

        drained = bytearray()
        t = threading.Thread(target=lambda: drained.extend(b"".join(iter(lambda: os.read(r, 1 << 20), b""))))
        t.start()
        compress_file(many, "optimizer.pt", f, engine, helpers=shards)
    t.join()
    os.close(r)
    assert shards.helped_bytes == 0 and drained


def test_a_helper_runs_the_callers_ckptz_not_one_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m`` puts the working directory first on the path: a ``ckptz`` folder there
    (another checkout, or planted) must not be what a helper runs."""
    planted = tmp_path / "ckptz" / "pipeline"
    planted.mkdir(parents=True)
    (tmp_path / "ckptz" / "__init__.py").write_text("")
    (planted / "__init__.py").write_text("")
    (planted / "shards.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.chdir(tmp_path)
    with Shards(EngineSpec("cpu", 1, 3, "auto", None), 1) as s:
        assert s.wait_started() == 1
