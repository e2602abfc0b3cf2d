"""The GPU's zstd literal frames (``ckptz/engines/gpu/literals.py``) checked on any machine.

The host plans every frame (``ckptz._native.literals_plan``) from each block quarter's byte
counts; the GPU writes the heads and streams. This compiles the kernels' stream writer with
the host's C++ compiler, runs the encoding kernel's work thread by thread, and has libzstd
(and ckptz's own decoder) decode every frame back to its chunk. The GPU tests run the
kernels themselves.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard
from conftest import host_build, tree_digests

from ckptz.codecs import cpu_codec
from ckptz.codecs.table import BITPACK, ZSTD
from ckptz.engines.gpu import literals

_HARNESS = (
    r"""
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;
#define HD static inline
#define LITERALS_HOST
"""
    + literals.SOURCE
    + r"""
/* literals_encode's work for every block of the plan, thread after thread. */
extern "C" void host_encode(const u8* src, u8* dst, const i64* plan, i64 rows, const u32* tables, const u8* blob) {
  for (i64 b = 0; b < rows; ++b) {
    const i64* p = plan + b * 16;
    const i64 at = p[0], m = p[1], mode = p[2], d = p[3], head = p[4], head_len = p[5];
    for (i64 i = 0; i < head_len; ++i) dst[d + i] = blob[head + i];
    if (mode == 0) {
      for (i64 i = 0; i < m; ++i) dst[d + head_len + i] = src[at + i];
    } else if (mode >= 2) {
      for (int t = 0; t < 4; ++t) {
        i64 start;
        const i64 count = lit_quarter(m, t, &start);
        lit_stream(src + at + start, count, tables + p[6] * 256, dst + p[7 + t]);
      }
      dst[p[11]] = 0;
    }
  }
}

/* bitpack_encode's work for every chunk of `rows` (src, n, dst, fixed | value << 8). */
extern "C" void host_bitpack(const u8* src, u8* dst, const i64* rows, i64 count) {
  for (i64 c = 0; c < count; ++c) {
    const i64* r = rows + c * 4;
    const i64 m = (r[1] + 7) / 8;
    for (i64 j = 0; j < m; ++j) bitpack_group(src + r[0], r[1], j, (int)(r[3] & 0xFF), dst + r[2] + 2, m);
    dst[r[2]] = (u8)(r[3] & 0xFF);
    dst[r[2] + 1] = (u8)((r[3] >> 8) & 0xFF);
  }
}

/* literals_decode's work for every row (kind, src, n, dst, m, code or byte); each stream's
   exact end into ends[r]. */
extern "C" void host_decode(const u8* src, u8* dst, const i64* rows, i64 count, const u16* codes, u8* ends) {
  for (i64 r = 0; r < count; ++r) {
    const i64* p = rows + r * 6;
    ends[r] = 1;
    if (p[0] == 2) ends[r] = (u8)lit_decode_stream(src + p[1], p[2], codes + p[5] * 2048, dst + p[3], p[4]);
    else if (p[0] == 1) for (i64 i = 0; i < p[4]; ++i) dst[p[3] + i] = (u8)p[5];
    else for (i64 i = 0; i < p[4]; ++i) dst[p[3] + i] = src[p[1] + i];
  }
}

