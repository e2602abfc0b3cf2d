"""The table of bitstreams: every codec id ckptz has ever written, and who implements it.

A chunk's ``codec`` byte names a *bitstream* (docs/FORMAT.md, "Codec bitstreams"), not an
implementation: two implementations may share a row only if each decodes the other's
output (the CPU ``zstd`` and nvCOMP's Zstd with ``bitstream_kind=RAW`` do). Ids are never
reused, so a row stays here after ckptz stops writing its bitstream (``ctx``).

Everything else is derived from :data:`TABLE`: the ``id`` and ``name`` of each CPU codec
class, the registry in :mod:`ckptz.codecs`, the GPU coder's constants, the nvCOMP
algorithms, and the codecs the engines accept for ``--codec``. Tests hold the C
extension's ``CODEC_*`` enum and FORMAT.md's table against it.

Importing this module imports the CPU codecs (numpy, zstd, deflate), never torch or nvCOMP.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptz.codecs.base import Codec
from ckptz.codecs.bitpack import BitpackCodec
from ckptz.codecs.cpu import ConstCodec, RawCodec, ZstdCodec
from ckptz.codecs.ctx import CtxCodec
from ckptz.codecs.deflate import DeflateCodec
from ckptz.codecs.huffexp import HuffexpCodec
from ckptz.codecs.order1 import Order1Codec
from ckptz.codecs.order2d import Order2dCodec
from ckptz.codecs.sign2d import Sign2dCodec

#: ``Bitstream.gpu`` of bitstreams the GPU coder handles without nvCOMP (stored and
#: constant planes).
BUILTIN = "builtin"
#: ``Bitstream.gpu`` of bitstreams ckptz's own CUDA kernels decode
#: (:mod:`ckptz.engines.gpu.literals`).
KERNELS = "kernels"


@dataclass(frozen=True, slots=True)
class Bitstream:
    """One row of the table.

    Attributes:
        id: the byte stored in each chunk record (0-255); never reused.
        name: what users pass to ``--codec`` and see in reports.
        cpu: the CPU implementation (encoder and decoder), or None if only a GPU decodes it.
        gpu: how the GPU engine codes it: :data:`BUILTIN`, an nvCOMP algorithm (``"Zstd"``,
            ``"ANS"``), :data:`KERNELS` (decoded by ckptz's kernels; the GPU's literal coder
            writes it), or None (GPU machines decode it on their CPU).
    """

    id: int
    name: str
    cpu: type[Codec] | None
    gpu: str | None

    @property
    def portable(self) -> bool:
        """True if a CPU-only machine can decode this bitstream."""
        return self.cpu is not None

    @property
    def nvcomp(self) -> str | None:
        """The nvCOMP algorithm that codes this bitstream on a GPU, or None."""
        return None if self.gpu in (None, BUILTIN, KERNELS) else self.gpu


RAW = Bitstream(0, "raw", cpu=RawCodec, gpu=BUILTIN)
CONST = Bitstream(1, "const", cpu=ConstCodec, gpu=BUILTIN)
ZSTD = Bitstream(2, "zstd", cpu=ZstdCodec, gpu="Zstd")
ANS = Bitstream(3, "ans", cpu=None, gpu="ANS")
CTX = Bitstream(4, "ctx", cpu=CtxCodec, gpu=None)
DEFLATE = Bitstream(5, "deflate", cpu=DeflateCodec, gpu=None)
BITPACK = Bitstream(6, "bitpack", cpu=BitpackCodec, gpu=KERNELS)
HUFF1 = Bitstream(7, "huff1", cpu=Order1Codec, gpu=None)
HUFF2D = Bitstream(8, "huff2d", cpu=Order2dCodec, gpu=None)
SIGN2D = Bitstream(9, "sign2d", cpu=Sign2dCodec, gpu=None)
HUFFEXP = Bitstream(10, "huffexp", cpu=HuffexpCodec, gpu=None)

#: Every bitstream, by id.
TABLE: tuple[Bitstream, ...] = (RAW, CONST, ZSTD, ANS, CTX, DEFLATE, BITPACK, HUFF1, HUFF2D, SIGN2D, HUFFEXP)

#: What ``--codec`` may name besides ``auto``: the bitstreams the GPU coder tries on every
#: plane (through nvCOMP). The CPU coder chooses its own per plane, all of them portable.
CHOOSABLE: tuple[Bitstream, ...] = tuple(b for b in TABLE if b.nvcomp is not None)

_BY_ID = {b.id: b for b in TABLE}
_BY_NAME = {b.name: b for b in TABLE}
# A codec class learns its id and name from its row, so they are written once, here.
for _row in TABLE:
    if _row.cpu is not None:
        _row.cpu.id, _row.cpu.name = _row.id, _row.name
del _row


def by_id(codec_id: int) -> Bitstream | None:
    """The row of bitstream ``codec_id``, or None for an id ckptz has never written."""
    return _BY_ID.get(codec_id)


def by_name(name: str) -> Bitstream | None:
    """The row named ``name`` (e.g. ``zstd``), or None."""
    return _BY_NAME.get(name)


__all__ = [
    "ANS",
    "BITPACK",
    "BUILTIN",
    "CHOOSABLE",
    "CONST",
    "CTX",
    "DEFLATE",
    "HUFF1",
    "HUFF2D",
    "HUFFEXP",
    "KERNELS",
    "RAW",
    "SIGN2D",
    "TABLE",
    "ZSTD",
    "Bitstream",
    "by_id",
    "by_name",
]
