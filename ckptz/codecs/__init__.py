"""Codec registry, keyed by bitstream id.

CPU implementations register here at import; GPU ones (nvCOMP) register from
:mod:`ckptz.codecs.nvcomp` when that module is imported, so nothing here imports nvCOMP.
"""

from __future__ import annotations

from ckptz.codecs.base import Codec
from ckptz.codecs.bitpack import BitpackCodec
from ckptz.codecs.cpu import ConstCodec, RawCodec, ZstdCodec
from ckptz.codecs.ctx import CtxCodec
from ckptz.codecs.deflate import DeflateCodec
from ckptz.errors import CodecUnavailableError

#: Names of every bitstream ckptz has ever written, so a container can name codecs
#: this machine cannot run. Never reuse an id.
BITSTREAMS: dict[int, str] = {0: "raw", 1: "const", 2: "zstd", 3: "ans", 4: "ctx", 5: "deflate", 6: "bitpack"}

#: Bitstreams that a CPU-only machine can decode.
PORTABLE: frozenset[int] = frozenset({0, 1, 2, 4, 5, 6})

_CPU: dict[int, Codec] = {c.id: c for c in (RawCodec(), ConstCodec(), ZstdCodec())}


def register_cpu(codec: Codec) -> None:
    """Add a CPU implementation (used by codec modules that extend the set)."""
    _CPU[codec.id] = codec
    BITSTREAMS.setdefault(codec.id, codec.name)


def cpu_codec(codec_id: int) -> Codec:
    """Return the CPU implementation of bitstream ``codec_id``.

    Raises:
        CodecUnavailableError: the bitstream has no CPU decoder (e.g. nvCOMP ANS).
    """
    codec = _CPU.get(codec_id)
    if codec is None:
        name = BITSTREAMS.get(codec_id, f"#{codec_id}")
        raise CodecUnavailableError(
            "this bitstream has no CPU decoder",
            codec=name,
            hint="decode on a GPU machine with `pip install ckptz[gpu]` and `--device cuda`",
        )
    return codec


def codec_name(codec_id: int) -> str:
    """Human name of a bitstream id, also for ids this build does not implement."""
    return BITSTREAMS.get(codec_id, f"#{codec_id}")


register_cpu(CtxCodec())
register_cpu(DeflateCodec())
register_cpu(BitpackCodec())

__all__ = ["BITSTREAMS", "PORTABLE", "Codec", "codec_name", "cpu_codec", "register_cpu"]
