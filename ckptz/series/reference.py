"""Finding, checking and reading the reference of a series container.

A series container names its reference by a path relative to its own folder (the newer
checkpoint's container, ``../checkpoint-50/model.safetensors.ckptz``) and by the reference's
original size and whole-file digest. The reference is used in whichever form it has now:
the container it names, or, once that was decompressed, the plain file beside it without
the ``.ckptz`` suffix. Either must have the recorded digest (a container's header says it; a
plain file is hashed, with the recorded digest's kind), so a wrong or changed reference is
an error, never a wrong restore.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, TypeVar

from ckptz.container import SUFFIX
from ckptz.digest import TREE, Digest, Hasher, Kind, of_file
from ckptz.errors import ContainerError, ReferenceChangedError, ReferenceDamagedError, ReferenceMissingError

#: References followed at once (a chain is at most ``--keyframe-every`` long; a hostile
#: container that names itself stops here).
MAX_CHAIN = 64
_HASH_BLOCK = 8 << 20
_depth = threading.local()
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RefSpec:
    """What a container says about its reference (header ``reference``, FORMAT.md 1.2)."""

    path: str
    size: int
    digest: Digest

    @classmethod
    def from_json(cls, obj: Any, where: str) -> RefSpec:
        try:
            path, size, digest = str(obj["path"]), int(obj["size"]), Digest.from_json(obj)
        except (KeyError, TypeError, ValueError) as exc:
            raise ContainerError(f"reference unreadable ({type(exc).__name__})", path=where) from None
        if digest is None:
            raise ContainerError("reference records no digest this ckptz knows", path=where)
        pure = PurePosixPath(path)
        if not path or "\x00" in path or pure.is_absolute() or not pure.name.endswith(SUFFIX) or size < 0:
            raise ContainerError("reference names an impossible path or size", path=where)
        return cls(path, size, digest)

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "size": self.size, **self.digest.to_json()}


class ReferenceBytes(Protocol):
    """The original bytes of a reference, read at any offset from any thread."""

    def read(self, offset: int, n: int) -> bytes: ...

    def close(self) -> None: ...


class PlainReference:
    """A reference that is a plain (uncompressed) file."""

    def __init__(self, path: Path) -> None:
        self._fd = -1  # close() and __del__ see a descriptor even when opening fails
        self._fd = os.open(path, os.O_RDONLY)

    def read(self, offset: int, n: int) -> bytes:
        return os.pread(self._fd, n, offset)

    def fileno(self) -> int:
        """The open descriptor (the native planes read the reference through it)."""
        return self._fd

    def digest(self, kind: Kind = TREE) -> Digest:
        """The file's whole-file digest, read through the open descriptor."""
        return of_file(self._fd, kind)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()


