"""Checks taken where decoded bytes lie: the GPU's xxh3_64, the digest's leaves from pieces,
and ``ckptz.load`` to a GPU checking there (``-m gpu`` for the device parts).

:func:`ckptz.engines.gpu.hashing.tree_leaves` plans which leaves lie whole in one piece and
assembles the others; on the host device (:class:`HostOps`) it runs on any machine.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

from ckptz.digest import TREE, Hasher
from ckptz.engines.gpu import hashing, kernels
from ckptz.engines.gpu.transform import HostOps

gpu = pytest.mark.gpu


def _tree_hex(leaves: np.ndarray) -> str:
    return xxhash.xxh3_128_hexdigest(leaves.astype("<u8").tobytes())


def _pieces(data: np.ndarray, cuts: list[int]) -> tuple[list[np.ndarray], list[tuple[int, int, int]]]:
    """``data`` cut at ``cuts`` into separate copies, as (file offset, address, bytes)."""
    bounds = [0, *cuts, data.size]
    parts = [data[a:b].copy() for a, b in itertools.pairwise(bounds)]
    return parts, [(a, p.ctypes.data, p.size) for a, p in zip(bounds, parts, strict=False)]


@pytest.mark.parametrize("assembly", [hashing.ASSEMBLY_BYTES, 3 * 4096])
def test_tree_leaves_of_pieces_are_the_files_digest(monkeypatch: pytest.MonkeyPatch, assembly: int) -> None:
    monkeypatch.setattr(hashing, "ASSEMBLY_BYTES", assembly)  # batches of straddling leaves
    leaf = 4096
    data = np.random.default_rng(1).integers(0, 256, 20 * leaf + 777, dtype=np.uint8)
    # Cuts inside leaves, on a leaf edge, two in one leaf, an empty piece, a one-byte piece.
    cuts = [100, 4096, 5000, 5001, 5001, 9000, 30000, 30001, 70000]
    parts, segments = _pieces(data, cuts)
    leaves = hashing.tree_leaves(HostOps(), segments, data.size, leaf)
    want = [xxhash.xxh3_64_intdigest(data[k : k + leaf].tobytes()) for k in range(0, data.size, leaf)]
    assert leaves.tolist() == want
    whole = Hasher(TREE.__class__("xxh3_tree", leaf))
    whole.update(data)
    assert _tree_hex(leaves) == whole.hexdigest()
    assert parts  # the pieces stay alive while hashed


def test_tree_leaves_refuse_pieces_that_do_not_tile_the_file() -> None:
    data = np.zeros(10_000, np.uint8)
    _, segments = _pieces(data, [4000])
    with pytest.raises(ValueError, match="gap or overlap"):
        hashing.tree_leaves(HostOps(), segments[1:], data.size, 4096)
    with pytest.raises(ValueError, match="cover"):
        hashing.tree_leaves(HostOps(), segments, data.size + 1, 4096)


def test_tree_leaves_of_an_empty_file() -> None:
    assert hashing.tree_leaves(HostOps(), [], 0, 4096).size == 0


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=gpu)])
def test_an_engine_asked_to_check_payloads_decodes_no_frame_that_fails(device: str) -> None:
    from ckptz.checksums import xxh3_64
    from ckptz.container import StreamInfo
    from ckptz.engines.base import SpanFrame, StoredChunk, StoredSpan
    from ckptz.engines.cpu import CpuEngine
    from ckptz.errors import CorruptionError

    stream = StreamInfo(0, "weights", "float32", 4, True, 1 << 16, 1 << 16, 1)
    data = np.random.default_rng(4).standard_normal(1 << 14).astype(np.float32).view(np.uint8)
    zeros = np.zeros_like(data)  # every plane a constant chunk
    if device == "cpu":
        engine: Any = CpuEngine(threads=2)
    else:
        from ckptz.engines.gpu.engine import GpuEngine

        engine = GpuEngine(0, codec="ans")
    with engine:
        frames, want = [], []
        for n, (damaged, values) in enumerate([(False, data), (True, data), (False, zeros), (True, zeros)]):
            coded = engine.encode(stream, values, xxh3_64(values)).result()
            chunks = [
                StoredChunk(
                    10 * n + j,
                    c.codec,
                    c.raw_size,
                    c.payload,
                    xxh3_64(c.payload) ^ (damaged and j == 2),
                )
                for j, c in enumerate(coded.chunks)
            ]
            frames.append(SpanFrame(stream, chunks, values.size, f"frame {n}", ()))
            want.append(values)
        span = engine.decode_span(StoredSpan.of(frames), check=True).result()
        for n, damaged in enumerate([False, True, False, True]):
            if not damaged:
                got = span.frame(n)
                assert isinstance(got, np.ndarray) and got.tobytes() == want[n].tobytes()
                continue
            with pytest.raises(CorruptionError) as err:
                span.frame(n)
            assert err.value.chunk == 10 * n + 2
            assert f"frame {n}" in err.value.reason
        # Unasked (the payloads were checked before), the same span decodes every frame.
        assert len(engine.decode_span(StoredSpan.of(frames)).result().frames) == 4


@gpu
def test_the_gpu_engine_refuses_chunks_that_do_not_fit_their_frame() -> None:
    # nvCOMP assumes well-formed input: such a frame fails with what is wrong, its span's
    # other frames decode.
    from ckptz.checksums import xxh3_64
    from ckptz.container import StreamInfo
    from ckptz.engines.base import SpanFrame, StoredChunk, StoredSpan
    from ckptz.engines.gpu.coder import CONST_ID, RAW_ID
    from ckptz.engines.gpu.engine import GpuEngine
    from ckptz.errors import CorruptionError

    stream = StreamInfo(0, "weights", "float32", 4, True, 1 << 16, 1 << 16, 1)
    data = np.random.default_rng(5).standard_normal(1 << 14).astype(np.float32).view(np.uint8)
    with GpuEngine(0, codec="ans") as engine:
        coded = engine.encode(stream, data, xxh3_64(data)).result()
        good = [StoredChunk(j, c.codec, c.raw_size, c.payload, 0) for j, c in enumerate(coded.chunks)]
        raw = good[0].raw_size
        cases = {
            "has malformed chunks": good[:3],
            ": constant chunk of 2 bytes": [StoredChunk(0, CONST_ID, raw, b"ab", 0), *good[1:]],
            ": stored chunk of the wrong size": [StoredChunk(0, RAW_ID, raw, bytes(raw - 1), 0), *good[1:]],
        }
        frames = [SpanFrame(stream, good, data.size, "frame 0", ())]
        frames += [
            SpanFrame(stream, chunks, data.size, f"frame {n + 1}", ())
            for n, chunks in enumerate(cases.values())
        ]
        span = engine.decode_span(StoredSpan.of(frames)).result()
        got = span.frame(0)
        assert isinstance(got, np.ndarray) and got.tobytes() == data.tobytes()
        for n, reason in enumerate(cases, start=1):
            with pytest.raises(CorruptionError) as err:
                span.frame(n)
            assert err.value.reason == f"frame {n}{' ' if reason[0] != ':' else ''}{reason}"
            assert err.value.chunk == 0


# -- on a GPU --------------------------------------------------------------------------------


@gpu
def test_gpu_xxh3_is_xxhash_on_every_path(cuda_ops: Any) -> None:
    data = np.random.default_rng(2).integers(0, 256, (5 << 20) + 64, dtype=np.uint8)
    data[1 << 20 : 2 << 20] = 0  # a constant stretch
    dev = cuda_ops.upload("data", data)
    edges = [k * 1024 + d for k in (1, 2, 5, 64) for d in (-65, -64, -1, 0, 1, 63, 64, 65)]
    lengths = [*range(0, 260), *edges, 1 << 19, (1 << 19) + 5, 4 << 20, 5 << 20]
    starts, sizes = [], []
    for n in lengths:
        for skew in (0, 1, 8):  # aligned and unaligned inputs
            starts.append(skew + (n * 7919) % 4096 * 8 % max(1, data.size - n - 16))
            sizes.append(n)
    got = cuda_ops.xxh3(np.array(starts, np.uint64) + np.uint64(dev.ptr), np.array(sizes, np.uint64))
    want = [xxhash.xxh3_64_intdigest(data[a : a + n].tobytes()) for a, n in zip(starts, sizes, strict=True)]
    assert got.tolist() == want


@gpu
def test_gpu_xxh3_in_several_launches_is_xxhash(cuda_ops: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Inputs whose block sums outgrow the scratch are hashed in several pairs of launches,
    # an input bigger than the scratch on its own.
    monkeypatch.setattr(kernels, "_HASH_BLOCKS", 5)
    data = np.random.default_rng(4).integers(0, 256, 64 << 10, dtype=np.uint8)
    dev = cuda_ops.upload("data", data)
    sizes = [3000, 100, 9 * 1024 + 5, 241, 1025, 0, 2048, 5 * 1024 + 1, 20 * 1024, 7]
    starts = [(37 * k) % 4000 for k in range(len(sizes))]
    got = cuda_ops.xxh3(np.array(starts, np.uint64) + np.uint64(dev.ptr), np.array(sizes, np.uint64))
    want = [xxhash.xxh3_64_intdigest(data[a : a + n].tobytes()) for a, n in zip(starts, sizes, strict=True)]
    assert got.tolist() == want


@gpu
def test_gpu_tree_leaves_match_the_host(cuda_ops: Any) -> None:
    leaf = 1 << 16
    data = np.random.default_rng(3).integers(0, 256, 40 * leaf + 12345, dtype=np.uint8)
    cuts = [1000, leaf, 3 * leaf + 17, 3 * leaf + 18, 20 * leaf - 1, 39 * leaf + 5]
    bounds = [0, *cuts, data.size]
    segments = []
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        buf = cuda_ops.upload(f"piece{i}", data[a:b])
        segments.append((a, buf.ptr, b - a))
    got = hashing.tree_leaves(cuda_ops, segments, data.size, leaf)
    want = [xxhash.xxh3_64_intdigest(data[k : k + leaf].tobytes()) for k in range(0, data.size, leaf)]
    assert got.tolist() == want


def _gpu_engine_or_skip() -> None:
    from ckptz.engines import gpu_unavailable_reason, nvcomp_installed

    if not nvcomp_installed() or gpu_unavailable_reason() is not None:
        pytest.skip("no GPU engine here")


@gpu
@pytest.mark.parametrize("codec", ["ans", "zstd"])
def test_gpu_load_checks_on_the_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, codec: str) -> None:
    import torch

    import ckptz
    from ckptz import api
    from ckptz.engines.gpu import engine as gpu_engine
    from ckptz.errors import CorruptionError

    _gpu_engine_or_skip()
    gen = torch.Generator().manual_seed(9)
    # Tensors of odd sizes: records at offsets that cut the digest's leaves everywhere.
    state = {f"t{i}": torch.randn(100_003 * (i + 1), generator=gen) for i in range(10)}
    state["bf16"] = state["t1"].to(torch.bfloat16)
    state["step"] = torch.tensor(12)
    plain = tmp_path / "optimizer.pt"
    torch.save(state, plain)
    packed = tmp_path / "optimizer.pt.ckptz"
    api.compress(plain, packed, device="cuda", codec=codec)
    copied_back: list[int] = []
    to_host = gpu_engine._to_host

    def counted(data: Any, stream: Any) -> np.ndarray:
        copied_back.append(data.size)
        return to_host(data, stream)

    monkeypatch.setattr(gpu_engine, "_to_host", counted)
    got = ckptz.load(packed, map_location="cuda:0")
    for k, v in torch.load(plain, weights_only=True).items():
        assert got[k].is_cuda and torch.equal(got[k].cpu(), v), k
    assert not copied_back  # checked on the GPU: no decoded byte came back to be checked
    # A digest that does not match the bytes is caught there too.
    from ckptz.library import storages

    leaf_hashes = gpu_engine.GpuEngine.leaf_hashes

    def off_by_one(self: Any, *args: Any) -> np.ndarray:
        leaves = leaf_hashes(self, *args)
        leaves[len(leaves) // 2] ^= np.uint64(1)
        return leaves

    monkeypatch.setattr(gpu_engine.GpuEngine, "leaf_hashes", off_by_one)
    with pytest.raises(CorruptionError, match="digest"):
        ckptz.load(packed, map_location="cuda:0")
    monkeypatch.setattr(gpu_engine.GpuEngine, "leaf_hashes", leaf_hashes)
    # So is a frame whose bytes, as the GPU hashed them, are not the frame's.
    from ckptz.engines.gpu.kernels import CudaOps

    xxh3 = CudaOps.xxh3

    def flipped(self: Any, ptrs: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        sums = xxh3(self, ptrs, lengths)
        sums[-1] ^= np.uint64(1 << 40)
        return sums

    monkeypatch.setattr(CudaOps, "xxh3", flipped)
    with pytest.raises(CorruptionError, match="fail their checksum"):
        ckptz.load(packed, map_location="cuda:0")
    assert storages._engines
