"""Codec registry, keyed by bitstream id: lookups over :data:`ckptz.codecs.table.TABLE`.

The GPU implementations (nvCOMP) are named by the same table and live in
:mod:`ckptz.engines.gpu.nvcomp_codecs`, so nothing here imports torch or nvCOMP.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ckptz.codecs.base import Codec
from ckptz.codecs.table import TABLE, Bitstream, by_id
from ckptz.errors import CodecUnavailableError

#: Names of every bitstream ckptz has ever written, so a container can name codecs
#: this machine cannot run.
BITSTREAMS: Mapping[int, str] = MappingProxyType({b.id: b.name for b in TABLE})

#: Bitstreams that a CPU-only machine can decode.
PORTABLE: frozenset[int] = frozenset(b.id for b in TABLE if b.portable)

_CPU: dict[int, Codec] = {b.id: b.cpu() for b in TABLE if b.cpu is not None}


def cpu_codec(codec_id: int) -> Codec:
    """Return the CPU implementation of bitstream ``codec_id``.

    Raises:
        CodecUnavailableError: the bitstream has no CPU decoder (e.g. nvCOMP ANS).
    """
    codec = _CPU.get(codec_id)
    if codec is None:
        raise CodecUnavailableError(
            "this bitstream has no CPU decoder",
            codec=codec_name(codec_id),
            hint="decode on a GPU machine with `pip install ckptz[gpu]` and `--device cuda`",
        )
    return codec


def codec_name(codec_id: int) -> str:
    """Human name of a bitstream id, also for ids this build does not implement."""
    row = by_id(codec_id)
    return f"#{codec_id}" if row is None else row.name


__all__ = ["BITSTREAMS", "PORTABLE", "TABLE", "Bitstream", "Codec", "codec_name", "cpu_codec"]
