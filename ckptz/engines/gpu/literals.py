"""The portable ``zstd`` bitstream written on the GPU: frames of Huffman-coded literal blocks.

The CPU coder writes a plane as one standard zstd frame made only of literal blocks
(``ckptz/native_src/literals_encode.c``): libzstd and nvCOMP decode it, and it codes
exponent planes markedly smaller than nvCOMP's own Zstd. This module writes the same kind
of frame on the GPU, in blocks of :data:`BLOCK` bytes (the CPU plans block ends by dynamic
programming; fixed blocks cost a fraction of a percent of an exponent plane's coded size):

1. ``literals_hist`` counts the bytes of every quarter of every block (a zstd block's four
   streams each code a quarter), one thread block per quarter;
2. the host plans every frame from those counts (``ckptz._native.literals_plan``, in C with
   the GIL released, in shares on the engine's CPU threads): each block's kind (raw, RLE, a
   new Huffman table or the previous one: a new one must save 128 bytes, a coded block a
   64th of itself), its table and headers, where each of its streams starts, each frame's
   size. A chunk whose bytes agree on some bit positions, with about as many bits of
   entropy as positions that vary, is bit-packed instead (the ``bitpack`` bitstream, the
   CPU coder's rule); a chunk whose frame would not be smaller than itself is left out (the
   coder stores it);
3. ``literals_encode`` writes every block at once: its head (frame header, block and
   literals headers, table description, jump table) copied from the plan, each of its four
   streams by one thread, raw blocks copied; ``bitpack_encode`` packs 8 bytes a thread.

So a batch costs one wait (the counts), and every payload's size is known before its bits
are written. (The GPU engine leaves metadata frames to the CPU coder, whose zstd finds the
repeats no order-0 coder does.)

Decoding is the same work the other way (:func:`decode`): the host cuts each frame into
rows in C from the payload's host copy (``ckptz._native.literals_scan``: the headers and
Huffman tables checked, each table made a lookup of the next 11 bits, each stream's bytes
and where its symbols go, raw and RLE blocks in pieces), and ``literals_decode`` decodes a
row a thread; ``bitpack_decode`` unpacks 8 bytes a thread. Frames the scan does not take
(any other zstd frame, or streams over 16 KiB, which a thread decodes slower than nvCOMP)
are nvCOMP's. The kernels are in ``cuda_src/literals.cu``; ``HD`` marks the code shared with the host build of the
tests (``tests/test_literals_gpu.py`` compiles the stream writer and the bit packer with a
C++ compiler, runs them thread by thread, and decodes what they write with libzstd and the
CPU codecs).
"""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any, Protocol, cast

import numpy as np

from ckptz import cuda, trace
from ckptz.codecs.bitpack import packed_size
from ckptz.codecs.native import native
from ckptz.codecs.table import BITPACK, ZSTD
from ckptz.engines.gpu import cuda_src
from ckptz.engines.gpu.coder import BatchCodecs, Ops
from ckptz.engines.gpu.memory import Buf
from ckptz.errors import CodecError

#: Input bytes per zstd block.
BLOCK = 64 << 10
#: Fields of a plan row (``literals_plan.c``'s ``LP_FIELDS``), the two a share's rows number
#: from its own tables and heads, and head bytes per block at most.
PLAN_FIELDS = 16
LP_HEAD, LP_TABLE = 4, 6
HEAD_MAX = 160
#: Fields of a row of the decoder's work (``literals_decode.c``'s ``SCAN_FIELDS``), and the
#: entries of each code's lookup table (by the next 11 bits: ``SCAN_LOOKUP``).
SCAN_FIELDS = 6
CODE_ENTRIES = 1 << 11

NAMES = ("literals_hist", "literals_encode", "bitpack_encode", "literals_decode", "bitpack_decode")
#: Chunks per launch of ``bitpack_encode`` (CUDA's limit on a grid's second dimension), and
#: the threads of a block of every kernel (:mod:`ckptz.engines.gpu.kernels`' ``THREADS``).
_MAX_Y = 65535
_THREADS = 256
SOURCE = cuda_src.read("literals.cu")


class _Ops(Ops, Protocol):
    """The coder's device (:class:`ckptz.engines.gpu.coder.Ops`) with its kernels to launch
    (:class:`ckptz.engines.gpu.kernels.CudaOps`)."""

    def launch(self, name: str, grid: tuple[int, int], args: Sequence[object]) -> None: ...


def max_frame_size(size: int) -> int:
    """The largest frame a ``size``-byte chunk can get (one it would store is left out)."""
    return size + 32


