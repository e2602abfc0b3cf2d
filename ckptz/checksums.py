"""xxh3_64 (seed 0): the checksum of every frame and payload and each leaf of the whole-file
digest (docs/FORMAT.md), computed without holding the GIL.

The python ``xxhash`` binding holds the GIL in its one-shot functions, so with many
pipeline threads every checksum ran one at a time (on the H100 host that capped restores
near 5 GB/s). The C extension's copy of xxHash (``ckptz/native_src/hash.c``) releases it,
and hashes many ranges of one buffer in one call; where the extension is not built (or
``CKPTZ_NO_NATIVE=1``), python ``xxhash`` computes the same values.
"""

from __future__ import annotations

import numpy as np
import xxhash

from ckptz.codecs.native import native

Buffer = bytes | bytearray | memoryview | np.ndarray


def _view(data: Buffer) -> bytes | bytearray | memoryview:
    return data.data if isinstance(data, np.ndarray) else data


def xxh3_64(data: Buffer) -> int:
    """xxh3_64, seed 0, of ``data``."""
    if native is not None:
        return int(native.xxh3_64(_view(data)))
    return xxhash.xxh3_64_intdigest(_view(data))


def xxh3_64_ranges(data: Buffer, offsets: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """xxh3_64 of each range ``[offsets[i], offsets[i] + sizes[i])`` of ``data``, as uint64.

    Raises:
        ValueError: a range lies outside ``data``.
    """
    offsets = np.ascontiguousarray(offsets, np.int64)
    sizes = np.ascontiguousarray(sizes, np.int64)
    out = np.zeros(offsets.size, np.uint64)
    view = _view(data)
    if native is not None:
        native.xxh3_64_ranges(view, offsets, sizes, out)
        return out
    flat = memoryview(view).cast("B")
    for i, (at, n) in enumerate(zip(offsets.tolist(), sizes.tolist(), strict=True)):
        if at < 0 or n < 0 or at + n > len(flat):
            raise ValueError(f"xxh3_64_ranges: range {i} ({at}, {n}) outside {len(flat)} bytes")
        out[i] = xxhash.xxh3_64_intdigest(flat[at : at + n])
    return out


__all__ = ["xxh3_64", "xxh3_64_ranges"]
