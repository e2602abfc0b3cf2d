"""Compressing one file on the CPU in one native call: Python plans, C moves the bytes.

:func:`plan` turns a file's frames (:func:`~ckptz.pipeline.plan.frame_map`) into two int64
tables (frames and their pieces in the file); :func:`code` hands them to the C extension's
``compress_plan``, which reads every frame, takes its checksum and hashes the digest's
leaves, splits it into planes, codes each plane by :mod:`ckptz.codecs.frames`' rules, and
writes the payloads at their places in the container's data area, on its own threads
without the GIL (``ckptz/native_src/compress_plane.c``). Places are handed out in frame
order, so the container is byte for byte the one the Python pipeline
(:mod:`ckptz.pipeline.compress`) writes. A series delta is applied there too (the
``delta`` argument, :func:`~ckptz.pipeline.native_restore.for_plane`): each frame's digest
leaves are hashed from the bytes read, and its checksum taken of the bytes coded, as the
Python pipeline records them. Progress crosses back as a counter polled here;
Ctrl-C and SIGTERM cross as a stop flag its threads check between frames.

The bytes are read from the file, or from host memory (``ckptz.save``'s image of the state
being saved, :mod:`ckptz.library.torch_image`); the payloads go to an output written at
offsets, to a pipe in order, or nowhere. Whether a file takes this path is decided up front
(:func:`suits`): the CPU engine (or the GPU engine, without a series delta), and a tree
digest. ``--verify`` runs in the plane too: each frame decoded back before its payloads are
written, and the payloads read back once they are (not from a pipe).

The GPU engine takes the same call with a :class:`Gpu`: the plane's threads read and split
the frames into pinned batches, the GPU codes each batch's planes
(``ckptz/native_src/compress_gpu.c``): nvCOMP ANS for ``ans``; for the portable bitstream
the threads plan each plane's literal-only zstd frame as they read it and ckptz's kernels
write the bits. The threads then write the payloads; the frames of
:data:`~ckptz.engines.base.HOST_COMPONENTS` are coded by the CPU coder on the way, as the
GPU engine codes them. With ``--verify``, the GPU decodes back what nvCOMP ANS coded and
the threads check every frame as on the CPU.
Everything else (a series delta on a GPU or against a reference the plane cannot read, the
hybrid engine once its GPU joins) goes through the Python pipeline.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from ckptz.codecs import frames as coder
from ckptz.codecs.native import native
from ckptz.codecs.table import ZSTD
from ckptz.container import ALIGN, PREFIX, StreamInfo
from ckptz.digest import Digest, Kind, Piecewise, leaf_count
from ckptz.engines.base import HOST_COMPONENTS, Engine
from ckptz.engines.cpu import CpuEngine
from ckptz.errors import CodecError, ContainerError, CorruptionError, DeviceError, FormatError
from ckptz.pipeline.native_call import DELTA_FAILURES, MAX_LEAVES, Gpu, GpuTotals, call_polled
from ckptz.pipeline.plan import Frame

if TYPE_CHECKING:
    from ckptz.engines.gpu.engine import GpuEngine

#: Word sizes the plane splits (every dtype ckptz knows has one of them).
WORDS = frozenset({1, 2, 4, 8})
#: A frame's rotate column: its words are floats; its exponents are tried in order-1 coding
#: too; its planes are coded on the GPU; its exponents are tried in order-1 coding where a
#: sample says it pays, and its signs row-predicted.
_FLOAT, _CONTEXT, _ON_GPU, _MEASURED = 1, 2, 4, 8
#: The bitstreams whose GPU compressions run in the plane (the others take the Python
#: pipeline, which tests also switch to where they check its own steps). Neither yet: the
#: plane measured faster only for `ans` with writes discarded; to a file it was slower, and
#: so was the portable bitstream, planned on the CPU threads (BENCHMARKS.md, "the native
#: planes").
GPU_PLANE: frozenset[int] = frozenset()
#: nvCOMP ANS codes planes of at most this many bytes (the GPU engine's frames stay below it).
_LARGEST_GPU_PLANE = 16 << 20
_NO_MEMORY = np.zeros((0, 3), np.int64)

#: frames.py's thresholds, in the order compress_plane.c reads them: the plane chooses each
#: plane's bitstream by the very numbers the Python coder uses.
RULES = np.array(
    [
        coder.SAMPLE,
        coder.NOISE_BITS,
        coder.NOISE_ZERO_SHARE,
        coder.ZSTD_ZEROS,
        coder.PACK_SLACK,
        coder.LOW_BITS,
        coder.RUN_SHARE,
        coder.CONTEXT_MARGIN,
        coder.BLOCK,
        coder.CLEAR_CONTEXT_SAVING,
        coder.CLEAR_SIGN_MISS,
        coder.MANTISSA_MARGIN,
    ],
    np.float64,
)

# Failure kinds, as plane.c and compress_plane.c number them.
_PAYLOAD, _FRAME, _READ, _WRITE, _STOPPED, _NOMEM, _CHECK_READ, _GPU, _SHORT, _CODER = (
    3,
    5,
    6,
    7,
    9,
    10,
    11,
    12,
    13,
    14,
)


def suits(
    engine: object,
    streams: Sequence[StreamInfo],
    size: int,
    digest: Kind,
    *,
    plain: bool,
) -> bool:
    """Whether the native plane may code a file: ``plain`` (no transform or one the plane
    applies, bytes read from the file or host memory) with the CPU engine or the GPU engine,
    a tree digest of a bounded number of leaves, and streams of words it splits."""
    if not plain or not digest.tree or not _codes(engine, streams):
        return False
    return leaf_count(size, digest.leaf) <= MAX_LEAVES and all(s.word in WORDS for s in streams)


def _gpu_engine(engine: object) -> GpuEngine | None:
    """``engine`` where it is the GPU engine (whose module is only loaded where one exists)."""
    module = sys.modules.get("ckptz.engines.gpu.engine")
    return cast("GpuEngine", engine) if module is not None and type(engine) is module.GpuEngine else None


def coders(engine: Engine) -> tuple[CpuEngine, Gpu | None]:
    """What the plane codes with for ``engine`` (one :func:`suits` took): the CPU coder, and
    the GPU that codes the rest (the GPU engine's; None for the CPU engine)."""
    gpu = _gpu_engine(engine)
    if gpu is None:
        return cast(CpuEngine, engine), None
    from ckptz.engines.gpu import kernels
    from ckptz.engines.gpu.nvcomp_codecs import library_path

    image = kernels.image(gpu.index) if gpu.codec_id == ZSTD.id else b""
    settings = Gpu(
        gpu.index, library_path() or "", gpu.batch_bytes, gpu.workers, codec=gpu.codec_id, kernels=image
    )
    return gpu.host_coder, settings


def _codes(engine: object, streams: Sequence[StreamInfo]) -> bool:
    """Whether the plane codes for ``engine``: the CPU engine, or the GPU engine in planes
    nvCOMP ANS takes where it codes ``ans``."""
    if type(engine) is CpuEngine:
        return True
    gpu = _gpu_engine(engine)
    if gpu is None or gpu.codec_id not in GPU_PLANE:
        return False
    return gpu.codec_id == ZSTD.id or all(
        s.frame_size // max(1, s.word) <= _LARGEST_GPU_PLANE for s in streams
    )


@dataclass(frozen=True, slots=True)
class Plan:
    """One file's compression as the native plane takes it: C-contiguous int64 tables.

    Attributes:
        frames: per frame: first chunk, word, whether its words are floats, length,
            checksum (filled in), first piece, piece count.
        pieces: per piece: file offset, offset in its frame, bytes.
        chunks: per chunk (filled in): container offset, payload size, plane size,
            checksum, codec, plane.
    """

    frames: np.ndarray
    pieces: np.ndarray
    chunks: np.ndarray


def plan(
    frames: Sequence[Frame], streams: Sequence[StreamInfo], coder: CpuEngine, on_gpu: bool = False
) -> Plan:
    """The tables for ``frames`` (in the order their payloads are placed), coded by
    ``coder`` or, ``on_gpu``, every frame but those of the components the GPU engine leaves
    to its CPU coder (:data:`~ckptz.engines.base.HOST_COMPONENTS`) on the GPU."""
    words = np.array([streams[f.stream].word for f in frames], np.int64)
    rotate = [
        (_FLOAT if s.rotate else 0)
        | (_ON_GPU if on_gpu and s.component not in HOST_COMPONENTS else 0)
        | (_CONTEXT if coder.options_for(s).context_exponents else 0)
        | (_MEASURED if coder.options_for(s).measured_contexts else 0)
        for s in streams
    ]
    floats = np.array([rotate[f.stream] for f in frames], np.int64)
    lengths = np.array([f.length for f in frames], np.int64)
    counts = np.array([len(f.pieces) for f in frames], np.int64)
    first_chunk = np.cumsum(words) - words
    first_piece = np.cumsum(counts) - counts
    table = np.stack([first_chunk, words, floats, lengths, np.zeros_like(words), first_piece, counts], axis=1)
    pieces = np.array([p for f in frames for p in f.pieces], np.int64).reshape(-1, 3)
    chunks = np.zeros((int(words.sum()), 6), np.int64)
    return Plan(*(np.ascontiguousarray(t, np.int64) for t in (table, pieces, chunks)))


@dataclass(frozen=True, slots=True)
class Coded:
    """What the plane wrote: the rows :func:`~ckptz.container.make_tables` takes, where the
    data area ends, and the file's digest."""

    frames: list[tuple[int, int, int, int]]
    chunks: list[tuple[int, int, int, int, int, int]]
    end: int
    digest: Digest


def memory_table(regions: Sequence[tuple[int, np.ndarray]]) -> np.ndarray:
    """The plane's memory table for ``regions`` (file offset, bytes) that tile a source in
    order; the arrays must stay alive while the plane reads them."""
    rows = [(at, part.nbytes, part.ctypes.data) for at, part in regions if part.nbytes]
    return np.array(rows, np.int64).reshape(-1, 3)


def code(
    fd: int,
    out: int,
    relpath: str,
    frames: Sequence[Frame],
    streams: Sequence[StreamInfo],
    size: int,
    digest: Kind,
    coder: CpuEngine,
    progress: Callable[[int], None],
    verify: bool = False,
    written: int = -1,
    *,
    memory: np.ndarray = _NO_MEMORY,
    in_order: bool = False,
    gpu: Gpu | None = None,
    threads: int | None = None,
    delta: tuple[object, ...] | None = None,
    explain: Callable[[int], object] | None = None,
) -> Coded:
    """Code every frame of the file open as ``fd`` (-1: of the host memory regions of
    ``memory``, a :func:`memory_table`) into the data area of the container open as ``out``
    (-1: write nothing; ``in_order``: a pipe, written where it stands, its prefix already
    written); what was written. ``coder`` codes the frames on the CPU, and with ``gpu``
    (:func:`coders`) that GPU codes all but the CPU coder's components, on
    ``threads`` (default: the coder's). With
    ``verify``, every frame is decoded back from its payloads before they are written, and
    they are read back from ``written`` (the container open for reading; -1: not) once
    they are. ``delta`` codes paired ranges as a series delta (on the CPU); where it fails,
    ``explain`` applies the Python transform to that frame, to raise its error as the
    Python pipeline words it.

    Raises:
        FormatError: the file ended early (it changed while being read).
        CodecError: zstd refused a plane.
        CorruptionError: (with ``verify``) a frame did not decode back to its bytes, or a
            payload read back differs from the one written.
        DeviceError: the GPU failed (CUDA or nvCOMP).
        OSError: reading the file or writing the container failed.
        KeyboardInterrupt: (or any error a signal handler raises) the compression was stopped.
        ContainerError, ValueError: (what ``explain`` raises) the series delta failed.
    """
    tables = plan(frames, streams, coder, on_gpu=gpu is not None)
    hashes = np.zeros(leaf_count(size, digest.leaf), "<u8")
    why = bytearray(256)
    stats = np.zeros(3, np.int64)
    settings = None
    if gpu is not None:
        settings = (gpu.library, gpu.device, gpu.batch_bytes, gpu.workers, gpu.codec, gpu.kernels, stats, why)

    def call(lent: int, counter: np.ndarray, stop: np.ndarray, error: np.ndarray, clocks: np.ndarray) -> int:
        return native.compress_plan(
            fd,
            memory,
            out,
            in_order,
            verify,
            written,
            len(PREFIX),
            tables.frames,
            tables.chunks,
            tables.pieces,
            size,
            digest.leaf,
            hashes,
            coder.options.level,
            RULES,
            lent,
            counter,
            stop,
            error,
            settings,
            delta,
            clocks,
        )

    try:
        failed, error = call_polled(
            call,
            "ckptz-native-compress",
            threads or coder.threads,
            progress,
            "compress",
            native.compress_stages,
            len(tables.frames),
        )
    finally:
        _CODED.add(stats)
    if failed == _GPU:
        message = bytes(why).split(b"\0", 1)[0].decode(errors="replace")
        raise DeviceError(f"the GPU could not code it: {message}", path=relpath, hint="use --device cpu")
    if failed in DELTA_FAILURES and explain is not None:
        explain(int(error[1]))  # raises, worded as the Python pipeline words it
    if failed:
        _raise(failed, int(error[1]), int(error[2]), relpath)
    whole = Piecewise(digest, size)
    whole.hashes.set_many(np.arange(hashes.size, dtype=np.int64), hashes)
    sums = tables.frames[:, 4].view(np.uint64).tolist()
    rows = [(f.stream, streams[f.stream].word, f.length, crc) for f, crc in zip(frames, sums, strict=True)]
    chunks = tables.chunks
    sizes = chunks[:, 1]
    end = len(PREFIX) + int((sizes + (-sizes % ALIGN)).sum())
    cols = [chunks[:, 0], sizes, chunks[:, 2], chunks[:, 3].view(np.uint64), chunks[:, 4], chunks[:, 5]]
    return Coded(rows, list(zip(*(c.tolist() for c in cols), strict=True)), end, whole.digest())


_CODED = GpuTotals()


def gpu_totals() -> tuple[int, int, int]:
    """(batches, chunks, input bytes) the native plane has coded on a GPU in this process."""
    return _CODED.get()


def _raise(kind: int, frame: int, detail: int, relpath: str) -> None:
    """Raise the error for a failure of the native plane, worded as the Python pipeline words it."""
    if kind == _SHORT:
        raise FormatError("file changed or was truncated while being read", path=relpath)
    if kind == _FRAME:
        raise CorruptionError(
            f"frame {frame} of {relpath} does not decode back to its original", path=relpath
        )
    if kind == _PAYLOAD:
        raise CorruptionError("a written payload differs from the one checked", path=relpath)
    if kind in (_READ, _WRITE, _CHECK_READ):
        raise OSError(detail, os.strerror(detail))
    if kind == _NOMEM:
        raise MemoryError("no memory for the compression's buffers")
    if kind == _CODER:
        raise CodecError(f"zstd could not code frame {frame} of {relpath} (error {detail})", codec="zstd")
    if kind in DELTA_FAILURES:  # one the Python transform did not find again: never quietly
        raise ContainerError(
            f"frame {frame} of {relpath} failed its series delta (failure {kind})", path=relpath
        )
    raise RuntimeError(f"native compression stopped (failure {kind})")  # _STOPPED is only ours to set


__all__ = [
    "GPU_PLANE",
    "WORDS",
    "Coded",
    "Plan",
    "code",
    "coders",
    "gpu_totals",
    "memory_table",
    "plan",
    "suits",
]
