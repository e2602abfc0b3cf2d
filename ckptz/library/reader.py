"""``ckptz.open``: a seekable, read-only file object over a container's original bytes.

Frames are decoded only when a read reaches them (:class:`~ckptz.pipeline.decoder.FrameDecoder`
finds the frames under a byte range and checks each one), and the last few that a read used
only in part are kept, so a library that reads a file object (``torch.load``, a safetensors
header parser, ``zipfile``) works on a container as it does on the original file, and reading
one tensor costs the frames that hold it. The frames a read needs are decoded in parallel on the engine.

Every payload and every frame is checked before its bytes are returned. The whole file's
digest can only be checked over every byte in order: a reader that reads the file from its
first byte to its last in order gets that check too, and a mismatch raises on the read that
reaches the end.
"""

from __future__ import annotations

import builtins
import io
import os
import threading
from collections import OrderedDict, deque
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, cast

import numpy as np

from ckptz.container import read_index
from ckptz.digest import Hasher
from ckptz.engines import open_engine
from ckptz.engines.base import Engine
from ckptz.errors import CorruptionError, UsageError
from ckptz.library.sources import looks_like_container
from ckptz.pipeline.decoder import FrameDecoder
from ckptz.pipeline.whole import seek_position

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

#: Decoded frames kept for later reads, in bytes: 16 tensor frames of 1 MiB and a few
#: 4 MiB metadata frames, enough for a zip reader that jumps between a record and the
#: central directory at the file's end.
CACHE_BYTES = 32 << 20


@dataclass(frozen=True, slots=True)
class ReadStats:
    """What a :class:`ContainerReader` has done so far.

    Attributes:
        frames_decoded: frames decoded (a frame served from the cache counts once).
        stored_bytes_read: container bytes read (payloads and their padding, not the index).
    """

    frames_decoded: int
    stored_bytes_read: int


