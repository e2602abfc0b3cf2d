"""The one seam where a frame's bytes change before coding and change back after decoding.

A :class:`FrameTransform` sits between the pipeline's frame buffers and the engine: on
compression, :meth:`~FrameTransform.forward` gives the bytes the engine codes (and whose
checksum the frame table records); on restore, :meth:`~FrameTransform.backward` turns a
decoded, checked frame back into the original bytes. The engines never know. The only
transform today is a series delta (:mod:`ckptz.series.delta`): XOR with the same tensor of a
newer checkpoint. The whole-file digest is always of the original bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from ckptz.container import Index
    from ckptz.pipeline.plan import Frame


class FrameTransform(Protocol):
    """Changes frame bytes around the engine; ``backward(forward(x)) == x`` for every frame.

    Attributes:
        apart: indices of the segments the transform changes (planned into streams of
            their own, since their bytes have other statistics).
    """

    apart: frozenset[int]

    def forward(self, frame: Frame, data: np.ndarray) -> np.ndarray:
        """The bytes to code for ``frame`` (``data`` is its original bytes; never modified)."""
        ...

    def backward(self, frame: Frame, data: np.ndarray) -> np.ndarray:
        """The original bytes of ``frame`` from its decoded bytes (may reuse ``data``)."""
        ...

    def header(self) -> dict[str, object]:
        """Fields the container's JSON header gets, so a reader can undo the transform."""
        ...


def transform_for(index: Index, fd: int, path: str) -> FrameTransform | None:
    """The transform a container's frames were coded through, or None (most containers).

    Raises:
        MissingReferenceError: the container's reference cannot be found or has changed.
    """
    if "reference" not in index.header:
        return None
    from ckptz.series.delta import open_delta

    return open_delta(index, fd, path)


__all__ = ["FrameTransform", "transform_for"]
