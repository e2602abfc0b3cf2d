"""Whole-file digests (ckptz.digest, format 1.4): the leaf tree's exact definition, the
parallel path against the sequential one over random files and random runs of bytes, and
the containers that record it: round trips, old containers, damage, headers, series deltas."""

from __future__ import annotations

import itertools
import os
import random
import struct
import tempfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

import ckptz
import ckptz.digest
from ckptz import api, checksums
from ckptz.container import (
    FOOTER,
    Index,
    checksum,
    frame_chunk_starts,
    index_bytes,
    read_index,
    stream_frame_lists,
)
from ckptz.digest import (
    LEAF,
    SEQUENTIAL,
    TREE,
    Digest,
    Hasher,
    Kind,
    Piecewise,
    leaf_count,
    of_file,
    whole_leaves,
)
from ckptz.engines.cpu import CpuEngine
from ckptz.errors import ContainerError, CorruptionError, ReferenceChangedError
from ckptz.pipeline import FileSink, compress_file, restore
from ckptz.pipeline.plan import Frame, frame_map
from ckptz.pipeline.workers import FileDigest
from ckptz.series.delta import delta_for, index_tensors
from ckptz.series.reference import ContainerReference, RefSpec
from ckptz.series.run import recode

FIXTURES = Path(__file__).parent.parent / "fixtures"


def tree_digest(data: bytes, leaf: int = LEAF) -> str:
    """FORMAT.md's definition, as plainly as it reads."""
    hashes = b"".join(
        xxhash.xxh3_64_intdigest(data[i : i + leaf]).to_bytes(8, "little") for i in range(0, len(data), leaf)
    )
    return xxhash.xxh3_128_hexdigest(hashes)


# --- the definition ----------------------------------------------------------------------


def test_known_answers() -> None:
    """Pinned values: a change here changes the format."""
    data = bytes(range(256)) * 1025  # two whole 128 KiB leaves and a short one
    kind = Kind("xxh3_tree", 1 << 17)
    assert Hasher(kind).hexdigest() == "99aa06d3014798d86001c324468d497f"  # no leaves
    h = Hasher(kind)
    h.update(data)
    assert h.hexdigest() == tree_digest(data, kind.leaf) == "85d774a4ad6ee040898a83908d1d2461"
    h = Hasher(SEQUENTIAL)
    h.update(data)
    assert h.hexdigest() == xxhash.xxh3_128_hexdigest(data)


def test_whole_leaves() -> None:
    assert list(whole_leaves(0, 10, 4, 10)) == [0, 1, 2]  # the short last leaf ends the file
    assert list(whole_leaves(0, 9, 4, 10)) == [0, 1]
    assert list(whole_leaves(1, 9, 4, 10)) == [1, 2]
    assert list(whole_leaves(1, 6, 4, 10)) == []  # [1, 7) holds no leaf whole
    assert list(whole_leaves(4, 4, 4, 10)) == [1]
    assert list(whole_leaves(10, 0, 4, 10)) == []
    assert leaf_count(0, 4) == 0 and leaf_count(1, 4) == 1 and leaf_count(8, 4) == 2


def test_json_forms() -> None:
    tree = Digest(TREE, "0123456789abcdef0123456789abcdef")
    assert tree.to_json() == {"xxh3_tree": {"leaf": LEAF, "digest": tree.hex}}
    assert Digest.from_json({"name": "x", **tree.to_json()}) == tree
    old = Digest.from_json({"xxh3_128": "00"})
    assert old == Digest(SEQUENTIAL, "00") and old.to_json() == {"xxh3_128": "00"}
    assert old != Digest(TREE, "00")  # kinds never compare equal
    assert Digest.from_json({"name": "x"}) is None
    assert str(tree) == f"{tree.hex} (xxh3_tree, 512 KiB leaves)"
    assert str(old) == "00 (xxh3_128)"
    for bad in (
        {"leaf": 1000, "digest": tree.hex},  # not a power of two
        {"leaf": 1 << 31, "digest": tree.hex},
        {"leaf": 1024, "digest": tree.hex},
        {"leaf": True, "digest": tree.hex},
        {"leaf": LEAF, "digest": "00"},
        {"leaf": LEAF, "digest": tree.hex.upper()},
        {"leaf": LEAF},
    ):
        with pytest.raises(ValueError):
            Digest.from_json({"xxh3_tree": bad})
    with pytest.raises(ValueError):
        Digest.from_json({"xxh3_tree": [LEAF, tree.hex]})
    with pytest.raises(TypeError):
        Digest.from_json(["xxh3_128"])  # type: ignore[arg-type]


