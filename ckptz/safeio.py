"""Writing files so that a crash, a full disk or a kill never leaves a wrong file under a final name.

Every output is written to a temporary file in the destination folder, flushed and fsynced,
checked, then atomically renamed; the folder is fsynced after each rename. Temporary files
are named ``.<final name>.ckptz-tmp-<pid>-<8 hex digits>``: hidden, tied to the name they
will take, and matched exactly by :func:`is_temp`, so a rerun recognises and removes them and
never takes user data for one.
"""

from __future__ import annotations

import errno
import os
import queue
import re
import secrets
import shutil
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from ckptz.errors import OutOfSpaceError, WriteError

TMP_MARK = ".ckptz-tmp-"
_TEMP_NAME = re.compile(r"\.(?P<final>.+)" + re.escape(TMP_MARK) + r"[0-9]+-[0-9a-f]{8}")


def is_temp(path: Path) -> bool:
    """True for a temporary file ckptz left behind (never user data)."""
    return _TEMP_NAME.fullmatch(path.name) is not None


def temp_path(final: Path) -> Path:
    """A fresh temporary name beside ``final`` (see the module docstring for its form)."""
    return final.parent / f".{final.name}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"


def stale_temps(final: Path) -> list[Path]:
    """Temporary files a killed run left for ``final`` (they are never complete outputs)."""
    try:
        names = os.listdir(final.parent)
    except OSError:
        return []
    out = []
    for name in names:
        m = _TEMP_NAME.fullmatch(name)
        if m is not None and m["final"] == final.name:
            out.append(final.parent / name)
    return out


def remove_temp(path: Path) -> None:
    """Remove a leftover temporary file; only names :func:`is_temp` accepts are ever touched."""
    if is_temp(path):
        _unlink_quietly(path)


def fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def os_error(exc: OSError, path: Path) -> OutOfSpaceError | WriteError:
    """Turn an OSError from writing ``path`` into ckptz's error with a hint."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return OutOfSpaceError(
            "no space left on the device", path=str(path), hint="free space and run the same command again"
        )
    reason = exc.strerror or str(exc)
    return WriteError(f"cannot write ({reason})", path=str(path), hint="check permissions and free space")


@contextmanager
def atomic_output(final: Path) -> Iterator[tuple[BinaryIO, Path]]:
    """Yield ``(file, temp path)``; on success fsync and rename to ``final``, else remove the temp.

    The caller may check the temp file's content before the block ends; the rename happens
    only if the block returns normally.
    """
    tmp = temp_path(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        f = _open_temp(tmp)
    except OSError as exc:
        raise os_error(exc, final) from None
    try:
        try:
            yield f, tmp
            f.flush()
            os.fsync(f.fileno())
        finally:
            f.close()
        os.replace(tmp, final)
        fsync_dir(final.parent)
    except OSError as exc:
        _unlink_quietly(tmp)
        if exc.filename is not None and exc.filename not in (str(tmp), str(final)):
            raise  # reading some other file failed: not a write error, keep its own name
        raise os_error(exc, final) from None
    except BaseException:
        _unlink_quietly(tmp)
        raise


#: Bytes between the writer's requests that the kernel start writing a file back to disk.
WRITEBACK_EVERY = 64 << 20


def _start_writeback(f: BinaryIO, offset: int, length: int) -> None:
    """Ask the kernel to start writing ``length`` bytes at ``offset`` to disk, without waiting.

    Every output is fsynced before its rename; without this, the whole file's writeback
    happens inside that fsync, after the work. ``POSIX_FADV_DONTNEED`` starts asynchronous
    writeback of the range's dirty pages on Linux (and drops its clean ones: nothing here
    reads them again soon); elsewhere this does nothing.
    """
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return
    try:
        fd = f.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a real file (a test double): nothing to write back
    f.flush()
    advise(fd, offset, length, os.POSIX_FADV_DONTNEED)


class BackgroundWriter:
    """Writes to a file on a thread of its own, so the caller's reads and hashing overlap them.

    :meth:`write` queues a buffer, which the caller must not change afterwards; :meth:`close`
    waits until everything queued is written. The first write error stops all later writes
    and is raised by the next :meth:`write` or by :meth:`close`. Every
    :data:`WRITEBACK_EVERY` bytes it asks the kernel to start writing them to disk, so the
    final fsync finds little left to do.

    Args:
        f: the open file.
        depth: buffers queued at most (the caller blocks beyond that).
    """

    def __init__(self, f: BinaryIO, depth: int = 64) -> None:
        self._f = f
        self._queue: queue.Queue[bytes | memoryview | None] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ckptz-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        written = started = 0
        while (data := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._f.write(data)
                    written += len(data)
                    if written - started >= WRITEBACK_EVERY:
                        _start_writeback(self._f, started, written - started)
                        started = written
                except BaseException as exc:
                    self._error = exc

    def write(self, data: bytes | memoryview) -> int:
        """Queue ``data``; raise the error of an earlier write, if any."""
        if self._error is not None:
            raise self._error
        self._queue.put(data)
        return len(data)

    def close(self) -> None:
        """Wait for every queued write; raise the first write error."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        if self._error is not None:
            raise self._error


@contextmanager
def background_writes(f: BinaryIO, depth: int = 64) -> Iterator[BackgroundWriter]:
    """A :class:`BackgroundWriter` on ``f``, closed (all written) when the block ends."""
    writer = BackgroundWriter(f, depth)
    try:
        yield writer
    except BaseException:
        with suppress(BaseException):
            writer.close()  # the block's own error is the one to report
        raise
    writer.close()


def _open_temp(tmp: Path) -> BinaryIO:
    """Create the temporary file (exclusive); tests replace this to inject write faults."""
    return open(tmp, "xb")


def copy_file(src: Path, final: Path) -> None:
    """Copy a non-checkpoint file unchanged (metadata included), atomically."""
    with atomic_output(final) as (f, tmp):
        with open(src, "rb") as s:
            shutil.copyfileobj(s, f, 8 << 20)
        f.flush()
        shutil.copystat(src, tmp)


def remove(path: Path) -> None:
    """Remove a file that is safely represented elsewhere, and make that durable."""
    os.unlink(path)
    fsync_dir(path.parent)


def _unlink_quietly(path: Path) -> None:
    with suppress(OSError):
        os.unlink(path)


def pwrite_all(fd: int, parts: Sequence[bytes | memoryview], offset: int) -> None:
    """Write ``parts`` back to back at ``offset`` of ``fd``, retrying short writes.

    Every output byte the pipeline writes goes through here (from many threads at once, at
    offsets known in advance); tests replace it to inject write faults.
    """
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        n = os.pwritev(fd, views, offset)
        offset += n
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]
