"""What an engine is: the frame coder on one device, behind per-frame futures.

The pipeline (:mod:`ckptz.pipeline`) reads, hashes and writes; an engine only codes frames.
:class:`ckptz.engines.cpu.CpuEngine` and :class:`ckptz.engines.gpu.engine.GpuEngine` are
peers behind :class:`Engine`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from ckptz import indices
from ckptz.checksums import xxh3_64, xxh3_64_each, xxh3_64_ranges
from ckptz.codecs.frames import EncodedChunk
from ckptz.container import StreamInfo
from ckptz.dtypes import DType, lookup
from ckptz.errors import CorruptionError

#: The ``buffer`` of a :class:`StoredSpan` whose frames' payloads lie anywhere (each chunk's
#: own payload), not in one buffer read for the span.
NO_BUFFER = np.zeros(0, np.uint8)


@dataclass(frozen=True, slots=True)
class Ranges:
    """Byte ranges of a span's frames for an engine to hash where it holds their bytes: the
    leaves of a whole-file digest inside them (:class:`ckptz.digest.LeafTable`).

    A range may be in parts, in several frames (a leaf straddling two frames of the span):
    its hash is of its parts joined in order.

    Attributes:
        frame: the frame each part lies in (its place in the span; int64).
        start: where the part starts in that frame (int64).
        size: its bytes (int64).
        parts: how many parts each range has, in order (None: one each).
    """

    frame: np.ndarray
    start: np.ndarray
    size: np.ndarray
    parts: np.ndarray | None = None

    @property
    def count(self) -> int:
        """How many ranges (hashes) there are."""
        return self.frame.size if self.parts is None else self.parts.size

    def _firsts(self) -> np.ndarray:
        assert self.parts is not None
        return np.cumsum(self.parts) - self.parts

    def within(self, frames: np.ndarray) -> np.ndarray:
        """The ranges (indices) whose every part lies in a frame that ``frames`` (bool, by
        frame) marks."""
        inside = frames[self.frame]
        if self.parts is None or not inside.size:
            return np.flatnonzero(inside)
        return np.flatnonzero(np.logical_and.reduceat(inside, self._firsts()))

    def pick(self, which: np.ndarray, frames: np.ndarray | None = None) -> Ranges:
        """The ranges ``which`` (indices, ascending) with their parts (their frames renumbered
        through ``frames``, by frame, where given)."""
        if self.parts is None:
            rows, counts = which, None
        else:
            counts = self.parts[which]
            rows = indices.runs(self._firsts()[which], counts)
        frame = self.frame[rows]
        return Ranges(frame if frames is None else frames[frame], self.start[rows], self.size[rows], counts)


@dataclass(frozen=True, slots=True)
class EncodedFrame:
    """A coded frame: the checksum of its original bytes and one chunk per plane."""

    checksum: int
    chunks: list[EncodedChunk]


@dataclass(frozen=True, slots=True)
class FrameToCode:
    """One frame handed to :meth:`Engine.encode_span`: its bytes and their xxh3_64 (None:
    the engine takes it where it holds the bytes, see :attr:`Engine.hashes`)."""

    stream: StreamInfo
    data: np.ndarray
    checksum: int | None


@dataclass(frozen=True, slots=True)
class EncodedSpan:
    """What :meth:`Engine.encode_span` gives back.

    Attributes:
        frames: each frame coded, in the order given.
        block: where the engine has it, every payload of the span in frame-then-plane
            order, each at a 16-byte boundary and zero-padded to the next: exactly the
            container's data area for the span, written as it is (``None``: the payloads
            lie anywhere).
        leaves: the xxh3_64 of each of the ``leaves`` ranges asked for, in order.
        sums: where the engine took them, the checksum (xxh3_64) of every payload in
            frame-then-plane order (a GPU: of the payloads it made, before they came back).
    """

    frames: list[EncodedFrame]
    block: np.ndarray | None = None
    leaves: np.ndarray | None = None
    sums: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class StoredChunk:
    """Where one chunk of a frame lies in a container, as the decoder needs it."""

    index: int
    codec: int
    raw_size: int
    payload: bytes | memoryview
    checksum: int


@dataclass(frozen=True, slots=True)
class SpanFrame:
    """One frame of a span handed to :meth:`Engine.decode_span`.

    Attributes:
        stream: the frame's stream.
        chunks: its checked payloads, one per plane (views of the span's buffer).
        length: bytes it decodes to.
        where: how errors name it.
        at: where each chunk's payload starts in the span's buffer (16-byte aligned).
    """

    stream: StreamInfo
    chunks: list[StoredChunk]
    length: int
    where: str
    at: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StoredSpan:
    """Consecutive frames handed to :meth:`Engine.decode_span` as one table: a row per chunk
    (each frame's chunks in plane order, frame after frame) and an entry per frame, so an
    engine that decodes the span as a whole never builds an object per chunk.

    Attributes:
        buffer: holds every payload at ``at`` (16-byte aligned, as the container stores
            them, read with one ``pread`` into a buffer from :meth:`Engine.host_buffer`;
            the caller frees it once the future is done), or :data:`NO_BUFFER` where the
            payloads lie anywhere (``payloads``).
        streams: each frame's stream.
        lengths: bytes each frame decodes to (int64).
        bounds: frame ``k``'s chunks are rows ``bounds[k]`` to ``bounds[k + 1]`` (int64).
        index: each chunk's number in its container, for errors (int64).
        codec: its bitstream id (int64).
        raw_size: bytes it decodes to (int64).
        size: its payload's bytes (int64).
        checksum: the stored xxh3_64 of its payload (uint64; 0 where none is stored).
        at: where its payload starts in ``buffer`` (int64; empty without a buffer).
        payloads: each chunk's payload where they are not in a buffer (else None).
        names: how errors name frame ``k`` (called only for an error).
    """

    buffer: np.ndarray
    streams: Sequence[StreamInfo]
    lengths: np.ndarray
    bounds: np.ndarray
    index: np.ndarray
    codec: np.ndarray
    raw_size: np.ndarray
    size: np.ndarray
    checksum: np.ndarray
    at: np.ndarray
    payloads: Sequence[bytes | memoryview] | None
    names: Callable[[int], str]

    @classmethod
    def of(cls, frames: Sequence[SpanFrame], buffer: np.ndarray = NO_BUFFER) -> StoredSpan:
        """The table of ``frames`` (with ``buffer``: their payloads lie in it at their
        ``at``; else anywhere)."""
        chunks = [c for f in frames for c in f.chunks]
        counts = [len(f.chunks) for f in frames]

        def column(values: Sequence[int], dtype: type = np.int64) -> np.ndarray:
            return np.array(values, dtype)

        return cls(
            buffer,
            [f.stream for f in frames],
            column([f.length for f in frames]),
            np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]),
            column([c.index for c in chunks]),
            column([c.codec for c in chunks]),
            column([c.raw_size for c in chunks]),
            column([len(c.payload) for c in chunks]),
            column([c.checksum for c in chunks], np.uint64),
            column([a for f in frames for a in f.at]) if buffer.size else column([]),
            None if buffer.size else [c.payload for c in chunks],
            [f.where for f in frames].__getitem__,
        )

    def __len__(self) -> int:
        return len(self.streams)

    def payload(self, c: int) -> memoryview:
        """Chunk ``c``'s payload (a view of the buffer, or as given)."""
        if self.payloads is not None:
            return memoryview(self.payloads[c])
        at = int(self.at[c])
        return memoryview(self.buffer)[at : at + int(self.size[c])]  # type: ignore[arg-type]

    def frame(self, k: int) -> SpanFrame:
        """Frame ``k`` as an engine that decodes frame by frame takes it."""
        return self._frames(range(k, k + 1))[0]

    def frames(self) -> list[SpanFrame]:
        """Every frame, as :meth:`frame` gives it."""
        return self._frames(range(len(self)))

    def _frames(self, which: range) -> list[SpanFrame]:
        a, b = int(self.bounds[which.start]), int(self.bounds[which.stop])
        index, codec, raw, stored, size = (
            x[a:b].tolist() for x in (self.index, self.codec, self.raw_size, self.checksum, self.size)
        )
        if self.payloads is None:
            at = self.at[a:b].tolist()
            whole = memoryview(self.buffer)  # type: ignore[arg-type]
            payloads: Sequence[bytes | memoryview] = [whole[o : o + n] for o, n in zip(at, size, strict=True)]
        else:
            at, payloads = [], self.payloads[a:b]
        chunks = [StoredChunk(*row) for row in zip(index, codec, raw, payloads, stored, strict=True)]
        out = []
        for k in which:
            lo, hi = int(self.bounds[k]) - a, int(self.bounds[k + 1]) - a
            out.append(
                SpanFrame(
                    self.streams[k], chunks[lo:hi], int(self.lengths[k]), self.names(k), tuple(at[lo:hi])
                )
            )
        return out


@dataclass(frozen=True, slots=True)
class OnDevice:
    """A frame decoded on a GPU and kept there (:meth:`Engine.decode_span` with ``keep``):
    handed to ``place``, never copied back; ``checksum`` is the xxh3_64 of its decoded bytes,
    taken on the GPU, for the caller to check as it checks host bytes."""

    length: int
    checksum: int


@dataclass(frozen=True, slots=True)
class DecodedSpan:
    """What :meth:`Engine.decode_span` gives back, frame by frame.

    Attributes:
        frames: each frame's decoded bytes in host memory (or, kept on a GPU, their
            :class:`OnDevice` record), or the error that frame met.
        taken: for frames copied back from a GPU, the xxh3_64 the GPU took of their
            decoded bytes there (None, or no entry: take it from the host bytes).
        leaves: the xxh3_64 of each of the ``leaves`` ranges asked for, in order, of the
            decoded bytes (a range of a frame that failed: any value).
    """

    frames: list[np.ndarray | OnDevice | BaseException]
    taken: list[int | None] = field(default_factory=list)
    leaves: np.ndarray | None = None

    def frame(self, k: int) -> np.ndarray | OnDevice:
        """Frame ``k``'s host bytes (or :class:`OnDevice` record), or its error raised."""
        got = self.frames[k]
        if isinstance(got, BaseException):
            raise got
        return got

    def measure(self, k: int, checksum: Callable[[np.ndarray], int] = xxh3_64) -> tuple[int, int]:
        """Frame ``k``'s decoded length and xxh3_64 (where the engine took it, else
        ``checksum`` of its host bytes now), or its error raised."""
        got = self.frame(k)
        if isinstance(got, OnDevice):
            return got.length, got.checksum
        taken = self.taken[k] if k < len(self.taken) else None
        return got.size, checksum(got) if taken is None else taken


#: Called by an engine with the ``k``-th frame of a span and its decoded bytes on the
#: engine's GPU (a uint8 tensor), from the engine's thread, on its CUDA stream, before any
#: check of the frame: copies queued there are ordered before the engine reuses the memory.
Place = Callable[[int, Any], None]

#: Bytes of original data per frame unless an engine prefers another size (the container
#: records each stream's, so any reader decodes any size). Frames are the unit of
#: parallelism and of checksums.
FRAME_SIZE = 1 << 20

#: Components whose frames a GPU engine leaves to its CPU coder: pickles, zip and JSON
#: headers and generator states, whose repeats zstd's matches find and no order-0 coder
#: does, so the CPU's frames are several times smaller; they are a sliver of a checkpoint's
#: bytes.
HOST_COMPONENTS = frozenset({"metadata", "rng_state"})


class Engine(Protocol):
    """The frame coder on one device; every coding method returns at once with a future.

    The pipeline does everything else: it reads, takes and checks every checksum, and
    writes. ``decode`` is given payloads whose checksums have been checked; it raises
    :class:`~ckptz.errors.CorruptionError` for a payload that does not decode and
    :class:`~ckptz.errors.CodecUnavailableError` for a bitstream it cannot decode.

    Attributes:
        device: where it runs (``cpu``, ``cuda:N``).
        threads: CPU threads it uses.
        frame_size: bytes of original data per frame it codes best.
        largest_frame: bytes per frame it codes as well, for large streams, where fewer
            frames spare the pipeline per-frame work (:func:`ckptz.pipeline.plan.frame_size_for`).
        look_ahead: frames a file should keep in flight to keep it busy.
        restore_ahead: frames a restore of a file keeps in flight (read, decoded, not yet
            written): a frame's memory is held until its bytes are written.
        span_bytes: bytes the pipeline reads at once and hands over as one unit: original
            frames to :meth:`encode_span`, stored payloads lying back to back to
            :meth:`decode_span`; 0: a frame at a time.
        inline: ``encode`` and ``decode`` do their work in the calling thread and return a
            finished future (the CPU engine); callers that want ``threads``-fold
            parallelism call them from that many threads. Otherwise they queue the work and
            return at once (the GPU engine).
        hashes: the pipeline leaves the hashing of each frame's bytes to the engine, which
            takes it where it holds them (a GPU engine: on the device, once copied there):
            :meth:`encode_span` gets frames whose ``checksum`` is None and gives back their
            checksums, and both span methods the hashes of the ``leaves`` ranges they are
            given. Every engine honours both (the CPU engine hashes on the host); those that
            hash no faster than the pipeline's readers, which hash a run of frames in one
            call while its bytes are in cache, say False.
        checks: :meth:`decode_span` with ``check`` checks each payload where the engine
            holds it (a GPU engine: the bytes it copied to the device) and takes each
            decoded frame's checksum there (:attr:`DecodedSpan.taken`), so the pipeline
            checks neither on the host. Engines that would only check on the host, as the
            pipeline's readers do in one call per run, say False.
    """

    @property
    def device(self) -> str: ...

    @property
    def restore_ahead(self) -> int: ...

    threads: int
    frame_size: int
    largest_frame: int
    look_ahead: int
    span_bytes: int
    inline: bool
    hashes: bool
    checks: bool

    def host_buffer(self, size: int) -> np.ndarray:
        """A uint8 buffer for frames that this engine reads fastest (pinned on a GPU)."""
        ...

    def free_buffer(self, buf: np.ndarray) -> None:
        """Take back a buffer from :meth:`host_buffer` for later reuse."""
        ...

    def encode(self, stream: StreamInfo, data: np.ndarray, checksum: int) -> Future[EncodedFrame]:
        """Code one frame (``checksum`` is its xxh3_64, carried into the result)."""
        ...

    def encode_span(
        self, frames: list[FrameToCode], buffer: np.ndarray | None, leaves: Ranges | None = None
    ) -> Future[EncodedSpan]:
        """Code consecutive frames as one unit. Where ``buffer`` (from :meth:`host_buffer`)
        holds every frame's bytes, a GPU engine copies it to the device at once; the caller
        frees it once the future is done. ``leaves``: ranges of the frames to hash as well
        (:attr:`EncodedSpan.leaves`)."""
        ...

    def flush(self) -> None:
        """The caller has queued the last frames of a file: code what is queued now rather
        than wait for more to fill a batch (an engine that batches; others do nothing)."""
        ...

    def decode(
        self, stream: StreamInfo, chunks: list[StoredChunk], length: int, where: str
    ) -> Future[np.ndarray]:
        """Decode one frame of ``length`` bytes from its checked payloads."""
        ...

    def decode_span(
        self,
        span: StoredSpan,
        place: Place | None = None,
        keep: bool = False,
        check: bool = False,
        leaves: Ranges | None = None,
    ) -> Future[DecodedSpan]:
        """Decode consecutive frames, given as one table (:class:`StoredSpan`; where their
        payloads were read together into its buffer, a GPU engine copies it to the device
        at once). With ``check``, each payload is first checked against its chunk's
        checksum (a GPU engine checks the bytes it copied to the device), and a frame with
        one that fails is not decoded: its error is a
        :class:`~ckptz.errors.CorruptionError` naming the chunk. An error in one frame is
        that frame's; the future fails only where the whole span did. An engine that
        decodes a frame on a GPU also hands it to ``place`` there (:data:`Place`), and with
        ``keep`` (an engine that is :class:`DeviceChecks`) gives back its :class:`OnDevice`
        record instead of copying it to the host (:meth:`DecodedSpan.measure` gives
        either's length and checksum). Frames decoded on a CPU always come back as host
        bytes. ``leaves``: ranges of the decoded frames to hash as well
        (:attr:`DecodedSpan.leaves`; not with ``keep``)."""
        ...

    def codec_config(self) -> dict[str, dict[str, object]]:
        """What each bitstream is written with (recorded in the container)."""
        ...

    def container_extras(self) -> dict[str, object]:
        """Fields this engine adds to a container's JSON header."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class DeviceChecks(Protocol):
    """An engine that checks decoded bytes where they lie, on its GPU (device ``index``):
    ``decode_span(..., keep=True)`` takes each frame's checksum there, and
    :meth:`leaf_hashes` a whole-file digest's leaves, so a caller that wants the decoded
    bytes on that GPU never copies them to the host to check them."""

    index: int

    def leaf_hashes(self, segments: Sequence[tuple[int, int, int]], size: int, leaf: int) -> np.ndarray:
        """The xxh3_64 of every ``leaf``-byte leaf of a ``size``-byte file whose bytes lie on
        the GPU as ``segments`` (file offset, device address, bytes), which tile the file in
        order; uint64, by leaf number. Work queued on other streams must be over."""
        ...


_T = TypeVar("_T")
_U = TypeVar("_U")


def run_all(engine: Engine, calls: Sequence[Callable[[], Future[_T]]]) -> list[_T]:
    """Every call's result, in order, with the engine's parallelism: from ``engine.threads``
    threads for an engine that works in its caller's thread, else all queued at once."""
    if not engine.inline:
        return [f.result() for f in [call() for call in calls]]
    with ThreadPoolExecutor(engine.threads, thread_name_prefix="ckptz-run") as pool:
        return list(pool.map(lambda call: call().result(), calls))


def encode_each(
    engine: Engine, frames: list[FrameToCode], leaves: Ranges | None = None
) -> Future[EncodedSpan]:
    """:meth:`Engine.encode_span` for an engine that codes frame by frame (checksums and
    leaves asked for taken here, on the host)."""

    def each(done: list[Future[EncodedFrame]]) -> EncodedSpan:
        hashed = None if leaves is None else hash_ranges([f.data for f in frames], leaves)
        return EncodedSpan([f.result() for f in done], None, hashed)

    return when_all(
        [
            engine.encode(f.stream, f.data, xxh3_64(f.data) if f.checksum is None else f.checksum)
            for f in frames
        ],
        each,
        fail_whole=True,
    )


def decode_each(
    engine: Engine, span: StoredSpan, check: bool = False, leaves: Ranges | None = None
) -> Future[DecodedSpan]:
    """:meth:`Engine.decode_span` for an engine that decodes frame by frame (``check``: each
    frame's payloads checked first, on the host; ``leaves`` hashed here too)."""

    def each(done: list[Future[np.ndarray]]) -> DecodedSpan:
        got: list[np.ndarray | OnDevice | BaseException] = [f.exception() or f.result() for f in done]
        return DecodedSpan(got, [], None if leaves is None else hash_ranges(got, leaves))

    def one(f: SpanFrame) -> Future[np.ndarray]:
        failed = payload_error(f) if check else None
        if failed is None:
            return engine.decode(f.stream, f.chunks, f.length, f.where)
        out: Future[np.ndarray] = Future()
        out.set_exception(failed)
        return out

    return when_all([one(f) for f in span.frames()], each)


def hash_ranges(frames: Sequence[object], ranges: Ranges) -> np.ndarray:
    """The xxh3_64 of each of ``ranges`` of ``frames`` (host bytes; a range with a part in
    anything else, such as a frame's error, hashes to 0): one call per frame for ranges in
    one part, each joined range on its own."""
    if ranges.parts is not None and (ranges.parts != 1).any():
        out = np.zeros(ranges.count, np.uint64)
        ends = np.cumsum(ranges.parts)
        for r, (a, b) in enumerate(zip((ends - ranges.parts).tolist(), ends.tolist(), strict=True)):
            pieces = [frames[f] for f in ranges.frame[a:b].tolist()]
            if all(isinstance(p, np.ndarray) for p in pieces):
                joined = b"".join(
                    p[at : at + n].tobytes()
                    for p, at, n in zip(
                        pieces, ranges.start[a:b].tolist(), ranges.size[a:b].tolist(), strict=True
                    )
                )
                out[r] = xxh3_64(joined)
        return out
    out = np.zeros(ranges.frame.size, np.uint64)
    for k in np.unique(ranges.frame).tolist():
        data = frames[k]
        if isinstance(data, np.ndarray):
            mine = ranges.frame == k
            out[mine] = xxh3_64_ranges(data, ranges.start[mine], ranges.size[mine])
    return out


def payload_error(frame: SpanFrame, sums: Sequence[int] | None = None) -> CorruptionError | None:
    """The error of a frame whose payloads' checksums (``sums``, one per chunk, taken where
    the payloads were copied; default: taken now from the host bytes) are not the ones
    stored, naming the first chunk that fails; None if they all match."""
    if sums is None:
        sums = xxh3_64_each([c.payload for c in frame.chunks])
    for c, got in zip(frame.chunks, sums, strict=True):
        if got != c.checksum:
            return CorruptionError(f"stored bytes of {frame.where} fail their checksum", chunk=c.index)
    return None


def when_all(
    futures: list[Future[_T]], combine: Callable[[list[Future[_T]]], _U], fail_whole: bool = False
) -> Future[_U]:
    """One future for many: ``combine`` of them once all are done (``fail_whole``: the
    first error, if any, fails it instead)."""
    out: Future[_U] = Future()
    # Emptied by the last callback: each future keeps its callbacks once run, and a callback
    # still holding the futures would hold them in a cycle (kept until a collection).
    waiting = list(futures)
    left = [len(waiting)]
    lock = threading.Lock()

    def done(_: Future[_T]) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
            ready, waiting[:] = waiting[:], []
        failed = next((e for f in ready if (e := f.exception()) is not None), None) if fail_whole else None
        if failed is not None:
            out.set_exception(failed)
            return
        try:
            out.set_result(combine(ready))
        except BaseException as exc:
            out.set_exception(exc)

    if not futures:
        out.set_result(combine(futures))
    for f in futures:
        f.add_done_callback(done)
    return out


def stream_dtype(stream: StreamInfo) -> DType:
    """The transform a stream was written with (its own record wins over the dtype table)."""
    return replace(lookup(stream.dtype), word=stream.word, is_float=stream.rotate)


__all__ = [
    "FRAME_SIZE",
    "NO_BUFFER",
    "DecodedSpan",
    "DeviceChecks",
    "EncodedFrame",
    "EncodedSpan",
    "Engine",
    "FrameToCode",
    "OnDevice",
    "Place",
    "Ranges",
    "SpanFrame",
    "StoredChunk",
    "StoredSpan",
    "decode_each",
    "encode_each",
    "hash_ranges",
    "payload_error",
    "run_all",
    "stream_dtype",
]