/* bitpack_decode's work for every chunk of `rows` (payload, n, dst, fixed | value << 8). */
extern "C" void host_unpack(const u8* src, u8* dst, const i64* rows, i64 count) {
  for (i64 c = 0; c < count; ++c) {
    const i64* r = rows + c * 4;
    const i64 m = (r[1] + 7) / 8;
    for (i64 j = 0; j < m; ++j)
      bitpack_ungroup(src + r[0] + 2, r[1], j, (int)(r[3] & 0xFF), (int)((r[3] >> 8) & 0xFF), dst + r[2], m);
  }
}
"""
)


@pytest.fixture(scope="module")
def host_encode(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    pytest.importorskip("ckptz._native")
    lib = host_build(tmp_path_factory, "literals", _HARNESS)
    lib.host_encode.restype = lib.host_bitpack.restype = lib.host_decode.restype = lib.host_unpack.restype = (
        None
    )
    lib.host_encode.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] + [ctypes.c_void_p] * 2
    lib.host_bitpack.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64]
    lib.host_decode.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] + [ctypes.c_void_p] * 2
    lib.host_unpack.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64]
    return lib


#: A chunk as the GPU writes it: (bitstream id, payload), or None where it is left stored.
Coded = tuple[int, bytes] | None


def _frames(
    host_encode: ctypes.CDLL, chunks: list[np.ndarray], pool: Any = None, threads: int = 1
) -> list[Coded]:
    """Each chunk as the GPU would write it, from the host build of its kernels."""
    sizes = np.array([c.size for c in chunks], np.int64)
    src = np.concatenate(chunks) if chunks else np.zeros(0, np.uint8)
    at = np.cumsum(sizes) - sizes
    q_at, q_len = literals.quarters(sizes, at)
    counts = np.zeros((q_at.size, 256), np.uint16)
    for q, (a, n) in enumerate(zip(q_at.tolist(), q_len.tolist(), strict=True)):
        counts[q] = np.bincount(src[a : a + n], minlength=256)
    room = np.array([literals.max_frame_size(int(n)) for n in sizes], np.int64)
    dst_at = np.cumsum(room) - room + 7  # payloads need no alignment
    got, packs, rows, tables, blob = literals.plan(counts, sizes, at, dst_at, room, pool, threads)
    dst = np.full(int(room.sum()) + 8, 0xEE, np.uint8)
    tables = np.ascontiguousarray(tables if tables.size else np.zeros((1, 256), np.uint32))
    blob = np.ascontiguousarray(blob if blob.size else np.zeros(1, np.uint8))
    rows = np.ascontiguousarray(rows)
    host_encode.host_encode(
        src.ctypes.data,
        dst.ctypes.data,
        rows.ctypes.data,
        rows.shape[0],
        tables.ctypes.data,
        blob.ctypes.data,
    )
    packed = np.flatnonzero(packs >= 0)
    table = np.ascontiguousarray(np.stack([at, sizes, dst_at, packs], axis=1)[packed])
    host_encode.host_bitpack(src.ctypes.data, dst.ctypes.data, table.ctypes.data, packed.size)
    return [
        None if g < 0 else (BITPACK.id if p >= 0 else ZSTD.id, dst[d : d + g].tobytes())
        for g, p, d in zip(got.tolist(), packs.tolist(), dst_at.tolist(), strict=True)
    ]


def _decoded(coded: Coded, size: int) -> bytes:
    """A chunk back from what the GPU wrote for it, by the CPU codecs."""
    assert coded is not None
    return cpu_codec(coded[0]).decode(coded[1], size).tobytes()


def _exponents(rng: np.random.Generator, n: int, spread: float = 3.0) -> np.ndarray:
    """Bytes like a float plane's exponents: a few values around one, a tail of rare ones."""
    return np.clip(np.round(rng.normal(120, spread, n)), 0, 255).astype(np.uint8)


def test_frames_decode_to_their_chunks(host_encode: ctypes.CDLL) -> None:
    from ckptz import _native

    rng = np.random.default_rng(7)
    block = literals.BLOCK
    drift = np.concatenate(
        [_exponents(rng, block, 1.0), _exponents(rng, block, 6.0), _exponents(rng, block, 1.0)]
    )
    chunks = [
        _exponents(rng, 256 << 10),  # whole blocks
        _exponents(rng, 3 * block + 12345),  # a short last block
        _exponents(rng, block + 1),  # a last block of one byte
        _exponents(rng, 700),  # below MIN_HUFFMAN: a raw block, so stored
        np.concatenate([np.full(block, 9, np.uint8), _exponents(rng, block)]),  # RLE, then coded
        drift,  # statistics that change: new tables, then the previous one again
        rng.integers(0, 256, 100_000, dtype=np.uint8),  # noise: stored
        (rng.random(300_000) < 0.001).astype(np.uint8) * 200,  # long codes (11 bits) beside 1-bit ones
        _exponents(rng, 70_000, 40.0),  # many distinct values
    ]
    coded = _frames(host_encode, chunks)
    dctx = zstandard.ZstdDecompressor()
    for i, (chunk, got) in enumerate(zip(chunks, coded, strict=True)):
        if i in (3, 6):
            assert got is None  # a raw block or noise is not worth a frame
            continue
        assert got is not None and got[0] == ZSTD.id, i
        frame = got[1]
        assert len(frame) < chunk.size, i
        assert dctx.decompress(frame, max_output_size=chunk.size) == chunk.tobytes(), i
        out = np.empty(chunk.size, np.uint8)
        assert _native.literals_decode(frame, out) and out.tobytes() == chunk.tobytes(), i


