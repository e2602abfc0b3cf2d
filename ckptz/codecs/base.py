"""The codec contract.

A codec turns one chunk of bytes into a self-contained payload and back. Its ``id`` names
a *bitstream*, not an implementation: two classes may share an id only if each decodes
the other's output (the CPU ``zstd`` and nvCOMP's Zstd with ``bitstream_kind=RAW`` do).
Ids and names are written once, in :mod:`ckptz.codecs.table`, which sets them on each class.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np


class Codec(ABC):
    """One bitstream's encoder/decoder on the CPU.

    Attributes:
        id: the bitstream id stored in each chunk record (0-255), from the class's row of
            :data:`ckptz.codecs.table.TABLE`.
        name: the bitstream's name in reports and errors, from the same row.
        needs_top_plane: the bitstream codes a lower plane of a frame given the frame's top
            plane (``huffexp``): its plane-only :meth:`encode` and :meth:`decode` refuse, and
            frame coders call its own methods that take the top plane.
    """

    id: ClassVar[int]
    name: ClassVar[str]
    needs_top_plane: ClassVar[bool] = False

    @abstractmethod
    def encode(self, data: np.ndarray) -> bytes:
        """Encode a 1-D uint8 array; the result may be larger than the input."""

    @abstractmethod
    def decode(self, payload: bytes | memoryview, size: int) -> np.ndarray:
        """Decode ``payload`` into a new 1-D uint8 array of exactly ``size`` bytes.

        Raises:
            CodecError: the payload is malformed or decodes to another size.
        """

    def decode_into(self, payload: bytes | memoryview, size: int, out: np.ndarray | None) -> np.ndarray:
        """Decode like :meth:`decode`, into ``out`` (``size`` bytes) where this codec can.

        Returns the array that holds the bytes: ``out``, or a new one (the default, and
        always when ``out`` is None).
        """
        return self.decode(payload, size)
