"""The library API: compress, decompress, inspect and verify checkpoint files and folders.

Every function returns a frozen dataclass of plain data and never prints; progress and
notices go to an optional :class:`Reporter`. Sources may be several files and folders
(folders are walked recursively, symlinks never followed, see :mod:`ckptz.tree`); what
happens to each file is planned before anything is written (:mod:`ckptz.plan`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

import xxhash

from ckptz.accounting import (
    ComponentStats,
    FileStats,
    index_stats,
    layout_stats,
    merge_counts,
    total_components,
)
from ckptz.compare import CheckStatus, FileCheck, VerifyResult, verify_trees
from ckptz.container import SUFFIX, amend_source, read_index
from ckptz.device import CODECS_CPU, GPU_ONLY_CODECS, open_engine
from ckptz.engine import Engine
from ckptz.errors import BusyError, CkptzError, CorruptionError, StoppedError, UsageError
from ckptz.formats import read_layout
from ckptz.jobs import Stop, run_jobs
from ckptz.lock import hold
from ckptz.meta import FileMeta, apply_link, apply_path
from ckptz.pipeline import Comparer, compress_file, restore
from ckptz.plan import Action, Job, Output, Plan, plan
from ckptz.safeio import (
    atomic_output,
    background_writes,
    copy_file,
    link_file,
    make_symlink,
    os_error,
    remove,
    remove_temp,
    stale_temps,
)
from ckptz.streams import spooled
from ckptz.tree import Selection, Tree, expand, scan

__all__ = [
    "Action",
    "CheckStatus",
    "FileCheck",
    "Reporter",
    "SilentReporter",
    "Summary",
    "VerifyResult",
    "compress",
    "compress_stream",
    "decompress",
    "decompress_stream",
    "inspect",
    "verify",
]


class Reporter(Protocol):
    """Receives progress while a long operation runs (the CLI draws a Rich progress bar).

    ``advance`` and the ``file`` calls come from worker threads.
    """

    def start(self, total: int, description: str) -> None: ...

    def advance(self, nbytes: int) -> None: ...

    def file(self, relpath: str) -> None: ...

    def file_done(self, relpath: str) -> None: ...

    def notice(self, text: str) -> None: ...


class SilentReporter:
    """A :class:`Reporter` that ignores everything (the default)."""

    def start(self, total: int, description: str) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        pass

    def file(self, relpath: str) -> None:
        pass

    def file_done(self, relpath: str) -> None:
        pass

    def notice(self, text: str) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Summary:
    """The result of compress, decompress or inspect.

    Attributes:
        operation: ``compress``, ``decompress`` or ``inspect``.
        root: the source the operation was given (several are joined by ", ").
        files: one entry per checkpoint file or container (with ``dry_run``, estimates).
        components: per-component totals over ``files``.
        copied: other files copied unchanged (relative paths).
        device: where the codec ran (None for inspect).
        threads: CPU threads used.
        seconds: wall time.
        notices: things the user should know (e.g. fell back to the CPU).
        actions: what was done to each input, skips included, or with ``dry_run`` what
            would be.
        dry_run: nothing was written; ``files`` hold estimates from a sample.
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
    actions: tuple[Action, ...] = ()
    dry_run: bool = False

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @property
    def compressed_bytes(self) -> int | None:
        if not self.files or any(f.compressed_bytes is None for f in self.files):
            return None
        return sum(f.compressed_bytes or 0 for f in self.files)

    @property
    def overhead_bytes(self) -> int:
        """Bytes of the containers' own structure (header, index, footer, alignment)."""
        return sum(f.overhead_bytes for f in self.files)

    @property
    def ratio(self) -> float | None:
        packed = self.compressed_bytes
        return None if not packed else self.bytes / packed

    @property
    def codecs(self) -> dict[str, int]:
        return merge_counts(f.codecs for f in self.files)


def _trees(sources: str | Path | Sequence[str | Path]) -> list[Tree]:
    items = [sources] if isinstance(sources, str | Path) else list(sources)
    return [scan(p) for p in expand([str(s) for s in items])]


