"""The library API: compress, decompress, inspect and verify checkpoint files and folders.

Every function returns a frozen dataclass of plain data and never prints; progress and
notices go to an optional :class:`Reporter`. Paths may name one file or a folder (walked
recursively, symlinks never followed).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import xxhash

from ckptz.accounting import (
    ComponentStats,
    FileStats,
    index_stats,
    layout_stats,
    merge_counts,
    total_components,
)
from ckptz.container import SUFFIX, read_index
from ckptz.engines import open_engine
from ckptz.engines.base import Engine
from ckptz.errors import (
    CkptzError,
    CorruptionError,
    InputNotFoundError,
    MismatchError,
    UnsafePathError,
    UsageError,
)
from ckptz.formats import is_checkpoint, read_layout
from ckptz.pipeline import Comparer, DiscardSink, FileSink, compress_file, restore
from ckptz.safeio import (
    atomic_output,
    copy_file,
    is_temp,
    os_error,
    remove,
    remove_temp,
    stale_temps,
)


class Reporter(Protocol):
    """Receives progress while a long operation runs (the CLI draws a Rich progress bar)."""

    def start(self, total: int, description: str) -> None: ...

    def advance(self, nbytes: int) -> None: ...

    def file(self, relpath: str) -> None: ...

    def notice(self, text: str) -> None: ...


class SilentReporter:
    """A :class:`Reporter` that ignores everything (the default)."""

    def start(self, total: int, description: str) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        pass

    def file(self, relpath: str) -> None:
        pass

    def notice(self, text: str) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Summary:
    """The result of compress, decompress or inspect.

    Attributes:
        operation: ``compress``, ``decompress`` or ``inspect``.
        root: the path the operation was given.
        files: one entry per checkpoint file or container.
        components: per-component totals over ``files``.
        copied: other files copied unchanged (relative paths).
        device: where the codec ran (None for inspect).
        threads: CPU threads used.
        seconds: wall time.
        notices: things the user should know (e.g. fell back to the CPU).
    """

    operation: str
    root: str
    files: tuple[FileStats, ...]
    components: tuple[ComponentStats, ...]
    copied: tuple[str, ...] = ()
    device: str | None = None
    threads: int | None = None
    seconds: float = 0.0
    notices: tuple[str, ...] = ()

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @property
    def compressed_bytes(self) -> int | None:
        if any(f.compressed_bytes is None for f in self.files):
            return None
        return sum(f.compressed_bytes or 0 for f in self.files)

    @property
    def ratio(self) -> float | None:
        packed = self.compressed_bytes
        return None if packed is None else (self.bytes / packed if packed else float("inf"))

    @property
    def codecs(self) -> dict[str, int]:
        return merge_counts(f.codecs for f in self.files)


@dataclass(frozen=True, slots=True)
class FileCheck:
    """The verdict on one container."""

    path: str
    ok: bool
    bytes: int = 0
    error: str | None = None


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """The result of verify: ``ok`` only if every container decoded and matched."""

    root: str
    files: tuple[FileCheck, ...]
    against: str | None = None
    device: str | None = None
    seconds: float = 0.0
    notices: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return bool(self.files) and all(f.ok for f in self.files)


EntryKind = Literal["checkpoint", "container", "other", "symlink", "temp"]


@dataclass(frozen=True, slots=True)
class _Entry:
    path: Path
    rel: str
    kind: EntryKind


def _walk(src: Path) -> list[_Entry]:
    """Every file under ``src`` (or ``src`` itself), sorted, symlinks not followed."""
    if not src.exists() and not src.is_symlink():
        raise InputNotFoundError("no such file or folder", path=str(src))
    if not src.is_dir() or src.is_symlink():
        kind = _kind(src)
        # A file named explicitly is compressed whatever its name says.
        return [_Entry(src, src.name, "checkpoint" if kind == "other" else kind)]
    out = []
    for folder, dirs, files in os.walk(src, followlinks=False):
        dirs.sort()
        base = Path(folder)
        for name in sorted(files) + sorted(d for d in dirs if (base / d).is_symlink()):
            path = base / name
            out.append(_Entry(path, path.relative_to(src).as_posix(), _kind(path)))
    return out


def _kind(path: Path) -> EntryKind:
    if path.is_symlink():
        return "symlink"
    if is_temp(path):
        return "temp"
    if path.name.endswith(SUFFIX):
        return "container"
    return "checkpoint" if is_checkpoint(path) else "other"


def _output_root(src: Path, dst: Path | None, in_place: bool, suffix_add: bool) -> Path:
    if in_place:
        if dst is not None:
            raise UsageError("--in-place and -o/--output exclude each other")
        return src if src.is_dir() else src.parent
    if dst is not None:
        if src.is_dir():
            try:
                dst.resolve().relative_to(src.resolve())
            except ValueError:
                return dst
            raise UsageError("the output folder must not be inside the source folder", path=str(dst))
        return dst
    if src.is_dir():
        name = src.name + SUFFIX if suffix_add else src.name.removesuffix(SUFFIX)
        if name == src.name:
            raise UsageError("cannot choose an output name", path=str(src), hint="give -o DST")
        return src.with_name(name)
    return src.parent


def _target(src: Path, root: Path, entry: _Entry, name: str, single_dst: Path | None) -> Path:
    if not src.is_dir():
        if single_dst is not None and not single_dst.is_dir():
            return single_dst
        return root / name
    return root / Path(entry.rel).parent / name


@contextmanager
def _engine(
    device: str | None, threads: int | None, level: int, codec: str, memory: int | None, reporter: Reporter
) -> Iterator[tuple[Engine, list[str]]]:
    engine, notice = open_engine(device, threads=threads, level=level, codec=codec, memory=memory)
    notices = [notice] if notice else []
    if notice:
        reporter.notice(notice)
    try:
        yield engine, notices
    finally:
        engine.close()


def compress(
    src: str | Path,
    dst: str | Path | None = None,
    *,
    in_place: bool = False,
    level: int = 3,
    threads: int | None = None,
    device: str | None = None,
    codec: str = "auto",
    memory: int | None = None,
    verify: bool | None = None,
    force: bool = False,
    reporter: Reporter | None = None,
    discard: bool = False,
) -> Summary:
    """Compress a checkpoint file or folder.

    Each checkpoint file ``X`` becomes ``X.ckptz``; other files are copied unchanged (with
    ``dst``) or left alone (``in_place``). In place, each container is decoded and compared
    with the original before the original is removed.

    Args:
        src: a checkpoint file or a folder.
        dst: output file or folder; default ``SRC.ckptz`` beside a folder, or ``X.ckptz``
            beside a file.
        in_place: replace each checkpoint file by its container.
        level: zstd level for the coded planes.
        threads: CPU threads (default: all cores).
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        codec: ``auto``, ``zstd`` or a GPU codec such as ``ans``.
        memory: byte budget for the GPU pipeline's buffers.
        verify: decode and compare each container before finishing (default: only in place).
        force: overwrite existing outputs.
        reporter: receives progress.
        discard: code everything but write nothing (measures the pipeline without storage;
            ``dst`` and ``in_place`` are ignored).

    Raises:
        CkptzError: bad arguments, unreadable input, or a failed write (nothing is lost).
    """
    reporter = reporter or SilentReporter()
    src, start = Path(src), time.perf_counter()
    entries = _walk(src)
    in_place = in_place and not discard
    root = src if discard else _output_root(src, Path(dst) if dst else None, in_place, suffix_add=True)
    single_dst = Path(dst) if dst and not src.is_dir() else None
    # In place, the original is removed only after its container decoded back to it.
    verify = True if in_place else bool(verify)
    jobs: list[tuple[_Entry, Path]] = []
    copies: list[tuple[_Entry, Path]] = []
    interrupted: list[tuple[Path, Path, Path]] = []
    for e in entries:
        if e.kind == "checkpoint":
            target = _target(src, root, e, e.path.name + SUFFIX, single_dst)
            _check_target(root, target)
            if in_place and target.exists():
                # A rerun after a crash between rename and removal: finish the job.
                interrupted.append((e.path, target, e.path))
                continue
            jobs.append((e, target))
        elif e.kind == "temp" and in_place:
            remove_temp(e.path)
        elif not in_place and e.kind in ("other", "container", "symlink"):
            copies.append((e, _target(src, root, e, e.path.name, single_dst)))
    if discard:
        copies, interrupted = [], []
    else:
        _refuse_existing(entries, [t for _, t in jobs + copies], force and not in_place)
    with _engine(device, threads, level, codec, memory, reporter) as (engine, notices):
        _finish_interrupted(interrupted, engine)
        reporter.start(sum(e.path.stat().st_size for e, _ in jobs), "compress")

        def one(e: _Entry, target: Path) -> FileStats:
            reporter.file(e.rel)
            return _compress_one(e, target, engine, verify, in_place, reporter, discard)

        files = _each_file(one, jobs)
        for e, target in copies:
            _copy(e, target)
    return _summary("compress", src, files, copies, engine, start, notices)


#: Files compressed or restored at once. One file's reads, hashing and writes run on one
#: thread while the engine codes; several files in flight overlap their I/O (the wall
#: once a GPU codes, measured in BENCHMARKS.md).
PARALLEL_FILES = 4


def _each_file(fn: Callable[[_Entry, Path], FileStats], jobs: list[tuple[_Entry, Path]]) -> list[FileStats]:
    """``fn`` over every job, up to :data:`PARALLEL_FILES` at once; results in job order.

    The first failure stops the files not yet started, lets the running ones finish (each
    leaves either a complete output or none), and is raised.
    """
    if len(jobs) < 2:
        return [fn(e, t) for e, t in jobs]
    with ThreadPoolExecutor(min(PARALLEL_FILES, len(jobs)), thread_name_prefix="ckptz-file") as pool:
        futures = [pool.submit(fn, e, t) for e, t in jobs]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
        finally:
            for f in futures:
                f.cancel()  # only those not started; leaving the block waits for the rest
        for f in futures:
            if not f.cancelled() and (error := f.exception()) is not None:
                raise error
        return [f.result() for f in futures]


def _summary(
    operation: str,
    src: Path,
    files: list[FileStats],
    copies: list[tuple[_Entry, Path]],
    engine: Engine,
    start: float,
    notices: list[str],
) -> Summary:
    return Summary(
        operation,
        str(src),
        tuple(files),
        total_components(files),
        tuple(e.rel for e, _ in copies),
        engine.device,
        engine.threads,
        time.perf_counter() - start,
        tuple(notices),
    )


def _compress_one(
    e: _Entry, target: Path, engine: Engine, verify: bool, in_place: bool, reporter: Reporter, discard: bool
) -> FileStats:
    for stale in stale_temps(target):
        remove_temp(stale)
    if discard:
        written = compress_file(e.path, e.rel, None, engine, progress=reporter.advance, verify=verify)
        return index_stats(e.rel, written.index, written.size)
    with atomic_output(target) as (f, _tmp):
        # ``verify`` decodes every frame back from the payloads written and reads the file
        # back before it is renamed (see ckptz.pipeline.compress and RELIABILITY.md).
        written = compress_file(e.path, e.rel, f, engine, progress=reporter.advance, verify=verify)
    if in_place:
        _remove_original(e.path)
    return index_stats(e.rel, written.index, written.size)


def _compare(container: Path, original: Path, rel: str, engine: Engine) -> None:
    with open(container, "rb") as c, open(original, "rb") as o:
        comparer = Comparer(o, rel)
        restore(c, rel, engine, comparer)
        comparer.finish()


def _finish_interrupted(jobs: list[tuple[Path, Path, Path]], engine: Engine) -> None:
    """Finish in-place work a killed run left with both forms present.

    Each job is ``(original, container, redundant)``: the container is decoded and compared
    with the original, and only if they match is ``redundant`` (whichever of the two the
    command replaces) removed. A mismatch stops the run with both files kept.
    """
    for original, container, redundant in jobs:
        _compare(container, original, str(original), engine)
        _remove_original(redundant)


def _remove_original(path: Path) -> None:
    try:
        remove(path)
    except OSError as exc:
        raise os_error(exc, path) from None


def _copy(e: _Entry, target: Path) -> None:
    for stale in stale_temps(target):
        remove_temp(stale)
    if e.kind == "symlink":
        # Recreated verbatim, never followed: a link that points outside the folder is the
        # user's data, and nothing is ever read or written through it.
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():
            target.unlink()
        os.symlink(os.readlink(e.path), target)
    else:
        copy_file(e.path, target)


def _refuse_existing(entries: list[_Entry], targets: list[Path], force: bool) -> None:
    """Refuse outputs that exist (unless ``force``) and, always, outputs that are inputs."""
    sources = {_identity(e.path) for e in entries} - {None}
    for t in targets:
        if _identity(t) in sources:
            raise UsageError("output would overwrite an input", path=str(t), hint="choose another -o")
        if not force and (t.exists() or t.is_symlink()):
            raise UsageError("output already exists", path=str(t), hint="remove it or pass --force")


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of a path, not following a final symlink; None if it does not exist."""
    try:
        st = path.lstat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _check_target(root: Path, target: Path) -> None:
    """Refuse an output whose folder (below ``root``) or own name is a symlink.

    Writing through such a link could put bytes outside the destination, or, in place, make
    ckptz remove an original whose container lives somewhere else.
    """
    try:
        rel = target.relative_to(root)
    except ValueError:
        rel = Path(target.name)
        root = target.parent
    here = root
    for part in rel.parts:
        here = here / part
        if here.is_symlink():
            raise UnsafePathError(
                "a symlink in the output path could redirect the write",
                path=str(here),
                hint="remove the link",
            )


