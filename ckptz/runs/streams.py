"""One file through a pipe: ``compress -c``/``-o -`` and ``decompress -``, as zstd does.

A stream source (stdin) is spooled to a private temporary file first, since format readers
seek; a stream output gets the bytes as they are produced.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import BinaryIO

from ckptz.accounting import index_stats
from ckptz.container import SUFFIX, read_index
from ckptz.errors import UsageError
from ckptz.meta import FileMeta
from ckptz.pipeline import FileSink, compress_file, restore
from ckptz.runs.jobs import Stop
from ckptz.runs.plan import Action, Plan
from ckptz.runs.results import Reporter, SilentReporter, Summary
from ckptz.runs.run import check_codec, engine_session, make_summary
from ckptz.runs.tree import expand, scan
from ckptz.safeio import atomic_output, is_device, os_error

_BLOCK = 8 << 20


@contextmanager
def spooled(stream: BinaryIO, near: Path | None = None) -> Iterator[Path]:
    """Copy ``stream`` to a temporary file (mode 0600, in ``near`` or ``$TMPDIR``); yield its path.

    The file is removed when the block ends, however it ends.
    """
    folder = near if near is not None and near.is_dir() else None
    try:
        fd, name = tempfile.mkstemp(prefix=".ckptz-stdin-", dir=folder)
    except OSError as exc:
        raise os_error(exc, Path(folder or tempfile.gettempdir())) from None
    path = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            while block := stream.read(_BLOCK):
                f.write(block)
        yield path
    finally:
        path.unlink(missing_ok=True)


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
    codec = check_codec(codec)
    with ExitStack() as stack:
        path, label = _stream_source(src, out, stack)
        if _kind_of(path) == "container":
            p = Plan(skipped=[Action("skip", label, note="already a ckptz container")])
            return make_summary("compress", label, [], p, None, start, [], compress=True)
        engine, notices = stack.enter_context(
            engine_session(device, threads, level, codec, memory, reporter, writes=True)
        )
        reporter.start(path.stat().st_size, "compress")
        reporter.file(label)
        tick = Stop().ticker(reporter.advance)
        if isinstance(out, str | Path):
            target = _stream_target(Path(out), force)
            meta = FileMeta.of(path.stat()) if isinstance(src, str | Path) else None
            with atomic_output(target, meta.container() if meta else None) as (f, _tmp):
                fields = meta.to_json() if meta is not None else None
                written = compress_file(path, label, f, engine, progress=tick, source_fields=fields)
                index, size = written.index, written.size
        else:
            written = compress_file(path, label, out, engine, progress=tick)
            index, size = written.index, written.size
            out.flush()
        reporter.file_done(label)
        files = [index_stats(label, index, size)]
        p = Plan()
        return make_summary("compress", label, files, p, engine, start, notices, compress=True)


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
            engine_session(device, threads, 3, "auto", memory, reporter, announce=False)
        )
        reporter.start(index.source_size, "decompress")
        reporter.file(label)
        tick = Stop().ticker(reporter.advance)
        if isinstance(out, str | Path):
            target = _stream_target(Path(out), force)
            meta = FileMeta.from_json(index.header.get("source"))
            with atomic_output(target, meta) as (f, _tmp):
                restore(c, label, engine, FileSink(f, index.source_size), index=index, progress=tick)
        else:
            restore(c, label, engine, out.write, index=index, progress=tick)
            out.flush()
        reporter.file_done(label)
        files = [index_stats(label.removesuffix(SUFFIX), index, path.stat().st_size)]
        return make_summary("decompress", label, files, Plan(), engine, start, notices, compress=False)


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
    if is_device(target):
        return target  # written into (-o /dev/null), never replaced
    if target.is_dir():
        raise UsageError("output is a folder", path=str(target), hint="name a file")
    if not force and (target.exists() or target.is_symlink()):
        raise UsageError("output already exists", path=str(target), hint="remove it or pass --force")
    return target


def _kind_of(path: Path) -> str:
    return scan(path).entries[0].kind