# --- the parallel path against the sequential one ------------------------------------------


@st.composite
def layouts(draw: st.DrawFn) -> tuple[bytes, int, list[Frame], list[int]]:
    """A random file, a leaf size, the file cut into pieces at random boundaries (tiny pieces
    and cuts beside leaf boundaries included), the pieces dealt to frames at random, and an
    order to finish the frames in."""
    leaf = draw(st.sampled_from([1, 3, 64, 4096, LEAF]))
    size = draw(st.one_of(st.just(0), st.integers(0, 4 * leaf + 3), st.integers(0, 300)))
    near = st.builds(lambda k, d: k * leaf + d, st.integers(0, 5), st.integers(-2, 2))
    cuts = draw(st.lists(st.one_of(st.integers(0, size), near), max_size=24))
    bounds = sorted({0, size, *(c for c in cuts if 0 <= c <= size)})
    pieces = [(a, b - a) for a, b in itertools.pairwise(bounds) if b > a]
    count = draw(st.integers(1, max(1, len(pieces))))
    owner = [draw(st.integers(0, count - 1)) for _ in pieces]
    frames = []
    for k in range(count):
        mine, within = [], 0
        for (at, n), o in zip(pieces, owner, strict=True):
            if o == k:
                mine.append((at, within, n))
                within += n
        if mine:
            frames.append(Frame(0, len(frames), within, tuple(mine)))
    order = draw(st.permutations(range(len(frames))))
    seed = draw(st.integers(0, 2**32 - 1))
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
    return data, leaf, frames, list(order)


def _frame_bytes(data: bytes, frame: Frame) -> np.ndarray:
    return np.frombuffer(b"".join(data[at : at + n] for at, _, n in frame.pieces), np.uint8)


def _pipeline_digest(
    data: bytes, kind: Kind, frames: list[Frame], order: list[int], in_order: bool = True
) -> tuple[Digest, bytes]:
    """The digest as the pipelines take it: frames finished in ``order``, each hashed where
    it is before its future is set and it is given; with ``in_order``, a sink that takes the
    file's bytes in order too (stdout), walked by ``result``."""
    digest = Piecewise(kind, len(data))
    futures: list[Future[np.ndarray]] = [Future() for _ in frames]
    released: list[int] = []
    seen: list[bytes] = []
    each = (lambda piece: seen.append(bytes(piece))) if in_order else None
    taker = FileDigest(digest, frames, futures, released.append, None, each)
    for i in order:
        buf = _frame_bytes(data, frames[i])
        digest.hash_whole(frames[i].pieces, buf)
        futures[i].set_result(buf)
        taker.give([(i, buf)])
    if not in_order and not digest.walks:  # nothing walks: every frame is free once given
        assert sorted(released) == list(range(len(frames)))
    got = taker.result()
    assert sorted(released) == list(range(len(frames)))  # each frame once
    return got, b"".join(seen)