@contextmanager
def _engine(
    device: str | None,
    threads: int | None,
    level: int,
    codec: str,
    memory: int | None,
    reporter: Reporter,
    announce: bool = True,
) -> Iterator[tuple[Engine, list[str]]]:
    engine, notice = open_engine(device, threads=threads, level=level, codec=codec, memory=memory)
    notices = [notice] if notice else []
    if notice and announce:
        reporter.notice(notice)
    try:
        yield engine, notices
    finally:
        engine.close()


@contextmanager
def _engine_for(
    p: Plan,
    device: str | None,
    threads: int | None,
    level: int,
    codec: str,
    memory: int | None,
    reporter: Reporter,
    announce: bool,
) -> Iterator[tuple[Engine | None, list[str]]]:
    """The engine for a plan, or None if it converts nothing (copying files needs none)."""
    if not (p.converts or p.finishes):
        yield None, []
        return
    with _engine(device, threads, level, codec, memory, reporter, announce) as opened:
        yield opened


def _check_codec(codec: str) -> str:
    valid = tuple(dict.fromkeys((*CODECS_CPU, *GPU_ONLY_CODECS)))
    codec = codec.lower()
    if codec not in valid:
        raise UsageError(f"unknown codec {codec!r}", hint="choose one of: " + ", ".join(valid))
    return codec


def compress(
    src: str | Path | Sequence[str | Path],
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
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    dry_run: bool = False,
    sample_bytes: int = 32 << 20,
    reporter: Reporter | None = None,
) -> Summary:
    """Compress checkpoint files and folders.

    Each checkpoint file ``X`` (recognised by content or suffix, or chosen by ``include``)
    becomes ``X.ckptz`` with ``X``'s permission bits and mtime (and owner, as root); other
    files are copied unchanged with theirs (with ``dst``) or left alone (``in_place``), empty
    folders and symlinks are kept, and hard links are compressed once. In place, each
    container is decoded and compared with the original before the original is removed.

    Args:
        src: one or more checkpoint files or folders (shell-style patterns are expanded).
        dst: output file or folder (see :mod:`ckptz.plan`); default ``SRC.ckptz`` beside a
            folder, or ``X.ckptz`` beside a file.
        in_place: replace each checkpoint file by its container.
        level: zstd level for the coded planes.
        threads: CPU threads (default: all cores).
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        codec: ``auto``, ``zstd`` or a GPU codec such as ``ans``.
        memory: byte budget for the GPU pipeline's buffers.
        verify: decode and compare each container before finishing (default: only in place).
        force: overwrite existing outputs (in place: replace a stale container).
        include: patterns of files to compress, whatever their content.
        exclude: patterns of files never to compress (copied unchanged).
        dry_run: write nothing; return the plan, with sizes estimated from a sample.
        sample_bytes: bytes sampled per component for ``dry_run``'s estimate.
        reporter: receives progress.

    Raises:
        CkptzError: bad arguments, unreadable input, a failed write, another run on the same
            files (``BusyError``) or a stop (``StoppedError``); nothing is lost.
    """
    reporter = reporter or SilentReporter()
    start = time.perf_counter()
    codec = _check_codec(codec)
    trees = _trees(src)
    out = Output.parse(dst, in_place, len(trees), trees[0].is_dir)
    p = plan(trees, out, compress=True, selection=Selection(tuple(include), tuple(exclude)), force=force)
    root = ", ".join(str(t.root) for t in trees)
    if dry_run:
        from ckptz.estimate import estimate

        with _engine(device, threads, level, codec, memory, reporter) as (sampler, notices):
            files = estimate(
                [(j.entry.path, j.label) for j in p.converts + p.finishes], sampler, sample_bytes
            )
        return _summary("compress", root, files, p, sampler, start, notices, dry_run=True, compress=True)
    # In place, the original is removed only after its container decoded back to it.
    verify = True if in_place else bool(verify)
    stop = Stop()
    done: list[str] = []
    with (
        _stopping(p, done),
        _locked(p),
        _engine_for(p, device, threads, level, codec, memory, reporter, True) as (engine, notices),
    ):
        _prepare(p, stop, done)
        _finish_interrupted(p.finishes, engine, stop, done, compress=True)
        reporter.start(sum(j.entry.size for j in p.converts), "compress")

        def one(job: Job) -> FileStats:
            assert engine is not None
            reporter.file(job.label)
            stats = _compress_one(job, engine, verify, in_place, reporter, stop)
            reporter.file_done(job.label)
            return stats

        files = run_jobs(one, p.converts, stop, name=_label, done=done)
        _carry(p, stop, done, in_place, reporter)
    return _summary("compress", root, files, p, engine, start, notices, compress=True)


