"""xxh3_64 (seed 0): the checksum of every frame and payload and each leaf of the whole-file
digest (docs/FORMAT.md), computed without holding the GIL.

The python ``xxhash`` binding holds the GIL in its one-shot functions, so with many
pipeline threads every checksum would run one at a time. The C extension's copy of xxHash
(``ckptz/native_src/hash.c``) releases it, and hashes many ranges of one buffer in one call.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from ckptz.codecs.native import native

Buffer = bytes | bytearray | memoryview | np.ndarray


def _view(data: Buffer) -> bytes | bytearray | memoryview:
    return data.data if isinstance(data, np.ndarray) else data


def xxh3_64(data: Buffer) -> int:
    """xxh3_64, seed 0, of ``data``."""
    return int(native.xxh3_64(_view(data)))


def xxh3_64_each(parts: Sequence[Buffer]) -> list[int]:
    """xxh3_64, seed 0, of each of ``parts``: one call that releases the GIL once."""
    return native.xxh3_64_each(parts)


def xxh3_64_ranges(data: Buffer, offsets: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """xxh3_64 of each range ``[offsets[i], offsets[i] + sizes[i])`` of ``data``, as uint64.

    Raises:
        ValueError: a range lies outside ``data``.
    """
    offsets = np.ascontiguousarray(offsets, np.int64)
    sizes = np.ascontiguousarray(sizes, np.int64)
    out = np.zeros(offsets.size, np.uint64)
    native.xxh3_64_ranges(_view(data), offsets, sizes, out)
    return out


def xxh3_64_nested(
    data: Buffer, offsets: np.ndarray, sizes: np.ndarray, inner_offsets: np.ndarray, inner_sizes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`xxh3_64_ranges` of ranges of ``data`` and of *inner* ranges, most of which lie
    inside them (a run's frames and the digest leaves inside them), as two uint64 arrays.

    An inner range inside a range is hashed and then streamed into that
    range's hash while its bytes are in the core's cache: the bytes are read from memory
    once, not twice (a pass over every byte that 16 threads share memory for). Each list's
    ranges must not overlap one another; they may come in any order.

    Raises:
        ValueError: a range lies outside ``data``, or two of one list overlap.
    """
    offsets, sizes = np.ascontiguousarray(offsets, np.int64), np.ascontiguousarray(sizes, np.int64)
    inner_offsets = np.ascontiguousarray(inner_offsets, np.int64)
    inner_sizes = np.ascontiguousarray(inner_sizes, np.int64)
    order, inner_order = np.argsort(offsets, kind="stable"), np.argsort(inner_offsets, kind="stable")
    out, inner_out = np.zeros(offsets.size, np.uint64), np.zeros(inner_offsets.size, np.uint64)
    got, inner_got = np.zeros_like(out), np.zeros_like(inner_out)
    native.xxh3_64_nested(
        _view(data),
        offsets[order],
        sizes[order],
        got,
        inner_offsets[inner_order],
        inner_sizes[inner_order],
        inner_got,
    )
    out[order], inner_out[inner_order] = got, inner_got
    return out, inner_out


class Streams:
    """xxh3_64 (seed 0) of inputs given in parts over several calls, one *state* each, from
    any thread (a digest leaf whose parts lie in frames that arrive at different times).

    :meth:`update` streams parts into states and returns the hash of all streamed into each
    so far, releasing the GIL once for them all (taking it back, among a pipeline's threads,
    costs more than hashing a leaf); :meth:`give` frees a state. The states are rows of
    tables that never move.
    """

    _ROWS = 256  # states per table

    def __init__(self) -> None:
        self._tables: list[np.ndarray] = []
        self._made = 0  # states made so far
        self._free: list[int] = []
        self._lock = threading.Lock()

    def take(self) -> int:
        """A free state (reset by the first :meth:`update`)."""
        with self._lock:
            if not self._free:
                self._tables.append(np.zeros((self._ROWS, native.xxh3_state_bytes), np.uint8))
                self._free.extend(range(self._made + self._ROWS - 1, self._made - 1, -1))
                self._made += self._ROWS
            return self._free.pop()

    def update(self, jobs: Sequence[tuple[int, Sequence[Buffer], bool]]) -> list[int]:
        """For each ``(state, parts, first)``: stream ``parts`` into ``state`` (afresh if
        ``first``). Each state's hash so far, all in one call."""
        rows = self._ROWS
        return list(
            native.xxh3_64_streams(
                [
                    (self._tables[s // rows], s % rows, first, [_view(p) for p in parts])
                    for s, parts, first in jobs
                ]
            )
        )

    def give(self, state: int) -> None:
        """``state`` is free again."""
        with self._lock:
            self._free.append(state)


__all__ = ["Streams", "xxh3_64", "xxh3_64_each", "xxh3_64_nested", "xxh3_64_ranges"]