def test_chunks_with_fixed_bits_are_bit_packed(host_encode: ctypes.CDLL) -> None:
    # As the CPU coder does: where only k bit positions vary and the bytes' entropy is about
    # k bits, the bits are packed (as small, decoded ~10x faster than Huffman codes).
    from ckptz.codecs.bitpack import packed_size

    rng = np.random.default_rng(9)
    chunks = [
        rng.integers(0, 2, 100_003, dtype=np.uint8) * 0x80 | 0x3C,  # one varying bit (a sign plane)
        rng.integers(0, 128, 70_001, dtype=np.uint8) & 0xFE,  # 6 varying bits, even values
        np.full(5000, 0x41, np.uint8),  # nothing varies: 2 bytes
        _exponents(rng, 90_000),  # entropy well below its varying bits: a frame
    ]
    coded = _frames(host_encode, chunks)
    for chunk, fixed, got in zip(chunks, (0x7F, 0x81, 0xFF, None), coded, strict=True):
        assert got is not None
        if fixed is None:
            assert got[0] == ZSTD.id
        else:
            assert got[0] == BITPACK.id and len(got[1]) == packed_size(chunk.size, fixed)
        assert _decoded(got, chunk.size) == chunk.tobytes()


def test_frames_cost_what_the_cpu_coder_writes_in_blocks_of_that_size(host_encode: ctypes.CDLL) -> None:
    # The same choices as the CPU coder given the same block ends (raw, RLE, a new table or
    # the previous one), so the same bytes per frame. (The CPU plans its block ends; on
    # these drifting planes that is 2 % smaller, on the e2e checkpoint's 0.1-0.2 %.)
    from ckptz import _native

    rng = np.random.default_rng(3)
    sizes, spreads = rng.integers(4_000, 90_000, 40), rng.uniform(0.5, 8, 40)
    plane = np.concatenate([_exponents(rng, int(n), float(s)) for n, s in zip(sizes, spreads, strict=True)])
    chunks = [plane[i : i + (256 << 10)] for i in range(0, 1 << 20, 256 << 10)] + [
        plane[: 3 * literals.BLOCK + 99]
    ]
    gpu = [len(f[1]) if f else 0 for f in _frames(host_encode, chunks)]
    cpu = [len(_native.huffman_zstd(c.tobytes(), literals.BLOCK)) for c in chunks]
    assert gpu == cpu


