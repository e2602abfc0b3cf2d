"""The one seam where a frame's bytes change before coding and change back after decoding.

A :class:`FrameTransform` sits between the pipeline's frame buffers and the engine: on
compression, :meth:`~FrameTransform.forward` gives the bytes the engine codes (and whose
checksum the frame table records); on restore, :meth:`~FrameTransform.backward` turns a
decoded, checked frame back into the original bytes. The engines never know. The only
transform today is a series delta (:mod:`ckptz.series.delta`): XOR with the same tensor of a
newer checkpoint, which :mod:`ckptz.series` registers in :mod:`ckptz.extensions` (so the
pipeline does not import what is built on it). The whole-file digest is always of the
original bytes.

The native planes apply a transform themselves where it describes itself as a
:class:`NativeDelta` (:meth:`FrameTransform.native`): paired ranges of the file coded against
a reference, which the planes read without calling back into Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

from ckptz.errors import ContainerError
from ckptz.extensions import transform_opener

if TYPE_CHECKING:
    import numpy as np

    from ckptz.container import Index
    from ckptz.pipeline.plan import Frame


@dataclass(frozen=True, slots=True)
class NativeDelta:
    """A transform as the native planes apply it (``ckptz/native_src/delta_plane.c``).

    Attributes:
        ranges: int64 rows (start, end, counterpart offset in the reference, delta kind,
            scale, word size, mantissa bits) of every paired range of the original file, in
            file order; no rows for a transform that changes no byte.
        reference_size: the reference's original size.
        reference_fd: the plain reference file, open for reading (-1: a container).
        container: the reference container's frame decoder
            (:class:`~ckptz.pipeline.decoder.FrameDecoder`, which imports this module), where
            it is one (with its own transform, if it is a series delta too).
    """

    ranges: np.ndarray
    reference_size: int = 0
    reference_fd: int = -1
    container: object | None = None


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

    def native(self) -> NativeDelta | None:
        """The transform as the native planes apply it; None where they cannot (the Python
        pipeline applies it then)."""
        ...


def transformed(header: dict[str, object]) -> bool:
    """Whether a container's frames were coded through a transform (a series delta), known
    from its header alone, whether or not the transform's module is imported."""
    return transform_opener(header) is not None or "reference" in header


def transform_for(index: Index, fd: int, path: str) -> FrameTransform | None:
    """The transform a container's frames were coded through, or None (most containers).

    Raises:
        MissingReferenceError: the container's reference cannot be found or has changed.
    """
    opener = transform_opener(index.header)
    if opener is not None:
        return cast(FrameTransform, opener(index, fd, path))
    if "reference" in index.header:  # a series delta, with ckptz.series not imported
        raise ContainerError("coded against a reference this ckptz cannot read", path=path)
    return None


__all__ = ["FrameTransform", "NativeDelta", "transform_for", "transformed"]
