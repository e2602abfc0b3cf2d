"""The dtype-aware transform on the GPU, byte for byte the CPU's (:mod:`ckptz.codecs.planes`).

Frames of one shape are transformed together: ``k`` frames of ``n`` bytes in one flat
uint8 tensor become a ``[k, word, stride]`` planes tensor whose row ``[f, p, :n // word]``
is plane ``p`` of frame ``f`` (plane 0 = lowest byte). ``stride`` is ``n // word`` rounded
up to 16 bytes, because nvCOMP's ANS wants every chunk 16-byte aligned.

Torch has no unsigned 16/32/64-bit shifts on CUDA in every version, so the rotation runs on
the signed type of the same width and masks away the sign extension.
"""

from __future__ import annotations

import torch

ALIGN = 16
#: Where :func:`merge_rows` finds a plane row: among the stored payloads, among the decoded
#: planes, or (any value >= 0) nowhere, the row being that byte repeated.
STORED = -1
DECODED = -2
#: int32 columns per plane row of :func:`split_rows`' statistics: min, max, 256 byte counts.
STATS = 258
#: The byte histogram in a row's statistics counts every ``SAMPLE_EVERY``-th full block of
#: ``SAMPLE_BLOCK`` bytes (1/8 of the row), the same sample on either implementation, so
#: the coder decides alike (and writes the same container) whichever ran.
SAMPLE_BLOCK = 4096
SAMPLE_EVERY = 8

_SIGNED = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def aligned(n: int) -> int:
    """``n`` rounded up to a multiple of :data:`ALIGN`."""
    return n + (-n % ALIGN)


def _rotl1(words: torch.Tensor, bits: int) -> torch.Tensor:
    # (x << 1) | (x >>> (bits - 1)); the arithmetic shift leaves 0 or -1, hence the mask.
    return (words << 1) | ((words >> (bits - 1)) & 1)


def _rotr1(words: torch.Tensor, bits: int) -> torch.Tensor:
    low = (1 << (bits - 1)) - 1
    return ((words >> 1) & low) | (words << (bits - 1))


def split_into(raw: torch.Tensor, planes: torch.Tensor, word: int, rotate: bool) -> None:
    """Transform ``k`` equal frames into byte planes.

    Args:
        raw: flat uint8 CUDA tensor of ``k * n`` bytes (``n`` a multiple of ``word``).
        planes: uint8 tensor ``[k, word, stride]`` with ``stride >= n // word``; the first
            ``n // word`` bytes of each row are written, the padding is left alone.
        word: bytes per transform word (1, 2, 4 or 8).
        rotate: rotate float words left by one bit first (sign to the bottom).
    """
    k, w, _ = planes.shape
    m = raw.numel() // max(k, 1) // word
    if w != word or k * m * word != raw.numel():
        raise ValueError("planes tensor does not match the frames")
    if word == 1:
        planes[:, 0, :m].copy_(raw.view(k, m))
        return
    src = raw
    if rotate:
        src = _rotl1(raw.view(_SIGNED[word]), word * 8).view(torch.uint8)
    planes[:, :, :m].copy_(src.view(k, m, word).permute(0, 2, 1))


def merge_from(planes: torch.Tensor, raw: torch.Tensor, word: int, rotate: bool) -> None:
    """Inverse of :func:`split_into`: interleave planes back into ``raw`` and undo the rotation."""
    k, w, _ = planes.shape
    m = raw.numel() // max(k, 1) // word
    if w != word or k * m * word != raw.numel():
        raise ValueError("planes tensor does not match the frames")
    if word == 1:
        raw.view(k, m).copy_(planes[:, 0, :m])
        return
    raw.view(k, m, word).copy_(planes[:, :, :m].permute(0, 2, 1))
    if rotate:
        words = raw.view(_SIGNED[word])
        words.copy_(_rotr1(words, word * 8))


# -- the coder's three primitives, in torch (CPU tensors; CUDA where the kernels cannot load)
# :mod:`ckptz.engines.gpu.kernels` has the same functions, each in one CUDA kernel.


def split_rows(raw: torch.Tensor, planes: torch.Tensor, stats: torch.Tensor, word: int, rotate: bool) -> None:
    """Split ``k`` equal frames into ``planes`` ``[k, word, stride]`` and write each row's
    minimum and maximum byte and sampled byte histogram into ``stats``
    ``[k * word, STATS]`` (see ``kernels.split_rows``)."""
    k, _, _ = planes.shape
    m = raw.numel() // max(k, 1) // word
    if k == 0 or m == 0:
        return
    split_into(raw, planes, word, rotate)
    rows = planes[:, :, :m].reshape(k * word, m)
    stats[:, 0] = rows.amin(dim=-1)
    stats[:, 1] = rows.amax(dim=-1)
    # The kernel's sample: every SAMPLE_EVERY-th full block of BLOCK bytes of each row.
    full = m // SAMPLE_BLOCK
    sample = rows[:, : full * SAMPLE_BLOCK].reshape(k * word, full, SAMPLE_BLOCK)[:, ::SAMPLE_EVERY]
    for r in range(k * word):
        stats[r, 2:] = torch.bincount(sample[r].reshape(-1), minlength=256)


def merge_rows(
    stored: torch.Tensor,
    decoded: torch.Tensor,
    offsets: torch.Tensor,
    sources: torch.Tensor,
    raw: torch.Tensor,
    word: int,
    rotate: bool,
) -> None:
    """Interleave plane rows found in ``stored``, ``decoded`` or ``sources`` into ``raw``
    (offsets in units of 16 bytes; see ``kernels.merge_rows``)."""
    k = offsets.numel() // word
    m = raw.numel() // max(k, 1) // word
    if k == 0 or m == 0:
        return
    planes = torch.empty((k, word, m), dtype=torch.uint8, device=raw.device)
    flat = planes.view(k * word, m)
    for r, (off, src) in enumerate(zip(offsets.tolist(), sources.tolist(), strict=True)):
        if src >= 0:
            flat[r].fill_(src)
        else:
            buf = stored if src == STORED else decoded
            flat[r].copy_(buf[off * ALIGN : off * ALIGN + m])
    merge_from(planes, raw, word, rotate)


def gather(
    src: torch.Tensor,
    src_offsets: torch.Tensor,
    sizes: torch.Tensor,
    dst: torch.Tensor,
    dst_offsets: torch.Tensor,
    padded: torch.Tensor,
    longest: int,
) -> None:
    """Copy byte ranges of ``src`` into ``dst``, each zero-filled to its padded size
    (offsets in units of 16 bytes; see ``kernels.gather``)."""
    rows = zip(src_offsets.tolist(), sizes.tolist(), dst_offsets.tolist(), padded.tolist(), strict=True)
    for so, n, do, pad in rows:
        so, do = so * ALIGN, do * ALIGN
        dst[do : do + n].copy_(src[so : so + n])
        dst[do + n : do + pad].zero_()


__all__ = [
    "ALIGN",
    "DECODED",
    "STATS",
    "STORED",
    "aligned",
    "gather",
    "merge_from",
    "merge_rows",
    "split_into",
    "split_rows",
]