class _OpenedFolders:
    """The folders of the reference containers this process holds open, by inode.

    A reference container is opened once, by its path, and read through that descriptor
    from then on; a reference of its own is found beside it, in the folder it was opened
    in. Once opened it may be removed (an in-place decompress restores it beside the
    container, then removes the container) while it is still read: its inode lives on while
    open, and this table still says where it lay.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._paths: dict[tuple[int, int], tuple[Path, int]] = {}

    def add(self, fd: int, path: Path) -> tuple[int, int]:
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        with self._lock:
            _, count = self._paths.get(key, (path, 0))
            self._paths[key] = (path, count + 1)
        return key

    def remove(self, key: tuple[int, int]) -> None:
        with self._lock:
            path, count = self._paths.pop(key)
            if count > 1:
                self._paths[key] = (path, count - 1)

    def get(self, st: os.stat_result) -> Path | None:
        with self._lock:
            found = self._paths.get((st.st_dev, st.st_ino))
        return None if found is None else found[0]


_opened = _OpenedFolders()


class ContainerReference:
    """A reference that is itself a container (and may have a reference of its own).

    The container is opened once and read only through that descriptor, so a reference
    found as a container stays readable if the container is removed meanwhile.

    Each thread reads through a reader of its own (a reader decodes the frames a read
    needs, in the calling thread), so the pipeline's threads restoring a delta read their
    counterparts in parallel rather than one at a time.

    A reference whose own bytes fail their checks raises
    :class:`~ckptz.errors.ReferenceDamagedError` naming it, for the container ``label`` that
    reads it: that container's bytes are not the ones at fault.

    Raises:
        FileNotFoundError: ``path`` is not there (restored and removed meanwhile).
        ReferenceDamagedError: its index is damaged.
    """

    def __init__(self, path: Path, label: str | None = None) -> None:
        from ckptz.library.reader import ContainerReader

        # close() and __del__ see every attribute even when opening fails.
        self._fd = -1
        self._key: tuple[int, int] | None = None
        self._readers: list[ContainerReader] = []
        self._lock = threading.Lock()
        self._path, self._label = path, label
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._key = _opened.add(self._fd, Path(os.path.realpath(path)))
            # Readers share the descriptor's offset while each reads its index: made one at a time.
            self._open = lambda: ContainerReader(path, device="cpu", fd=self._fd)
            self.reader = self._checked(self._open)
        except BaseException:
            self.close()
            raise
        self._local = threading.local()
        self._local.reader = self.reader
        self._readers.append(self.reader)

    def _checked(self, call: Callable[[], T]) -> T:
        """``call()``, a failure of the reference's own checks raised as the reference's damage
        (one further down its chain, already worded so, as it is)."""
        try:
            return call()
        except ReferenceMissingError:
            raise
        except ContainerError as exc:
            if self._label is None:
                raise
            raise damaged(self._path, self._label, exc) from None

    def read(self, offset: int, n: int) -> bytes:
        reader = getattr(self._local, "reader", None)
        if reader is None:
            with self._lock:
                reader = self._local.reader = self._checked(self._open)
                self._readers.append(reader)
        reader.seek(offset)
        return self._checked(lambda: reader.read(n)) or b""

    def close(self) -> None:
        with self._lock:
            readers, self._readers = self._readers, []
            fd, self._fd = self._fd, -1
            key, self._key = self._key, None
        for reader in readers:
            reader.close()
        if key is not None:
            _opened.remove(key)
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()


def locate(fd: int, path: str) -> Path:
    """Where the open container ``fd`` (shown as ``path``) lies, to find what it names beside it.

    Raises:
        ReferenceMissingError: it cannot be found (read from a pipe or a deleted file).
    """
    st = os.fstat(fd)
    opened = _opened.get(st)
    if opened is not None:
        return opened
    candidates = [Path(path), Path(f"/proc/self/fd/{fd}")]
    for c in candidates:
        try:
            real = Path(os.path.realpath(c))
            if os.path.samestat(os.stat(real), st):
                return real
        except OSError:
            continue
    raise ReferenceMissingError(
        "is a series delta, and its folder (where its reference lies) cannot be found",
        reference="?",
        path=path,
        hint="restore it from its place in the run folder",
    )


def open_reference(container: Path, spec: RefSpec, label: str) -> ReferenceBytes:
    """Open ``container``'s reference, checked to be the file it was coded against.

    Raises:
        ReferenceMissingError: neither the reference container nor its restored file exists.
        ReferenceChangedError: it exists but has another digest or size.
    """
    depth = getattr(_depth, "n", 0)
    if depth >= MAX_CHAIN:
        raise ContainerError(f"reference chain longer than {MAX_CHAIN} (a cycle?)", path=label)
    _depth.n = depth + 1
    try:
        return _open(_shown(container.parent / spec.path), spec, label)
    finally:
        _depth.n = depth


def _open(target: Path, spec: RefSpec, label: str) -> ReferenceBytes:
    plain = target.with_name(target.name.removesuffix(SUFFIX))
    if _is_file(target):
        try:
            ref = ContainerReference(target, label)
        except FileNotFoundError:
            pass  # decompressed meanwhile: the plain file below
        else:
            try:
                same = ref.reader.index.source_size == spec.size and ref._checked(
                    lambda: _same(ref, spec.digest)
                )
            except BaseException:
                ref.close()
                raise
            if not same:
                ref.close()
                raise _changed(spec, label)
            return ref
    if _is_file(plain):
        if os.stat(plain).st_size != spec.size:
            raise _changed(spec, label)
        ref_plain = PlainReference(plain)
        if ref_plain.digest(spec.digest.kind) != spec.digest:
            ref_plain.close()
            raise _changed(spec, label)
        return ref_plain
    raise ReferenceMissingError(
        f"needs its reference {spec.path}, which is missing",
        reference=spec.path,
        path=label,
        hint="put it back; to delete a checkpoint, first `ckptz detach` the next older one",
    )


def _same(ref: ContainerReference, digest: Digest) -> bool:
    """Whether the reference container's original has ``digest``. Its header says so when it
    records a digest of the same kind; a container re-made since (a 1.3 container
    decompressed and compressed again records the other kind) is read through to hash its
    original with ``digest``'s kind (its own digest is checked on the way)."""
    recorded = ref.reader.index.source_digest
    if recorded.kind == digest.kind:
        return recorded == digest
    hasher, reader = Hasher(digest.kind), ref.reader
    reader.seek(0)
    while block := reader.read(_HASH_BLOCK):
        hasher.update(block)
    reader.seek(0)
    return hasher.digest() == digest


def damaged(reference: Path, label: str, error: ContainerError) -> ReferenceDamagedError:
    """The error of the container ``label`` whose reference ``reference`` failed its own
    checks with ``error``."""
    return ReferenceDamagedError(
        f"its reference {reference} is damaged: {error.message}",
        reference=str(reference),
        path=label,
        hint=f"restore {reference} from another copy; this container's own bytes were not at fault",
    )


def _shown(path: Path) -> Path:
    """``path`` without ``..`` steps, relative to the working folder when below it."""
    norm = os.path.normpath(path)
    rel = os.path.relpath(norm)
    return Path(rel if not rel.startswith("..") else norm)


def _changed(spec: RefSpec, label: str) -> ReferenceChangedError:
    return ReferenceChangedError(
        f"its reference {spec.path} is not the file it was coded against (other digest)",
        reference=spec.path,
        path=label,
        hint="put the original reference back; nothing was written",
    )


def _is_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


__all__ = [
    "MAX_CHAIN",
    "ContainerReference",
    "PlainReference",
    "RefSpec",
    "ReferenceBytes",
    "locate",
    "open_reference",
]