def _label(job: Job) -> str:
    return job.label


@contextmanager
def _stopping(p: Plan, done: list[str]) -> Iterator[None]:
    """Turn a stop anywhere in a run (Ctrl-C, SIGTERM) into :class:`StoppedError` naming ``done``."""
    try:
        yield
    except (KeyboardInterrupt, StoppedError):
        total = len(p.finishes) + len(p.converts) + len(p.links) + len(p.carries)
        raise StoppedError(tuple(done), max(total - len(done), 0)) from None


@contextmanager
def _locked(p: Plan) -> Iterator[None]:
    """Create the output folders (no more open than their sources) and lock everything."""
    for src_dir, out_dir in p.dirs:
        _mkdir(out_dir, src_dir)
    with hold(p.writes, p.reads):
        yield


def _mkdir(path: Path, like: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        return
    try:
        mode = FileMeta.of(like.stat()).mode
    except OSError:
        mode = 0o777
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, (mode & 0o777) | 0o700)
    except FileExistsError:
        if not path.is_dir():
            raise UsageError("a file is in the way of an output folder", path=str(path)) from None
    except OSError as exc:
        raise os_error(exc, path) from None


def _prepare(p: Plan, stop: Stop, done: list[str]) -> None:
    """Remove temp files that killed runs left (refusing those a live run is writing)."""
    for j in p.temps:
        stop.check()
        remove_temp(j.entry.path)


def _compress_one(
    job: Job, engine: Engine, verify: bool, in_place: bool, reporter: Reporter, stop: Stop
) -> FileStats:
    e, target = job.entry, job.target
    for stale in stale_temps(target):
        remove_temp(stale)
    meta = FileMeta.of(os.stat(e.path))
    with atomic_output(target, meta.container()) as (f, tmp):
        written = compress_file(e.path, job.label, f, engine, progress=stop.ticker(reporter.advance))
        index, size = amend_source(f, written.index, meta.to_json())
        if verify:
            f.flush()
            _compare(tmp, e.path, job.label, engine, stop)
    if in_place:
        _remove_original(e.path)
    return index_stats(job.label, index, size)


def _compare(container: Path, original: Path, rel: str, engine: Engine, stop: Stop | None = None) -> None:
    progress = _ignore if stop is None else stop.ticker(_ignore)
    with open(container, "rb") as c, open(original, "rb") as o:
        comparer = Comparer(o, rel)
        restore(c, rel, engine, comparer, progress=progress)
        comparer.finish()


def _ignore(_: int) -> None:
    pass


def _finish_interrupted(
    jobs: list[Job], engine: Engine | None, stop: Stop, done: list[str], *, compress: bool
) -> None:
    """Finish in-place work a killed run left with both forms present.

    The container is decoded and compared with the original, and only if they match is the
    input (whichever of the two the command replaces) removed. A mismatch stops the run with
    both files kept and says which one is stale and how to go on.
    """
    for j in jobs:
        assert engine is not None
        stop.check()
        original, container = (j.entry.path, j.target) if compress else (j.target, j.entry.path)
        try:
            _compare(container, original, str(original), engine, stop)
        except (StoppedError, BusyError):
            raise
        except CkptzError as exc:
            what = "is not the container of" if compress else "does not restore to"
            raise UsageError(
                f"{container.name} {what} {original.name} beside it ({exc.message})",
                path=str(container if compress else original),
                hint=f"a stale {'container' if compress else 'file'} from an earlier run? remove it, or pass --force to "
                + ("compress over it" if compress else "restore over it"),
            ) from None
        _remove_original(j.entry.path)
        done.append(j.label)


