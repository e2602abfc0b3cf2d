"""The GPU engine: on a CUDA machine with nvCOMP (``-m gpu``), and its no-GPU behaviour everywhere.

The CPU half runs the GPU coder's batching logic on CPU tensors with a zstandard stand-in for
nvCOMP, checks the torch transform against the CPU transform's bytes, and checks that a
container with GPU-only ANS chunks fails with one clear error on a machine without a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import zstandard
from conftest import sha256, tree_digests

from ckptz import api
from ckptz.codecs.frames import EncodedChunk
from ckptz.codecs.planes import split
from ckptz.container import StreamInfo, checksum, read_index
from ckptz.dtypes import DType, lookup
from ckptz.engines.base import EncodedFrame, StoredChunk
from ckptz.engines.cpu import CpuEngine
from ckptz.errors import CodecUnavailableError
from ckptz.pipeline.compress import compress_file

torch = pytest.importorskip("torch")

from ckptz.engines.gpu.coder import (  # noqa: E402
    ANS_ID,
    CONST_ID,
    RAW_ID,
    ZSTD_ID,
    FrameShape,
    decode_batch,
    encode_batch,
    plan_batch,
)
from ckptz.engines.gpu.transform import merge_from, split_into  # noqa: E402

DTYPES = ["float32", "bfloat16", "float16", "float64", "int64", "int32", "uint8"]


def _trained_bytes(dtype: str, n: int, seed: int = 0) -> np.ndarray:
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(n, generator=gen) * 0.02
    t[: n // 8] = 0  # zero rows, like never-updated optimizer state
    if dtype in ("int64", "int32", "uint8"):
        t = (t * 1000).to(getattr(torch, dtype))
    else:
        t = t.to(getattr(torch, dtype))
    return t.view(torch.uint8).numpy().copy()


# -- CPU: transform and batching logic ---------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_transform_matches_cpu_planes(dtype: str) -> None:
    dt = lookup(dtype)
    raw = _trained_bytes(dtype, 3 * 4096)
    k, n = 3, raw.size // 3
    word = dt.word
    planes = torch.full((k, word, (n // word + 15) // 16 * 16), 7, dtype=torch.uint8)
    split_into(torch.from_numpy(raw), planes, word, dt.is_float)
    for f in range(k):
        want = split(raw[f * n : (f + 1) * n], dt)
        for p in range(word):
            assert planes[f, p, : n // word].numpy().tobytes() == want[p].tobytes()
    back = torch.empty(raw.size, dtype=torch.uint8)
    merge_from(planes, back, word, dt.is_float)
    assert back.numpy().tobytes() == raw.tobytes()


class ZstdStandIn:
    """nvCOMP's batch interface served by zstandard on CPU tensors (ids 2 and 3 alike)."""

    def max_compressed_size(self, codec_id: int, size: int) -> int:
        return size + size // 128 + 1024

    def encode(
        self,
        codec_id: int,
        src: torch.Tensor,
        offsets: Sequence[int],
        sizes: Sequence[int],
        dst: torch.Tensor,
        dst_offsets: Sequence[int],
        capacities: Sequence[int],
    ) -> list[int]:
        out = []
        for o, n, d, cap in zip(offsets, sizes, dst_offsets, capacities, strict=True):
            payload = zstandard.ZstdCompressor(level=1).compress(src[o : o + n].numpy().tobytes())
            assert len(payload) <= cap and o % 16 == 0 and d % 16 == 0
            dst[d : d + len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            out.append(len(payload))
        return out

    def decode(
        self,
        codec_id: int,
        src: torch.Tensor,
        offsets: Sequence[int],
        sizes: Sequence[int],
        dst: torch.Tensor,
        dst_offsets: Sequence[int],
        raw_sizes: Sequence[int],
    ) -> None:
        for o, n, d, r in zip(offsets, sizes, dst_offsets, raw_sizes, strict=True):
            assert o % 16 == 0 and d % 16 == 0
            raw = zstandard.ZstdDecompressor().decompress(src[o : o + n].numpy().tobytes(), max_output_size=r)
            dst[d : d + r] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)


