"""Hashing left to the engine (``Engine.hashes``): each frame's checksum and the whole-file
digest's leaves inside it, taken where the engine holds the frame's bytes.

A GPU engine takes them on the device; :class:`HashingCpu` is the CPU engine saying it hashes
too (``encode_each``/``decode_each`` hash on the host), so the pipeline's side of it (which
frames ask for what, and where the answers go) runs here on any machine. A container made
so must be byte-identical to one whose pipeline hashed on the host, and an engine's wrong
answer must fail the run, which shows the answers are the ones used.
"""

from __future__ import annotations

import io
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from ckptz.checksums import xxh3_64
from ckptz.container import read_index
from ckptz.digest import LEAF
from ckptz.engines.base import DecodedSpan, EncodedSpan, FrameToCode, Place, Ranges, StoredSpan
from ckptz.engines.cpu import CpuEngine
from ckptz.errors import CorruptionError
from ckptz.pipeline import DiscardSink, FileSink, compress_file, restore


class HostHashing(CpuEngine):
    """The CPU engine with frames of two leaves and runs of several frames (coding too: a
    look-ahead that holds many runs)."""

    frame_size = 2 * LEAF
    largest_frame = 2 * LEAF
    span_bytes = 8 * LEAF

    def __init__(self, threads: int = 4) -> None:
        super().__init__(threads=threads)
        self.look_ahead = 200


class HashingCpu(HostHashing):
    """The same engine, hashing each frame itself; counts what it was asked."""

    hashes = True

    def __init__(self, threads: int = 4) -> None:
        super().__init__(threads=threads)
        self.asked = {"checksums": 0, "leaves": 0, "joined": 0, "decoded leaves": 0, "decoded joined": 0}

    def encode_span(
        self, frames: list[FrameToCode], buffer: np.ndarray | None, leaves: Ranges | None = None
    ) -> Future[EncodedSpan]:
        self.asked["checksums"] += sum(f.checksum is None for f in frames)
        self.asked["leaves"] += 0 if leaves is None else leaves.count
        self.asked["joined"] += 0 if leaves is None or leaves.parts is None else int((leaves.parts > 1).sum())
        # The payloads' checksums too, as a GPU takes them where it made the payloads.
        span = super().encode_span(frames, buffer, leaves).result()
        sums = np.array([xxh3_64(c.payload) for f in span.frames for c in f.chunks], np.uint64)
        return _done(replace(span, sums=sums))

    def decode_span(
        self,
        span: StoredSpan,
        place: Place | None = None,
        keep: bool = False,
        check: bool = False,
        leaves: Ranges | None = None,
    ) -> Future[DecodedSpan]:
        self.asked["decoded leaves"] += 0 if leaves is None else leaves.count
        joined = 0 if leaves is None or leaves.parts is None else int((leaves.parts > 1).sum())
        self.asked["decoded joined"] += joined
        return super().decode_span(span, place, keep, check, leaves)


class WrongLeaves(HashingCpu):
    """Gives a wrong hash for the first leaf of every span, coding or decoding (``last``:
    for the last, a joined one where the span has any)."""

    last = False

    def encode_span(
        self, frames: list[FrameToCode], buffer: np.ndarray | None, leaves: Ranges | None = None
    ) -> Future[EncodedSpan]:
        span = super().encode_span(frames, buffer, leaves).result()
        if span.leaves is not None and span.leaves.size:
            span.leaves[-1 if self.last else 0] ^= 1
        return _done(span)

    def decode_span(
        self,
        span: StoredSpan,
        place: Place | None = None,
        keep: bool = False,
        check: bool = False,
        leaves: Ranges | None = None,
    ) -> Future[DecodedSpan]:
        got = super().decode_span(span, place, keep, check, leaves).result()
        if got.leaves is not None and got.leaves.size:
            got.leaves[-1 if self.last else 0] ^= 1
        return _done(got)


class WrongSums(HashingCpu):
    """Gives a wrong checksum for the first payload of every span."""

    def encode_span(
        self, frames: list[FrameToCode], buffer: np.ndarray | None, leaves: Ranges | None = None
    ) -> Future[EncodedSpan]:
        span = super().encode_span(frames, buffer, leaves).result()
        assert span.sums is not None
        span.sums[0] ^= 1
        return _done(span)


class NoLeaves(HashingCpu):
    """Takes the checksums it is asked for but drops the leaves."""

    def encode_span(
        self, frames: list[FrameToCode], buffer: np.ndarray | None, leaves: Ranges | None = None
    ) -> Future[EncodedSpan]:
        return super().encode_span(frames, buffer)