def _remove_original(path: Path) -> None:
    try:
        remove(path)
    except OSError as exc:
        raise os_error(exc, path) from None


def _carry(p: Plan, stop: Stop, done: list[str], in_place: bool, reporter: Reporter) -> None:
    """Hard links to outputs, copies, symlinks; then the folders' own metadata."""
    for j in p.links:
        stop.check()
        assert j.primary is not None
        link_file(j.primary, j.target)
        if in_place:
            _remove_original(j.entry.path)
        done.append(j.label)
        reporter.file_done(j.label)

    def carry(j: Job) -> None:
        reporter.file(j.label)
        _carry_one(j, stop)
        reporter.file_done(j.label)

    run_jobs(carry, p.carries, stop, name=_label, done=done)
    for src_dir, out_dir in reversed(p.dirs):
        try:
            apply_path(out_dir, FileMeta.of(src_dir.stat()))
        except OSError as exc:
            raise os_error(exc, out_dir) from None


def _carry_one(j: Job, stop: Stop) -> None:
    if j.kind == "symlink":
        # Recreated verbatim, never followed: a link that points outside the folder is the
        # user's data, and nothing is ever read or written through it.
        make_symlink(os.readlink(j.entry.path), j.target)
        apply_link(j.target, FileMeta.of(j.entry.path.lstat()))
    else:
        for stale in stale_temps(j.target):
            remove_temp(stale)
        copy_file(j.entry.path, j.target, stop.ticker(_ignore))


def _summary(
    operation: str,
    root: str,
    files: list[FileStats],
    p: Plan,
    engine: Engine | None,
    start: float,
    notices: list[str],
    *,
    compress: bool,
    dry_run: bool = False,
) -> Summary:
    return Summary(
        operation,
        root,
        tuple(files),
        total_components(files),
        tuple(j.label for j in p.carries if j.kind == "copy"),
        engine.device if engine else None,
        engine.threads if engine else None,
        time.perf_counter() - start,
        tuple(notices),
        p.actions(compress),
        dry_run,
    )


def decompress(
    src: str | Path | Sequence[str | Path],
    dst: str | Path | None = None,
    *,
    in_place: bool = False,
    threads: int | None = None,
    device: str | None = None,
    memory: int | None = None,
    force: bool = False,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    dry_run: bool = False,
    reporter: Reporter | None = None,
) -> Summary:
    """Restore every container under the sources to its original bytes and metadata.

    Each restored file is written to a temporary name, checked against the original's
    digest, given the original's permission bits and mtime (and owner, as root), and only
    then renamed; in place, the container is removed after that.

    Raises:
        CkptzError: bad arguments, a file that is not a container, a damaged container, a
            failed write, another run on the same files, or a stop.
    """
    reporter = reporter or SilentReporter()
    start = time.perf_counter()
    trees = _trees(src)
    out = Output.parse(dst, in_place, len(trees), trees[0].is_dir)
    p = plan(trees, out, compress=False, selection=Selection(tuple(include), tuple(exclude)), force=force)
    root = ", ".join(str(t.root) for t in trees)
    if dry_run:
        files = [_container_stats(j.entry.path, j.label) for j in p.converts + p.finishes]
        return _summary("decompress", root, files, p, None, start, [], dry_run=True, compress=False)
    stop = Stop()
    done: list[str] = []
    with ExitStack() as stack:
        stack.enter_context(_stopping(p, done))
        stack.enter_context(_locked(p))
        engine, notices = stack.enter_context(
            _engine_for(p, device, threads, 3, "auto", memory, reporter, False)
        )
        _prepare(p, stop, done)
        _finish_interrupted(p.finishes, engine, stop, done, compress=False)
        reporter.start(sum(_source_size(j.entry.path) for j in p.converts), "decompress")

        def one(job: Job) -> FileStats:
            assert engine is not None
            reporter.file(job.label)
            stats = _restore_one(job, engine, in_place, reporter, stop)
            reporter.file_done(job.label)
            return stats

        files = run_jobs(one, p.converts, stop, name=_label, done=done)
        _carry(p, stop, done, in_place, reporter)
    return _summary("decompress", root, files, p, engine, start, notices, compress=False)


