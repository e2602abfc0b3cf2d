"""Damaged payloads for the decoders' fuzz tests: one drawn way of breaking a payload, and
the check that a C decoder given it stays inside its output buffer."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from hypothesis import strategies as st


def damage(data: st.DataObject, payload: bytes, ways: list[str], header: int = 200) -> tuple[str, bytes]:
    """``payload`` broken one way drawn from ``ways``: a zeroed 4-byte ``width``, 1-4 bytes
    flipped in the first ``header`` bytes (``header``) or anywhere (``flip``), a ``cut`` at
    a drawn offset, or 1-16 zero bytes appended (``extend``). Returns the way and the bytes."""
    out = bytearray(payload)
    how = data.draw(st.sampled_from(ways))
    if how == "width":
        out[:4] = bytes(4)
    elif how in ("header", "flip"):
        span = min(len(out), header) if how == "header" else len(out)
        for _ in range(data.draw(st.integers(1, 4))):
            out[data.draw(st.integers(0, span - 1))] ^= data.draw(st.integers(1, 255))
    elif how == "cut":
        del out[data.draw(st.integers(0, len(out) - 1)) :]
    else:
        out += bytes(data.draw(st.integers(1, 16)))
    return how, bytes(out)


def decodes_in_bounds(decode: Callable[[bytes, np.ndarray], object], payload: bytes, size: int) -> bool:
    """What the C decoder ``decode`` returns for ``payload`` into ``size`` bytes, asserting
    that it returned a bool and wrote nothing in the guard bytes either side of its buffer."""
    guarded = np.full(size + 64, 0xA5, np.uint8)
    result = decode(payload, guarded[32 : 32 + size])
    assert isinstance(result, bool)
    assert (guarded[:32] == 0xA5).all() and (guarded[32 + size :] == 0xA5).all()
    return result