def decompress(
    src: str | Path,
    dst: str | Path | None = None,
    *,
    in_place: bool = False,
    threads: int | None = None,
    device: str | None = None,
    memory: int | None = None,
    force: bool = False,
    reporter: Reporter | None = None,
    discard: bool = False,
) -> Summary:
    """Restore every container under ``src`` to its original bytes (``discard``: decode and
    check everything, write nothing).

    Each restored file is written to a temporary name, checked against the original's
    digest, and only then renamed; in place, the container is removed after that.

    Raises:
        CkptzError: bad arguments, a damaged container, or a failed write.
    """
    reporter = reporter or SilentReporter()
    src, start = Path(src), time.perf_counter()
    entries = _walk(src)
    in_place = in_place and not discard
    root = src if discard else _output_root(src, Path(dst) if dst else None, in_place, suffix_add=False)
    single_dst = Path(dst) if dst and not src.is_dir() else None
    jobs: list[tuple[_Entry, Path]] = []
    copies: list[tuple[_Entry, Path]] = []
    interrupted: list[tuple[Path, Path, Path]] = []
    for e in entries:
        if e.kind == "container":
            target = _target(src, root, e, e.path.name.removesuffix(SUFFIX), single_dst)
            _check_target(root, target)
            if in_place and target.exists():
                # The original was restored but the container not yet removed.
                interrupted.append((target, e.path, e.path))
                continue
            jobs.append((e, target))
        elif e.kind == "temp" and in_place:
            remove_temp(e.path)
        elif not in_place and e.kind != "temp":
            copies.append((e, _target(src, root, e, e.path.name, single_dst)))
    if discard:
        copies, interrupted = [], []
    else:
        _refuse_existing(entries, [t for _, t in jobs + copies], force and not in_place)
    with _engine(device, threads, 3, "auto", memory, reporter) as (engine, notices):
        _finish_interrupted(interrupted, engine)
        reporter.start(sum(_source_size(e.path) for e, _ in jobs), "decompress")

        def one(e: _Entry, target: Path) -> FileStats:
            reporter.file(e.rel)
            if discard:
                with open(e.path, "rb") as c:
                    index = restore(c, e.rel, engine, DiscardSink(), progress=reporter.advance)
                return index_stats(e.rel.removesuffix(SUFFIX), index, e.path.stat().st_size)
            for stale in stale_temps(target):
                remove_temp(stale)
            with open(e.path, "rb") as c, atomic_output(target) as (f, tmp):
                index = restore(c, e.rel, engine, FileSink(f), progress=reporter.advance)
                if in_place:
                    # The container goes away next: read back what reached the file first.
                    f.flush()
                    _check_written(tmp, index.source_digest, e.rel)
            stats = index_stats(e.rel.removesuffix(SUFFIX), index, e.path.stat().st_size)
            if in_place:
                _remove_original(e.path)
            return stats

        files = _each_file(one, jobs)
        for e, target in copies:
            _copy(e, target)
    return _summary("decompress", src, files, copies, engine, start, notices)