def _restore_one(job: Job, engine: Engine, in_place: bool, reporter: Reporter, stop: Stop) -> FileStats:
    e, target = job.entry, job.target
    for stale in stale_temps(target):
        remove_temp(stale)
    with open(e.path, "rb") as c:
        index = read_index(c, job.label)
        with atomic_output(target, FileMeta.from_json(index.header.get("source"))) as (f, tmp):
            with background_writes(f) as out:
                restore(c, job.label, engine, out.write, index=index, progress=stop.ticker(reporter.advance))
            if in_place:
                # The container goes away next: read back what reached the file first.
                f.flush()
                _check_written(tmp, index.source_digest, job.label)
    stats = index_stats(job.label.removesuffix(SUFFIX), index, e.path.stat().st_size)
    if in_place:
        _remove_original(e.path)
    return stats


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


def _container_stats(path: Path, label: str) -> FileStats:
    with open(path, "rb") as f:
        index = read_index(f, label)
    return index_stats(label.removesuffix(SUFFIX), index, path.stat().st_size)


def inspect(path: str | Path | Sequence[str | Path]) -> Summary:
    """Describe checkpoints or their compressed form without decoding any payload.

    Raw checkpoint files are cut into segments (bytes per component and dtype); containers
    report per component their original and compressed bytes and the codecs used.
    """
    start = time.perf_counter()
    trees = _trees(path)
    files: list[FileStats] = []
    others: list[str] = []
    several = len(trees) > 1
    for t in trees:
        prefix = t.root.name + "/" if several and t.is_dir else ""
        for e in t.entries:
            label = prefix + e.rel
            if e.kind == "container":
                files.append(_container_stats(e.path, label))
            elif e.kind == "checkpoint" or (e.kind == "other" and not t.is_dir):
                files.append(layout_stats(label, read_layout(e.path, label)))
            elif e.kind == "other":
                others.append(label)
    return Summary(
        "inspect",
        ", ".join(str(t.root) for t in trees),
        tuple(files),
        total_components(files),
        tuple(others),
        seconds=time.perf_counter() - start,
    )


def verify(
    path: str | Path | Sequence[str | Path],
    against: str | Path | None = None,
    *,
    threads: int | None = None,
    device: str | None = None,
    reporter: Reporter | None = None,
) -> VerifyResult:
    """Check that restoring ``path`` gives exactly ``against`` (or, alone, that it decodes).

    With ``against`` (the original file or folder), every file must be present on both sides
    with equal bytes and permission bits: containers are decoded and compared in a stream,
    plain files byte for byte, symlinks by target. Missing, extra and changed files each get
    an entry. Without it, every container is decoded and its checksums checked, and other
    files are listed as not checked. Failures are recorded per file, not raised.
    """
    reporter = reporter or SilentReporter()
    start = time.perf_counter()
    trees = _trees(path)
    base = None if against is None else scan(expand([str(against)])[0])
    stop = Stop()
    with ExitStack() as stack:
        stack.enter_context(hold((), [t.root for t in trees] + ([base.root] if base else [])))
        engine, notices = stack.enter_context(
            _engine(device, threads, 3, "auto", None, reporter, announce=False)
        )
        checks = verify_trees(trees, base, engine, reporter, stop)
    return VerifyResult(
        ", ".join(str(t.root) for t in trees),
        tuple(checks),
        None if base is None else str(base.root),
        engine.device,
        time.perf_counter() - start,
        tuple(notices),
    )


