"""xxh3_64 (seed 0): the checksum of every frame and payload and each leaf of the whole-file
digest (docs/FORMAT.md), computed without holding the GIL.

The python ``xxhash`` binding holds the GIL in its one-shot functions, so with many
pipeline threads every checksum ran one at a time (on the H100 host that capped restores
near 5 GB/s). The C extension's copy of xxHash (``ckptz/native_src/hash.c``) releases it,
and hashes many ranges of one buffer in one call; where the extension is not built (or
``CKPTZ_NO_NATIVE=1``), python ``xxhash`` computes the same values.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

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


def xxh3_64_each(parts: Sequence[Buffer]) -> list[int]:
    """xxh3_64, seed 0, of each of ``parts``: one call that releases the GIL once."""
    if native is not None:
        return native.xxh3_64_each(parts)
    return [xxhash.xxh3_64_intdigest(_view(p)) for p in parts]


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


class Streams:
    """xxh3_64 (seed 0) of inputs given in parts over several calls, one *state* each, from
    any thread (a digest leaf whose parts lie in frames that arrive at different times).

    :meth:`update` streams parts into states and returns the hash of all streamed into each
    so far, releasing the GIL once for them all (taking it back, among a pipeline's threads,
    costs more than hashing a leaf); :meth:`give` frees a state. With the
    C extension the states are rows of tables that never move; without it, python
    ``xxhash`` objects.
    """

    _ROWS = 256  # states per table

    def __init__(self) -> None:
        self._tables: list[np.ndarray] = []  # with the C extension
        self._made = 0  # states made so far
        self._free: list[int] = []
        self._python: dict[int, xxhash.xxh3_64] = {}
        self._lock = threading.Lock()

    def take(self) -> int:
        """A free state (reset by the first :meth:`update`)."""
        with self._lock:
            if not self._free:
                if native is not None:
                    self._tables.append(np.zeros((self._ROWS, native.xxh3_state_bytes), np.uint8))
                self._free.extend(range(self._made + self._ROWS - 1, self._made - 1, -1))
                self._made += self._ROWS
            return self._free.pop()

    def update(self, jobs: Sequence[tuple[int, Sequence[Buffer], bool]]) -> list[int]:
        """For each ``(state, parts, first)``: stream ``parts`` into ``state`` (afresh if
        ``first``). Each state's hash so far, all in one call."""
        if native is not None:
            rows = self._ROWS
            return list(
                native.xxh3_64_streams(
                    [
                        (self._tables[s // rows], s % rows, first, [_view(p) for p in parts])
                        for s, parts, first in jobs
                    ]
                )
            )
        out = []
        for state, parts, first in jobs:
            if first:
                self._python[state] = xxhash.xxh3_64()
            hasher = self._python[state]
            for p in parts:
                hasher.update(_view(p))
            out.append(hasher.intdigest())
        return out

    def give(self, state: int) -> None:
        """``state`` is free again."""
        with self._lock:
            self._python.pop(state, None)
            self._free.append(state)


__all__ = ["Streams", "xxh3_64", "xxh3_64_each", "xxh3_64_ranges"]