def test_plan_in_shares_writes_the_same_frames(
    host_encode: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch's plan split over threads (each share numbering its own tables and heads)
    # gives every frame the bytes one thread would.
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(5)
    chunks = [
        _exponents(rng, int(n), float(s))
        for n, s in zip(rng.integers(1, 300_000, 23), rng.uniform(0.5, 9, 23), strict=True)
    ]
    chunks[4] = rng.integers(0, 256, 90_000, dtype=np.uint8)  # stored: its rows left out
    chunks[9] = rng.integers(0, 4, 50_000, dtype=np.uint8)  # bit-packed: no rows either
    monkeypatch.setattr(literals, "PLAN_SHARE", 3)
    alone = _frames(host_encode, chunks)
    with ThreadPoolExecutor(4) as pool:
        shared = _frames(host_encode, chunks, pool, 4)
    assert shared == alone and alone[4] is None and alone[9] is not None and alone[9][0] == BITPACK.id
    assert all(
        f is not None for i, (c, f) in enumerate(zip(chunks, alone, strict=True)) if c.size > 2000 and i != 4
    )


def test_quarters_cover_every_byte_once() -> None:
    sizes = np.array([1, 4, 5, literals.BLOCK, literals.BLOCK + 3, 3 * literals.BLOCK - 1], np.int64)
    at = np.cumsum(sizes) - sizes + 100
    start, length = literals.quarters(sizes, at)
    covered = np.zeros(int(at[-1] + sizes[-1]), np.int64)
    for a, n in zip(start.tolist(), length.tolist(), strict=True):
        covered[a : a + n] += 1
    assert (covered[100:] == 1).all() and not covered[:100].any()


@pytest.mark.gpu
def test_gpu_writes_the_planned_frames(host_encode: ctypes.CDLL, cuda_ops: Any) -> None:
    # The kernels on the device: the same bytes as the host build, which the CPU codecs and
    # nvCOMP (on the GPU, the zstd frames) decode back to every chunk.
    from ckptz.engines.gpu.coder import ZSTD_ID
    from ckptz.engines.gpu.nvcomp_codecs import NvcompCodecs

    rng = np.random.default_rng(11)
    chunks = [
        _exponents(rng, 1 << 20),
        _exponents(rng, 5 * literals.BLOCK + 777, 5.0),
        np.full(150_000, 0x41, np.uint8),  # bit-packed: 2 bytes
        rng.integers(0, 256, 70_000, dtype=np.uint8),  # stored
        np.concatenate([_exponents(rng, 90_000, 1.0), _exponents(rng, 90_000, 9.0)]),
        rng.integers(0, 2, 300_001, dtype=np.uint8) << 7,  # bit-packed: one varying bit
        _exponents(rng, 2000),
    ]
    codecs = literals.LiteralCodecs(NvcompCodecs(cuda_ops), cuda_ops)
    offs = np.cumsum([0] + [c.size + (-c.size % 16) for c in chunks])[:-1]
    host = np.zeros(int(offs[-1]) + chunks[-1].size + 16, np.uint8)
    for c, o in zip(chunks, offs.tolist(), strict=True):
        host[o : o + c.size] = c
    caps = [codecs.max_compressed_size(ZSTD_ID, c.size) for c in chunks]
    dst_offs = np.cumsum([0] + [c + (-c % 16) for c in caps])[:-1]
    src = cuda_ops.upload("lit_test_in", host)
    dst = cuda_ops.upload("lit_test_out", np.zeros(int(dst_offs[-1]) + caps[-1] + 16, np.uint8))
    got = codecs.encode(ZSTD_ID, src, offs.tolist(), [c.size for c in chunks], dst, dst_offs.tolist(), caps)
    ids = codecs.bitstreams()
    assert ids is not None
    out = cuda_ops.download(dst, np.uint8)
    coded = [
        None if g < 0 else (b, out[o : o + g].tobytes())
        for g, b, o in zip(got, ids, dst_offs.tolist(), strict=True)
    ]
    assert coded == _frames(host_encode, chunks)
    assert [c[0] if c else None for c in coded] == [
        ZSTD.id,
        ZSTD.id,
        BITPACK.id,
        None,
        ZSTD.id,
        BITPACK.id,
        ZSTD.id,
    ]
    assert all(
        _decoded(c, chunk.size) == chunk.tobytes() for chunk, c in zip(chunks, coded, strict=True) if c
    )
    frames = [(chunk, c[1]) for chunk, c in zip(chunks, coded, strict=True) if c and c[0] == ZSTD.id]
    packed = np.zeros(sum(len(f) + 16 for _, f in frames), np.uint8)
    at, pos = [], 0
    for _, f in frames:
        at.append(pos)
        packed[pos : pos + len(f)] = np.frombuffer(f, np.uint8)
        pos += len(f) + (-len(f) % 16)
    back_at = np.cumsum([0] + [c.size + (-c.size % 16) for c, _ in frames])[:-1].tolist()
    back = cuda_ops.upload("lit_test_back", np.zeros(back_at[-1] + frames[-1][0].size + 16, np.uint8))
    payload = cuda_ops.upload("lit_test_payload", packed)
    codecs.decode(
        ZSTD_ID, payload, at, [len(f) for _, f in frames], back, back_at, [c.size for c, _ in frames]
    )
    decoded = cuda_ops.download(back, np.uint8)
    assert all(
        decoded[o : o + c.size].tobytes() == c.tobytes() for (c, _), o in zip(frames, back_at, strict=True)
    )


@pytest.mark.gpu
def test_gpu_decodes_literal_frames_and_bit_packs_with_its_kernels(
    host_encode: ctypes.CDLL, cuda_ops: Any
) -> None:
    # The GPU's frames and the CPU coder's (planned blocks) by the decoding kernel, a frame
    # with sequences by nvCOMP beside them, bit packs by the unpacking kernel: every chunk back.
    from ckptz import _native
    from ckptz.engines.gpu.coder import ZSTD_ID
    from ckptz.engines.gpu.nvcomp_codecs import NvcompCodecs

    rng = np.random.default_rng(21)
    chunks = [
        _exponents(rng, 1 << 20),
        _exponents(rng, 5 * literals.BLOCK + 777, 5.0),
        np.concatenate([_exponents(rng, 90_000, 1.0), _exponents(rng, 90_000, 9.0)]),
        (rng.random(300_000) < 0.001).astype(np.uint8) * 200,
        _exponents(rng, 2000),
    ]
    frames = [f[1] for f in _frames(host_encode, chunks)] + [
        _native.huffman_zstd(c.tobytes(), 0) for c in chunks
    ]
    repeats = bytes(range(200)) * 500
    frames.append(zstandard.ZstdCompressor(level=3).compress(repeats))
    raws = [c.tobytes() for c in chunks] * 2 + [repeats]
    packs = [
        rng.integers(0, 2, 100_003, dtype=np.uint8) * 0x80 | 0x3C,
        rng.integers(0, 128, 70_001, dtype=np.uint8) & 0xFE,
    ]
    packed = [f[1] for f in _frames(host_encode, packs)]  # type: ignore[index]
    payloads = [*frames, *packed]
    at = np.cumsum([0] + [len(p) + (-len(p) % 16) for p in payloads])[:-1]
    host = np.zeros(int(at[-1]) + len(payloads[-1]) + 16, np.uint8)
    for p, o in zip(payloads, at.tolist(), strict=True):
        host[o : o + len(p)] = np.frombuffer(p, np.uint8)
    sizes = [len(r) for r in raws] + [c.size for c in packs]
    out_at = np.cumsum([0] + [n + (-n % 16) for n in sizes])[:-1]
    codecs = literals.LiteralCodecs(NvcompCodecs(cuda_ops), cuda_ops)
    src = cuda_ops.upload("lit_dec_in", host)
    dst = cuda_ops.upload("lit_dec_out", np.zeros(int(out_at[-1]) + sizes[-1] + 16, np.uint8))
    n = len(frames)
    args = [
        (at[a:b].tolist(), [len(p) for p in payloads[a:b]], out_at[a:b].tolist(), sizes[a:b])
        for a, b in ((0, n), (n, len(payloads)))
    ]
    codecs.decode(ZSTD_ID, src, args[0][0], args[0][1], dst, args[0][2], args[0][3], host=host)
    codecs.decode(BITPACK.id, src, args[1][0], args[1][1], dst, args[1][2], args[1][3], host=host)
    out = cuda_ops.download(dst, np.uint8)
    want = raws + [c.tobytes() for c in packs]
    for i, (o, w) in enumerate(zip(out_at.tolist(), want, strict=True)):
        assert out[o : o + len(w)].tobytes() == w, i


@pytest.mark.gpu
def test_gpu_engine_restores_portable_containers_on_the_gpu(
    small_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Containers the CPU and the GPU wrote, restored by the GPU engine itself (its kernels
    # decoding the literal frames and bit packs): byte-exact, no frame left to the CPU threads.
    from ckptz import api
    from ckptz.engines.gpu import engine as gpu_engine

    on_cpu = []
    real = gpu_engine.decode_chunks
    monkeypatch.setattr(gpu_engine, "decode_chunks", lambda *a: on_cpu.append(1) or real(*a))
    for device in ("cuda", "cpu"):
        out = tmp_path / device
        api.compress(small_checkpoint, out, device=device)
        back = tmp_path / f"back-{device}"
        summary = api.decompress(out, back, device="cuda")
        assert summary.device.startswith("cuda")
        assert tree_digests(back) == tree_digests(small_checkpoint)
    assert not on_cpu


@pytest.mark.gpu
def test_gpu_runs_leave_metadata_to_the_cpu_coder(
    small_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pickles, headers and generator states are coded by the CPU coder (zstd's matches find
    # their repeats): the same bytes as a CPU run's, whatever the GPU codes.
    from ckptz import api

    sizes = {}
    for device in ("cuda", "cpu"):
        out = tmp_path / device
        summary = api.compress(small_checkpoint, out, device=device)
        assert summary.device.startswith(device)
        sizes[device] = {c.name: c.compressed_bytes for c in api.inspect(out).components}
        api.decompress(out, tmp_path / f"back-{device}", device="cpu")
        assert tree_digests(tmp_path / f"back-{device}") == tree_digests(small_checkpoint)
    assert "metadata" in sizes["cpu"]
    for component in ("metadata", "rng_state"):
        assert sizes["cuda"].get(component) == sizes["cpu"].get(component), component


def test_kernels_share_the_block_size() -> None:
    from ckptz.engines.gpu import kernels

    assert literals._THREADS == kernels._THREADS  # bitpack_encode's grid is sized by it


def _gpu_decoded(
    host_encode: ctypes.CDLL, payloads: list[bytes], sizes: list[int]
) -> tuple[list[bytes | None], np.ndarray]:
    """Each payload decoded as the GPU decodes it (the host's scan, then the decoding
    kernel's rows run one after another), None where the scan leaves it to nvCOMP; and
    whether each stream ended exactly."""
    from ckptz import _native

    size = np.array([len(p) for p in payloads], np.int64)
    room = (size + 15) // 16 * 16 + 16
    at = np.cumsum(room) - room + 16  # 16-byte aligned, as in a span's buffer
    host = np.zeros(int(room.sum()) + 16, np.uint8)
    for a, p in zip(at.tolist(), payloads, strict=True):
        host[a : a + len(p)] = np.frombuffer(p, np.uint8)
    raw = np.array(sizes, np.int64)
    out_at = np.cumsum(raw) - raw + 3  # anywhere
    ok = np.zeros(size.size, np.uint8)
    rows, codes = _native.literals_scan(host, at, size, raw, out_at, ok, None, None)
    table = np.empty((rows, literals.SCAN_FIELDS), np.int64)
    lookups = np.empty((max(codes, 1), literals.CODE_ENTRIES), np.uint16)
    got = _native.literals_scan(host, at, size, raw, out_at, ok, table, lookups)
    assert 0 <= got[0] <= rows and 0 <= got[1] <= codes
    table = np.ascontiguousarray(table[: got[0]])
    out = np.full(int(raw.sum()) + 8, 0xEE, np.uint8)
    ends = np.zeros(max(got[0], 1), np.uint8)
    host_encode.host_decode(
        host.ctypes.data, out.ctypes.data, table.ctypes.data, got[0], lookups.ctypes.data, ends.ctypes.data
    )
    assert (out[:3] == 0xEE).all() and (out[3 + int(raw.sum()) :] == 0xEE).all()  # nothing written outside
    return [
        out[o : o + n].tobytes() if k else None
        for o, n, k in zip(out_at.tolist(), sizes, ok.tolist(), strict=True)
    ], ends[: got[0]]


def test_gpu_decoder_reads_the_gpu_and_cpu_coders_frames(host_encode: ctypes.CDLL) -> None:
    from ckptz import _native

    rng = np.random.default_rng(11)
    block = literals.BLOCK
    chunks = [
        _exponents(rng, 256 << 10),
        _exponents(rng, 3 * block + 12345),
        _exponents(rng, block + 1),
        np.concatenate([np.full(block, 9, np.uint8), _exponents(rng, block)]),  # RLE, then coded
        np.concatenate(
            [_exponents(rng, block, 1.0), _exponents(rng, block, 6.0), _exponents(rng, block, 1.0)]
        ),
        (rng.random(300_000) < 0.001).astype(np.uint8) * 200,  # 11-bit codes beside 1-bit ones
        _exponents(rng, 70_000, 40.0),  # many distinct values: weights FSE-coded
        _exponents(rng, 5_000, 2.0),  # one small block
    ]
    gpu = [f[1] for f in _frames(host_encode, chunks)]  # fixed 64 KiB blocks
    cpu = [_native.huffman_zstd(c.tobytes(), literals.BLOCK) for c in chunks]  # the CPU coder's, same blocks
    raw_blocks = [_native.huffman_zstd(rng.integers(0, 256, 9_000, dtype=np.uint8).tobytes(), 0)]
    payloads = [*gpu, *cpu]
    sizes = [c.size for c in chunks] * 2
    assert all(p is not None for p in payloads)
    decoded, ends = _gpu_decoded(host_encode, payloads, sizes)
    for i, (got, chunk) in enumerate(zip(decoded, chunks * 2, strict=True)):
        assert got == chunk.tobytes(), i
    assert ends.all()
    # Blocks of more than 64 KiB (the CPU coder plans up to 128 KiB) make streams a thread
    # decodes slower than nvCOMP: such frames are left to it.
    big = _native.huffman_zstd(_exponents(rng, 1 << 20).tobytes(), 1 << 17)
    assert _gpu_decoded(host_encode, [big], [1 << 20])[0] == [None]
    if raw_blocks[0] is not None:  # noise: a frame of raw blocks, copied
        got, _ = _gpu_decoded(host_encode, raw_blocks, [9_000])
        assert got[0] is not None and len(got[0]) == 9_000


def test_gpu_decoder_leaves_other_zstd_frames_to_nvcomp(host_encode: ctypes.CDLL) -> None:
    # Frames with sequences (libzstd's), a checksum, a wrong content size or a cut stream
    # are not the scan's: it says so and writes nothing for them.
    rng = np.random.default_rng(5)
    chunk = _exponents(rng, 100_000)
    ours = _frames(host_encode, [chunk])[0]
    assert ours is not None
    frame = ours[1]
    repeats = zstandard.ZstdCompressor(level=3).compress(bytes(range(200)) * 500)
    checked = zstandard.ZstdCompressor(level=1, write_checksum=True).compress(bytes(range(256)) * 40)
    cut = frame[: len(frame) - 10]
    bad_tree = bytearray(frame)
    bad_tree[9] ^= 0xFF  # the first block's literals header or table
    # A frame whose raw blocks come before one with sequences: their rows are made, then
    # taken back (the room counted for the batch must hold them meanwhile).
    noisy = rng.integers(0, 256, 3 << 17, dtype=np.uint8).tobytes() + bytes(range(200)) * 2000
    late = zstandard.ZstdCompressor(level=3).compress(noisy)
    payloads = [repeats, checked, cut, frame, frame, late, frame]
    sizes = [100_000, 10_240, chunk.size, chunk.size, chunk.size + 1, len(noisy), chunk.size]
    decoded, _ = _gpu_decoded(host_encode, payloads, sizes)
    assert [d is None for d in decoded] == [True, True, True, False, True, True, False]
    assert decoded[3] == decoded[6] == chunk.tobytes()


def test_gpu_decoder_on_a_corrupt_stream_stays_in_its_bounds(host_encode: ctypes.CDLL) -> None:
    # A flipped bit inside a stream passes the scan (streams are not checked on the host):
    # the kernel writes only its rows' bytes, which differ, and the frame's checksum says so.
    rng = np.random.default_rng(6)
    chunk = _exponents(rng, 200_000)
    frame = bytearray(_frames(host_encode, [chunk])[0][1])  # type: ignore[index]
    for where in (len(frame) // 2, len(frame) - 2, 40):
        bad = bytearray(frame)
        bad[where] ^= 0x10
        decoded, ends = _gpu_decoded(host_encode, [bytes(bad)], [chunk.size])
        if decoded[0] is not None:
            assert decoded[0] != chunk.tobytes() or not ends.all()


def test_gpu_bit_unpacking_inverts_the_packing(host_encode: ctypes.CDLL) -> None:
    rng = np.random.default_rng(13)
    chunks = [
        rng.integers(0, 2, 100_003, dtype=np.uint8) * 0x80 | 0x3C,
        rng.integers(0, 128, 70_001, dtype=np.uint8) & 0xFE,
        np.full(5000, 0x41, np.uint8),
        rng.integers(0, 4, 17, dtype=np.uint8) << 3 | 0x81,
    ]
    coded = _frames(host_encode, chunks)
    assert all(c is not None and c[0] == BITPACK.id for c in coded)
    payloads = [c[1] for c in coded]  # type: ignore[index]
    at = np.cumsum([0] + [len(p) for p in payloads])[:-1].astype(np.int64)
    src = np.frombuffer(b"".join(payloads), np.uint8).copy()
    raw = np.array([c.size for c in chunks], np.int64)
    out_at = np.cumsum(raw) - raw
    rows = np.stack([at, raw, out_at, src[at].astype(np.int64) | src[at + 1].astype(np.int64) << 8], axis=1)
    rows = np.ascontiguousarray(rows)
    out = np.zeros(int(raw.sum()), np.uint8)
    host_encode.host_unpack(src.ctypes.data, out.ctypes.data, rows.ctypes.data, len(chunks))
    assert out.tobytes() == b"".join(c.tobytes() for c in chunks)