def compress_stream(
    src: str | Path | BinaryIO,
    out: str | Path | BinaryIO,
    *,
    level: int = 3,
    threads: int | None = None,
    device: str | None = None,
    codec: str = "auto",
    memory: int | None = None,
    force: bool = False,
    reporter: Reporter | None = None,
) -> Summary:
    """Compress one checkpoint from a file or a stream (stdin) to a file or a stream (stdout).

    A stream source is first spooled to a temporary file (the format readers seek). A
    container written to a stream records no file metadata, as ``zstd -c`` records none.
    A source that is already a container is skipped (nothing is written) with an action
    saying so.
    """
    reporter = reporter or SilentReporter()
    start = time.perf_counter()
    codec = _check_codec(codec)
    with ExitStack() as stack:
        path, label = _stream_source(src, out, stack)
        if _kind_of(path) == "container":
            p = Plan(skipped=[Action("skip", label, note="already a ckptz container")])
            return _summary("compress", label, [], p, None, start, [], compress=True)
        engine, notices = stack.enter_context(_engine(device, threads, level, codec, memory, reporter))
        reporter.start(path.stat().st_size, "compress")
        reporter.file(label)
        tick = Stop().ticker(reporter.advance)
        if isinstance(out, str | Path):
            target = _stream_target(Path(out), force)
            meta = FileMeta.of(path.stat()) if isinstance(src, str | Path) else None
            with atomic_output(target, meta.container() if meta else None) as (f, _tmp):
                written = compress_file(path, label, f, engine, progress=tick)
                index, size = written.index, written.size
                if meta is not None:
                    index, size = amend_source(f, index, meta.to_json())
        else:
            written = compress_file(path, label, out, engine, progress=tick)
            index, size = written.index, written.size
            out.flush()
        reporter.file_done(label)
        files = [index_stats(label, index, size)]
        p = Plan()
        return _summary("compress", label, files, p, engine, start, notices, compress=True)


def decompress_stream(
    src: str | Path | BinaryIO,
    out: str | Path | BinaryIO,
    *,
    threads: int | None = None,
    device: str | None = None,
    memory: int | None = None,
    force: bool = False,
    reporter: Reporter | None = None,
) -> Summary:
    """Restore one container from a file or a stream (stdin) to a file or a stream (stdout).

    Bytes reach a stream as they are restored; the whole file's digest is checked at the
    end, and a mismatch raises (as ``zstd -d`` does, the bytes already written stay written).

    Raises:
        ContainerError: the source is not a container.
    """
    reporter = reporter or SilentReporter()
    start = time.perf_counter()
    with ExitStack() as stack:
        path, label = _stream_source(src, out, stack)
        c = stack.enter_context(open(path, "rb"))
        index = read_index(c, label)
        engine, notices = stack.enter_context(
            _engine(device, threads, 3, "auto", memory, reporter, announce=False)
        )
        reporter.start(index.source_size, "decompress")
        reporter.file(label)
        tick = Stop().ticker(reporter.advance)
        if isinstance(out, str | Path):
            target = _stream_target(Path(out), force)
            meta = FileMeta.from_json(index.header.get("source"))
            with atomic_output(target, meta) as (f, _tmp), background_writes(f) as w:
                restore(c, label, engine, w.write, index=index, progress=tick)
        else:
            restore(c, label, engine, out.write, index=index, progress=tick)
            out.flush()
        reporter.file_done(label)
        files = [index_stats(label.removesuffix(SUFFIX), index, path.stat().st_size)]
        return _summary("decompress", label, files, Plan(), engine, start, notices, compress=False)


def _stream_source(
    src: str | Path | BinaryIO, out: str | Path | BinaryIO, stack: ExitStack
) -> tuple[Path, str]:
    """The source as a file path (a stream is spooled to a temp file first) and its label."""
    if isinstance(src, str | Path):
        (path,) = expand([str(src)])
        if path.is_dir():
            raise UsageError(
                "a folder cannot go to or come from a stream", path=str(path), hint="name one file"
            )
        return path, path.name
    near = Path(out).parent if isinstance(out, str | Path) else None
    return stack.enter_context(spooled(src, near)), "stdin"


def _stream_target(target: Path, force: bool) -> Path:
    if target.is_dir():
        raise UsageError("output is a folder", path=str(target), hint="name a file")
    if not force and (target.exists() or target.is_symlink()):
        raise UsageError("output already exists", path=str(target), hint="remove it or pass --force")
    return target


def _kind_of(path: Path) -> str:
    return scan(path).entries[0].kind