def quarters(sizes: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each quarter of each :data:`BLOCK`-byte block of each chunk (``sizes[c]`` bytes
    at ``at[c]``) starts, and its bytes: four per block, chunk after chunk."""
    sizes = np.asarray(sizes, np.int64)
    blocks = -(-sizes // BLOCK)
    chunk = np.repeat(np.arange(sizes.size), blocks)
    first = np.cumsum(blocks) - blocks
    b = np.arange(int(blocks.sum())) - np.repeat(first, blocks)
    m = np.minimum(sizes[chunk] - b * BLOCK, BLOCK)
    seg = (m + 3) // 4
    k = np.arange(4)
    lo = np.minimum(k * seg[:, None], m[:, None])
    hi = np.where(k < 3, np.minimum((k + 1) * seg[:, None], m[:, None]), m[:, None])
    start = np.asarray(at, np.int64)[chunk][:, None] + b[:, None] * BLOCK + lo
    return start.reshape(-1), (hi - lo).reshape(-1)


#: A plan: each payload's size, each chunk's bit pack (or -1), the rows, tables and heads.
_Plan = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]

#: Blocks a share of a batch's plan has at least: each share is planned by a thread of its
#: own, since planning a whole batch's blocks in one thread would hold up the GPU.
PLAN_SHARE = 128


def plan(
    counts: np.ndarray,
    sizes: np.ndarray,
    src_at: np.ndarray,
    dst_at: np.ndarray,
    capacities: np.ndarray,
    pool: Executor | None = None,
    threads: int = 1,
) -> _Plan:
    """The frames of chunks ``sizes`` planned from their quarters' byte ``counts``
    (``ckptz._native.literals_plan``; where a ``pool`` is given, on up to ``threads`` of its
    threads, each a share of whole chunks): each payload's size (-1: store the chunk),
    where a chunk is bit-packed instead (``fixed | value << 8``; -1: a frame), and the
    plan's rows, tables and head bytes."""
    sizes = np.ascontiguousarray(sizes, np.int64)
    ends = np.cumsum(-(-sizes // BLOCK))
    total = int(ends[-1]) if ends.size else 0
    shares = max(1, min(threads if pool is not None else 1, total // PLAN_SHARE))
    cuts = np.searchsorted(ends, np.arange(1, shares) * total / shares).tolist()
    bounds = [0, *sorted(set(cuts) - {0, sizes.size}), sizes.size]
    src_at = np.ascontiguousarray(src_at, np.int64)
    dst_at = np.ascontiguousarray(dst_at, np.int64)
    caps = np.ascontiguousarray(capacities, np.int64)
    counts = np.ascontiguousarray(counts, np.uint16).reshape(-1, 256)

    def share(lo: int, hi: int) -> _Plan:
        # Slices of whole chunks: contiguous, as the C extension wants them.
        first = int(ends[lo - 1]) if lo else 0
        rows = slice(4 * first, 4 * int(ends[hi - 1]))
        return _plan_share(counts[rows], sizes[lo:hi], src_at[lo:hi], dst_at[lo:hi], caps[lo:hi])

    pairs = list(itertools.pairwise(bounds))
    if len(pairs) == 1 or pool is None:
        parts = [share(lo, hi) for lo, hi in pairs]
    else:
        parts = list(pool.map(lambda p: share(*p), pairs))
    # Each share numbered its tables and heads from 0: shifted past the shares before it.
    table_base = np.cumsum([0] + [p[3].shape[0] for p in parts])
    head_base = np.cumsum([0] + [p[4].size for p in parts])
    for p, tb, hb in zip(parts, table_base.tolist(), head_base.tolist(), strict=False):
        p[2][:, LP_TABLE] += tb
        p[2][:, LP_HEAD] += hb
    return cast(_Plan, tuple(np.concatenate([p[k] for p in parts]) for k in range(5)))


def _plan_share(
    counts: np.ndarray, sizes: np.ndarray, src_at: np.ndarray, dst_at: np.ndarray, capacities: np.ndarray
) -> _Plan:
    blocks = int((-(-sizes // BLOCK)).sum())
    got = np.empty(sizes.size, np.int64)
    packs = np.empty(sizes.size, np.int64)
    rows = np.empty((blocks, PLAN_FIELDS), np.int64)
    tables = np.empty((blocks, 256), np.uint32)
    blob = np.empty(max(blocks * HEAD_MAX, 1), np.uint8)
    n, t, used = native.literals_plan(
        counts,
        sizes,
        src_at,
        dst_at,
        capacities,
        BLOCK,
        got,
        packs,
        rows,
        tables,
        blob,
    )
    return got, packs, rows[:n], tables[:t], blob[:used]


def encode(
    ops: _Ops,
    src: Buf,
    offsets: Sequence[int],
    sizes: Sequence[int],
    dst: Buf,
    dst_offsets: Sequence[int],
    capacities: Sequence[int],
    *,
    pool: Executor | None = None,
    threads: int = 1,
) -> tuple[list[int], list[int]]:
    """Code chunks ``sizes[c]`` bytes at ``src + offsets[c]`` into zstd frames (or bit packs)
    at ``dst + dst_offsets[c]`` (at most ``capacities[c]`` bytes each), queued on ``ops``'
    stream after one wait for the byte counts (the plan on up to ``threads`` of ``pool``'s);
    each payload's size (-1 for a chunk better stored), and its bitstream."""
    size = np.asarray(sizes, np.int64)
    if not size.size:
        return [], []
    at, dst_at = np.asarray(offsets, np.int64), np.asarray(dst_offsets, np.int64)
    q_at, q_len = quarters(size, at)
    table = ops.upload("lit_quarters", np.concatenate([q_at, q_len]))
    counts = ops.scratch("lit_counts", q_at.size * 512)
    ops.launch(
        "literals_hist",
        (q_at.size, 1),
        [
            cuda.pointer(src.ptr),
            cuda.pointer(table.ptr),
            cuda.pointer(table.ptr + 8 * q_at.size),
            cuda.pointer(counts.ptr),
        ],
    )
    with trace.span("literal counts"):
        counted = ops.download(counts, np.uint16)
    with trace.span("literal plan"):
        got, packs, rows, tables, blob = plan(
            counted, size, at, dst_at, np.asarray(capacities, np.int64), pool, threads
        )
    if rows.shape[0]:
        put_rows = ops.upload("lit_plan", rows)
        # (Every block has a head; a batch of raw and RLE blocks has no table.)
        put_tables = ops.upload("lit_tables", tables if tables.size else np.zeros(256, np.uint32))
        put_blob = ops.upload("lit_blob", blob)
        ops.launch(
            "literals_encode",
            (rows.shape[0], 1),
            [
                cuda.pointer(src.ptr),
                cuda.pointer(dst.ptr),
                cuda.pointer(put_rows.ptr),
                cuda.pointer(put_tables.ptr),
                cuda.pointer(put_blob.ptr),
            ],
        )
    packed = np.flatnonzero(packs >= 0)
    if packed.size:
        put = ops.upload("lit_packs", np.stack([at, size, dst_at, packs], axis=1)[packed])
        groups = int(size[packed].max() + 7) // 8
        for c0 in range(0, packed.size, _MAX_Y):
            c1 = min(packed.size, c0 + _MAX_Y)
            ops.launch(
                "bitpack_encode",
                (min(-(-groups // _THREADS), 1024), c1 - c0),
                [cuda.pointer(src.ptr), cuda.pointer(dst.ptr), cuda.pointer(put.ptr + 32 * c0)],
            )
    return got.tolist(), np.where(packs >= 0, BITPACK.id, ZSTD.id).tolist()


def _columns(*columns: Sequence[int]) -> list[np.ndarray]:
    """Each of a decode's per-payload columns as an int64 array."""
    return [np.asarray(c, np.int64) for c in columns]


def decode(
    ops: _Ops,
    host: np.ndarray,
    dst: Buf,
    src: Buf,
    offsets: Sequence[int],
    sizes: Sequence[int],
    dst_offsets: Sequence[int],
    raw_sizes: Sequence[int],
) -> np.ndarray:
    """Decode the literal frames among ``sizes[c]``-byte payloads at ``src + offsets[c]``
    (the same bytes at ``host[offsets[c]:]``) into ``raw_sizes[c]`` bytes at ``dst +
    dst_offsets[c]``, queued on ``ops``' stream: the host cuts each frame into rows in C
    (``ckptz._native.literals_scan``: its headers and Huffman tables checked and made into
    lookup tables, each stream's bytes and where its symbols go), a thread a row decodes
    them. Which payloads were such frames (the others are left to the caller)."""
    at, size, raw, out_at = _columns(offsets, sizes, raw_sizes, dst_offsets)
    ok = np.zeros(at.size, np.uint8)
    if not at.size:
        return ok.astype(bool)
    with trace.span("literal scan"):
        rows, codes = native.literals_scan(host, at, size, raw, out_at, ok, None, None)
        table = np.empty((rows, SCAN_FIELDS), np.int64)
        lookups = np.empty((max(codes, 1), CODE_ENTRIES), np.uint16)
        rows, codes = native.literals_scan(host, at, size, raw, out_at, ok, table, lookups)
    if rows < 0:  # cannot be (the count is the room the scan needs): nvCOMP decodes them all
        ok[:] = 0
    elif rows > 0:
        put_rows = ops.upload("lit_rows", table[:rows])
        put_codes = ops.upload("lit_codes", lookups[: max(codes, 1)])
        ops.launch(
            "literals_decode",
            (-(-rows // _THREADS), 1),
            [
                cuda.pointer(src.ptr),
                cuda.pointer(dst.ptr),
                cuda.pointer(put_rows.ptr),
                ctypes.c_int64(rows),
                cuda.pointer(put_codes.ptr),
            ],
        )
    return ok.astype(bool)


def decode_bitpack(
    ops: _Ops,
    host: np.ndarray,
    dst: Buf,
    src: Buf,
    offsets: Sequence[int],
    sizes: Sequence[int],
    dst_offsets: Sequence[int],
    raw_sizes: Sequence[int],
) -> None:
    """Unpack ``bitpack`` payloads as :func:`decode` decodes literal frames, their headers
    checked on the host first.

    Raises:
        CodecError: a payload's header or length does not fit its chunk.
    """
    at, size, raw, out_at = _columns(offsets, sizes, raw_sizes, dst_offsets)
    if not at.size:
        return
    if (size < 2).any():
        raise CodecError("bitpack payload is shorter than its header", codec=BITPACK.name)
    fixed = host[at].astype(np.int64)
    value = host[at + 1].astype(np.int64)
    packed = [packed_size(n, f) for n, f in zip(raw.tolist(), fixed.tolist(), strict=True)]
    if (value & ~fixed).any() or (size != packed).any():
        raise CodecError("bitpack payload header or length is corrupt", codec=BITPACK.name)
    put = ops.upload("lit_unpacks", np.stack([at, raw, out_at, fixed | value << 8], axis=1))
    groups = int(raw.max() + 7) // 8
    for c0 in range(0, at.size, _MAX_Y):
        c1 = min(at.size, c0 + _MAX_Y)
        ops.launch(
            "bitpack_decode",
            (max(1, min(-(-groups // _THREADS), 1024)), c1 - c0),
            [cuda.pointer(src.ptr), cuda.pointer(dst.ptr), cuda.pointer(put.ptr + 32 * c0)],
        )


class LiteralCodecs:
    """The GPU coder's batched codecs (:class:`ckptz.engines.gpu.coder.BatchCodecs`): the
    ``zstd`` bitstream written by :func:`encode` (a chunk it bit-packs gets the ``bitpack``
    bitstream, which CPUs decode) and its frames decoded by :func:`decode`, bit packs by
    :func:`decode_bitpack`; everything else by ``nvcomp``."""

    def __init__(
        self, nvcomp: BatchCodecs, ops: _Ops, pool: Executor | None = None, threads: int = 1
    ) -> None:
        self._nvcomp, self._ops, self._pool, self._threads = nvcomp, ops, pool, threads
        self._chosen: list[int] | None = None

    def max_compressed_size(self, codec_id: int, size: int) -> int:
        if codec_id == ZSTD.id:
            return max_frame_size(size)
        return self._nvcomp.max_compressed_size(codec_id, size)

    def encode(self, codec_id: int, *args: Any) -> list[int]:
        """:meth:`~ckptz.engines.gpu.coder.BatchCodecs.encode`."""
        if codec_id == ZSTD.id:
            got, self._chosen = encode(self._ops, *args, pool=self._pool, threads=self._threads)
            return got
        self._chosen = None
        return self._nvcomp.encode(codec_id, *args)

    def bitstreams(self) -> list[int] | None:
        """:meth:`~ckptz.engines.gpu.coder.BatchCodecs.bitstreams`: each chunk's of the last
        :meth:`encode`."""
        return self._chosen

    def decode(
        self,
        codec_id: int,
        src: Buf,
        offsets: Sequence[int],
        sizes: Sequence[int],
        dst: Buf,
        dst_offsets: Sequence[int],
        raw_sizes: Sequence[int],
        host: np.ndarray | None = None,
    ) -> None:
        """:meth:`~ckptz.engines.gpu.coder.BatchCodecs.decode`: literal frames and bit packs
        by :func:`decode` and :func:`decode_bitpack` (their payloads parsed from ``host``),
        every other payload by nvCOMP."""
        args = (offsets, sizes, dst_offsets, raw_sizes)
        if codec_id == BITPACK.id:
            if host is None:
                raise CodecError("bitpack payloads are decoded from their host copy", codec=BITPACK.name)
            decode_bitpack(self._ops, host, dst, src, *args)
            return
        if codec_id == ZSTD.id and host is not None:
            rest = np.flatnonzero(~decode(self._ops, host, dst, src, *args)).tolist()
            if not rest:
                return
            offsets, sizes, dst_offsets, raw_sizes = ([a[i] for i in rest] for a in args)
        self._nvcomp.decode(codec_id, src, offsets, sizes, dst, dst_offsets, raw_sizes)
