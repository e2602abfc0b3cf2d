"""The library API: compress, decompress, inspect and verify checkpoint files and folders.

Every function returns a frozen dataclass of plain data and never prints; progress and
notices go to an optional :class:`Reporter`. Sources may be several files and folders
(folders are walked recursively, symlinks never followed, see :mod:`ckptz.runs.tree`); what
happens to each file is planned before anything is written (:mod:`ckptz.runs.plan`), and the
run around the per-file work lives in :mod:`ckptz.runs.run`. One file to or from a pipe:
:func:`compress_stream`, :func:`decompress_stream` (:mod:`ckptz.runs.streams`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from ckptz.accounting import FileStats, index_stats, layout_stats, total_components
from ckptz.container import SUFFIX, read_index
from ckptz.engines import check_device, warm_gpu
from ckptz.engines.base import Engine
from ckptz.errors import (
    BusyError,
    CkptzError,
    CorruptionError,
    ReferenceChangedError,
    ReferenceDamagedError,
    ReferenceMissingError,
    SourceChangedError,
    StoppedError,
    UsageError,
)
from ckptz.formats import read_layout
from ckptz.meta import FileMeta
from ckptz.pipeline import Comparer, DiscardSink, FileSink, compress_file, restore
from ckptz.runs.compare import CheckStatus, FileCheck, VerifyResult, verify_trees
from ckptz.runs.jobs import Stop, run_jobs
from ckptz.runs.lock import hold
from ckptz.runs.plan import Action, Job, Output, Plan, linked_elsewhere, plan
from ckptz.runs.results import Reporter, SilentReporter, Summary
from ckptz.runs.resume import remove_stale
from ckptz.runs.run import (
    Changed,
    OpeningEngine,
    carry,
    check_codec,
    decoding_codec,
    engine_for_plan,
    engine_session,
    ignore_progress,
    job_label,
    locked,
    make_summary,
    prepare,
    remove_original,
    scan_sources,
    stopping,
)
from ckptz.runs.share import SOLO, Team
from ckptz.runs.streams import compress_stream, decompress_stream
from ckptz.runs.tree import Selection, Tree, expand, scan
from ckptz.safeio import FileIdentity, atomic_output

if TYPE_CHECKING:
    from ckptz.formats.layout import FileLayout
    from ckptz.pipeline.transform import FrameTransform
    from ckptz.series.run import SeriesPlan

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
    "detach",
    "inspect",
    "verify",
]


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
    discard: bool = False,
    team: Team = SOLO,
    series: bool = False,
    keyframe_every: int = 8,
    skip_unreadable: bool = False,
) -> Summary:
    """Compress checkpoint files and folders.

    Each checkpoint file ``X`` (recognised by content or suffix, or chosen by ``include``)
    becomes ``X.ckptz`` with ``X``'s permission bits and mtime (and owner, as root); other
    files are copied unchanged with theirs (with ``dst``) or left alone (``in_place``), empty
    folders and symlinks are kept, and hard links are compressed once. In place, each
    container is decoded and compared with the original before the original is removed.

    Args:
        src: one or more checkpoint files or folders (shell-style patterns are expanded).
        dst: output file or folder (see :mod:`ckptz.runs.plan`); default ``SRC.ckptz`` beside a
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
        discard: code and check everything but write nothing (measures the pipeline without
            storage; ``dst`` and ``in_place`` are ignored).
        team: the ranks this call is one part of (:mod:`ckptz.runs.share`; the CLI passes
            them under ``torchrun``); this process does its share and returns its part.
        series: the source is a run folder: code each checkpoint's tensors as their XOR with
            the next newer checkpoint's, and re-code the previous newest one when a
            checkpoint was added (:mod:`ckptz.series.run`).
        keyframe_every: with ``series``, a restore decodes at most this many containers.
        skip_unreadable: leave out the files that cannot be read (listed in the summary's
            actions as skipped, ``cannot be read``) instead of refusing to run.

    Raises:
        CkptzError: bad arguments, unreadable input (``UnreadableError``: files this user
            cannot read, before anything is done), a failed write, another run on the same
            files (``BusyError``), a stop (``StoppedError``), or in place files that changed
            after they were read (``SourceChangedError``, once the other files are done: each
            kept as it is now, without a container); nothing is lost.
    """
    reporter = reporter or SilentReporter()
    start = time.perf_counter()
    codec = check_codec(codec)
    check_device(device, codec, writes=True)  # before any output folder is made
    warm_gpu(device, codec, writes=True)  # the GPU comes up while the files are scanned and planned
    trees = scan_sources(src)
    # Discarding names no outputs: planned as in place, which needs none.
    out = Output.parse(None if discard else dst, in_place or discard, len(trees), trees[0].is_dir)
    in_place = in_place and not discard
    selection = Selection(tuple(include), tuple(exclude))
    if series and team is not SOLO:
        raise UsageError("--series runs in one process", hint="run it without torchrun or --nproc")
    p = plan(
        trees,
        out,
        compress=True,
        selection=selection,
        force=force or discard,
        skip_unreadable=skip_unreadable,
    )
    mine = team.share(p)
    warm_gpu(device, codec, writes=True, job_bytes=mine.converted_bytes)  # a large job's GPU, likewise
    root = ", ".join(str(t.root) for t in trees)
    sp = _series_plan(trees, p, keyframe_every) if series and not (discard or dry_run) else None
    if discard:
        return _discard(True, root, mine, device, threads, level, codec, memory, reporter, start)
    if dry_run:
        from ckptz.runs.estimate import estimate

        with engine_session(device, threads, level, codec, memory, reporter, writes=True) as (
            sampler,
            notices,
        ):
            files = estimate(
                [(j.entry.path, j.label) for j in mine.converts + mine.finishes], sampler, sample_bytes
            )
        return make_summary("compress", root, files, p, sampler, start, notices, dry_run=True, compress=True)
    # In place, the original is removed only after its container decoded back to it.
    verify = True if in_place else bool(verify)
    stop = Stop()
    team.watch(stop)
    done: list[str] = []
    # In place: each file as read, by (device, inode), and those that changed after that.
    read: dict[tuple[int, int], FileIdentity] = {}
    changed = Changed()
    with ExitStack() as stack:
        stack.enter_context(stopping(mine, done))
        stack.enter_context(locked(mine))
        opening, notices = stack.enter_context(
            engine_for_plan(mine, device, threads, level, codec, memory, reporter, True, writes=True)
        )
        _tell_linked_elsewhere(mine, in_place, True, reporter, notices)
        prepare(mine, stop, done)
        team.ready(p)
        _finish_interrupted(mine.finishes, opening, stop, done, changed, compress=True)
        reporter.start(sum(j.entry.size for j in mine.converts), "compress")

        def one(job: Job) -> FileStats | None:
            assert opening is not None
            reporter.file(job.label)
            make = sp.transform(job) if sp is not None else None
            try:
                stats = _compress_one(job, opening.get, verify, in_place, reporter, stop, make, read, force)
            except SourceChangedError as exc:
                changed.add(exc)  # the other files go on
                return None
            reporter.file_done(job.label)
            return stats

        files = [f for f in run_jobs(one, mine.converts, stop, name=job_label, done=done) if f is not None]
        team.converted()
        carry(mine, stop, done, in_place, reporter, read, changed)
        remove_stale(mine.stale, {out_dir for _, out_dir in mine.dirs})
        engine = opening.get() if opening is not None else None
        # Re-coding against a file that changed would name a container no longer there.
        if sp is not None and sp.recodes and not changed.labels:
            files += _recode_all(
                sp, engine, device, threads, level, codec, memory, reporter, stop, done, changed
            )
        changed.raise_any(compress=True)
    return make_summary("compress", root, files, p, engine, start, notices, compress=True)


def _series_plan(trees: list[Tree], p: Plan, keyframe_every: int) -> SeriesPlan:
    from ckptz.series.run import plan_series

    if len(trees) != 1 or not trees[0].is_dir:
        raise UsageError("--series needs one run folder", hint="name the folder that holds checkpoint-N/ ...")
    if keyframe_every < 1:
        raise UsageError("--keyframe-every must be at least 1")
    return plan_series(trees[0], p, keyframe_every)


def _recode_all(
    sp: SeriesPlan,
    engine: Engine | None,
    device: str | None,
    threads: int | None,
    level: int,
    codec: str,
    memory: int | None,
    reporter: Reporter,
    stop: Stop,
    done: list[str],
    changed: Changed,
) -> list[FileStats]:
    """Re-code the previous newest files against the new ones, one at a time, each safely (a
    container changed meanwhile is kept and added to ``changed``)."""
    from ckptz.series.run import recode

    with ExitStack() as stack:
        if engine is None:
            engine, _ = stack.enter_context(
                engine_session(device, threads, level, codec, memory, reporter, writes=True)
            )
        out = []
        for node, ref in sp.recodes:
            stop.check()
            label = node.member.entry.rel
            reporter.file(label)
            try:
                index = recode(node.target, label, engine, ref.target, stop.ticker(ignore_progress))
            except SourceChangedError as exc:
                changed.add(exc)
                continue
            out.append(index_stats(label.removesuffix(SUFFIX), index, node.target.stat().st_size))
            reporter.file_done(label)
            done.append(label)
        return out


def detach(
    path: str | Path | Sequence[str | Path],
    *,
    threads: int | None = None,
    device: str | None = None,
    reporter: Reporter | None = None,
) -> Summary:
    """Make series containers self-contained again, in place (keyframes later runs keep).

    Every container under ``path`` that is coded against a reference is restored (through
    its reference), coded again on its own, checked and renamed over itself; containers
    that reference it still restore (its original bytes do not change). Safe at every
    instant, like every in-place change.

    Raises:
        ReferenceMissingError: a container's reference is already gone (it is left as it is).
    """
    from ckptz.series.run import recode

    reporter = reporter or SilentReporter()
    start = time.perf_counter()
    trees = scan_sources(path)
    todo: list[tuple[Path, str]] = []
    for t in trees:
        for e in t.entries:
            if e.kind == "container":
                with open(e.path, "rb") as f:
                    if "reference" in read_index(f, e.rel).header:
                        todo.append((e.path, e.rel))
    files: list[FileStats] = []
    stop = Stop()
    done: list[str] = []
    with ExitStack() as stack:
        stack.enter_context(hold([p.parent for p, _ in todo], [t.root for t in trees]))
        engine, notices = stack.enter_context(engine_session(device, threads, 3, "auto", None, reporter))
        for container, rel in todo:
            stop.check()
            reporter.file(rel)
            index = recode(container, rel, engine, None)
            files.append(index_stats(rel.removesuffix(SUFFIX), index, container.stat().st_size))
            reporter.file_done(rel)
            done.append(rel)
    root = ", ".join(str(t.root) for t in trees)
    return Summary(
        "detach",
        root,
        tuple(files),
        total_components(files),
        (),
        engine.device,
        engine.threads,
        time.perf_counter() - start,
        tuple(notices),
        tuple(Action("detach", str(c)) for c, _ in todo),
    )


def _compress_one(
    job: Job,
    engine: Callable[[], Engine],
    verify: bool,
    in_place: bool,
    reporter: Reporter,
    stop: Stop,
    transform: Callable[[FileLayout], FrameTransform | None] | None = None,
    read: dict[tuple[int, int], FileIdentity] | None = None,
    force: bool = False,
) -> FileStats:
    """Compress one file; in place, replace it only while it is the file that was read (its
    identity taken before its first byte is read, recorded in ``read`` once it is replaced),
    and (without ``force``) give its container its name only while no other file took it.

    Raises:
        SourceChangedError: in place, the file changed after it was read; it is kept as it
            is now and its container removed.
        NameTakenError: in place, another program made a file of the container's name
            meanwhile; both are kept.
    """
    e, target = job.entry, job.target
    identity, st = FileIdentity.open(e.path, job.label)
    meta = FileMeta.of(st)
    replace = force or not in_place

    try:
        with atomic_output(target, meta.container(), identity if in_place else None, replace=replace) as (
            f,
            _tmp,
        ):
            # ``verify`` decodes every frame back from the payloads written and reads the
            # file back before it is renamed (see ckptz.pipeline.compress and RELIABILITY.md).
            written = compress_file(
                e.path,
                job.label,
                f,
                engine,
                progress=stop.ticker(reporter.advance),
                verify=verify,
                source_fields=meta.to_json(),
                transform=transform,
            )
    except CkptzError as exc:
        _changed_instead(exc, identity if in_place else None)
        raise
    if in_place:
        remove_original(identity, target)
        if read is not None:
            read[identity.device, identity.inode] = identity  # its other names may follow
    return index_stats(job.label, written.index, written.size)


def _discard(
    compress: bool,
    root: str,
    p: Plan,
    device: str | None,
    threads: int | None,
    level: int,
    codec: str,
    memory: int | None,
    reporter: Reporter,
    start: float,
) -> Summary:
    """Code (or decode) and check every file the plan converts, and write nothing."""
    stop = Stop()
    operation = "compress" if compress else "decompress"
    with engine_for_plan(p, device, threads, level, codec, memory, reporter, True, writes=compress) as (
        opening,
        notices,
    ):

        def one(job: Job) -> FileStats:
            assert opening is not None
            tick = stop.ticker(reporter.advance)
            if compress:
                written = compress_file(job.entry.path, job.label, None, opening.get, progress=tick)
                return index_stats(job.label, written.index, written.size)
            with open(job.entry.path, "rb") as c:
                index = read_index(c, job.label)  # while the engine opens
                restore(c, job.label, opening.get(), DiscardSink(), index=index, progress=tick)
            return index_stats(job.label.removesuffix(SUFFIX), index, job.entry.size)

        files = run_jobs(one, p.converts + p.finishes, stop, name=job_label, done=[])
        engine = opening.get() if opening is not None else None
    return make_summary(operation, root, files, Plan(), engine, start, notices, compress=compress)


def _tell_linked_elsewhere(
    p: Plan, in_place: bool, compress: bool, reporter: Reporter, notices: list[str]
) -> None:
    """In place, say which files keep their old form under hard links the run was not given
    (:func:`~ckptz.runs.plan.linked_elsewhere`): the link is broken there, never silently."""
    if not in_place:
        return
    for line in linked_elsewhere(p, compress):
        notices.append(line)
        reporter.notice(line)


def _compare(container: Path, original: Path, rel: str, engine: Engine, stop: Stop | None = None) -> None:
    progress = ignore_progress if stop is None else stop.ticker(ignore_progress)
    with open(container, "rb") as c, open(original, "rb") as o:
        comparer = Comparer(o, rel)
        restore(c, rel, engine, comparer, progress=progress)
        comparer.finish()


def _finish_interrupted(
    jobs: list[Job],
    opening: OpeningEngine | None,
    stop: Stop,
    done: list[str],
    changed: Changed,
    *,
    compress: bool,
) -> None:
    """Finish in-place work a killed run left with both forms present.

    The container is decoded and compared with the original, and only if they match, and
    both are still the files compared, is the input (whichever of the two the command
    replaces) removed. A mismatch stops the run with both files kept and says which one is
    stale and how to go on; an input changed since it was compared is kept, the other form
    removed, and added to ``changed``; the form to keep changed since (a trainer saved it
    again) keeps both, the input then being the only copy of the bytes compared, and is
    added to ``changed``.
    """
    for j in jobs:
        assert opening is not None
        stop.check()
        original, container = (j.entry.path, j.target) if compress else (j.target, j.entry.path)
        identity, _ = FileIdentity.open(j.entry.path, j.label)
        kept_label = j.label.removesuffix(SUFFIX) if not compress else j.label + SUFFIX
        try:
            kept, _ = FileIdentity.open(j.target, kept_label)
        except OSError:  # gone since the run was planned: the input is all there is
            changed.add(SourceChangedError((kept_label,)))
            continue
        try:
            _compare(container, original, str(original), opening.get(), stop)
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
        if not kept.holds():
            changed.add(SourceChangedError((kept.label,)))
            continue
        try:
            remove_original(identity, j.target)
        except SourceChangedError as exc:
            changed.add(exc)
            continue
        done.append(j.label)


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
    discard: bool = False,
    team: Team = SOLO,
    skip_unreadable: bool = False,
) -> Summary:
    """Restore every container under the sources to its original bytes and metadata
    (``discard``: decode and check everything, write nothing).

    Each restored file is written to a temporary name, checked against the original's
    digest, given the original's permission bits and mtime (and owner, as root), and only
    then renamed; in place, the container is removed after that.

    A file that cannot be read is refused before anything is done (``UnreadableError``), or
    with ``skip_unreadable`` left out and listed in the summary's actions as skipped.

    Raises:
        CkptzError: bad arguments, a file that is not a container or cannot be read, a
            damaged container, a failed write, another run on the same files, a stop, or in
            place containers that changed after they were read (``SourceChangedError``, once
            the other files are done: each kept as it is now, nothing restored from it).
    """
    reporter = reporter or SilentReporter()
    start = time.perf_counter()
    trees = scan_sources(src)
    # Discarding names no outputs: planned as in place, which needs none.
    out = Output.parse(None if discard else dst, in_place or discard, len(trees), trees[0].is_dir)
    in_place = in_place and not discard
    selection = Selection(tuple(include), tuple(exclude))
    p = plan(
        trees,
        out,
        compress=False,
        selection=selection,
        force=force or discard,
        skip_unreadable=skip_unreadable,
    )
    mine = team.share(p)
    root = ", ".join(str(t.root) for t in trees)
    codec = decoding_codec(mine.converts + mine.finishes, device)
    if dry_run and not discard:  # reads the containers' indexes: no engine, no GPU
        files = [_container_stats(j.entry.path, j.label) for j in mine.converts + mine.finishes]
        return make_summary("decompress", root, files, p, None, start, [], dry_run=True, compress=False)
    check_device(device)  # before any output folder is made
    warm_gpu(device, codec)  # where a container holds a bitstream only a GPU decodes
    if discard:
        return _discard(False, root, mine, device, threads, 3, codec, memory, reporter, start)
    stop = Stop()
    team.watch(stop)
    done: list[str] = []
    # In place: each container as read, by (device, inode), and those that changed after that.
    read: dict[tuple[int, int], FileIdentity] = {}
    changed = Changed()
    with ExitStack() as stack:
        stack.enter_context(stopping(mine, done))
        stack.enter_context(locked(mine))
        opening, notices = stack.enter_context(
            engine_for_plan(mine, device, threads, 3, codec, memory, reporter, False)
        )
        _tell_linked_elsewhere(mine, in_place, False, reporter, notices)
        prepare(mine, stop, done)
        team.ready(p)
        _finish_interrupted(mine.finishes, opening, stop, done, changed, compress=False)
        reporter.start(sum(_source_size(j.entry.path) for j in mine.converts), "decompress")

        def one(job: Job) -> FileStats | None:
            assert opening is not None
            reporter.file(job.label)
            try:
                stats = _restore_one(job, opening.get, in_place, reporter, stop, read, force)
            except SourceChangedError as exc:
                changed.add(exc)  # the other files go on
                return None
            reporter.file_done(job.label)
            return stats

        files = [f for f in run_jobs(one, mine.converts, stop, name=job_label, done=done) if f is not None]
        team.converted()
        carry(mine, stop, done, in_place, reporter, read, changed)
        remove_stale(mine.stale, {out_dir for _, out_dir in mine.dirs})
        engine = opening.get() if opening is not None else None
        changed.raise_any(compress=False)
    return make_summary("decompress", root, files, p, engine, start, notices, compress=False)


def _restore_one(
    job: Job,
    engine: Callable[[], Engine],
    in_place: bool,
    reporter: Reporter,
    stop: Stop,
    read: dict[tuple[int, int], FileIdentity] | None = None,
    force: bool = False,
) -> FileStats:
    """Restore one container; its output is made, and where written through mappings begins
    reserving its space (:class:`~ckptz.pipeline.restore.FileSink`), while ``engine`` opens.
    In place, the container is replaced only while it is the one that was read (recorded in ``read``
    once it is replaced), and (without ``force``) the restored file takes its name only
    while no other file did (a trainer saving it again).

    Raises:
        SourceChangedError: in place, the container changed after it was read; it is kept
            as it is now and the restored file removed.
        NameTakenError: in place, another program made a file of the restored file's name
            meanwhile; both are kept.
    """
    e, target = job.entry, job.target
    with open(e.path, "rb") as c:
        identity = FileIdentity.of(e.path, job.label, os.fstat(c.fileno()))
        try:
            index = read_index(c, job.label)
            meta = FileMeta.from_json(index.header.get("source"))
            replace = force or not in_place
            with atomic_output(target, meta, identity if in_place else None, replace=replace) as (f, _tmp):
                # The container goes away next: each frame is read back as it is written.
                sink = FileSink(f, index.source_size, read_back=in_place, path=job.label)
                restore(
                    c,
                    job.label,
                    engine(),
                    sink,
                    index=index,
                    progress=stop.ticker(reporter.advance),
                )
                if in_place:
                    _check_size(f.fileno(), index.source_size, job.label)
        except CkptzError as exc:
            _changed_instead(exc, identity if in_place else None)
            raise
    stats = index_stats(job.label.removesuffix(SUFFIX), index, identity.size)
    if in_place:
        remove_original(identity, target)
        if read is not None:
            read[identity.device, identity.inode] = identity  # its other names may follow
    return stats


def _changed_instead(error: CkptzError, read: FileIdentity | None) -> None:
    """A file rewritten while it was read fails the reader's own checks (it grew, a checksum
    is wrong): in place (``read`` given), raise what happened to it instead of what the
    reader saw."""
    if read is None or isinstance(error, StoppedError | BusyError | SourceChangedError):
        return
    if not read.holds():
        raise SourceChangedError((read.label,)) from None


def _check_size(fd: int, size: int, rel: str) -> None:
    """A file restored in place, every frame of it read back as written: it must also end
    where the original did (its frames tile exactly ``size`` bytes)."""
    if os.fstat(fd).st_size != size:
        raise CorruptionError(f"restored file is not the original's {size} bytes long", path=rel)


def _source_size(container: Path) -> int:
    with open(container, "rb") as f:
        return read_index(f, str(container)).source_size


def _container_stats(path: Path, label: str) -> FileStats:
    with open(path, "rb") as f:
        index = read_index(f, str(path))  # an error names the file as the user can find it
    return index_stats(label.removesuffix(SUFFIX), index, path.stat().st_size)


def _damaged(label: str, path: Path, exc: CkptzError | OSError) -> FileStats:
    """The row of a container that could not be read: it names the file and why."""
    reason = str(exc) if isinstance(exc, CkptzError) else f"{path}: cannot read ({exc.strerror or exc})"
    if str(path) not in reason:
        reason = f"{path}: {reason}"
    status = "damaged"
    if isinstance(exc, ReferenceMissingError):
        whole = isinstance(exc, ReferenceChangedError) and not isinstance(exc, ReferenceDamagedError)
        status = "changed reference" if whole else "missing reference"
    return FileStats(label.removesuffix(SUFFIX), status, 0, None, (), error=reason)


def _check_chain(container: Path) -> None:
    """A series container's references must all be there (only indexes are read)."""
    with open(container, "rb") as f:
        if "reference" not in read_index(f, str(container)).header:
            return
    from ckptz.series.run import chain

    chain(container)