class ContainerReader(io.RawIOBase):
    """A read-only, seekable file object over the original bytes of a ``.ckptz`` container.

    Thread-safe: reads are serialised; the frames one read needs are decoded in parallel.

    Args:
        path: the container.
        device: where frames are decoded (``cpu`` by default; ``cuda[:N]``, ``auto``).
        cache_bytes: decoded frames kept for later reads.
        fd: the container already open (``path`` then only names it): read through a
            duplicate of it, so a container removed since it was opened still reads. Its
            offset is moved while the index is read.
        fileobj: the container already open as a real file (``path`` then only names it);
            it stays open after :meth:`close`.

    Raises:
        ContainerError: ``path`` is not a container, or its index is damaged.
        OSError: ``path`` cannot be opened.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        device: str = "cpu",
        cache_bytes: int = CACHE_BYTES,
        fd: int | None = None,
        fileobj: BinaryIO | None = None,
    ):
        super().__init__()
        self.name = os.fspath(path)
        self._owned = fileobj is None
        self._file: BinaryIO | None = (  # closed by close() unless the caller's fileobj
            fileobj
            if fileobj is not None
            else builtins.open(path, "rb")  # noqa: SIM115
            if fd is None
            else os.fdopen(os.dup(fd), "rb")
        )
        self._engine: Engine | None = None
        try:
            self.index = read_index(self._file, self.name)
            self._engine, _notice = open_engine(device)
            # A series container finds its reference here, and may fail to.
            self._decoder = FrameDecoder(self._file.fileno(), self.name, self.index, self._engine)
        except BaseException:
            self.close()
            raise
        self._size = self.index.source_size
        self._pos = 0
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self._cached = 0
        self._cache_bytes = cache_bytes
        self._lock = threading.Lock()
        # The whole-file digest, over the bytes read so far if they were read in order.
        self._hasher = Hasher(self.index.source_digest.kind)
        self._hashed = 0

    # -- io.RawIOBase ---------------------------------------------------------------------

    #: The mode a file opened for binary reading has (libraries check it).
    mode = "rb"

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def write(self, data: object) -> int:
        raise io.UnsupportedOperation("write")

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes (all the rest for ``-1`` or ``None``, as ``open(p, "rb")``)."""
        return self.readall() if size is None or size < 0 else cast(bytes, super().read(size))

    def tell(self) -> int:
        self._check_open()
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._check_open()
        self._pos = seek_position(self._pos, self._size, offset, whence)
        return self._pos

    def readinto(self, buffer: WriteableBuffer) -> int:
        """Read up to ``len(buffer)`` bytes at the current position into ``buffer``.

        Raises:
            CorruptionError: a frame under the range fails a check (names the chunk and tensor).
            CodecUnavailableError: a frame's bitstream cannot be decoded on this device.
        """
        self._check_open()
        out = memoryview(buffer).cast("B")
        with self._lock:
            lo = self._pos
            n = max(0, min(len(out), self._size - lo))
            if n:
                self._fill(out[:n], lo)
                self._digest(out[:n], lo)
            self._pos = lo + n
            return n

    def readall(self) -> bytes:
        """The rest of the file in one read (the default would read it 8 KiB at a time)."""
        self._check_open()
        buf = bytearray(max(0, self._size - self._pos))
        view = memoryview(buf)
        got = 0
        while got < len(buf):
            n = self.readinto(view[got:])
            if not n:
                break
            got += n
        return bytes(buf[:got])

    def close(self) -> None:
        if self.closed:
            return
        try:
            engine, self._engine = getattr(self, "_engine", None), None
            if engine is not None:
                engine.close()
            file, self._file = getattr(self, "_file", None), None
            if file is not None and getattr(self, "_owned", True):
                file.close()
        finally:
            super().close()

    # -- what else it tells ----------------------------------------------------------------

    @property
    def size(self) -> int:
        """Bytes of the original file."""
        return self._size

    @property
    def decoder(self) -> FrameDecoder:
        """Its frames' decoder, a series container's reference found and checked (the native
        planes plan the restore of a reference container from it)."""
        return self._decoder

    @property
    def stats(self) -> ReadStats:
        """Frames decoded and container bytes read so far."""
        return ReadStats(self._decoder.frames_decoded, self._decoder.stored_bytes_read)

    def frames_over(self, offset: int, size: int) -> list[int]:
        """The frames that hold bytes ``[offset, offset + size)`` of the original file."""
        return self._decoder.frames_over(offset, offset + size)

    # -- inside ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")

    def _fill(self, out: memoryview, lo: int) -> None:
        """Copy original bytes ``[lo, lo + len(out))`` into ``out``, decoding frames as needed.

        Frames are started a window ahead of the one being copied, so a long read keeps the
        engine's threads busy while holding only that window in memory.
        """
        hi = lo + len(out)
        todo = iter(self._decoder.frames_over(lo, hi))
        window = max(2, self._engine.look_ahead if self._engine is not None else 2)
        queue: deque[tuple[int, np.ndarray | Future[np.ndarray]]] = deque()

        def top_up() -> None:
            while len(queue) < window and (i := next(todo, None)) is not None:
                cached = self._cache.get(i)
                if cached is not None:
                    self._cache.move_to_end(i)
                queue.append((i, cached if cached is not None else self._decoder.start(i)))

        try:
            top_up()
            while queue:
                i, got = queue.popleft()
                top_up()
                pieces = self._decoder.frames[i].pieces
                if isinstance(got, np.ndarray):
                    data = got
                else:
                    data = self._decoder.finish(i, got)
                    # Only a frame this read leaves bytes of is kept. One it covers whole is
                    # done with, and keeping it would evict the frames that the neighbours of
                    # a large tensor, in other streams, still share (a 100 MB tensor's frames
                    # would flush the whole cache).
                    if any(at < lo or at + n > hi for at, _, n in pieces):
                        self._keep(i, data)
                for at, within, n in pieces:
                    s, e = max(lo, at), min(hi, at + n)
                    if s < e:
                        out[s - lo : e - lo] = data.data[within + s - at : within + e - at]
        finally:
            for _, got in queue:  # a failed read leaves no decoding behind
                if isinstance(got, Future):
                    got.cancel()

    def _keep(self, i: int, data: np.ndarray) -> None:
        self._cache[i] = data
        self._cached += data.size
        while self._cached > self._cache_bytes and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cached -= old.size

    def _digest(self, data: memoryview, lo: int) -> None:
        if lo != self._hashed or self._hashed >= self._size:
            return
        self._hasher.update(data)
        self._hashed += len(data)
        if self._hashed == self._size and self._hasher.digest() != self.index.source_digest:
            raise CorruptionError("restored file does not match the original's digest", path=self.name)


def is_container(path: str | os.PathLike[str]) -> bool:
    """Whether the file at ``path`` is to be read as a ``.ckptz`` container: it starts with
    the magic, or is a damaged or truncated container (first bytes near the magic, the
    footer's magic at its end, or a ``.ckptz`` name), which then raises
    :class:`~ckptz.errors.CorruptionError` when opened rather than read as a plain file.

    Raises:
        OSError: ``path`` cannot be read.
    """
    with builtins.open(path, "rb") as f:
        return looks_like_container(f, os.fspath(path))


def open(
    path: str | os.PathLike[str], mode: str = "rb", *, device: str = "cpu", cache_bytes: int = CACHE_BYTES
) -> ContainerReader | io.BufferedReader:
    """Open a container (or a plain file) for reading its original bytes.

    A container gives a :class:`ContainerReader`, which decodes frames as reads reach them;
    a plain file opens as itself (``builtins.open(path, "rb")``), so callers need not know
    which one they have.

    Args:
        path: a ``.ckptz`` container or any file.
        mode: ``"rb"`` (``"r"`` is taken to mean the same); containers are read-only.
        device: where frames are decoded (``cpu``, ``cuda[:N]``, ``auto``).
        cache_bytes: decoded frames kept for later reads.

    Raises:
        UsageError: a mode other than reading.
        ContainerError: the container's index is damaged.
        OSError: the file cannot be opened.
    """
    if mode not in ("rb", "r"):
        raise UsageError(f"mode {mode!r} is not supported", hint="containers open read-only: use 'rb'")
    if is_container(path):
        return ContainerReader(path, device=device, cache_bytes=cache_bytes)
    return builtins.open(Path(path), "rb")


__all__ = ["CACHE_BYTES", "ContainerReader", "ReadStats", "is_container", "open"]