@settings(max_examples=300, deadline=None)
@given(layouts(), st.integers(1, 5), st.data())
def test_pieces_in_any_order_give_the_sequential_digest(
    layout: tuple[bytes, int, list[Frame], list[int]], shift: int, draw: st.DataObject
) -> None:
    data, leaf, frames, order = layout
    kind = Kind("xxh3_tree", leaf)
    # Small blocks of leaf hashes, so that leaves of one file fall into several.
    with mock.patch.object(ckptz.digest, "_BLOCK_SHIFT", shift):
        got, seen = _pipeline_digest(data, kind, frames, order)
        assert seen == data
        assert _pipeline_digest(data, kind, frames, order, in_order=False)[0] == got
        sequential = Hasher(kind)
        at = 0
        while at < len(data):  # fed in random amounts, across leaf boundaries
            n = draw.draw(st.integers(1, max(1, len(data) // 3 + 1)))
            sequential.update(data[at : at + n])
            at += n
        assert got == sequential.digest() == Digest(kind, tree_digest(data, leaf))
        with tempfile.NamedTemporaryFile() as f:
            f.write(data)
            f.flush()
            assert of_file(f.name, kind, threads=draw.draw(st.integers(1, 4))) == got
            assert of_file(f.fileno(), SEQUENTIAL) == Digest(SEQUENTIAL, xxhash.xxh3_128_hexdigest(data))
    for in_order in (True, False):
        old, _ = _pipeline_digest(data, SEQUENTIAL, frames, order, in_order)
        assert old == Digest(SEQUENTIAL, xxhash.xxh3_128_hexdigest(data))


@st.composite
def nested(draw: st.DrawFn) -> tuple[np.ndarray, list[tuple[int, int]], list[tuple[int, int]]]:
    """Bytes, ranges of them that do not overlap one another (frames, with gaps), and inner
    ranges that do not overlap one another: inside a frame, across two, in a gap, empty."""
    size = draw(st.integers(0, 3000))
    data = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).integers(0, 256, size, dtype=np.uint8)

    def disjoint() -> list[tuple[int, int]]:
        bounds = sorted(set(draw(st.lists(st.integers(0, size), max_size=16))))
        ranges = [(a, b - a) for a, b in itertools.pairwise(bounds) if draw(st.booleans())]
        return [ranges[i] for i in draw(st.permutations(range(len(ranges))))]  # any order

    return data, disjoint(), disjoint()


@settings(max_examples=300, deadline=None)
@given(nested())
def test_nested_ranges_hash_as_each_alone(
    case: tuple[np.ndarray, list[tuple[int, int]], list[tuple[int, int]]],
) -> None:
    """A frame's checksum and its leaves in one pass give what each hashed alone gives
    (python xxhash, an independent implementation); overlapping ranges are refused, not misread."""
    data, outer, inner = case
    o = np.array(outer, np.int64).reshape(-1, 2)
    i = np.array(inner, np.int64).reshape(-1, 2)
    sums, leaves = checksums.xxh3_64_nested(data, o[:, 0], o[:, 1], i[:, 0], i[:, 1])
    assert sums.tolist() == [xxhash.xxh3_64_intdigest(data[a : a + n].tobytes()) for a, n in outer]
    assert leaves.tolist() == [xxhash.xxh3_64_intdigest(data[a : a + n].tobytes()) for a, n in inner]
    if len(inner) and inner[0][1] > 1:
        a, n = inner[0]
        with pytest.raises(ValueError, match="overlaps"):
            checksums.xxh3_64_nested(data, o[:, 0], o[:, 1], np.array([a, a + 1]), np.array([n, n - 1]))
    with pytest.raises(ValueError, match="outside"):
        checksums.xxh3_64_nested(data, np.array([data.size]), np.array([1]), i[:, 0], i[:, 1])


@settings(max_examples=200, deadline=None)
@given(layouts())
def test_a_run_s_frames_hashed_with_their_leaves(layout: tuple[bytes, int, list[Frame], list[int]]) -> None:
    """:meth:`Piecewise.hash_frames` of a run's frames laid end to end in one buffer (as a
    CPU compression reads them): each frame's checksum, and the digest's leaves that lie
    whole inside their pieces, the same as hashing each apart."""
    data, leaf, frames, _ = layout
    kind = Kind("xxh3_tree", leaf)
    buf = np.concatenate([_frame_bytes(data, f) for f in frames]) if frames else np.zeros(0, np.uint8)
    at = np.cumsum([0, *(f.length for f in frames)])[:-1].astype(np.int64)
    pieces = [(p, a + w, n) for f, a in zip(frames, at.tolist(), strict=True) for p, w, n in f.pieces]
    fused, apart = Piecewise(kind, len(data)), Piecewise(kind, len(data))
    lengths = np.array([f.length for f in frames], np.int64)
    sums = fused.hash_frames(sorted(pieces), buf, at, lengths)
    assert sums.tolist() == [xxhash.xxh3_64_intdigest(_frame_bytes(data, f).tobytes()) for f in frames]
    apart.hash_whole(sorted(pieces), buf)
    assert fused.hashes.hexdigest() == apart.hashes.hexdigest()  # every leaf hash alike
    assert Piecewise(SEQUENTIAL, len(data)).hash_frames(pieces, buf, at, lengths).tolist() == sums.tolist()


@settings(max_examples=200, deadline=None)
@given(layouts(), st.data())
def test_leaves_by_run_give_the_sequential_digest(
    layout: tuple[bytes, int, list[Frame], list[int]], draw: st.DataObject
) -> None:
    """Runs of consecutive frames hashed where their bytes are (:class:`LeafTable`): the
    leaves inside their frames, and those straddling two of a run's frames joined from
    their parts; :class:`LeafJoins` hashes those straddling runs as frames are given."""
    data, leaf, frames, _ = layout
    kind = Kind("xxh3_tree", leaf)
    cuts = draw.draw(st.sets(st.integers(1, len(frames) - 1))) if len(frames) > 1 else set()
    runs = [range(a, b) for a, b in itertools.pairwise([0, *sorted(cuts), len(frames)]) if b > a]
    digest = Piecewise(kind, len(data))
    futures: list[Future[np.ndarray]] = [Future() for _ in frames]
    released: list[int] = []
    taker = FileDigest(digest, frames, futures, released.append, runs)
    table = taker.table
    assert table is not None
    # A table not told the runs works each span out on its own: the same leaves and parts.
    unplanned = Piecewise(kind, len(data)).leaf_table([f.pieces for f in frames])
    loose = set(table.loose()[0].tolist())
    assert loose <= set(unplanned.loose()[0].tolist())
    for r in [runs[i] for i in draw.draw(st.permutations(range(len(runs))))]:
        numbers, frame, start, size, parts = table.span(r.start, r.stop)
        for got, want in zip(table.span(r.start, r.stop), unplanned.span(r.start, r.stop), strict=True):
            assert got.tolist() == want.tolist()
        assert parts.sum() == frame.size and (parts >= 1).all()
        assert not loose & set(numbers.tolist())  # a leaf is the run's or loose, never both
        got, ends = [], np.cumsum(parts).tolist()
        for k, end, count in zip(numbers.tolist(), ends, parts.tolist(), strict=True):
            joined = b"".join(
                _frame_bytes(data, frames[r.start + f])[a : a + n].tobytes()
                for f, a, n in zip(
                    frame[end - count : end], start[end - count : end], size[end - count : end], strict=True
                )
            )
            assert joined == data[k * leaf : (k + 1) * leaf]  # each leaf, whole
            got.append(xxhash.xxh3_64_intdigest(joined))
        table.take(r, np.array(got, np.uint64))
        for i in r:
            futures[i].set_result(_frame_bytes(data, frames[i]))
        taker.give([(i, futures[i].result()) for i in r])  # a run's frames at once
    assert taker.result() == Digest(kind, tree_digest(data, leaf))
    assert sorted(released) == list(range(len(frames)))
    if runs and table.span(runs[0].start, runs[0].stop)[0].size:
        with pytest.raises(RuntimeError, match="did not hash"):
            table.take(runs[0], None)  # an engine that gave no hashes


def test_a_frame_held_for_a_leaf_keeps_only_that_leaf_s_bytes() -> None:
    """A frame that waits for another (a leaf straddles them) keeps copies of the parts the
    leaf needs, not the buffer it lies in: a GPU restore decodes ~40 frames into one pinned
    buffer, which a view of one frame kept whole (session 37: 43 buffers of 171 MiB held in
    an 8.25 GB restore). The digest is the same."""
    import gc
    import weakref

    leaf = 1 << 12
    data = np.random.default_rng(4).integers(0, 256, 4 * leaf, dtype=np.uint8).tobytes()
    cut = 2 * leaf + 100  # leaf 2 straddles frames 0 and 1
    frames = [Frame(0, 0, cut, ((0, 0, cut),)), Frame(0, 1, len(data) - cut, ((cut, 0, len(data) - cut),))]
    digest = Piecewise(Kind("xxh3_tree", leaf), len(data))
    released: list[int] = []
    taker = FileDigest(digest, frames, [Future(), Future()], released.append)
    big = np.zeros(64 * leaf, np.uint8)  # the span's buffer: frame 1 is a view of part of it
    big[leaf : leaf + frames[1].length] = np.frombuffer(data[cut:], np.uint8)
    gone = weakref.ref(big)
    frame1 = big[leaf : leaf + frames[1].length]
    digest.hash_whole(frames[1].pieces, frame1)
    taker.give([(1, frame1)])  # before frame 0: leaf 2's second part waits for its first
    assert released == []
    del big, frame1
    gc.collect()
    assert gone() is None  # only leaf 2's part in frame 1 is kept
    first = np.frombuffer(data[:cut], np.uint8)
    digest.hash_whole(frames[0].pieces, first)
    taker.give([(0, first)])
    assert sorted(released) == [0, 1]
    assert taker.result() == Digest(digest.kind, tree_digest(data, leaf))


def test_a_frame_is_held_only_while_a_leaf_needs_it() -> None:
    """A leaf straddling frames holds each until the last of them is given, no longer; a
    frame with no such leaf is free at once; a failure wakes whoever waits for the digest."""
    leaf = 1 << 12
    data = np.random.default_rng(3).integers(0, 256, 4 * leaf, dtype=np.uint8).tobytes()
    # Frame 0: bytes 0-99 and from 100 + leaf to 3 leaves; frame 1: the bytes between (leaves
    # 0 and 1 straddle both); frame 2: the last leaf, whole.
    cut = 100 + leaf
    pieces = [[(0, 0, 100), (cut, 100, 3 * leaf - cut)], [(100, 0, cut - 100)], [(3 * leaf, 0, leaf)]]
    frames = [Frame(0, k, sum(p[2] for p in ps), tuple(ps)) for k, ps in enumerate(pieces)]
    assert sum(f.length for f in frames) == len(data)
    digest = Piecewise(Kind("xxh3_tree", leaf), len(data))
    futures: list[Future[np.ndarray]] = [Future() for _ in frames]
    released: list[int] = []
    taker = FileDigest(digest, frames, futures, released.append)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(taker.result)
        for i in (2, 0, 1):
            assert not wait([waiting], timeout=0.05).done  # a frame is still to come
            buf = _frame_bytes(data, frames[i])
            digest.hash_whole(frames[i].pieces, buf)
            futures[i].set_result(buf)
            taker.give([(i, buf)])
            assert sorted(released) == {2: [2], 0: [2], 1: [0, 1, 2]}[i]
        assert waiting.result() == Digest(digest.kind, tree_digest(data, leaf))
    # A leaf over many small frames, given in order, holds none of them (it is hashed as a
    # stream, part by part); given backwards, it holds each until the first one comes.
    small = [
        Frame(0, k, 1000, ((1000 * k, 0, min(1000, len(data) - 1000 * k)),))
        for k in range(-(-len(data) // 1000))
    ]
    small[-1] = Frame(0, len(small) - 1, small[-1].pieces[0][2], small[-1].pieces)
    for order in (list(range(len(small))), list(range(len(small)))[::-1]):
        freed: list[int] = []
        stream = FileDigest(Piecewise(digest.kind, len(data)), small, [Future() for _ in small], freed.append)
        for n, i in enumerate(order):
            buf = _frame_bytes(data, small[i])
            stream.digest.hash_whole(small[i].pieces, buf)
            stream.give([(i, buf)])
            if order[0] == 0:
                assert freed == order[: n + 1]
            elif i:  # frames 1-3 lie in leaf 0 only, whose first part is in frame 0
                assert not {1, 2, 3} & set(freed)
        assert sorted(freed) == list(range(len(small)))
        assert stream.result() == Digest(digest.kind, tree_digest(data, leaf))
    # Nothing straddles: the digest still waits for every frame's whole leaves.
    whole = Frame(0, 0, len(data), ((0, 0, len(data)),))
    lone = FileDigest(Piecewise(digest.kind, len(data)), [whole], [Future()], released.append)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(lone.result)
        assert not wait([waiting], timeout=0.05).done
        lone.digest.hash_whole(whole.pieces, np.frombuffer(data, np.uint8))
        lone.give([(0, np.frombuffer(data, np.uint8))])
        assert waiting.result() == Digest(digest.kind, tree_digest(data, leaf))
    stalled = FileDigest(
        Piecewise(digest.kind, len(data)), frames, [Future() for _ in frames], released.append
    )
    stalled.give([(1, _frame_bytes(data, frames[1]))])  # frame 0 never comes
    stalled.fail(OSError("read failed"))
    with pytest.raises(OSError, match="read failed"):
        stalled.result()


def test_hashing_threads_give_frames_at_once(tmp_path: Path) -> None:
    """Frames finished by many threads at once, as in the pipelines."""
    data = np.random.default_rng(1).integers(0, 256, 3 * LEAF * 7 + 5, dtype=np.uint8).tobytes()
    segments = [(s % 3, n) for s, n in enumerate([1000, 2 * LEAF + 7, 5, LEAF - 3, 300_000, 1_000_000])]
    segments.append((1, len(data) - sum(n for _, n in segments)))
    frames = frame_map(segments, [LEAF + 1000, 64 << 10, 1 << 20])
    digest = Piecewise(TREE, len(data))
    futures: list[Future[np.ndarray]] = [Future() for _ in frames]

    released: list[int] = []
    taker = FileDigest(digest, frames, futures, released.append)

    def finish(i: int) -> None:
        buf = _frame_bytes(data, frames[i])
        digest.hash_whole(frames[i].pieces, buf)
        futures[i].set_result(buf)
        taker.give([(i, buf)])

    order = list(range(len(frames)))
    random.Random(2).shuffle(order)
    with ThreadPoolExecutor(4) as pool:
        waiting = pool.submit(taker.result)  # waits beside the threads that give frames
        for _ in pool.map(finish, order):
            pass
        got = waiting.result()
    assert sorted(released) == list(range(len(frames)))
    (tmp_path / "f").write_bytes(data)
    assert got == Digest(TREE, tree_digest(data)) == of_file(tmp_path / "f")


# --- containers ------------------------------------------------------------------------------


def _mixed_safetensors(path: Path, seed: int = 0) -> Path:
    """A ~1.2 MB safetensors file whose uint8 tensors are stored raw (random bytes) and whose
    streams cut leaves at boundaries of their own."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    save_file(
        {
            "a": rng.integers(0, 256, 600_000, dtype=np.uint8),
            "b": rng.standard_normal(70_000).astype(np.float32),
            "c": rng.integers(0, 256, 300_000, dtype=np.uint8),
        },
        str(path),
    )
    return path


def _compress(src: Path, out: Path, kind: Kind = TREE, transform: Callable | None = None) -> Index:
    with CpuEngine(1) as engine, open(out, "wb") as f:
        return compress_file(src, src.name, f, engine, digest=kind, transform=transform).index


def test_round_trip_records_the_tree_digest(tmp_path: Path) -> None:
    src = _mixed_safetensors(tmp_path / "m.safetensors")
    out = tmp_path / "m.safetensors.ckptz"
    api.compress(src, out, device="cpu")
    data = out.read_bytes()
    assert struct.unpack("<HH", data[8:12]) == (1, 4)
    with open(out, "rb") as f:
        index = read_index(f, "m")
    source = index.header["source"]
    assert "xxh3_128" not in source and source["xxh3_tree"]["leaf"] == LEAF
    assert index.source_digest == Digest(TREE, tree_digest(src.read_bytes())) == of_file(src)
    api.decompress(out, tmp_path / "back.safetensors", device="cpu")
    assert (tmp_path / "back.safetensors").read_bytes() == src.read_bytes()
    with ckptz.open(out) as r:  # read in order: the reader's own Hasher checks the digest
        assert r.read() == src.read_bytes()
    assert api.verify(out, device="cpu").ok


@pytest.mark.parametrize("version", ["v1.0", "v1.3", "v1.4"])
def test_frozen_containers_keep_their_kind(version: str, tmp_path: Path) -> None:
    for container in sorted((FIXTURES / version).glob("*.ckptz")):
        with open(container, "rb") as f:
            index = read_index(f, container.name)
        # fixtures/v1.4 were written with 128 KiB leaves, before ckptz moved to 512 KiB.
        assert index.source_digest.kind == (Kind("xxh3_tree", 1 << 17) if version == "v1.4" else SEQUENTIAL)
        work = tmp_path / container.name
        work.write_bytes(container.read_bytes())
        api.decompress(work, in_place=True, device="cpu")  # the read-back hashes with its kind
        plain = tmp_path / container.name.removesuffix(".ckptz")
        assert of_file(plain, index.source_digest.kind) == index.source_digest


def _rewrite_index(path: Path, edit: Callable[[Index], Index]) -> None:
    with open(path, "r+b") as f:
        index = read_index(f, str(path))
        f.seek(-FOOTER.size, os.SEEK_END)
        data_end = FOOTER.unpack(f.read(FOOTER.size))[0]
        new = edit(index)
        f.truncate(data_end)
        f.seek(data_end)
        f.write(index_bytes(new, data_end))


def _forge(path: Path, offset: int) -> None:
    """Flip the restored byte at file ``offset``: it lies in a one-plane frame stored raw,
    whose payload is edited and whose chunk and frame checksums are forged to match, so
    only the whole-file digest can tell."""
    with open(path, "rb") as f:
        index = read_index(f, str(path))
    frames = frame_map(
        list(zip(index.segments["stream"].tolist(), index.segments["length"].tolist(), strict=True)),
        [s.frame_size for s in index.streams],
    )
    frame, at, within = next((f, a, w) for f in frames for a, w, n in f.pieces if a <= offset < a + n)
    row = int(stream_frame_lists(index)[frame.stream][frame.number])
    chunk = int(frame_chunk_starts(index.frames)[row])
    assert index.streams[frame.stream].word == 1 and int(index.chunks[chunk]["codec"]) == 0
    start, size = int(index.chunks[chunk]["offset"]), int(index.chunks[chunk]["size"])
    with open(path, "r+b") as f:
        f.seek(start + within + offset - at)
        byte = f.read(1)[0]
        f.seek(start + within + offset - at)
        f.write(bytes([byte ^ 0x40]))
        f.seek(start)
        forged = checksum(f.read(size))

    def edit(index: Index) -> Index:
        frames, chunks = index.frames.copy(), index.chunks.copy()
        frames["checksum"][row] = chunks["checksum"][chunk] = forged
        return Index(index.header, index.streams, index.segments, frames, chunks)

    _rewrite_index(path, edit)


# Small leaves, so that the test file's 600 kB tensor holds whole ones.
SMALL = Kind("xxh3_tree", 1 << 17)


@pytest.mark.parametrize("kind", [SMALL, SEQUENTIAL], ids=lambda k: k.name)
@pytest.mark.parametrize("where", ["whole leaf", "straddling leaf", "short last leaf"])
def test_a_forged_frame_is_caught_by_the_digest(kind: Kind, where: str, tmp_path: Path) -> None:
    src = _mixed_safetensors(tmp_path / "m.safetensors")
    size = src.stat().st_size
    container = tmp_path / "m.safetensors.ckptz"
    index = _compress(src, container, kind)
    # The uint8 stream's pieces: a 600 kB and a 300 kB tensor, back to back, ending the file.
    frames = frame_map(
        list(zip(index.segments["stream"].tolist(), index.segments["length"].tolist(), strict=True)),
        [s.frame_size for s in index.streams],
    )
    (p1, _, n1), (p2, _, n2) = next(f.pieces for f in frames if len(f.pieces) == 2)
    assert p1 + n1 == p2 and p2 + n2 == size
    inside = whole_leaves(p1, n1, SMALL.leaf, size)
    offset = {
        "whole leaf": inside.start * SMALL.leaf + 5,  # hashed where the frame is checked
        "straddling leaf": p2 - 3,  # its leaf spans both pieces: hashed by the walk
        "short last leaf": size - 2,
    }[where]
    assert (offset // SMALL.leaf in inside) == (where == "whole leaf")
    _forge(container, offset)
    with pytest.raises(CorruptionError, match="digest"):
        api.decompress(container, tmp_path / "out.safetensors", device="cpu")
    assert not (tmp_path / "out.safetensors").exists()
    assert not api.verify(container, device="cpu").ok
    with ckptz.open(container) as r, pytest.raises(CorruptionError, match="digest"):
        r.read()


def test_a_header_without_a_digest_is_refused(tmp_path: Path) -> None:
    src = _mixed_safetensors(tmp_path / "m.safetensors")
    container = tmp_path / "m.safetensors.ckptz"
    _compress(src, container)

    def drop(index: Index) -> Index:
        source = {k: v for k, v in index.header["source"].items() if k != "xxh3_tree"}
        return Index(
            {**index.header, "source": source}, index.streams, index.segments, index.frames, index.chunks
        )

    _rewrite_index(container, drop)
    with open(container, "rb") as f, pytest.raises(ContainerError, match="no whole-file digest"):
        read_index(f, "m")
    assert not api.verify(container, device="cpu").ok

    def bad_leaf(index: Index) -> Index:
        source = {**index.header["source"], "xxh3_tree": {"leaf": 1000, "digest": "0" * 32}}
        return Index(
            {**index.header, "source": source}, index.streams, index.segments, index.frames, index.chunks
        )

    _compress(src, container)
    _rewrite_index(container, bad_leaf)
    with open(container, "rb") as f, pytest.raises(ContainerError, match="unreadable"):
        read_index(f, "m")


# --- series deltas ---------------------------------------------------------------------------


def _delta_against(old: Path, new_container: Path, out: Path) -> Index:
    """``old`` coded against the reference container ``new_container`` (beside ``out``)."""
    ref = ContainerReference(new_container)
    index = ref.reader.index
    spec = RefSpec(new_container.name, index.source_size, index.source_digest)
    return _compress(
        old, out, transform=lambda layout: delta_for(layout, old, spec, ref, index_tensors(index))
    )


def _restored(container: Path, tmp_path: Path) -> bytes:
    out = tmp_path / "restored"
    with CpuEngine(1) as engine, open(container, "rb") as c, open(out, "wb") as f:
        restore(c, str(container), engine, FileSink(f))
    return out.read_bytes()


def _pair(tmp_path: Path) -> tuple[Path, Path]:
    """Two versions of one file: the older differs from the newer in a few bytes."""
    (tmp_path / "src").mkdir()
    new = _mixed_safetensors(tmp_path / "src" / "new.safetensors")
    data = bytearray(new.read_bytes())
    for at in range(300_000, 880_000, 40_000):
        data[at] ^= 1
    old = tmp_path / "src" / "old.safetensors"
    old.write_bytes(bytes(data))
    return old, new


@pytest.mark.parametrize("ref_kind", [TREE, SEQUENTIAL], ids=lambda k: k.name)
def test_series_delta_against_each_form_of_reference(ref_kind: Kind, tmp_path: Path) -> None:
    """The reference recorded in its own kind; checked as a container, as that container
    re-made with the other kind, re-coded, and as a plain file."""
    old, new = _pair(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    ref = run / "new.safetensors.ckptz"
    _compress(new, ref, ref_kind)
    delta = run / "old.safetensors.ckptz"
    index = _delta_against(old, ref, delta)
    recorded = index.header["reference"]
    assert ("xxh3_tree" in recorded) == ref_kind.tree and ("xxh3_128" in recorded) != ref_kind.tree
    assert index.source_digest.kind == TREE
    assert _restored(delta, tmp_path) == old.read_bytes()

    # Re-coding the reference (a later --series run, or detach) keeps its kind.
    with CpuEngine(1) as engine:
        recoded = recode(ref, ref.name, engine, None)
    assert recoded.source_digest.kind == ref_kind
    assert _restored(delta, tmp_path) == old.read_bytes()

    # Decompressed and compressed again, the reference records the other kind: read through.
    other = SEQUENTIAL if ref_kind.tree else TREE
    _compress(new, ref, other)
    assert _restored(delta, tmp_path) == old.read_bytes()

    # Decompressed: the plain file is hashed with the recorded kind.
    ref.unlink()
    plain = run / "new.safetensors"
    plain.write_bytes(new.read_bytes())
    assert _restored(delta, tmp_path) == old.read_bytes()
    data = bytearray(plain.read_bytes())
    data[-1] ^= 1
    plain.write_bytes(bytes(data))
    with pytest.raises(ReferenceChangedError):
        _restored(delta, tmp_path)


def test_series_run_records_tree_digests(tmp_path: Path) -> None:
    """``compress --series``: deltas name their reference by its tree digest, taken from the
    plain newer file while it exists; the run restores byte-exact, also from a decompressed
    reference."""
    from series_run import make_run

    run = tmp_path / "run"
    make_run(run, (10, 20, 30))
    want = {p.relative_to(run).as_posix(): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    api.compress(run, in_place=True, series=True, device="cpu")
    deltas = 0
    for container in run.rglob("*.ckptz"):
        with open(container, "rb") as f:
            header = read_index(f, str(container)).header
        assert "xxh3_128" not in header["source"]
        if "reference" in header:
            deltas += 1
            assert "xxh3_tree" in header["reference"] and "xxh3_128" not in header["reference"]
            with open(container.parent / header["reference"]["path"], "rb") as f:
                assert Digest.from_json(header["reference"]) == read_index(f, "ref").source_digest
    assert deltas
    api.decompress(run / "checkpoint-30", in_place=True, device="cpu")  # references become plain
    out = tmp_path / "out"
    api.decompress(run, out, device="cpu")
    got = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert got == want
