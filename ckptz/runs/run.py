"""The machinery of a ``compress`` or ``decompress`` run around the per-file work.

:mod:`ckptz.api` plans a run (:mod:`ckptz.runs.plan`) and converts each file; this module
opens the engine (only if something is converted; on a thread of its own, beside the
run's start), creates and locks the output folders, turns a stop into
:class:`~ckptz.errors.StoppedError` naming the finished files, carries over what is not
converted (copies, symlinks, hard links) and gives folders their metadata last.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager, suppress
from pathlib import Path

from ckptz import trace
from ckptz.accounting import FileStats, total_components
from ckptz.codecs.table import by_id
from ckptz.container import read_index
from ckptz.engines import (
    CODECS_CPU,
    GPU_ONLY_CODECS,
    gpu_unavailable_reason,
    nvcomp_installed,
    open_engine,
    requested_device,
)
from ckptz.engines.base import Engine
from ckptz.errors import CkptzError, NameTakenError, SourceChangedError, StoppedError, UsageError
from ckptz.meta import FileMeta, apply_fd
from ckptz.pipeline.workers import tuned_interpreter
from ckptz.runs.jobs import Stop, run_jobs
from ckptz.runs.lock import hold
from ckptz.runs.plan import Job, Plan
from ckptz.runs.results import Reporter, Summary
from ckptz.runs.tree import Tree, expand, scan
from ckptz.safeio import (
    FileIdentity,
    confined,
    copy_file,
    link_file,
    make_symlink,
    open_folder,
    os_error,
    remove_read,
    remove_temp,
    stale_temps_of,
)


def scan_sources(sources: str | Path | Sequence[str | Path]) -> list[Tree]:
    items = [sources] if isinstance(sources, str | Path) else list(sources)
    return [scan(p) for p in expand([str(s) for s in items])]


def _open_engine(
    device: str | None,
    threads: int | None,
    level: int,
    codec: str,
    memory: int | None,
    reporter: Reporter,
    announce: bool,
    writes: bool,
    job_bytes: int,
    notices: list[str],
) -> Engine:
    """:func:`~ckptz.engines.open_engine` for a run; its notice added to ``notices`` and,
    with ``announce``, told the user."""
    with trace.span("open engine"):
        engine, notice = open_engine(
            device,
            threads=threads,
            level=level,
            codec=codec,
            memory=memory,
            writes=writes,
            job_bytes=job_bytes,
        )
    if notice:
        notices.append(notice)
        if announce:
            reporter.notice(notice)
    return engine


@contextmanager
def engine_session(
    device: str | None,
    threads: int | None,
    level: int,
    codec: str,
    memory: int | None,
    reporter: Reporter,
    announce: bool = True,
    writes: bool = False,
    job_bytes: int = 0,
) -> Iterator[tuple[Engine, list[str]]]:
    """The engine of a run (``writes``: it compresses ``job_bytes``;
    :func:`~ckptz.engines.open_engine`), its notice announced, closed at the end."""
    notices: list[str] = []
    engine = _open_engine(
        device, threads, level, codec, memory, reporter, announce, writes, job_bytes, notices
    )
    try:
        with tuned_interpreter():
            yield engine, notices
    finally:
        engine.close()


def decoding_codec(jobs: Sequence[Job], device: str | None) -> str:
    """The coder a decompression opens: the GPU's where a container to decode holds a
    bitstream only a GPU decodes (its engine then reads and decodes runs of frames in
    batches), else ``auto``."""
    if requested_device(device) == "cpu":
        return "auto"
    for job in jobs:
        try:
            with open(job.entry.path, "rb") as f:
                codecs = read_index(f, job.label).header.get("codecs", {})
        except (CkptzError, OSError):
            continue  # the run reports it when it gets there
        for key in codecs if isinstance(codecs, dict) else ():
            bitstream = by_id(int(key)) if key.isdigit() else None
            if bitstream is not None and bitstream.name in GPU_ONLY_CODECS:
                # Without a usable GPU, the run decodes what it can and names what it cannot.
                usable = nvcomp_installed() and gpu_unavailable_reason() is None
                return bitstream.name if usable else "auto"
    return "auto"


class OpeningEngine:
    """A run's engine, opened on a thread of its own while the run prepares its outputs,
    lays out its files and makes their outputs; :meth:`get` waits for it.

    A GPU engine's open (its workers' CUDA streams, kernels and nvCOMP) takes a noticeable
    fraction of a second, every other thread idle meanwhile if it ran on the main thread;
    a restore's output began reserving its space only after it, and that reservation bounds
    a restore to tmpfs. Opened here, it overlaps both. An engine that
    cannot open raises from :meth:`get` what :func:`~ckptz.engines.open_engine` raised.
    """

    def __init__(self, opener: Callable[[], Engine]) -> None:
        self._future: Future[Engine] = Future()
        self._thread = threading.Thread(target=self._open, args=(opener,), name="ckptz-open", daemon=True)
        self._thread.start()

    def _open(self, opener: Callable[[], Engine]) -> None:
        try:
            engine = opener()
        except BaseException as exc:
            self._future.set_exception(exc)
        else:
            self._future.set_result(engine)

    def get(self) -> Engine:
        """The engine, once open."""
        return self._future.result()

    def close(self) -> None:
        """Close the engine once open (a failed open has nothing to close)."""
        self._thread.join()
        if self._future.exception() is None:
            self._future.result().close()


@contextmanager
def engine_for_plan(
    p: Plan,
    device: str | None,
    threads: int | None,
    level: int,
    codec: str,
    memory: int | None,
    reporter: Reporter,
    announce: bool,
    writes: bool = False,
) -> Iterator[tuple[OpeningEngine | None, list[str]]]:
    """The engine for a plan, opening (:class:`OpeningEngine`), or None if the plan
    converts nothing (copying files needs none); the notices of its open, once open."""
    if not (p.converts or p.finishes):
        yield None, []
        return
    notices: list[str] = []
    opener = functools.partial(
        _open_engine,
        device,
        threads,
        level,
        codec,
        memory,
        reporter,
        announce,
        writes,
        p.converted_bytes,
        notices,
    )
    opening = OpeningEngine(opener)
    try:
        with tuned_interpreter():
            yield opening, notices
    finally:
        opening.close()


def check_codec(codec: str) -> str:
    valid = tuple(dict.fromkeys((*CODECS_CPU, *GPU_ONLY_CODECS)))
    codec = codec.lower()
    if codec not in valid:
        raise UsageError(f"unknown codec {codec!r}", hint="choose one of: " + ", ".join(valid))
    return codec


def job_label(job: Job) -> str:
    return job.label


@contextmanager
def stopping(p: Plan, done: list[str]) -> Iterator[None]:
    """Turn a stop anywhere in a run (Ctrl-C, SIGTERM) into :class:`StoppedError` naming ``done``."""
    try:
        yield
    except (KeyboardInterrupt, StoppedError):
        total = len(p.finishes) + len(p.converts) + len(p.links) + len(p.carries)
        raise StoppedError(tuple(done), max(total - len(done), 0)) from None


@contextmanager
def locked(p: Plan) -> Iterator[None]:
    """Create the output folders (no more open than their sources) and lock everything."""
    absent = _absent_folders(
        [out_dir for _, out_dir in p.dirs]
        + [j.target.parent for j in p.converts + p.finishes + p.links + p.carries]
    )
    try:
        for src_dir, out_dir in p.dirs:
            _mkdir(out_dir, src_dir)
        # From here on, folders below the roots are never entered through a symlink.
        with hold(p.writes, p.reads), confined(w for w in p.writes if w.is_dir()):
            yield
    except BaseException:
        # A failed run leaves no empty folders of its own making behind: rmdir spares any
        # that holds something, and folders that were there before the run are not listed.
        for folder in absent:
            with suppress(OSError):
                folder.rmdir()
        raise


def _absent_folders(folders: list[Path]) -> list[Path]:
    """The folders among ``folders`` and their parents that do not exist yet, deepest first."""
    absent: set[Path] = set()
    for folder in folders:
        while folder not in absent and not folder.exists() and folder.parent != folder:
            absent.add(folder)
            folder = folder.parent
    return sorted(absent, key=lambda f: len(f.parts), reverse=True)


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


def prepare(p: Plan, stop: Stop, done: list[str]) -> None:
    """Remove temp files that killed runs left in the tree and beside every output this run
    writes (refusing those a live run is writing)."""
    for j in p.temps:
        stop.check()
        remove_temp(j.entry.path)
    for stale in stale_temps_of(j.target for j in p.converts + p.links + p.carries):
        stop.check()
        remove_temp(stale)


def ignore_progress(_: int) -> None:
    pass


def remove_original(read: FileIdentity, made: Path, *, relinked: bool = False) -> None:
    """Remove an original now represented by its verified, durable counterpart ``made``,
    only while it is still the file that was read (:func:`~ckptz.safeio.remove_read`). (On
    tmpfs this frees the file's pages, ~0.1 s a GB: traced as its own stage.)

    Raises:
        SourceChangedError: it changed after it was read; it is kept and ``made`` removed.
    """
    try:
        with trace.span("remove original"):
            remove_read(read, made, relinked=relinked)
    except OSError as exc:
        raise os_error(exc, read.path) from None


class Changed:
    """The files of a run that changed after they were read (each kept as it is now, its
    output removed): collected while the other files go on, raised at the run's end."""

    def __init__(self) -> None:
        self.labels: list[str] = []
        self._errors: list[SourceChangedError] = []
        self._lock = threading.Lock()

    def add(self, error: SourceChangedError) -> None:
        with self._lock:
            self.labels.extend(error.changed)
            self._errors.append(error)

    def raise_any(self, *, compress: bool) -> None:
        """Raise :class:`~ckptz.errors.SourceChangedError` naming them, if any changed (a
        lone name taken by another file, :class:`~ckptz.errors.NameTakenError`, as it was
        raised: it says what to do instead of a rerun)."""
        if len(self._errors) == 1 and isinstance(self._errors[0], NameTakenError):
            raise self._errors[0]
        if self.labels:
            raise SourceChangedError(tuple(self.labels), replaces="compress" if compress else "restore")


def carry(
    p: Plan,
    stop: Stop,
    done: list[str],
    in_place: bool,
    reporter: Reporter,
    read: dict[tuple[int, int], FileIdentity] | None = None,
    changed: Changed | None = None,
) -> None:
    """Copies and symlinks, then hard links to outputs (a link's target, converted or
    copied, is complete by then); then the folders' own metadata.

    In place, a second name of a file is removed only while its inode is still the one
    ``read`` (by ``(device, inode)``) says its first name was when read; a change is added
    to ``changed``."""

    def one(j: Job) -> None:
        reporter.file(j.label)
        _carry_one(j, stop)
        reporter.file_done(j.label)

    run_jobs(one, p.carries, stop, name=job_label, done=done)
    for j in p.links:
        stop.check()
        assert j.primary is not None
        first = (read or {}).get(j.entry.inode)
        if in_place and first is None:
            continue  # its first name was not converted (it changed): this one stays too
        try:
            # In place, a name another program took meanwhile is never linked over.
            link_file(j.primary, j.target, replace=not in_place, label=j.label)
        except NameTakenError as exc:
            if changed is None:
                raise
            changed.add(exc)
            continue
        if in_place:
            assert first is not None
            this = FileIdentity(
                j.entry.path, j.label, *j.entry.inode, first.size, first.mtime_ns, first.ctime_ns
            )
            try:
                # Removing the first name moved the inode's ctime: only that may differ.
                remove_original(this, j.target, relinked=True)
            except SourceChangedError as exc:
                if changed is None:
                    raise
                changed.add(exc)
                continue
        done.append(j.label)
        reporter.file_done(j.label)
    for src_dir, out_dir in reversed(p.dirs):
        try:
            folder = open_folder(out_dir, create=False)
            try:
                apply_fd(folder, FileMeta.of(src_dir.stat()))
            finally:
                os.close(folder)
        except OSError as exc:
            raise os_error(exc, out_dir) from None


def _carry_one(j: Job, stop: Stop) -> None:
    if j.kind == "symlink":
        # Recreated verbatim, never followed: a link that points outside the folder is the
        # user's data, and nothing is ever read or written through it.
        make_symlink(os.readlink(j.entry.path), j.target, FileMeta.of(j.entry.path.lstat()))
    else:
        copy_file(j.entry.path, j.target, stop.ticker(ignore_progress))


def make_summary(
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