def inspect(path: str | Path | Sequence[str | Path]) -> Summary:
    """Describe checkpoints or their compressed form without decoding any payload.

    Raw checkpoint files are cut into segments (bytes per component and dtype); containers
    report per component their original and compressed bytes and the codecs used.
    """
    start = time.perf_counter()
    trees = scan_sources(path)
    files: list[FileStats] = []
    others: list[str] = []
    several = len(trees) > 1
    for t in trees:
        # Several sources (a shell glob over checkpoint-*/optimizer.pt) are told apart by the
        # folder each is, or is in.
        folder = (t.root.name or str(t.root)) if t.is_dir else t.root.parent.name
        prefix = folder + "/" if several and folder else ""
        for e in t.entries:
            label = prefix + e.rel
            if e.kind == "container":
                try:
                    stats = _container_stats(e.path, label)
                    _check_chain(e.path)
                except (CkptzError, OSError) as exc:
                    if not t.is_dir:
                        raise
                    # One damaged container in a folder is a row among the others, not the end of the listing.
                    stats = _damaged(label, e.path, exc)
                files.append(stats)
            elif e.kind == "checkpoint" or (e.kind in ("other", "unreadable") and not t.is_dir):
                files.append(layout_stats(label, read_layout(e.path, label)))
            elif e.kind in ("other", "unreadable"):
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
    team: Team = SOLO,
    skip_unreadable: bool = False,
) -> VerifyResult:
    """Check that restoring ``path`` gives exactly ``against`` (or, alone, that it decodes).

    With ``against`` (the original file or folder), every file must be present on both sides
    with equal bytes and permission bits: containers are decoded and compared in a stream,
    plain files byte for byte, symlinks by target. Missing, extra and changed files each get
    an entry. Without it, every container is decoded and its checksums checked, and other
    files are listed as not checked. Failures are recorded per file, not raised: a file
    that cannot be read is ``unreadable`` (a failure), or with ``skip_unreadable``
    ``skipped``.
    """
    reporter = reporter or SilentReporter()
    start = time.perf_counter()
    trees = scan_sources(path)
    base = None if against is None else scan(expand([str(against)])[0])
    stop = Stop()
    team.watch(stop)
    with ExitStack() as stack:
        stack.enter_context(hold((), [t.root for t in trees] + ([base.root] if base else [])))
        engine, notices = stack.enter_context(
            engine_session(device, threads, 3, "auto", None, reporter, announce=False)
        )
        checks = verify_trees(trees, base, engine, reporter, stop, team, skip_unreadable)
    return VerifyResult(
        ", ".join(str(t.root) for t in trees),
        tuple(checks),
        None if base is None else str(base.root),
        engine.device,
        time.perf_counter() - start,
        tuple(notices),
    )