@pytest.mark.parametrize("codec_id", [ZSTD_ID, ANS_ID])
def test_batch_coder_round_trip_with_stand_in(codec_id: int) -> None:
    frames, shapes = [], []
    for i, dtype in enumerate(["float32", "bfloat16", "float32", "uint8", "float32", "int64"]):
        dt = lookup(dtype)
        n = 4096 if i != 4 else 1000  # a short last frame: planes not a multiple of 16
        raw = _trained_bytes(dtype, n // max(dt.itemsize, 1) * max(dt.itemsize, 1) // dt.itemsize, seed=i)
        raw = raw[: n - n % dt.word]
        frames.append(raw)
        shapes.append(FrameShape(dt.word, dt.is_float and dt.word > 1, raw.size))
    frames.append(np.zeros(4096, np.uint8))
    shapes.append(FrameShape(4, True, 4096))
    layout = plan_batch(shapes)
    data = torch.zeros(layout.data_bytes, dtype=torch.uint8)
    for f, off in zip(frames, layout.data_offsets, strict=True):
        data[off : off + f.size] = torch.from_numpy(f)
    codecs = ZstdStandIn()
    batch = encode_batch(codecs, codec_id, data, layout)
    kinds = set(batch.codec.tolist())
    assert kinds >= {CONST_ID, codec_id}
    last = batch.table.starts[-1]
    assert set(batch.codec[last:].tolist()) == {CONST_ID}
    block = batch.block.numpy()
    # The block is the container's data area: payloads 16-byte aligned, zero padded.
    assert block.size == sum(n + (-n % 16) for n in batch.size.tolist())
    for c, (codec, off, n) in enumerate(zip(batch.codec, batch.offset, batch.size, strict=True)):
        assert off % 16 == 0 and not block[off + n : off + n + (-n % 16)].any()
        if codec == RAW_ID:
            plane = batch.table.plane_offset[c]
            assert n == batch.table.raw_size[c]
            frame = int(np.searchsorted(batch.table.starts, c, side="right")) - 1
            p = c - batch.table.starts[frame]
            dt_planes = split(frames[frame], _dtype_of(shapes[frame]))
            assert block[off : off + n].tobytes() == dt_planes[p].tobytes(), plane
    const_value = np.where(batch.codec == CONST_ID, block[np.minimum(batch.offset, block.size - 1)], 0)
    back = decode_batch(
        codecs, batch.block, layout, batch.codec, batch.offset, batch.size, const_value.astype(np.int64)
    )
    for f, off in zip(frames, layout.data_offsets, strict=True):
        assert back[off : off + f.size].numpy().tobytes() == f.tobytes()


def _dtype_of(shape: FrameShape) -> DType:
    return replace(
        lookup({1: "uint8", 2: "int16", 4: "int32", 8: "int64"}[shape.word]), is_float=shape.rotate
    )


def test_noise_rows_follow_the_cpu_coders_test() -> None:
    from ckptz.engines.gpu.coder import _noise_rows

    rng = np.random.default_rng(0)
    noise = np.bincount(rng.integers(0, 256, 1 << 15), minlength=256)
    exponents = np.bincount(np.clip(rng.normal(120, 3, 1 << 15).astype(int), 0, 255), minlength=256)
    zero_runs = noise.copy()
    zero_runs[0] += 2000  # a fine-tune's zero rows in an otherwise noisy plane: worth coding
    unsampled = np.zeros(256, dtype=np.int64)
    got = _noise_rows(np.stack([noise, exponents, zero_runs, unsampled]))
    assert got.tolist() == [True, False, False, False]


# -- CPU: no GPU here ---------------------------------------------------------------------


class _AnsStubEngine(CpuEngine):
    """Writes the top plane of every frame as an 'ans' chunk: what a GPU machine would write."""

    def _encode(self, stream: StreamInfo, data: np.ndarray, checksum: int) -> EncodedFrame:
        frame = super()._encode(stream, data, checksum)
        top = frame.chunks[-1]
        frame.chunks[-1] = EncodedChunk(ANS_ID, top.raw_size, b"\x00" * 16)
        return frame

    def container_extras(self) -> dict[str, object]:
        return {"nvcomp": {"version": "6.0.0", "codec": "ans"}}


def test_ans_container_without_gpu_is_a_clear_error(small_checkpoint: Path, tmp_path: Path) -> None:
    src = small_checkpoint / "model.safetensors"
    out = tmp_path / "m.ckptz"
    from ckptz.pipeline import compress_file

    with open(out, "wb") as f, _AnsStubEngine(2) as engine:
        compress_file(src, "model.safetensors", f, engine)
    with open(out, "rb") as f:
        index = read_index(f, str(out))
    assert ANS_ID in set(index.chunks["codec"].tolist())
    assert index.header["nvcomp"]["version"] == "6.0.0"
    from ckptz.engines import gpu_unavailable_reason

    # Where a GPU is present, "auto" would try (and rightly fail) to decode the stub payload.
    for device in ("cpu", "auto") if gpu_unavailable_reason() else ("cpu",):
        with pytest.raises(CodecUnavailableError, match=r"ans.*no CPU decoder.*GPU"):
            api.decompress(out, tmp_path / f"back-{device}", device=device)
    from typer.testing import CliRunner

    from ckptz.cli import app

    result = CliRunner().invoke(app, ["decompress", str(out), "-o", str(tmp_path / "cli"), "--device", "cpu"])
    assert result.exit_code != 0 and "no CPU decoder" in result.output and "Traceback" not in result.output


def test_gpu_package_imports_light() -> None:
    import subprocess
    import sys

    probe = "import sys, ckptz.engines.gpu; print(sorted(m for m in ('torch', 'nvidia.nvcomp') if m in sys.modules))"
    assert (
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "[]"
    )


# -- GPU ----------------------------------------------------------------------------------

gpu = pytest.mark.gpu


def _frames_of(path: Path) -> list[tuple[StreamInfo, np.ndarray]]:
    """Real tensor planes of a checkpoint: (stream, frame bytes) for every float stream."""
    from ckptz.formats import read_layout
    from ckptz.pipeline import plan_streams

    layout = read_layout(path, path.name)
    plan = plan_streams(layout)
    raw = np.fromfile(path, dtype=np.uint8)
    out, pos = [], 0
    for seg, sid in zip(layout.segments, plan.segment_streams, strict=True):
        stream = plan.streams[sid]
        if seg.kind == "tensor" and stream.rotate and seg.length:
            out.append((stream, raw[pos : pos + seg.length]))
        pos += seg.length
    return out


@gpu
def test_gpu_transform_matches_cpu_bytes() -> None:
    for dtype in DTYPES:
        dt = lookup(dtype)
        raw = _trained_bytes(dtype, 1 << 16)
        k, n = 4, raw.size // 4
        planes = torch.zeros((k, dt.word, n // dt.word), dtype=torch.uint8, device="cuda")
        split_into(torch.from_numpy(raw).cuda(), planes, dt.word, dt.is_float)
        got = planes.cpu().numpy()
        for f in range(k):
            for p, want in enumerate(split(raw[f * n : (f + 1) * n], dt)):
                assert got[f, p].tobytes() == want.tobytes(), (dtype, f, p)


def _sample(row: np.ndarray) -> np.ndarray:
    """The byte histogram of every 8th full 4096-byte block of a plane row."""
    full = row.size // 4096
    return np.bincount(row[: full * 4096].reshape(full, 4096)[::8].reshape(-1), minlength=256)


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_split_rows_takes_the_kernels_sample(dtype: str) -> None:
    """The torch split (CPU tensors) gives the planes, and the same statistics as the
    CUDA kernel: min, max and the histogram of every 8th full 4096-byte block."""
    from ckptz.engines.gpu import transform
    from ckptz.engines.gpu.transform import STATS

    dt = lookup(dtype)
    raw = _trained_bytes(dtype, 4 * dt.word * (9 * 4096 + 100))  # rows of 9 blocks and a bit
    k, n = 4, raw.size // 4
    m, word = n // dt.word, dt.word
    planes = torch.zeros((k, word, (m + 15) // 16 * 16), dtype=torch.uint8)
    stats = torch.zeros((k * word, STATS), dtype=torch.int32)
    transform.split_rows(torch.from_numpy(raw), planes, stats, word, dt.is_float)
    got, mm = planes.numpy(), stats.numpy()
    for f in range(k):
        for p, want in enumerate(split(raw[f * n : (f + 1) * n], dt)):
            assert got[f, p, :m].tobytes() == want.tobytes(), (dtype, f, p)
            assert tuple(mm[f * word + p, :2]) == (want.min(), want.max())
            assert (mm[f * word + p, 2:] == _sample(want)).all()  # blocks 0 and 8


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_kernels_match_cpu_transform(dtype: str) -> None:
    from ckptz.engines.gpu import kernels
    from ckptz.engines.gpu.transform import DECODED, STATS, STORED

    dt = lookup(dtype)
    raw = _trained_bytes(dtype, 1 << 16)
    k, n = 4, raw.size // 4
    raw[:n] = 0  # frame 0: every plane constant
    m, word = n // dt.word, dt.word
    stride = (m + 15) // 16 * 16
    planes = torch.full((k, word, stride), 7, dtype=torch.uint8, device="cuda")
    stats = torch.zeros((k * word, STATS), dtype=torch.int32, device="cuda")
    stats[:, 0] = 255
    kernels.split_rows(torch.from_numpy(raw).cuda(), planes, stats, word, dt.is_float)
    got, mm = planes.cpu().numpy(), stats.cpu().numpy()
    assert m >= 4096  # one full block at least: the sample is the row's first 4096 bytes
    for f in range(k):
        for p, want in enumerate(split(raw[f * n : (f + 1) * n], dt)):
            assert got[f, p, :m].tobytes() == want.tobytes(), (dtype, f, p)
            assert (got[f, p, m:] == 7).all()  # padding untouched
            assert tuple(mm[f * word + p, :2]) == (want.min(), want.max())
            assert (mm[f * word + p, 2:] == np.bincount(want[:4096], minlength=256)).all()
    # Merge back from a mix of sources: frame 0 from its constants, the rest alternately
    # from the "stored" and the "decoded" buffer (both the planes here).
    flat = planes.view(-1)
    offsets = torch.arange(k * word, dtype=torch.int64, device="cuda") * (stride // 16)
    sources = [int(mm[r, 0]) if r < word else (STORED if r % 2 else DECODED) for r in range(k * word)]
    back = torch.zeros(raw.size, dtype=torch.uint8, device="cuda")
    kernels.merge_rows(
        flat, flat, offsets, torch.tensor(sources, dtype=torch.int64, device="cuda"), back, word, dt.is_float
    )
    assert back.cpu().numpy().tobytes() == raw.tobytes()


@gpu
def test_gather_kernel_pads_with_zeros() -> None:
    from ckptz.engines.gpu import kernels

    src = torch.arange(256, dtype=torch.int64, device="cuda").to(torch.uint8).repeat(1024)
    sizes = [1, 15, 16, 17, 40000, 0, 65536]
    src_off = [0, 32, 64, 4096, 8192, 0, 96]
    padded = [n + (-n % 16) for n in sizes]
    dst_off = [sum(padded[:i]) for i in range(len(sizes))]
    dst = torch.full((sum(padded),), 0xEE, dtype=torch.uint8, device="cuda")

    def dev(v: list[int]) -> torch.Tensor:
        return torch.tensor(v, dtype=torch.int64, device="cuda")

    kernels.gather(
        src,
        dev([o // 16 for o in src_off]),
        dev(sizes),
        dst,
        dev([o // 16 for o in dst_off]),
        dev(padded),
        max(padded),
    )
    host, s = dst.cpu().numpy(), src.cpu().numpy()
    for so, n, do, pad in zip(src_off, sizes, dst_off, padded, strict=True):
        assert host[do : do + n].tobytes() == s[so : so + n].tobytes()
        assert not host[do + n : do + pad].any()


@gpu
@pytest.mark.parametrize("algorithm", ["zstd", "ans"])
def test_raw_codec_round_trip(algorithm: str) -> None:
    from ckptz.engines.gpu import raw_codec

    data = _trained_bytes("float32", 1 << 18)
    coder = raw_codec(algorithm, "cuda:0")
    blob = coder.encode(data)
    assert len(blob) < data.size
    assert coder.decode(blob, data.size).tobytes() == data.tobytes()


@gpu
@pytest.mark.parametrize("codec", ["zstd", "ans"])
def test_corpus_round_trips_on_gpu(tmp_path: Path, codec: str) -> None:
    from corpus import make_corpus

    corpus = make_corpus(tmp_path / "corpus")
    root = tmp_path / "corpus"
    before = tree_digests(root)
    summary = api.compress(root, tmp_path / "all.ckptz", device="cuda", codec=codec)
    # ans codes on the GPU; the portable codec on the CPU threads, the GPU joining only
    # jobs over 32 GiB (ckptz.engines.hybrid), which this corpus is not.
    assert summary.device.startswith("cuda") if codec == "ans" else summary.device == "cpu"
    assert api.verify(tmp_path / "all.ckptz", root, device="cuda").ok
    api.decompress(tmp_path / "all.ckptz", tmp_path / "back", device="cuda")
    assert tree_digests(tmp_path / "back") == before and len(corpus) >= 20


@gpu
def test_zstd_cross_decodes_both_ways_on_real_planes(small_checkpoint: Path, tmp_path: Path) -> None:
    src = small_checkpoint / "optimizer.pt"
    gpu_packed, cpu_packed = tmp_path / "g.ckptz", tmp_path / "c.ckptz"
    from ckptz.engines.gpu.engine import GpuEngine

    # The GPU coder itself (``--device cuda`` shares frames between it and the CPU coder).
    with GpuEngine(0, codec="zstd") as engine, open(gpu_packed, "wb") as out:
        compress_file(src, "optimizer.pt", out, engine)
    api.compress(src, cpu_packed, device="cpu")
    for packed in (gpu_packed, cpu_packed):
        with open(packed, "rb") as f:
            assert ZSTD_ID in set(read_index(f, str(packed)).chunks["codec"].tolist())
    api.decompress(gpu_packed, tmp_path / "g_on_cpu", device="cpu")
    api.decompress(cpu_packed, tmp_path / "c_on_gpu", device="cuda")
    assert sha256(tmp_path / "g_on_cpu") == sha256(src) == sha256(tmp_path / "c_on_gpu")


@gpu
def test_nvcomp_zstd_chunks_are_standard_frames(small_checkpoint: Path) -> None:
    from ckptz.engines.gpu.nvcomp_codecs import NvcompCodecs

    stream = torch.cuda.Stream()
    codecs = NvcompCodecs(torch.cuda.current_device(), stream)
    dtype = lookup("float32")
    planes = [p for _, raw in _frames_of(small_checkpoint / "optimizer.pt") for p in split(raw, dtype)]
    planes = [p for p in planes if p.size >= 64][:16]
    offs, pos = [], 0
    for p in planes:
        offs.append(pos)
        pos += p.size + (-p.size % 16)
    buf = torch.zeros(pos, dtype=torch.uint8)
    for p, o in zip(planes, offs, strict=True):
        buf[o : o + p.size] = torch.from_numpy(p)
    buf = buf.cuda()
    caps = [codecs.max_compressed_size(ZSTD_ID, p.size) + 16 for p in planes]
    dst_offs = list(np.cumsum([0, *[c + (-c % 16) for c in caps]])[:-1].tolist())
    dst = torch.zeros(sum(c + (-c % 16) for c in caps), dtype=torch.uint8, device="cuda")
    with torch.cuda.stream(stream):
        sizes = codecs.encode(ZSTD_ID, buf, offs, [p.size for p in planes], dst, dst_offs, caps)
    host = dst.cpu().numpy()
    for p, o, n in zip(planes, dst_offs, sizes, strict=True):
        frame = host[o : o + n].tobytes()
        assert zstandard.ZstdDecompressor().decompress(frame, max_output_size=p.size) == p.tobytes()
    # And CPU frames decode on the GPU: libzstd's, and the C extension's Huffman-only
    # frames (FSE-described and treeless tables, RLE and raw blocks).
    from ckptz.codecs.cpu import HuffmanZstd

    rng = np.random.default_rng(3)
    planes += [
        np.zeros(200_000, np.uint8),
        rng.integers(0, 256, 100_000, dtype=np.uint8),
        (200 + rng.geometric(0.3, 100_000).clip(0, 55)).astype(np.uint8),
        np.concatenate([planes[0], np.zeros(70_000, np.uint8), planes[1]]),
    ]
    frames = [zstandard.ZstdCompressor(level=3).compress(p.tobytes()) for p in planes]
    frames += [HuffmanZstd().encode(p) for p in planes]
    planes += planes
    offs, pos = [], 0
    for fr in frames:
        offs.append(pos)
        pos += len(fr) + (-len(fr) % 16)
    src = torch.zeros(pos, dtype=torch.uint8)
    for fr, o in zip(frames, offs, strict=True):
        src[o : o + len(fr)] = torch.frombuffer(bytearray(fr), dtype=torch.uint8)
    out = torch.zeros(sum(p.size + (-p.size % 16) for p in planes), dtype=torch.uint8, device="cuda")
    out_offs = list(np.cumsum([0, *[p.size + (-p.size % 16) for p in planes]])[:-1].tolist())
    with torch.cuda.stream(stream):
        codecs.decode(
            ZSTD_ID, src.cuda(), offs, [len(f) for f in frames], out, out_offs, [p.size for p in planes]
        )
    stream.synchronize()
    got = out.cpu().numpy()
    for p, o in zip(planes, out_offs, strict=True):
        assert got[o : o + p.size].tobytes() == p.tobytes()


@gpu
def test_file_four_times_the_memory_budget(tmp_path: Path) -> None:
    budget = 32 << 20
    src = tmp_path / "big.pt"
    gen = torch.Generator().manual_seed(1)
    torch.save({f"t{i}": torch.randn(8 << 20, generator=gen) * 0.02 for i in range(4)}, src)  # 128 MiB
    assert src.stat().st_size >= 4 * budget
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    api.compress(src, tmp_path / "big.ckptz", device="cuda", codec="ans", memory=budget)
    peak = torch.cuda.max_memory_allocated() - base
    assert peak <= budget, f"GPU peak {peak} over the {budget} budget"
    api.decompress(tmp_path / "big.ckptz", tmp_path / "back.pt", device="cuda", memory=budget)
    assert sha256(tmp_path / "back.pt") == sha256(src)


@gpu
def test_restore_to_device(small_checkpoint: Path, tmp_path: Path) -> None:
    from ckptz.pipeline.device import restore_to_device

    src = small_checkpoint / "model.safetensors"
    api.compress(src, tmp_path / "m.ckptz", device="cuda", codec="ans")
    restored = restore_to_device(tmp_path / "m.ckptz", "cuda")
    assert restored.is_cuda and restored.cpu().numpy().tobytes() == src.read_bytes()


@gpu
def test_two_devices_by_index(small_checkpoint: Path, tmp_path: Path) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    src = small_checkpoint / "optimizer.pt"
    for i in (0, 1):
        summary = api.compress(src, tmp_path / f"o{i}.ckptz", device=f"cuda:{i}", codec="ans")
        assert summary.device == f"cuda:{i}"
        api.decompress(tmp_path / f"o{i}.ckptz", tmp_path / f"o{i}.pt", device=f"cuda:{1 - i}")
        assert sha256(tmp_path / f"o{i}.pt") == sha256(src)


@gpu
def test_engine_futures_and_checksums() -> None:
    from ckptz.engines.gpu.engine import GpuEngine

    stream = StreamInfo(0, "weights", "float32", 4, True, 1 << 20, 3 << 20, 1)
    frames = [_trained_bytes("float32", 1 << 18, seed=s) for s in range(3)]
    with GpuEngine(0, codec="ans", memory=64 << 20) as engine:
        # Pinned buffers from the engine are copied to the device as they are; others are staged.
        pinned = engine.host_buffer(frames[0].size)
        pinned[:] = frames[0]
        inputs = [pinned, *frames[1:]]
        futs: list[Future[EncodedFrame]] = [engine.encode(stream, f, checksum(f)) for f in inputs]
        for i, (f, fut) in enumerate(zip(frames, futs, strict=True)):
            coded = fut.result()
            assert coded.checksum == checksum(f)
            stored = [StoredChunk(p, c.codec, c.raw_size, c.payload, 0) for p, c in enumerate(coded.chunks)]
            back = engine.decode(stream, stored, f.size, f"frame {i}").result()
            assert back.tobytes() == f.tobytes()
        engine.free_buffer(pinned)


@gpu
def test_bench_runs_every_configuration_on_the_gpu(small_checkpoint: Path) -> None:
    from ckptz.bench.benchmark import CONFIGS, bench

    result = bench(small_checkpoint, device="cuda:0", storage_gbps=5.0, sample_bytes=4 << 20)
    assert not result.skipped, result.skipped
    ran = {r.codec for r in result.rows}
    assert ran == set(CONFIGS)
    for r in result.rows:
        assert r.compressed_bytes > 0 and r.compress_gbps > 0 and r.decompress_gbps > 0


@gpu
def test_hybrid_engine_codes_the_portable_bitstream_on_cpu_and_gpu(
    small_checkpoint: Path, tmp_path: Path
) -> None:
    from ckptz.engines import open_engine
    from ckptz.engines.hybrid import HybridEngine

    src = small_checkpoint / "optimizer.pt"
    engine, _ = open_engine("cuda", codec="auto")
    assert isinstance(engine, HybridEngine) and engine.wait_for_gpu()
    with open(tmp_path / "h.ckptz", "wb") as out:
        written = compress_file(src, "optimizer.pt", out, engine)
    engine.close()
    assert engine.frames["gpu"] > 0 and written.index.header["device"].startswith("cuda:")
    api.decompress(tmp_path / "h.ckptz", tmp_path / "back.pt", device="cpu")
    assert sha256(tmp_path / "back.pt") == sha256(src)


@gpu
def test_pinned_leases_come_back_when_their_views_are_gone() -> None:
    import gc

    from ckptz.engines.gpu.pinned import GRAIN, PinnedPool

    pool = PinnedPool()
    lease = pool.take(3 * GRAIN + 5)
    assert lease.size == 3 * GRAIN + 5 and lease.flags.writeable
    start = lease.ctypes.data
    lease[:] = np.arange(lease.size, dtype=np.uint64).astype(np.uint8)
    view = lease[7:1000]
    src = pool.tensor(view)
    assert src is not None and src.is_pinned()
    on_gpu = src.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert on_gpu.cpu().numpy().tobytes() == view.tobytes()
    assert pool.tensor(np.zeros(16, np.uint8)) is None  # not pinned by the pool
    del lease
    gc.collect()
    # The view still holds the region: a new lease gets other memory.
    other = pool.take(3 * GRAIN)
    start_b = other.ctypes.data
    assert start_b != start
    del view, src, other
    gc.collect()
    # Both regions are free again: each request gets the smallest one that fits.
    x = pool.take(3 * GRAIN)
    y = pool.take(3 * GRAIN + 5)
    assert (x.ctypes.data, y.ctypes.data) == (start_b, start)
    del x
    gc.collect()
    # A region far bigger than a request is not tied up by it.
    assert pool.take(100).ctypes.data != start_b


def test_warming_a_cuda_context_without_a_gpu_is_harmless() -> None:
    """The context warm-up thread swallows a missing driver or device: the caller's own CUDA
    calls report it (on this machine, there may be no libcuda at all)."""
    import subprocess
    import sys

    code = (
        "import sys; from ckptz.engines.gpu import driver; driver.warm(97); "
        "t = driver._WARMING[97]; t.join(30); assert not t.is_alive(); "
        "assert 'torch' not in sys.modules; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
