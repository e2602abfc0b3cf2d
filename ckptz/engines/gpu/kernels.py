"""Triton kernels for the GPU coder: split, merge and chunk gathering, one pass each.

The torch transform (:mod:`ckptz.engines.gpu.transform`) takes six passes over the data to split a
batch (four for the rotation, one permuting copy, two for the constant check) and a launch
per chunk to gather payloads; these kernels do each job in one pass:

* :func:`split_rows` reads each word once, rotates it in registers, writes its bytes to
  their planes, and folds every plane row's minimum and maximum byte (a row is constant
  exactly when the two agree) and a sampled byte histogram (is the row noise?) into a
  small table, so the coder's two decisions cost no extra pass;
* :func:`merge_rows` reads each plane row from wherever it lies (a stored payload, a
  decoded plane, or a constant) and writes whole words, rotated back;
* :func:`gather` copies any number of byte ranges of one buffer to 16-byte-aligned places
  of another, zero-filling each up to its padded size: the container's data area for a
  whole batch, in one launch.

Every kernel produces exactly the bytes of the CPU transform (:mod:`ckptz.codecs.planes`);
the GPU tests compare them. Only :mod:`ckptz.engines.gpu.coder` imports this module, and only for
CUDA tensors when Triton is importable; elsewhere the torch operations stand in.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ckptz.engines.gpu.transform import DECODED, SAMPLE_BLOCK, SAMPLE_EVERY, STATS, STORED

#: Words per program: 4096 fp32 words is 16 KiB in, four 4 KiB plane rows out; each
#: program's plane row block is one histogram sample block.
_BLOCK = SAMPLE_BLOCK
#: Every this many full blocks of a plane row, :func:`split_rows` adds the block's byte
#: histogram to the row's sample (1/8 of a 256 KiB row: 32 K bytes).
_SAMPLE_EVERY = SAMPLE_EVERY
#: 4-byte words per program in :func:`gather`.
_COPY_BLOCK = 4096

_STORAGE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
#: CUDA's limit on a grid's second dimension (frames or chunks per launch).
_MAX_Y = 65535


@triton.jit
def _split_kernel(
    src,
    planes,
    stats,
    m,
    stride,
    WORD: tl.constexpr,
    ST: tl.constexpr,
    UT: tl.constexpr,
    ROTATE: tl.constexpr,
    BLOCK: tl.constexpr,
    SAMPLE_EVERY: tl.constexpr,
    NSTATS: tl.constexpr,
):
    b = tl.program_id(0)
    f = tl.program_id(1).to(tl.int64)
    i = b * BLOCK + tl.arange(0, BLOCK)
    mask = i < m
    x = tl.load(src + f * m + i, mask=mask, other=0).to(ST, bitcast=True).to(UT)
    if ROTATE:
        x = (x << 1) | (x >> (8 * WORD - 1))
        if WORD == 2:
            x = x & 0xFFFF
    for p in tl.static_range(WORD):
        v = ((x >> (8 * p)) & 0xFF).to(tl.uint8)
        row = f * WORD + p
        tl.store(planes + row * stride + i, v, mask=mask)
        vi = v.to(tl.int32)
        at = stats + row * NSTATS
        tl.atomic_min(at, tl.min(tl.where(mask, vi, 255), axis=0))
        tl.atomic_max(at + 1, tl.max(tl.where(mask, vi, 0), axis=0))
        if (b % SAMPLE_EVERY == 0) and ((b + 1) * BLOCK <= m):
            tl.atomic_add(at + 2 + tl.arange(0, 256), tl.histogram(vi, 256))


@triton.jit
def _merge_kernel(
    stored,
    decoded,
    offsets,
    sources,
    out,
    m,
    WORD: tl.constexpr,
    ST: tl.constexpr,
    UT: tl.constexpr,
    ROTATE: tl.constexpr,
    BLOCK: tl.constexpr,
    STORED: tl.constexpr,
    DECODED: tl.constexpr,
):
    b = tl.program_id(0)
    f = tl.program_id(1).to(tl.int64)
    i = b * BLOCK + tl.arange(0, BLOCK)
    mask = i < m
    acc = tl.zeros([BLOCK], dtype=UT)
    for p in tl.static_range(WORD):
        row = f * WORD + p
        off = tl.load(offsets + row) * 16
        c = tl.load(sources + row)
        # Only one of the two loads touches memory: the other is fully masked.
        v = tl.load(stored + off + i, mask=mask & (c == STORED), other=0).to(UT)
        v = v | tl.load(decoded + off + i, mask=mask & (c == DECODED), other=0).to(UT)
        v = tl.where(c >= 0, c.to(UT), v)
        acc = acc | (v << (8 * p))
    if ROTATE:
        acc = (acc >> 1) | (acc << (8 * WORD - 1))
    tl.store(out + f * m + i, acc.to(ST).to(out.dtype.element_ty, bitcast=True), mask=mask)


@triton.jit
def _gather_kernel(src, src_offsets, sizes, dst, dst_offsets, padded, BLOCK: tl.constexpr):
    # In 4-byte words: every range starts 16-byte aligned and its padded size is a multiple
    # of 16, so only the word holding a range's last byte needs masking within itself.
    b = tl.program_id(0)
    c = tl.program_id(1)
    w = b * BLOCK + tl.arange(0, BLOCK)
    n = tl.load(sizes + c)
    words = tl.load(padded + c) // 4
    so = tl.load(src_offsets + c) * 4
    do = tl.load(dst_offsets + c) * 4
    v = tl.load(src + so + w, mask=w * 4 < n, other=0).to(tl.uint32, bitcast=True)
    keep = n - w * 4  # bytes of this word inside the range
    low = (tl.full([BLOCK], 1, tl.uint32) << (8 * tl.minimum(tl.maximum(keep, 0), 3)).to(tl.uint32)) - 1
    v = tl.where(keep >= 4, v, v & low)
    tl.store(dst + do + w, v.to(tl.int32, bitcast=True), mask=w < words)


def _types(word: int) -> tuple[tl.dtype, tl.dtype]:
    storage = {1: tl.uint8, 2: tl.uint16, 4: tl.uint32, 8: tl.uint64}[word]
    return storage, (tl.uint64 if word == 8 else tl.uint32)


def split_rows(raw: torch.Tensor, planes: torch.Tensor, stats: torch.Tensor, word: int, rotate: bool) -> None:
    """Split ``k`` equal frames into planes, gathering each row's statistics on the way.

    Args:
        raw: flat uint8 CUDA tensor of ``k * n`` bytes, 16-byte aligned.
        planes: uint8 CUDA tensor ``[k, word, stride]``; the first ``n // word`` bytes of
            each row are written.
        stats: int32 CUDA tensor ``[k * word, 258]``, zero but for column 0 (255): each
            row's minimum and maximum byte are folded into columns 0 and 1, and a byte
            histogram of a sample of its full blocks (1 in 8) added to columns 2..257.
        word: bytes per word (1, 2, 4 or 8).
        rotate: rotate float words left by one bit first.
    """
    k, _, stride = planes.shape
    m = raw.numel() // max(k, 1) // word
    if k == 0 or m == 0:
        return
    st, ut = _types(word)
    words = raw.view(_STORAGE[word]).view(k, m)
    for f0 in range(0, k, _MAX_Y):
        f1 = min(k, f0 + _MAX_Y)
        grid = (triton.cdiv(m, _BLOCK), f1 - f0)
        _split_kernel[grid](
            words[f0:f1],
            planes[f0:f1],
            stats[f0 * word : f1 * word],
            m,
            stride,
            word,
            st,
            ut,
            rotate and word > 1,
            _BLOCK,
            _SAMPLE_EVERY,
            STATS,
        )


def merge_rows(
    stored: torch.Tensor,
    decoded: torch.Tensor,
    offsets: torch.Tensor,
    sources: torch.Tensor,
    raw: torch.Tensor,
    word: int,
    rotate: bool,
) -> None:
    """Interleave ``k`` frames' plane rows, found in either of two buffers, into ``raw``.

    Args:
        stored: flat uint8 CUDA tensor holding rows stored raw (the payloads).
        decoded: flat uint8 CUDA tensor holding rows an nvCOMP codec decoded.
        offsets: int64 CUDA tensor ``[k * word]``: where row ``f * word + p`` starts in its
            buffer, in units of 16 bytes.
        sources: int64 CUDA tensor ``[k * word]``: ``STORED``, ``DECODED`` (from
            :mod:`ckptz.engines.gpu.transform`) or the
            row's byte (>= 0) when it is constant.
        raw: flat uint8 CUDA tensor of ``k * n`` bytes (16-byte aligned) to write.
        word: bytes per word.
        rotate: undo the left rotation of float words.
    """
    k = offsets.numel() // word
    m = raw.numel() // max(k, 1) // word
    st, ut = _types(word)
    out = raw.view(_STORAGE[word]).view(k, m)
    for f0 in range(0, k if m else 0, _MAX_Y):
        f1 = min(k, f0 + _MAX_Y)
        rows = slice(f0 * word, f1 * word)
        grid = (triton.cdiv(m, _BLOCK), f1 - f0)
        _merge_kernel[grid](
            stored,
            decoded,
            offsets[rows],
            sources[rows],
            out[f0:f1],
            m,
            word,
            st,
            ut,
            rotate and word > 1,
            _BLOCK,
            STORED,
            DECODED,
        )


def gather(
    src: torch.Tensor,
    src_offsets: torch.Tensor,
    sizes: torch.Tensor,
    dst: torch.Tensor,
    dst_offsets: torch.Tensor,
    padded: torch.Tensor,
    longest: int,
) -> None:
    """Copy ``sizes[c]`` bytes from ``src`` to ``dst``, zero-filled up to ``padded[c]`` bytes.

    Offsets are int64 CUDA tensors in units of 16 bytes (every range starts aligned);
    ``longest`` is the largest padded size.
    """
    count = sizes.numel()
    for c0 in range(0, count if longest else 0, _MAX_Y):
        c1 = min(count, c0 + _MAX_Y)
        grid = (triton.cdiv(longest // 4, _COPY_BLOCK), c1 - c0)
        part = slice(c0, c1)
        _gather_kernel[grid](
            src.view(torch.int32),
            src_offsets[part],
            sizes[part],
            dst.view(torch.int32),
            dst_offsets[part],
            padded[part],
            _COPY_BLOCK,
        )


__all__ = ["gather", "merge_rows", "split_rows"]
