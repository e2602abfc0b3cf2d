"""Writing files so that a crash, a full disk or a kill never leaves a wrong file under a final name.

Every output is written to a temporary file in the destination folder, flushed and fsynced,
checked, then atomically renamed; the folder is fsynced after each rename. Temporary files
are named ``.<final name>.ckptz-tmp-<pid>-<8 hex digits>`` (a long name cut to keep the
whole within 255 bytes): hidden, tied to the name they will take, and matched exactly by
:func:`is_temp`, so a rerun recognises and removes them and never takes user data for one.
A writer holds an exclusive ``flock`` on its temp file while it writes, so a run that finds
a temp file another live run is writing stops with :class:`~ckptz.errors.BusyError`
instead of deleting it. A character device named as the output (``/dev/null``) is written
into instead, never replaced.

Outputs are created with their final permission bits (plus owner read/write while writing)
and get their final metadata before the rename (:mod:`ckptz.meta`).

Every output is created, renamed and removed relative to a descriptor of its folder, opened
once for it. Under the output roots of a run (:func:`confined`), that folder is opened one
component at a time from the root with ``O_NOFOLLOW``, as rsync and tar do: a folder swapped
for a symlink while the run goes on stops the run with
:class:`~ckptz.errors.UnsafePathError` instead of being written through.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import stat
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ckptz.codecs.native import native
from ckptz.errors import (
    BusyError,
    CkptzError,
    NameTakenError,
    OutOfSpaceError,
    SourceChangedError,
    UnsafePathError,
    UsageError,
    WriteError,
)
from ckptz.mapped import MappedOutput, open_output, pwrite_views
from ckptz.meta import FileMeta, apply_fd, create_mode, is_root

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no advisory locks
    fcntl = None  # type: ignore[assignment]

TMP_MARK = ".ckptz-tmp-"
_TEMP_NAME = re.compile(r"\.(?P<final>.+)" + re.escape(TMP_MARK) + r"[0-9]+-[0-9a-f]{8}")


def is_temp(path: Path) -> bool:
    """True for a temporary file ckptz left behind (never user data)."""
    return _TEMP_NAME.fullmatch(path.name) is not None


#: The longest file name in bytes that common file systems take.
_NAME_MAX = 255
#: What a temporary name adds to the final name at most: ".", the mark, a pid, "-", 8 digits.
_TEMP_EXTRA = 1 + len(TMP_MARK) + 10 + 1 + 8


def temp_stem(name: str) -> str:
    """``name`` as its temporary names carry it: cut where the whole temporary name would
    pass 255 bytes (a long final name that fits must not fail for its temporary name)."""
    raw = os.fsencode(name)
    if len(raw) + _TEMP_EXTRA <= _NAME_MAX:
        return name
    return os.fsdecode(raw[: _NAME_MAX - _TEMP_EXTRA])  # a cut character round-trips as bytes


def temp_path(final: Path) -> Path:
    """A fresh temporary name beside ``final`` (see the module docstring for its form)."""
    return final.parent / f".{temp_stem(final.name)}{TMP_MARK}{os.getpid()}-{os.urandom(4).hex()}"


def stale_temps(final: Path) -> list[Path]:
    """Temporary files a killed run left for ``final`` (they are never complete outputs)."""
    return stale_temps_of([final])


def stale_temps_of(finals: Iterable[Path]) -> list[Path]:
    """Temporary files killed runs left for any of ``finals``, each folder listed once (one
    listing per output made a folder of N files cost N² name checks: 3000 files, 17 % of
    a run's samples)."""
    by_folder: dict[Path, set[str]] = {}
    for final in finals:
        by_folder.setdefault(final.parent, set()).add(temp_stem(final.name))
    out = []
    for folder, names in by_folder.items():
        try:
            listing = os.listdir(folder)
        except OSError:
            continue
        for name in listing:
            m = _TEMP_NAME.fullmatch(name)
            if m is not None and m["final"] in names:
                out.append(folder / name)
    return out


def remove_temp(path: Path) -> None:
    """Remove a leftover temporary file; only names :func:`is_temp` accepts are ever touched.

    Raises:
        BusyError: a live ckptz run is writing it (it holds the file's lock).
    """
    if not is_temp(path):
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        _unlink_quietly(path)  # a symlink or an unreadable file of ckptz's name: still ours
        return
    try:
        if not try_lock(fd, exclusive=True):
            raise BusyError(
                "another ckptz run is writing here",
                path=str(path.parent / _TEMP_NAME.fullmatch(path.name)["final"]),  # type: ignore[index]
                hint="wait for it to finish, or stop it",
            )
        _unlink_quietly(path)
    finally:
        os.close(fd)


def try_lock(fd: int, *, exclusive: bool) -> bool:
    """Take an advisory ``flock`` on ``fd`` without waiting; False only if someone else holds it.

    Filesystems without ``flock`` (some network mounts) count as unlocked: the lock is a
    courtesy between ckptz runs, never what keeps data safe.
    """
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return True


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """A file as it was when opened for reading, before its first byte was read.

    An in-place run replaces a file only while its name still holds this: the same inode
    on the same device, unchanged size, mtime and ctime. A write in place moves mtime and
    ctime, a rename over the name brings another inode, so a file rewritten or replaced
    after it was read (a trainer saving ``last.ckpt`` again) is never taken for the bytes
    that were read.

    Attributes:
        path: the name it was opened by (never followed: a symlink there is another file).
        label: how the run names it to the user.
    """

    path: Path
    label: str
    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: Path, label: str, st: os.stat_result) -> FileIdentity:
        """``path`` as ``st`` (an ``fstat`` of it opened for reading) describes it."""
        return cls(path, label, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    @classmethod
    def open(cls, path: Path, label: str) -> tuple[FileIdentity, os.stat_result]:
        """Open ``path`` (without following a symlink) and ``fstat`` it: its identity and stat.

        Raises:
            OSError: it cannot be opened.
        """
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        return cls.of(path, label, st), st

    def holds(self, *, relinked: bool = False) -> bool:
        """Whether ``path`` is still this file, unchanged (``relinked``: its ctime may have
        moved, as removing another hard link to it moves it)."""
        try:
            st = os.lstat(self.path)
        except OSError:
            return False
        return (
            stat.S_ISREG(st.st_mode)
            and (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            == (self.device, self.inode, self.size, self.mtime_ns)
            and (relinked or st.st_ctime_ns == self.ctime_ns)
        )

    def check(self, *, relinked: bool = False) -> None:
        """Raise :class:`~ckptz.errors.SourceChangedError` unless :meth:`holds`."""
        if not self.holds(relinked=relinked):
            raise SourceChangedError((self.label,))


_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC

#: The output roots of the runs in progress (absolute paths) and a descriptor of each.
_ROOTS: dict[str, int] = {}
_ROOTS_LOCK = threading.Lock()


@contextmanager
def confined(roots: Iterable[Path]) -> Iterator[None]:
    """For the block, every folder below one of ``roots`` (existing folders a run writes in)
    is opened from the root one component at a time, never through a symlink
    (:func:`open_folder`). The roots themselves are opened now, as named."""
    mine: list[str] = []
    try:
        for root in roots:
            try:
                fd = os.open(root, _FOLDER_FLAGS)
            except OSError:
                continue  # not a folder (a file source, written beside): nothing to confine
            key = os.path.abspath(root)
            with _ROOTS_LOCK:
                if key in _ROOTS:
                    os.close(fd)
                    continue
                _ROOTS[key] = fd
            mine.append(key)
        yield
    finally:
        with _ROOTS_LOCK:
            for key in mine:
                os.close(_ROOTS.pop(key))


def _root_of(folder: str) -> tuple[str, int] | None:
    """The deepest confined root holding ``folder`` (an absolute path), with its descriptor."""
    with _ROOTS_LOCK:
        best = None
        for key, fd in _ROOTS.items():
            if (folder == key or folder.startswith(key.rstrip(os.sep) + os.sep)) and (
                best is None or len(key) > len(best[0])
            ):
                best = (key, fd)
        return None if best is None else (best[0], os.dup(best[1]))


def open_folder(folder: Path, *, create: bool = True) -> int:
    """A new descriptor of the output folder ``folder``, made first (with its parents) where
    ``create``. Below a confined root (:func:`confined`) each component is opened with
    ``O_NOFOLLOW`` from the root's descriptor; elsewhere the path is opened as named.

    Raises:
        UnsafePathError: a component below the root is a symlink or not a folder.
        OSError: the folder cannot be made or opened.
    """
    absolute = os.path.abspath(folder)
    found = _root_of(absolute)
    if found is None:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        return os.open(folder, _FOLDER_FLAGS)
    key, fd = found
    try:
        for part in Path(absolute[len(key) :]).parts:
            if part == os.sep:
                continue
            if create:
                with suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
            try:
                inner = os.open(part, _FOLDER_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafePathError(
                        "an output folder was replaced by a symlink or a file during the run;"
                        " nothing is written through it",
                        path=absolute,
                        hint="check who else writes there, then run again",
                    ) from None
                raise
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _fsync_fd(fd: int) -> None:
    with suppress(OSError):
        os.fsync(fd)


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


def os_error(exc: OSError, path: Path) -> CkptzError:
    """Turn an OSError from writing ``path`` into ckptz's error with a hint (one of ckptz's
    own is kept as it is)."""
    if isinstance(exc, CkptzError):
        return exc
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        # A check of ckptz's own (check_room) says how much is missing; the kernel's words do not.
        detail = exc.strerror if exc.strerror and exc.strerror != os.strerror(exc.errno) else None
        return OutOfSpaceError(
            f"no space left on the device ({detail})" if detail else "no space left on the device",
            path=str(path),
            hint="free space and run the same command again",
        )
    if exc.errno == errno.ENAMETOOLONG:
        return WriteError(
            "cannot write (the name is too long for the file system)", path=str(path), hint="shorten the name"
        )
    reason = exc.strerror or str(exc)
    return WriteError(f"cannot write ({reason})", path=str(path), hint="check permissions and free space")


_RENAME_NOREPLACE = 1


@functools.cache
def _renameat2() -> Callable[[int, bytes, int, bytes, int], int] | None:
    """libc's ``renameat2`` (Linux), or None where there is none."""
    import ctypes

    try:
        call = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    call.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    call.restype = ctypes.c_int
    return call


def rename_new(name: str, final: str, folder: int) -> None:
    """Rename ``name`` to ``final`` in the open ``folder`` only if no entry has that name:
    atomically (``RENAME_NOREPLACE``, else a hard link then an unlink), or where the file
    system allows neither, after looking.

    Raises:
        FileExistsError: ``final`` exists; nothing was renamed.
    """
    import ctypes

    call = _renameat2()
    if call is not None:
        if call(folder, os.fsencode(name), folder, os.fsencode(final), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), final)
    try:
        os.link(name, final, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        # No hard links here either: look, then rename (a narrow race, as any tool without them).
        try:
            os.lstat(final, dir_fd=folder)
        except FileNotFoundError:
            os.replace(name, final, src_dir_fd=folder, dst_dir_fd=folder)
            return
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), final) from None
    os.unlink(name, dir_fd=folder)


@contextmanager
def atomic_output(
    final: Path, meta: FileMeta | None = None, read: FileIdentity | None = None, *, replace: bool = True
) -> Iterator[tuple[BinaryIO, Path]]:
    """Yield ``(file, temp path)``; on success fsync and rename to ``final``, else remove the temp.

    The temp file is created with ``meta``'s permission bits (plus owner read/write) and gets
    ``meta`` (bits, mtime, owner as root) before the rename. The caller may check the temp
    file's content before the block ends; the rename happens only if the block returns normally
    and, given the file ``read`` that the output is made from, only while that file is
    unchanged (else :class:`~ckptz.errors.SourceChangedError`, the temp removed). Without
    ``replace``, a file another program put under ``final`` meanwhile is never renamed over
    (:class:`~ckptz.errors.NameTakenError`, the temp removed).
    """
    if is_device(final):
        yield from _device_output(final)
        return
    tmp = temp_path(final)
    folder = _output_folder(final)
    try:
        yield from _atomic_output_in(folder, final, tmp, meta, read, replace)
    finally:
        os.close(folder)


def _output_folder(final: Path) -> int:
    """A descriptor of ``final``'s folder, made first where missing.

    Raises:
        UsageError: a file is where the folder (or one above it) must be.
        WriteError: it cannot be made or opened.
    """
    try:
        return open_folder(final.parent)
    except (FileExistsError, NotADirectoryError) as exc:
        blocker = next(
            (p for p in (final.parent, *final.parent.parents) if p.exists() and not p.is_dir()), None
        )
        if blocker is None:
            raise os_error(exc, final) from None
        raise UsageError("a file is in the way of an output folder", path=str(blocker)) from None
    except OSError as exc:
        raise os_error(exc, final) from None


def is_device(path: Path) -> bool:
    """Whether ``path`` is a character device (``/dev/null``): an output written into, as
    ``torch.save`` and ``zstd -o`` write, never replaced by a renamed file.

    Raises:
        UsageError: ``path`` is a fifo, socket or block device, which ckptz does not write to.
    """
    try:
        mode = path.lstat().st_mode
    except OSError:
        return False
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISBLK(mode):
        raise UsageError(
            "output is not a regular file", path=str(path), hint="write to a file, or to stdout with -c"
        )
    return stat.S_ISCHR(mode)


def _device_output(final: Path) -> Iterator[tuple[BinaryIO, Path]]:
    """:func:`atomic_output` into a character device: written in place, nothing renamed,
    no metadata or fsync (a device has neither)."""
    try:
        f = os.fdopen(os.open(final, os.O_WRONLY | _CLOEXEC), "wb")
    except OSError as exc:
        raise os_error(exc, final) from None
    try:
        yield f, final
        f.flush()
    except OSError as exc:
        raise os_error(exc, final) from None
    finally:
        f.close()


def _atomic_output_in(
    folder: int, final: Path, tmp: Path, meta: FileMeta | None, read: FileIdentity | None, replace: bool
) -> Iterator[tuple[BinaryIO, Path]]:
    """:func:`atomic_output` once its folder is open as ``folder``."""
    try:
        f = _open_temp(tmp, create_mode(meta), folder)
    except OSError as exc:
        raise os_error(exc, final) from None
    try:
        mapped: MappedOutput | None = None
        try:
            with suppress(AttributeError, OSError, ValueError):
                try_lock(f.fileno(), exclusive=True)  # released when the file closes
                mapped = open_output(f.fileno())
                if mapped is not None:
                    _MAPPED[mapped.fd] = mapped
            yield f, tmp
            f.flush()
            if mapped is not None:
                mapped.finish()  # the space reserved past the end, given back
            if meta is not None:
                apply_fd(f.fileno(), meta)
            os.fsync(f.fileno())
        finally:
            if mapped is not None:
                _MAPPED.pop(mapped.fd, None)  # before the number can be reused
                mapped.close()
            f.close()
        if read is not None:
            read.check()  # the last moment before the output takes its name
        _rename(tmp.name, final, folder, replace, read.label if read is not None else str(final))
        _fsync_fd(folder)
    except OSError as exc:
        _unlink_quietly(tmp, folder)
        if exc.filename is not None and exc.filename not in (str(tmp), str(final), tmp.name, final.name):
            raise  # reading some other file failed: not a write error, keep its own name
        raise os_error(exc, final) from None
    except BaseException:
        _unlink_quietly(tmp, folder)
        raise


def _rename(name: str, final: Path, folder: int, replace: bool, label: str) -> None:
    """Give the entry ``name`` of ``folder`` its final name; without ``replace`` only while that
    name is free.

    Raises:
        NameTakenError: without ``replace``, ``final`` exists (``name`` is left as it is).
    """
    if replace:
        os.replace(name, final.name, src_dir_fd=folder, dst_dir_fd=folder)
        return
    try:
        rename_new(name, final.name, folder)
    except FileExistsError:
        raise NameTakenError(label, final.name) from None


#: The outputs of :func:`atomic_output` written through mappings, by descriptor (while open).
_MAPPED: dict[int, MappedOutput] = {}

#: Writes at least this large ask the kernel to start writing them back at once.
WRITEBACK_MIN = 256 << 10


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing ``length`` bytes at ``offset`` to disk, without waiting.

    Every output is fsynced before its rename; without this, the whole file's writeback
    happens inside that fsync, after the work. ``POSIX_FADV_DONTNEED`` starts asynchronous
    writeback of the range's dirty pages on Linux (and drops its clean ones); elsewhere
    this does nothing.
    """
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None and length >= WRITEBACK_MIN:
        advise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def _open_temp(tmp: Path, mode: int = 0o666, folder: int | None = None) -> BinaryIO:
    """Create the temporary file (exclusive, never through a symlink) with ``mode``, in the
    open ``folder`` where given; tests replace this to inject write faults."""
    # Readable too: compressing in place reads the container back before it is renamed.
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
    fd = os.open(tmp if folder is None else tmp.name, flags, mode, dir_fd=folder)
    return os.fdopen(fd, "wb")


COPY_BLOCK = 8 << 20


def copy_file(src: Path, final: Path, tick: Callable[[int], object] | None = None) -> None:
    """Copy a non-checkpoint file unchanged, with its permission bits, mtime (and owner as root).

    ``tick`` is called with each block's size (progress, and a chance to stop between blocks).
    """
    with open(src, "rb") as s:
        st = os.fstat(s.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise WriteError(
                "not a regular file", path=str(src), hint="ckptz copies only files, folders and links"
            )
        with atomic_output(final, FileMeta.of(st)) as (f, _tmp):
            while block := s.read(COPY_BLOCK):
                f.write(block)
                if tick is not None:
                    tick(len(block))


def link_file(existing: Path, final: Path, *, replace: bool = True, label: str | None = None) -> None:
    """Make ``final`` a hard link to ``existing``, atomically (a link under a temp name,
    renamed; without ``replace`` only while ``final`` is free, else
    :class:`~ckptz.errors.NameTakenError` naming ``label``)."""

    def make(name: str, folder: int) -> None:
        source = open_folder(existing.parent, create=False)
        try:
            os.link(existing.name, name, src_dir_fd=source, dst_dir_fd=folder, follow_symlinks=False)
        finally:
            os.close(source)

    _make_and_rename(make, final, replace, label or str(final))


def make_symlink(text: str, final: Path, meta: FileMeta | None = None) -> None:
    """Make ``final`` a symlink whose target is ``text`` (never resolved), atomically, with
    ``meta``'s mtime (and owner, as root) where given."""

    def make(name: str, folder: int) -> None:
        os.symlink(text, name, dir_fd=folder)
        if meta is not None:
            if is_root():
                os.chown(name, meta.uid, meta.gid, dir_fd=folder, follow_symlinks=False)
            if os.utime in os.supports_follow_symlinks and os.utime in os.supports_dir_fd:
                os.utime(name, ns=(meta.mtime_ns, meta.mtime_ns), dir_fd=folder, follow_symlinks=False)

    _make_and_rename(make, final)


def _make_and_rename(
    make: Callable[[str, int], None], final: Path, replace: bool = True, label: str = ""
) -> None:
    """``make`` an entry under a temp name in ``final``'s open folder and rename it there
    (removed on failure; without ``replace`` only while ``final`` is free, see :func:`_rename`);
    the folder is fsynced after."""
    tmp = temp_path(final)
    folder = _output_folder(final)
    try:
        make(tmp.name, folder)
        _rename(tmp.name, final, folder, replace, label or str(final))
        _fsync_fd(folder)
    except BaseException as exc:
        _unlink_quietly(tmp, folder)
        if isinstance(exc, OSError):
            raise os_error(exc, final) from None
        raise
    finally:
        os.close(folder)


def remove(path: Path) -> None:
    """Remove a file that is safely represented elsewhere, and make that durable."""
    folder = open_folder(path.parent, create=False)
    try:
        os.unlink(path.name, dir_fd=folder)
        _fsync_fd(folder)
    finally:
        os.close(folder)


def remove_read(read: FileIdentity, made: Path, *, relinked: bool = False) -> None:
    """Remove the file ``read`` now that ``made`` (the output made from it, already under its
    final name) represents it, but only while it is still the file that was read; else
    remove ``made`` instead, keep the file, and raise.

    Raises:
        SourceChangedError: the file changed after it was read (``made`` is removed).
        OSError: the removal failed.
    """
    if not read.holds(relinked=relinked):
        with suppress(OSError):
            remove(made)
        raise SourceChangedError((read.label,))
    remove(read.path)


def _unlink_quietly(path: Path, folder: int | None = None) -> None:
    with suppress(OSError):
        os.unlink(path if folder is None else path.name, dir_fd=folder)


def expect_size(fd: int, size: int) -> None:
    """``fd`` (an output of :func:`atomic_output`) will be ``size`` bytes: where it is written
    through mappings, reserve and size it whole now (:meth:`MappedOutput.expect`); elsewhere
    nothing changes.

    Raises:
        OSError: ``ENOSPC`` where the file system has no room for it.
    """
    mapped = _MAPPED.get(fd)
    if mapped is not None:
        mapped.expect(size)
    else:
        check_room(fd, size)


def check_room(fd: int, size: int) -> None:
    """Refuse to start writing ``fd`` to ``size`` bytes where its file system has less free
    space than that: a container may declare any size (a few hundred bytes of constant
    frames can claim terabytes), and a restore must fail before writing, not fill the disk.

    Raises:
        OSError: ``ENOSPC``, naming both sizes.
    """
    try:
        have = os.fstat(fd).st_size
        vfs = os.fstatvfs(fd)
    except OSError:
        return  # no figures to judge by: writing will say if there is no room
    # Root may use the blocks kept back for it; anyone else only those available to all.
    blocks = vfs.f_bfree if is_root() else vfs.f_bavail
    free = blocks * vfs.f_frsize
    if size - have > free:
        raise OSError(errno.ENOSPC, f"the file needs {size:,} bytes and its file system has {free:,} free")


def grow(fd: int, size: int) -> None:
    """Make ``fd`` at least ``size`` bytes long (never shorter), through its mapped output
    where it has one (which keeps its own record of the size)."""
    mapped = _MAPPED.get(fd)
    if mapped is not None:
        mapped.grow(size)
    elif os.fstat(fd).st_size < size:
        os.ftruncate(fd, size)


def pread_spans(fd: int, spans: Sequence[tuple[int, int]]) -> list[bytes]:
    """The bytes at each ``(offset, size)`` of a file (fewer past its end), in one call that
    gives the GIL up once: a file's thousands of small reads
    (a zip's local headers, the stream plan's samples), each made alone, each took the GIL
    back among a busy pipeline's threads."""
    if not spans:
        return []
    table = np.array(spans, np.int64).reshape(-1, 2)
    return list(native.pread_many(fd, np.ascontiguousarray(table[:, 0]), np.ascontiguousarray(table[:, 1])))


def first_difference(fd: int, data: np.ndarray, pieces: Sequence[tuple[int, int, int]]) -> int | None:
    """Read back each ``(file offset, offset in data, bytes)`` piece of a file and compare it
    with those bytes of ``data``: None where all are equal, else the file offset of the first
    difference found (a piece cut short by the file's end differs where it stops). One call
    that gives the GIL up once."""
    table = np.array(pieces, np.int64).reshape(-1, 3).T
    at = native.first_difference(fd, data, *(np.ascontiguousarray(column) for column in table))
    return None if at < 0 else int(at)


def pwrite_all(fd: int, parts: Sequence[bytes | memoryview], offset: int) -> None:
    """Write ``parts`` back to back at ``offset`` of ``fd``, retrying short writes.

    Every output byte the Python pipeline writes goes through here (from many threads at
    once, at offsets known in advance). An output made by
    :func:`atomic_output` on a file system that allows it is written through mappings of it
    (:mod:`ckptz.mapped`: writes to one file then run in parallel).
    """
    views = [memoryview(p).cast("B") for p in parts]
    n = sum(len(v) for v in views)
    mapped = _MAPPED.get(fd)
    if mapped is not None:
        mapped.write(views, offset)
    else:
        pwrite_views(fd, views, offset)
    _start_writeback(fd, offset, n)
