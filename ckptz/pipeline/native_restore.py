"""Restoring one file on the CPU in one native call: Python plans, C moves the bytes.

:func:`plan` turns a container's index into three int64 tables (frames, their chunks, and
their pieces in the original file); :func:`run` hands them to the C extension's
``restore_plan``, which reads, checks, decodes, checks again, writes (or compares) and
hashes the digest's leaves on its own threads without the GIL (``ckptz/native_src/plane.c``).
Progress crosses back as a counter polled here; Ctrl-C and SIGTERM (which raise in this,
the main, thread) cross as a stop flag its threads check between frames. The whole-file
digest is combined here from the leaf hashes and compared by the caller, as on every path.

With a :class:`Gpu`, the same call decodes the chunks of nvCOMP's bitstreams on that GPU
(``ckptz/native_src/plane_gpu.c``, ``gpu_engine.c``): the native threads read batches of
frames into pinned memory, a GPU worker thread decodes each batch's chunks with nvCOMP, and
the threads finish every frame exactly as on the CPU.

A series delta's frames are undone in the plane too, against the reference that the
delta's :class:`~ckptz.pipeline.transform.NativeDelta` names (:func:`for_plane`): a plain
file it reads, or a container whose frames it decodes itself from the plan this module makes
of it (and undoes that container's own delta, where it is one, against its reference in
turn). A GPU and a reference the plane cannot restore leave such a file to the Python loop.

A failing frame is decoded once more by :class:`~ckptz.pipeline.decoder.FrameDecoder`, so
that its error reads exactly as the Python loop words it; a frame the native plane cannot
decode but Python can (a bitstream it lacks) sends the file back to that loop.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np

from ckptz import safeio
from ckptz.codecs.native import native
from ckptz.codecs.table import ANS, BITPACK, CONST, DEFLATE, HUFF1, HUFF2D, HUFFEXP, RAW, SIGN2D, ZSTD
from ckptz.container import Index
from ckptz.digest import Digest, Piecewise, leaf_count
from ckptz.errors import CorruptionError, DeviceError
from ckptz.pipeline.decoder import FrameDecoder
from ckptz.pipeline.native_call import DELTA_FAILURES, MAX_LEAVES, Gpu, GpuTotals, call_polled
from ckptz.pipeline.transform import FrameTransform, transformed

#: Bitstreams the native plane decodes (a zstd frame with LZ sequences through the system's
#: libzstd, and older containers' deflate through its zlib, where they are found; else the
#: file goes back to the Python loop).
NATIVE_CODECS = frozenset(
    {RAW.id, CONST.id, ZSTD.id, DEFLATE.id, BITPACK.id, HUFF1.id, HUFF2D.id, SIGN2D.id, HUFFEXP.id}
)
#: Bitstreams the native plane decodes with a GPU: the GPU-only ``ans`` besides.
NATIVE_GPU_CODECS = NATIVE_CODECS | {ANS.id}
#: Bytes of the file restored at once where they must come in file order: large against a
#: frame's reach in the file, so that few frames are decoded twice.
WINDOW = 256 << 20

_NO_MEMORY = np.empty(0, np.uint8)


# Failure kinds, as plane.c numbers them.
_TRUNCATED, _PADDING, _PAYLOAD, _DECODE, _FRAME = 1, 2, 3, 4, 5
_READ, _WRITE, _DIFFERS, _STOPPED, _NOMEM, _CHECK_READ, _GPU = 6, 7, 8, 9, 10, 11, 12


_DECODED = GpuTotals()


def gpu_totals() -> tuple[int, int, int]:
    """(batches, chunks, payload bytes) the native plane has decoded on a GPU in this process."""
    return _DECODED.get()


@dataclass(frozen=True, slots=True)
class Plan:
    """One file's restore as the native plane takes it: C-contiguous int64 tables.

    Attributes:
        frames: per frame: first chunk, chunk count (its word), rotate, length, checksum
            (the u64's bits), first piece, piece count.
        chunks: per chunk: container offset, payload size, codec, plane size, checksum.
        pieces: per piece: file offset, offset in its frame, bytes.
    """

    frames: np.ndarray
    chunks: np.ndarray
    pieces: np.ndarray
    #: The series delta to undo, as the plane's ``delta`` argument (:func:`for_plane`).
    delta: tuple[object, ...] | None = None


@dataclass(frozen=True, slots=True)
class PlaneDelta:
    """A transform as the native planes take it: their ``delta`` argument (None: it changes
    no byte, and the planes code and restore the file as any other)."""

    argument: tuple[object, ...] | None


def for_plane(change: FrameTransform | None) -> PlaneDelta | None:
    """``change`` as the native planes apply it, its reference container (if it has one)
    planned, and that container's own delta (if it is one) in turn; None where they cannot
    (the Python pipeline applies it): a transform that does not describe itself to them, or
    a reference container the plane cannot restore (:func:`plan`: bitstreams it does not
    decode). The references stay ``change``'s to close."""
    if change is None:
        return PlaneDelta(None)
    delta = change.native()
    if delta is None:
        return None
    ranges = np.ascontiguousarray(delta.ranges, np.int64)
    if not len(ranges):
        return PlaneDelta(None)
    if delta.container is None:
        none = np.zeros(0, np.int64)
        return PlaneDelta(
            (ranges, delta.reference_size, delta.reference_fd, -1, none, none, none, none, None)
        )
    container = cast(FrameDecoder, delta.container)
    tables = plan(container)  # with the reference's own delta, where it is one
    if tables is None:
        return None
    # The reference's pieces by file offset, where the plane looks up a counterpart's bytes.
    owner = np.repeat(np.arange(len(tables.frames), dtype=np.int64), tables.frames[:, 6])
    rows = np.column_stack([tables.pieces[:, 0], owner, tables.pieces[:, 1], tables.pieces[:, 2]])
    rows = rows[rows[:, 3] > 0]
    lookup = np.ascontiguousarray(rows[np.argsort(rows[:, 0], kind="stable")], np.int64)
    fd = container.fd
    argument = (
        ranges,
        delta.reference_size,
        -1,
        fd,
        tables.frames,
        tables.chunks,
        tables.pieces,
        lookup,
        tables.delta,
    )
    return PlaneDelta(argument)


def suits(index: Index, gpu: bool = False) -> bool:
    """Whether the native plane may restore a container, from its index alone: a series
    delta only on the CPU, a tree digest with a bounded number of leaves, only bitstreams it
    decodes (with a GPU where ``gpu`` is set)."""
    kind = index.source_digest.kind
    if transformed(index.header) and gpu:
        return False
    if kind.tree and leaf_count(index.source_size, kind.leaf) > MAX_LEAVES:
        return False
    codecs = index.chunks["codec"]
    return not len(codecs) or set(np.unique(codecs).tolist()) <= (NATIVE_GPU_CODECS if gpu else NATIVE_CODECS)


def plan(decoder: FrameDecoder, gpu: bool = False) -> Plan | None:
    """The tables for every frame of ``decoder``'s container; None where the native plane
    cannot restore it (as :func:`suits` says, or an index whose frames do not add up, which
    the Python loop reports)."""
    index = decoder.index
    if not suits(index, gpu):
        return None
    delta = for_plane(decoder.transform)
    if delta is None:
        return None
    chunks = index.chunks
    frames = decoder.frames
    rows, first, counts, lengths = decoder.layout()
    if (rows < 0).any():
        return None
    streams = index.streams
    words = np.array([max(streams[f.stream].word, 1) for f in frames], np.int64)
    if not np.array_equal(counts, words):
        return None  # a frame whose chunks do not match its word: the Python loop words it
    rotate = np.array([streams[f.stream].rotate for f in frames], np.int64)
    piece_counts = np.array([len(f.pieces) for f in frames], np.int64)
    first_piece = np.concatenate([[0], np.cumsum(piece_counts)[:-1]]) if frames else piece_counts
    pieces = np.array([p for f in frames for p in f.pieces], np.int64).reshape(-1, 3)
    frame_table = np.stack(
        [
            first,
            words,
            rotate,
            lengths,
            index.frames["checksum"][rows].astype(np.uint64).view(np.int64) if frames else words,
            first_piece,
            piece_counts,
        ],
        axis=1,
    ).astype(np.int64)
    chunk_table = np.stack(
        [
            chunks["offset"].astype(np.int64),
            chunks["size"].astype(np.int64),
            chunks["codec"].astype(np.int64),
            chunks["raw_size"].astype(np.int64),
            chunks["checksum"].astype(np.uint64).view(np.int64),
        ],
        axis=1,
    )
    frame_table, chunk_table, pieces = (
        np.ascontiguousarray(t, np.int64) for t in (frame_table, chunk_table, pieces)
    )
    return Plan(frame_table, chunk_table, pieces, delta.argument)


@dataclass(frozen=True, slots=True)
class Target:
    """Where the restored bytes go: ``output`` (a descriptor written at file offsets, -1 for
    none), ``memory`` (a uint8 array that receives the whole file), and ``checked`` (a
    descriptor whose bytes each piece must equal, -1 for none: the original for a
    comparison, the output itself to read back a restore in place)."""

    output: int = -1
    checked: int = -1
    memory: np.ndarray | None = None
    #: Raises the error for the first differing byte ``checked`` holds.
    differs: Callable[[int], BaseException] | None = None
    #: Takes the bytes in file order (stdout's ``write``): :func:`run_in_order`.
    stream: Callable[[memoryview], object] | None = None


def run(
    fd: int,
    path: str,
    decoder: FrameDecoder,
    tables: Plan,
    target: Target,
    threads: int,
    progress: Callable[[int], None],
    gpu: Gpu | None = None,
) -> Digest | None:
    """Restore every frame of ``tables`` (from the container open as ``fd``) into
    ``target``, decoding nvCOMP's bitstreams on ``gpu``; return the digest of what was
    restored, or None where a frame needs the Python loop after all (nothing the caller can
    use was finished: it restores again).

    Raises:
        CorruptionError: bytes fail their checksum or do not decode (worded as the Python
            loop words it), or a read-back differs.
        MismatchError: a compared original differs (``target.differs``).
        OSError: reading the container or writing the output failed.
        DeviceError: the GPU failed (CUDA or nvCOMP).
        KeyboardInterrupt: (or any error a signal handler raises) the restore was stopped.
    """
    index = decoder.index
    kind = index.source_digest.kind
    if not kind.tree or target.stream is not None:
        # Windows in file order run on the CPU threads alone: a GPU's file goes to the loop.
        if gpu is not None:
            return None
        return run_in_order(fd, path, decoder, tables, target, threads, progress)
    hashes = np.zeros(leaf_count(index.source_size, kind.leaf), "<u8")
    stats = np.zeros(3, np.int64)
    why = bytearray(256)
    settings = None
    if gpu is not None:
        zstd = ZSTD.id if gpu.zstd else -1
        settings = (gpu.library, gpu.device, gpu.batch_bytes, gpu.workers, ANS.id, zstd, stats, why)
    try:
        failed = _call(
            fd,
            tables,
            target,
            index.source_size,
            kind.leaf,
            hashes,
            threads,
            progress,
            settings,
            tables.delta,
        )
    finally:
        _DECODED.add(stats)
    if failed is not None and failed[0] == _GPU:
        message = bytes(why).split(b"\0", 1)[0].decode(errors="replace")
        raise DeviceError(f"the GPU could not decode it: {message}", path=path, hint="use --device cpu")
    if failed is not None:
        _raise(*failed, decoder, target, path)
        return None
    digest = Piecewise(kind, index.source_size)
    digest.hashes.set_many(np.arange(hashes.size, dtype=np.int64), hashes)
    return digest.digest()


def run_in_order(
    fd: int,
    path: str,
    decoder: FrameDecoder,
    tables: Plan,
    target: Target,
    threads: int,
    progress: Callable[[int], None],
) -> Digest | None:
    """:func:`run` where the bytes must come in file order (a stream such as stdout, or the
    ``xxh3_128`` digest of an older container, which hashes the file from its start): a
    window of :data:`WINDOW` bytes at a time, each restored in one native call into one
    buffer (the frames with pieces in the window, each decoded whole, as its checks and its
    series delta need, and its pieces clipped to the window: a frame reaching into the next
    window is decoded again there), then given to ``target`` and hashed. None where a frame
    of the first window needs the Python loop; past it (bytes already given to a stream),
    that window's frames are decoded by Python instead.

    Raises:
        what :func:`run` raises.
    """
    from ckptz.digest import Hasher  # the digest of either kind, from bytes in order

    size = decoder.index.source_size
    hasher = Hasher(decoder.index.source_digest.kind)
    pieces = tables.pieces
    owner = np.repeat(np.arange(len(tables.frames), dtype=np.int64), tables.frames[:, 6])
    # Pieces cut the file without overlapping: in the order of their starts, their ends are
    # in order too, and a window's pieces are a run of that order.
    by_start = np.argsort(pieces[:, 0], kind="stable")
    starts = pieces[by_start, 0]
    ends = starts + pieces[by_start, 2]
    room = np.empty(min(WINDOW, size), np.uint8) if target.memory is None else None
    for start in range(0, size, WINDOW):
        stop = min(start + WINDOW, size)
        run = by_start[np.searchsorted(ends, start, "right") : np.searchsorted(starts, stop, "left")]
        # The frames with bytes in the window, each restored whole and its pieces clipped to it.
        frames = np.unique(owner[run[pieces[run, 2] > 0]])
        window = Plan(np.ascontiguousarray(tables.frames[frames]), tables.chunks, pieces, tables.delta)
        buf = target.memory[start:stop] if target.memory is not None else room[: stop - start]  # type: ignore[index]
        failed = _call(
            fd,
            window,
            Target(memory=buf),
            size,
            0,
            _NO_LEAVES,
            threads,
            delta=window.delta,
            window=(start, stop),
        )
        if failed:
            kind, frame, detail = failed
            _raise(kind, int(frames[frame]) if frame >= 0 else frame, detail, decoder, target, path)
            if start == 0:
                return None
            _decode_in_python(decoder, frames, window, buf, start)
        _put(target, buf, start, path)
        hasher.update(buf)
        if target.stream is not None:
            _give_all(target.stream, buf.data)
        progress(stop - start)
    return hasher.digest()


def _give_all(write: Callable[[memoryview], object], data: memoryview) -> None:
    """``data`` to a stream's ``write``, again from where it stopped where it took part of
    it (a pipe whose reader went away: the next write then raises)."""
    while data:
        took = write(data)
        if not isinstance(took, int) or not 0 < took < len(data):
            return
        data = data[took:]


def _decode_in_python(
    decoder: FrameDecoder, frames: np.ndarray, window: Plan, buf: np.ndarray, start: int
) -> None:
    """A window's frames decoded by the Python decoder (one the native plane lacks a bitstream
    of), their pieces clipped to the window's bytes from ``start``, ``buf``."""
    for row, i in enumerate(frames.tolist()):
        data = decoder.decode(i)
        first, count = window.frames[row, 5:7].tolist()
        for at, within, n in window.pieces[first : first + count].tolist():
            lo, hi = max(at, start), min(at + n, start + buf.size)
            if lo < hi:
                buf[lo - start : hi - start] = data[within + lo - at : within + hi - at]


def _put(target: Target, buf: np.ndarray, start: int, path: str) -> None:
    """A restored window's bytes to ``target``'s file, or compared with its checked file."""
    if target.output >= 0:
        safeio.pwrite_all(target.output, [buf.data], start)
    if target.checked >= 0:
        got = np.frombuffer(os.pread(target.checked, buf.size, start), np.uint8)
        wrong = np.flatnonzero(got != buf[: got.size])
        if wrong.size or got.size < buf.size:
            assert target.differs is not None
            raise target.differs(start + int(wrong[0]) if wrong.size else start + got.size)


_NO_LEAVES = np.zeros(0, "<u8")


def _call(
    fd: int, tables: Plan, target: Target, size: int, leaf: int, hashes: np.ndarray, threads: int,
    progress: Callable[[int], None] = lambda _: None, gpu: tuple[object, ...] | None = None,
    delta: tuple[object, ...] | None = None, window: tuple[int, int] = (0, 0),
) -> tuple[int, int, int] | None:  # fmt: skip
    """One call of the native plane (decoding on a GPU with ``gpu``'s settings, undoing a
    series ``delta``, restoring only the ``window`` of the file's bytes (start, end) into the
    target's memory where it is not empty); None, or its failure (kind, frame, detail)."""

    def call(lent: int, counter: np.ndarray, stop: np.ndarray, error: np.ndarray, clocks: np.ndarray) -> int:
        return native.restore_plan(
            fd,
            target.output,
            target.checked,
            _NO_MEMORY if target.memory is None else target.memory,
            tables.frames,
            tables.chunks,
            tables.pieces,
            size,
            leaf,
            hashes,
            lent,
            counter,
            stop,
            error,
            gpu,
            delta,
            window,
            clocks,
        )

    failed, error = call_polled(
        call, "ckptz-native-restore", threads, progress, "restore", native.restore_stages, len(tables.frames)
    )
    if failed:
        return int(error[0]), int(error[1]), int(error[2])
    return None


def _raise(kind: int, frame: int, detail: int, decoder: FrameDecoder, target: Target, path: str) -> None:
    """Raise the error for a failure of the native plane; return where the Python loop must
    restore the file instead."""
    if kind in (_TRUNCATED, _PADDING, _PAYLOAD, _DECODE, _FRAME) or kind in DELTA_FAILURES:
        decoder.decode(frame)  # raises, worded as the Python loop words it
        if kind != _DECODE:  # a check that failed in C but not in Python: never quietly
            raise CorruptionError(f"frame {frame} failed a check restoring it (failure {kind})", path=path)
        return  # a frame only Python decodes
    if kind in (_READ, _WRITE, _CHECK_READ):
        raise OSError(detail, os.strerror(detail))
    if kind == _DIFFERS:
        assert target.differs is not None
        raise target.differs(detail)
    if kind == _NOMEM:
        raise MemoryError("no memory for the restore's buffers")
    raise RuntimeError(f"native restore stopped (failure {kind})")  # _STOPPED is only ours to set


__all__ = [
    "NATIVE_CODECS",
    "NATIVE_GPU_CODECS",
    "Gpu",
    "Plan",
    "PlaneDelta",
    "Target",
    "for_plane",
    "gpu_totals",
    "plan",
    "run",
    "suits",
]