def _done(value: object) -> Future:  # type: ignore[type-arg]
    fut: Future[object] = Future()
    fut.set_result(value)
    return fut


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gen = torch.Generator().manual_seed(11)
    state = {
        "w": torch.randn(1_500_000, generator=gen),  # 6 MB: whole leaves in every frame
        "m": (torch.randn(900_001, generator=gen) * 1e-3).to(torch.bfloat16),  # an odd size
        "zeros": torch.zeros(300_000),
        "step": 7,
    }
    path = tmp_path_factory.mktemp("hashes") / "model.pt"
    torch.save(state, path)
    return path


def _compress(src: Path, engine: CpuEngine, out: Path | None = None, verify: bool = False) -> bytes:
    buf = io.BytesIO()
    with engine:
        if out is None:
            compress_file(src, src.name, buf, engine)
            return buf.getvalue()
        with open(out, "wb+") as f:
            compress_file(src, src.name, f, engine, verify=verify)
        return out.read_bytes()


@pytest.mark.parametrize("verify", [False, True])
def test_an_engine_that_hashes_makes_the_same_container(source: Path, tmp_path: Path, verify: bool) -> None:
    want = _compress(source, HostHashing(threads=4))
    engine = HashingCpu()
    got = _compress(source, engine, tmp_path / "c.ckptz", verify)
    assert got == want
    with open(tmp_path / "c.ckptz", "rb") as f:
        frames = len(read_index(f, "c").frames)
    assert engine.asked["checksums"] == frames
    # Every frame of two leaves at an offset of its own holds at least one whole leaf, and
    # the leaf across a boundary between two frames of a run is joined from both.
    assert engine.asked["leaves"] >= frames // 2
    assert engine.asked["joined"] > 0


def test_an_engine_that_hashes_restores_and_checks(source: Path, tmp_path: Path) -> None:
    packed = tmp_path / "c.ckptz"
    packed.write_bytes(_compress(source, HostHashing(threads=4)))
    back = tmp_path / "back.pt"
    with open(packed, "rb") as f, open(back, "wb") as sink, HashingCpu() as engine:
        restore(f, "c", engine, FileSink(sink))
    assert back.read_bytes() == source.read_bytes()
    assert engine.asked["decoded leaves"] > 0 and engine.asked["decoded joined"] > 0


def test_wrong_leaf_hashes_from_the_engine_fail_the_digest(source: Path, tmp_path: Path) -> None:
    # Coding: the container records the digest the engine's hashes make, which the file's
    # bytes then do not match.
    packed = tmp_path / "c.ckptz"
    packed.write_bytes(_compress(source, WrongLeaves()))
    with (
        open(packed, "rb") as f,
        HostHashing(threads=4) as engine,
        pytest.raises(CorruptionError, match="digest"),
    ):
        restore(f, "c", engine, DiscardSink())
    # Restoring: a good container, and an engine whose leaves are wrong.
    packed.write_bytes(_compress(source, HostHashing(threads=4)))
    with open(packed, "rb") as f, WrongLeaves() as engine, pytest.raises(CorruptionError, match="digest"):
        restore(f, "c", engine, DiscardSink())


@pytest.mark.parametrize("coding", [True, False])
def test_a_wrong_joined_leaf_from_the_engine_fails_the_digest(
    source: Path, tmp_path: Path, coding: bool
) -> None:
    wrong = WrongLeaves()
    wrong.last = True
    packed = tmp_path / "c.ckptz"
    packed.write_bytes(_compress(source, wrong if coding else HostHashing(threads=4)))
    reader = HostHashing(threads=4) if coding else wrong
    with open(packed, "rb") as f, reader, pytest.raises(CorruptionError, match="digest"):
        restore(f, "c", reader, DiscardSink())


def test_an_engine_that_drops_the_leaves_fails_the_compression(source: Path) -> None:
    with pytest.raises(RuntimeError, match="did not hash the leaves"):
        _compress(source, NoLeaves())


def test_payload_checksums_from_the_engine_are_the_ones_recorded(source: Path, tmp_path: Path) -> None:
    """An engine that gives its payloads' checksums (a GPU takes them on the device) makes
    the same container (the tests above); a wrong one is what the container records: the
    read-back of a verified compression fails, and so does restoring an unverified one."""
    packed = tmp_path / "c.ckptz"
    with pytest.raises(CorruptionError):
        _compress(source, WrongSums(), packed, verify=True)
    packed.write_bytes(_compress(source, WrongSums()))
    with open(packed, "rb") as f, HostHashing(threads=4) as engine, pytest.raises(CorruptionError):
        restore(f, "c", engine, DiscardSink())
