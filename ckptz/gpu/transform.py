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


def constant_rows(planes: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which plane rows hold one repeated byte, and that byte (both ``[k, word]``, on the GPU)."""
    rows = planes[:, :, :m]
    first = rows[:, :, :1]
    return (rows == first).all(dim=-1), first[:, :, 0]


__all__ = ["ALIGN", "aligned", "constant_rows", "merge_from", "split_into"]