def _check_written(path: Path, digest: str, rel: str) -> None:
    hasher = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            hasher.update(block)
    if hasher.hexdigest() != digest:
        raise CorruptionError("restored file read back differs from the original's digest", path=rel)


def _source_size(container: Path) -> int:
    with open(container, "rb") as f:
        return read_index(f, str(container)).source_size


def inspect(path: str | Path) -> Summary:
    """Describe a checkpoint or its compressed form without decoding any payload.

    Raw checkpoint files are cut into segments (bytes per component and dtype); containers
    report per component their original and compressed bytes and the codecs used.
    """
    src, start = Path(path), time.perf_counter()
    files: list[FileStats] = []
    others: list[str] = []
    for e in _walk(src):
        if e.kind == "container":
            with open(e.path, "rb") as f:
                index = read_index(f, e.rel)
            files.append(index_stats(e.rel.removesuffix(SUFFIX), index, e.path.stat().st_size))
        elif e.kind == "checkpoint":
            files.append(layout_stats(e.rel, read_layout(e.path, e.rel)))
        elif e.kind == "other":
            others.append(e.rel)
    return Summary(
        "inspect",
        str(src),
        tuple(files),
        total_components(files),
        tuple(others),
        seconds=time.perf_counter() - start,
    )


def verify(
    path: str | Path,
    against: str | Path | None = None,
    *,
    threads: int | None = None,
    device: str | None = None,
    reporter: Reporter | None = None,
) -> VerifyResult:
    """Decode every container under ``path`` and check every checksum and digest.

    With ``against`` (the original file or folder), also compare byte for byte. A failure is
    recorded per file (``ok`` False with the error) rather than raised.
    """
    reporter = reporter or SilentReporter()
    src, start = Path(path), time.perf_counter()
    base = Path(against) if against else None
    containers = [e for e in _walk(src) if e.kind == "container"]
    if not containers:
        raise UsageError("no .ckptz containers found", path=str(src))
    checks: list[FileCheck] = []
    with _engine(device, threads, 3, "auto", None, reporter) as (engine, notices):
        reporter.start(sum(e.path.stat().st_size for e in containers), "verify")
        for e in containers:
            reporter.file(e.rel)
            checks.append(_verify_one(e, src, base, engine, reporter))
    return VerifyResult(
        str(src),
        tuple(checks),
        str(base) if base else None,
        engine.device,
        time.perf_counter() - start,
        tuple(notices),
    )


def _verify_one(e: _Entry, src: Path, base: Path | None, engine: Engine, reporter: Reporter) -> FileCheck:
    original_rel = e.rel.removesuffix(SUFFIX)
    size = e.path.stat().st_size
    try:
        with open(e.path, "rb") as c:
            index = read_index(c, e.rel)
            ratio = size / max(index.source_size, 1)

            def tick(n: int) -> None:
                reporter.advance(int(n * ratio))

            if base is None:
                restore(c, e.rel, engine, lambda _v: None, index=index, progress=tick)
            else:
                original = base if not src.is_dir() and not base.is_dir() else base / original_rel
                if not src.is_dir() and base.is_dir():
                    original = base / original_rel
                if not original.is_file():
                    raise MismatchError("original not found to compare against", path=str(original))
                with open(original, "rb") as o:
                    comparer = Comparer(o, original_rel)
                    restore(c, e.rel, engine, comparer, index=index, progress=tick)
                    comparer.finish()
        return FileCheck(e.rel, True, index.source_size)
    except CkptzError as exc:
        return FileCheck(e.rel, False, 0, str(exc))
