"""A file restored by several processes, each a range of its bytes (ckptz.pipeline.shards)."""

from __future__ import annotations

import itertools
import os
import signal
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
from ckptz.pipeline import Comparer, DiscardSink, FileSink, compress_file
from ckptz.pipeline import shards as shards_module
from ckptz.pipeline.restore import restore_range
from ckptz.pipeline.shards import EngineSpec, Shards, ranges, restore_with
from ckptz.runs import run as run_module
from ckptz.runs.run import restore_processes


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


def test_processes_by_default(monkeypatch: pytest.MonkeyPatch, packed: tuple[Path, Path]) -> None:
    from ckptz.runs.plan import Job
    from ckptz.runs.tree import Entry

    monkeypatch.delenv("CKPTZ_PROCESSES", raising=False)
    big = Job("convert", Entry(Path("x"), "x", "file", 8 << 30, (0, 0), 1), Path("x"), "x")  # type: ignore[arg-type]
    small = Job("convert", Entry(Path("y"), "y", "file", 1 << 20, (0, 0), 1), Path("y"), "y")  # type: ignore[arg-type]
    monkeypatch.setattr(run_module.os, "cpu_count", lambda: 16)
    assert restore_processes([big], "ans", None) == run_module.RESTORE_PROCESSES
    assert restore_processes([small], "ans", None) == 1
    assert restore_processes([big], "auto", None) == 1  # CPU decoding is bound by its cores
    assert restore_processes([big], "auto", 3) == 3
    monkeypatch.setenv("CKPTZ_PROCESSES", "4")
    assert restore_processes([big], "auto", None) == 4
    monkeypatch.setattr(run_module.os, "cpu_count", lambda: 2)
    monkeypatch.delenv("CKPTZ_PROCESSES")
    assert restore_processes([big], "ans", None) == 1


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
