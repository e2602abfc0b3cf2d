r"""Writing one output from many threads at once through shared mappings of it (tmpfs).

Linux serialises writes to one file on the file's lock, so ``pwrite``\ s from many threads
into one tmpfs file move little more than one thread's; copies into shared mappings of it
take no such lock and move markedly more. A restore writes every original byte into one file, and a compression of a large file most
of them: on tmpfs, that lock was their wall. On ext4 the same copies ran no faster than
``pwrite`` into the page cache, and whole commands writing to the disk with ``fsync`` were
slower (ext4 starts a journal handle at a page's first write through a mapping), so mappings are used on tmpfs only (:data:`FILE_SYSTEMS`).

Safety. A copy into a mapped page that the file system cannot back (it is full) raises
``SIGBUS`` and kills the process, where ``pwrite`` returns ``ENOSPC``. So the space of every
byte a mapping is written at is reserved first (``fallocate``, which fails cleanly with
``ENOSPC``: tests/test_mapped.py fills a small tmpfs, and without the reservation the process
dies of ``SIGBUS``). Writes under :data:`MIN_BYTES`, files not open for reading and writing,
and every other file system are written with ``pwrite`` as before.

The reservation runs up to :data:`STEP` bytes ahead of the writes without changing the
file's size, which only ever grows to the end of a write about to be made, so the file is
at every moment as long as ``pwrite``\ s would have made it (compressing in place reads its
index back from its end before the run is over). :meth:`MappedOutput.finish` gives back what
was reserved past the end. Each write maps only its own range and unmaps it once copied, so
the mapped pages are never more than the writes in flight (and count as the process's
memory only meanwhile).

Reserving ahead must never fail a run that ``pwrite``\ s would have fitted (several
outputs written at once each ran ahead into the room the others' writes needed): it runs
at most an :data:`AHEAD_SHARE` of the free space ahead, and where a write's own bytes
cannot be reserved, every output of the process on that file system gives back what it
reserved past its end, none runs ahead there any more while they are open, and the
write's bytes are reserved again. Only when that fails too does the write fail with
``ENOSPC``: then the file system cannot hold them.

A file whose final size is known before it is written (a restore: the container records
it) is sized at once (:meth:`MappedOutput.expect`: a file system without that much free
space fails there, before any byte is written) and written through mappings of
:data:`WINDOW` bytes, each made at its first write and unmapped once every byte of it is
written: no system call per write, writes of any size copied, and mapped pages still bounded by the windows being written. Its space is reserved
by a thread of its own (:class:`_Reserver`), :data:`STEP` bytes at a time from the start,
while the restore runs; a window it has not reached when a writer needs it is reserved
next, and the writer waits for it before mapping it. Reserving on tmpfs clears every page,
so reserving a large file whole up front would delay the restore's start by most of a
second.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import mmap
import os
import struct
import sys
import threading
import weakref
from collections.abc import Sequence

from ckptz import trace

#: File systems written through mappings (``statfs`` magic numbers): those where it was
#: measured to pay, and where a reserved range then takes writes without allocating.
FILE_SYSTEMS = {0x01021994: "tmpfs"}
#: Writes smaller than this are ``pwrite``\ s: mapping costs two system calls and a fault
#: per page, and the file's lock is held only briefly.
MIN_BYTES = 1 << 20
#: Bytes reserved at once ahead of the writes (fewer, larger ``fallocate`` calls).
STEP = 256 << 20
#: Reserving ahead takes at most this share of the file system's free space, so that the
#: outputs written beside it find room for their own writes.
AHEAD_SHARE = 8
#: Bytes of a file of known size mapped at once (:meth:`MappedOutput.expect`).
WINDOW = 64 << 20


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, with ``fallocate`` and ``fstatfs`` (Linux), loaded on first use."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        libc.fstatfs.argtypes = [ctypes.c_int, ctypes.c_char_p]
    except (AttributeError, OSError):
        return None
    return libc


_KEEP_SIZE = 1  # FALLOC_FL_KEEP_SIZE


def file_system(fd: int) -> int | None:
    """The ``statfs`` magic number of the file system ``fd`` is on (None where unknown)."""
    libc = _libc()
    if libc is None:
        return None
    buf = ctypes.create_string_buffer(256)  # struct statfs: f_type, a long, comes first
    if libc.fstatfs(fd, buf) != 0:
        return None
    return int(struct.unpack_from("l", buf.raw)[0]) & 0xFFFFFFFF


def reserve(fd: int, offset: int, length: int) -> None:
    """Reserve the space of ``length`` bytes at ``offset`` without changing the file's size.

    Raises:
        OSError: ``ENOSPC`` where there is no room for them, or what else ``fallocate`` says.
    """
    libc = _libc()
    assert libc is not None
    if libc.fallocate(fd, _KEEP_SIZE, offset, length) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def open_output(fd: int) -> MappedOutput | None:
    """A :class:`MappedOutput` for ``fd`` where mapped writes are safe and possible: a
    regular file open for reading and writing, on one of :data:`FILE_SYSTEMS`; else None."""
    if _libc() is None:
        return None
    try:
        import fcntl
        import stat

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDWR:
            return None  # a shared writable mapping needs the file open for reading too
    except (ImportError, OSError):
        return None
    kind = file_system(fd)
    if kind not in FILE_SYSTEMS:
        return None
    return MappedOutput(fd)


#: The outputs of this process written through mappings now: one that has no room for its
#: own bytes makes the others on its file system give back what they reserved ahead.
_LIVE: weakref.WeakSet[MappedOutput] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()
#: File systems (``st_dev``) found short of room: outputs on them reserve no more ahead
#: (the room given back stays for the writes that need it) until none is open there.
_SHORT: set[int] = set()


def _give_back_ahead(but: MappedOutput | None, fd: int) -> None:
    """Have every live output on the file system of ``fd`` other than ``but`` give back the
    space it reserved ahead, and none reserve ahead there from now on."""
    device = os.fstat(fd).st_dev
    with _LIVE_LOCK:
        _SHORT.add(device)
        others = [o for o in _LIVE if o is not but and o.device == device]
    for other in others:
        other.give_back_ahead()


def _is_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


class MappedOutput:
    r"""One regular file written at known offsets by many threads (see the module docstring).

    The file's size is at every moment what ``pwrite``\ s of the same bytes would have made
    it (the end of the last byte written): space is reserved past it without changing it,
    and the size grows to a mapped write's end before the write.

    Args:
        fd: the file, open for reading and writing; it must outlive this object's writes.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()
        #: The file's size, and the bytes whose space is reserved (at least that).
        self.size = self.reserved = os.fstat(fd).st_size
        #: The final size, once :meth:`expect` was told it, and the windows being written.
        self.final: int | None = None
        self._windows: dict[int, _Window] = {}
        #: Reserves the space of a file of known size (:meth:`expect`).
        self._reserver: _Reserver | None = None
        st = os.fstat(fd)
        self.device, self._inode = st.st_dev, (st.st_dev, st.st_ino)
        self._closed = False
        with _LIVE_LOCK:
            _LIVE.add(self)

    def expect(self, size: int) -> None:
        """The file will be ``size`` bytes: size it now, start reserving its space in the
        background, and write every later byte before ``size`` through windows of
        :data:`WINDOW` bytes (see the module docstring). Its size is then ``size`` from
        here on.

        Raises:
            OSError: ``ENOSPC`` where the file system has less free space than the bytes
                not reserved yet (nothing is changed then).
        """
        if size <= 0:
            return
        with self._lock:
            missing = size - self.reserved
        if missing > 0 and _free_bytes(self.fd) < missing:
            _give_back_ahead(self, self.fd)  # other outputs may hold it only reserved ahead
            if _free_bytes(self.fd) < missing:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.grow(size)
        self.final = size
        if missing > 0:
            self._reserver = _Reserver(self.fd, self.reserved, size)

    def write(self, views: Sequence[memoryview], offset: int) -> None:
        """Write ``views`` (byte views) back to back at ``offset``."""
        n = sum(len(v) for v in views)
        if not n:
            return  # as ``pwrite``: nothing written, the size unchanged wherever ``offset`` is
        if self.final is not None and offset + n <= self.final:
            for v in views:
                self._to_windows(v, offset)
                offset += len(v)
            return
        if n < MIN_BYTES:
            self.grow(offset + n)  # every change of the size under the lock, never down
            try:
                pwrite_views(self.fd, list(views), offset)
            except OSError as exc:
                if not _is_full(exc):
                    raise
                _give_back_ahead(self, self.fd)  # the room may be held only reserved ahead
                pwrite_views(self.fd, list(views), offset)
            return
        self._make_room(offset + n)
        self._copy(views, offset, n)

    def close(self) -> None:
        """Stop reserving, and unmap the windows left (of a file not written whole, or a
        failed run); once no write is under way."""
        self.give_back_ahead(closing=True)  # before it leaves _LIVE: no room held unseen
        with _LIVE_LOCK:
            _LIVE.discard(self)
            if not any(o.device == self.device for o in _LIVE):
                _SHORT.discard(self.device)  # the outputs that were short of room are done
        if self._reserver is not None:
            self._reserver.stop()  # within one STEP: the descriptor must outlive its calls
            self.reserved = max(self.reserved, self._reserver.prefix())
            self._reserver = None
        with self._lock:
            windows, self._windows = list(self._windows.values()), {}
        for w in windows:
            w.map.close()

    def finish(self) -> None:
        """Give back the space reserved past the file's end (the file keeps its size)."""
        self.close()
        with self._lock:
            size = max(self.size, os.fstat(self.fd).st_size)  # bytes written by other means too
            if self.reserved > size:
                os.ftruncate(self.fd, size)  # frees the pages past the end
            self.reserved = self.size = size

    def _make_room(self, end: int) -> None:
        """Reserve the space of every byte before ``end`` (and some ahead, see the module
        docstring), and make the file at least that long, so that a mapping of it can be
        written.

        Raises:
            OSError: ``ENOSPC`` where the file system cannot hold the bytes before ``end``.
        """
        with self._lock:
            if self._reserve_to(end, ahead=True):
                return
        _give_back_ahead(self, self.fd)  # other outputs may hold the room only reserved ahead
        with self._lock:
            if not self._reserve_to(end, ahead=False):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def _reserve_to(self, end: int, *, ahead: bool) -> bool:
        """Under the lock: reserve up to ``end`` (and ahead, where asked and there is room)
        and grow the file to ``end`` in the same hold of the lock, so that space reserved
        for a write is below the file's end before anyone could give it back. False where
        the file system has no room for the bytes before ``end``."""
        if end > self.reserved:
            wants = [end]
            if ahead and self.device not in _SHORT:
                run_ahead = self.reserved + min(STEP, _free_bytes(self.fd) // AHEAD_SHARE)
                if run_ahead > end:
                    wants.insert(0, run_ahead)
            for want in wants:
                try:
                    reserve(self.fd, self.reserved, want - self.reserved)
                except OSError as exc:
                    if not _is_full(exc):
                        raise
                    continue
                self.reserved = want
                break
            else:
                return False
        self._grow_locked(end)
        return True

    def give_back_ahead(self, *, closing: bool = False) -> None:
        """Give back the space reserved past the file's end (another output needs it); a
        later write past the end reserves again. Nothing once closed (``closing``: this is
        the last time), as the caller closes the descriptor next."""
        with self._lock:
            if self._closed:
                return
            self._closed = closing
            if self.reserved <= self.size:
                return
            st = os.fstat(self.fd)
            end = max(self.size, st.st_size)  # bytes written by other means too
            if (st.st_dev, st.st_ino) == self._inode and self.reserved > end:
                os.ftruncate(self.fd, end)  # frees the pages past the end
                self.reserved = end

    def grow(self, end: int) -> None:
        """Make the file at least ``end`` bytes long."""
        with self._lock:
            self._grow_locked(end)

    def _grow_locked(self, end: int) -> None:
        if end > self.size:
            os.ftruncate(self.fd, end)
            self.size = end

    def _to_windows(self, view: memoryview, offset: int) -> None:
        """Copy ``view`` to ``offset`` through the windows it falls in."""
        import numpy as np  # here: ``ckptz --help`` imports this module, and no numpy

        assert self.final is not None
        src = np.frombuffer(view, np.uint8)
        done = 0
        while done < src.size:
            at = offset + done
            k = at // WINDOW
            if self._reserver is not None:
                with trace.span("wait reserve"):
                    self._reserver.wait(k)  # its space reserved before it is mapped
            with self._lock:
                w = self._windows.get(k)
                if w is None:
                    start = k * WINDOW
                    length = min(WINDOW, self.final - start)
                    m = mmap.mmap(
                        self.fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=start
                    )
                    w = self._windows[k] = _Window(m, length)
                w.users += 1
            n = min(src.size - done, (k + 1) * WINDOW - at)
            try:
                target = np.frombuffer(w.map, np.uint8)  # numpy copies without the GIL
                target[at - k * WINDOW : at - k * WINDOW + n] = src[done : done + n]
                del target
            finally:
                with self._lock:
                    w.users -= 1
                    w.left -= n
                    spent = w.left <= 0 and w.users == 0 and self._windows.get(k) is w
                    if spent:
                        del self._windows[k]
                if spent:
                    w.map.close()  # every byte of it written: its pages leave the process
            done += n

    def _copy(self, views: Sequence[memoryview], offset: int, n: int) -> None:
        import numpy as np  # here: ``ckptz --help`` imports this module, and no numpy

        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        # Pages are faulted in as they are copied to: mapping them all at once (MAP_POPULATE)
        # halved the rate on tmpfs.
        m = mmap.mmap(
            self.fd, offset + n - start, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=start
        )
        try:
            target = np.frombuffer(m, np.uint8)  # numpy copies without the GIL
            at = offset - start
            for v in views:
                target[at : at + len(v)] = np.frombuffer(v, np.uint8)
                at += len(v)
            del target
        finally:
            m.close()


def _free_bytes(fd: int) -> int:
    """Bytes the file system of ``fd`` has free for this user."""
    free = os.fstatvfs(fd)
    return free.f_bavail * free.f_frsize


class _Reserver:
    """Reserves the windows of a file of known size in a thread of its own: :data:`STEP`
    bytes at a time in order from the start (where a restore's writes begin), but first any
    window a writer waits for. Only this thread reserves the file's space: ``fallocate``
    holds the file's lock throughout, and writers reserving their own windows beside it
    waited for nearly all of it, stalling the restore with them.

    Args:
        fd: the file (open until :meth:`stop`).
        start: bytes already reserved from the file's start.
        final: the file's size.
    """

    def __init__(self, fd: int, start: int, final: int) -> None:
        self._fd, self._final = fd, final
        self._count = -(-final // WINDOW)
        self._next = min(start // WINDOW, self._count)  # windows before it are ready
        self._ready = bytearray(b"\x01" * self._next + bytes(self._count - self._next))
        self._wanted: list[int] = []
        self._error: OSError | None = None
        self._stopping = False
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="ckptz-reserve", daemon=True)
        self._thread.start()

    def wait(self, k: int) -> None:
        """Return once window ``k`` is reserved.

        Raises:
            OSError: reserving it (or an earlier step) failed, e.g. ``ENOSPC``.
        """
        if self._ready[k]:
            return
        with self._cv:
            while not self._ready[k]:
                if self._error is not None:
                    raise OSError(self._error.errno, self._error.strerror)
                if not self._thread.is_alive():  # stopped: no write may still be under way
                    raise RuntimeError("a write after the output was closed")
                self._wanted.append(k)
                self._cv.notify_all()
                self._cv.wait()

    def prefix(self) -> int:
        """Bytes reserved from the file's start, in one piece."""
        with self._cv:
            self._skip_ready()
            return min(self._next * WINDOW, self._final)

    def stop(self) -> None:
        """Stop after the current step, and wait for it."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self._thread.join()

    def _skip_ready(self) -> None:
        while self._next < self._count and self._ready[self._next]:
            self._next += 1

    def _run(self) -> None:
        step = max(1, STEP // WINDOW)
        while True:
            with self._cv:
                k, n = -1, 1
                while self._wanted and k < 0:
                    w = self._wanted.pop()
                    k = -1 if self._ready[w] else w
                if k < 0:
                    self._skip_ready()
                    k, n = self._next, min(step, self._count - self._next)
                if self._stopping or k >= self._count:
                    return
            start = k * WINDOW
            length = min(n * WINDOW, self._final - start)
            try:
                with trace.span("reserve"):
                    try:
                        reserve(self._fd, start, length)
                    except OSError as exc:
                        if not _is_full(exc):
                            raise
                        _give_back_ahead(None, self._fd)  # the room may be held only reserved ahead
                        reserve(self._fd, start, length)
            except OSError as exc:
                with self._cv:
                    self._error = exc
                    self._cv.notify_all()
                return
            with self._cv:
                self._ready[k : k + n] = b"\x01" * n
                self._cv.notify_all()


class _Window:
    """A window of a file of known size being written: its mapping, the writes in it now,
    and the bytes of it not yet written."""

    __slots__ = ("left", "map", "users")

    def __init__(self, m: mmap.mmap, length: int) -> None:
        self.map, self.left, self.users = m, length, 0


def pwrite_views(fd: int, views: list[memoryview], offset: int) -> None:
    """``pwritev`` ``views`` back to back at ``offset``, retrying short writes."""
    while views:
        n = os.pwritev(fd, views, offset)
        offset += n
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


__all__ = [
    "AHEAD_SHARE",
    "FILE_SYSTEMS",
    "MIN_BYTES",
    "STEP",
    "WINDOW",
    "MappedOutput",
    "file_system",
    "open_output",
    "pwrite_views",
    "reserve",
]
