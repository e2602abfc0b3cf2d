"""``torch.distributed.checkpoint`` storage that writes and reads ckptz containers.

:class:`CompressedWriter` lets DCP write each of this rank's ``.distcp`` files as usual, but
into a private staging folder inside the checkpoint, then codes it into
``<name>.distcp.ckptz`` beside the plain ``.metadata``. That is exactly the layout
``ckptz compress DIR --in-place`` leaves on a DCP folder, so ``ckptz decompress`` gives back
a plain checkpoint that ``dcp.load`` reads with its default reader, and ``ckptz inspect`` and
``verify`` work on it. The coding runs inside :meth:`~CompressedWriter.write_data`, on the
rank that wrote the file, so ``dcp.async_save`` codes in its background executor. The staged
files are not synced (the container is): they are gone before most of their pages would
reach the disk.

Where coding happens: DCP copies every tensor, CUDA-resident or not, to host memory while it
writes the staged file, and the rank's engine codes those host bytes, on its ``LOCAL_RANK``
GPU (frames sent back through pinned buffers) or on the CPU. Coding on the GPU *before*
staging, so that only coded bytes cross PCIe, is not done: the container records the xxh3_64
of every frame's original bytes and the whole file's digest (``xxh3_tree``), and the ``.distcp`` bytes
themselves hold ``torch.save``'s CRC-32 of every tensor. All three are computed on the host,
so the original bytes must reach host memory whichever device codes them; coding from device
memory would save only the host-to-device copy, at the price of a second container writer.

:class:`CompressedReader` is DCP's ``FileSystemReader`` whose file system decodes a
``<name>.ckptz`` into memory (a temporary file for a very large one) when DCP opens
``<name>`` and only the container is there; it reads plain files, folders this writer wrote and folders the CLI compressed.

Example:
    >>> import torch.distributed.checkpoint as dcp
    >>> from ckptz.dcp import CompressedReader, CompressedWriter
    >>> dcp.save(state, storage_writer=CompressedWriter("ckpt/step-100"))  # doctest: +SKIP
    >>> dcp.load(state, storage_reader=CompressedReader("ckpt/step-100"))  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import pickle
import queue
import shutil
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import Any, BinaryIO, cast

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX, FileSystem, _split_by_size_and_type
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from ckptz import settings
from ckptz.container import SUFFIX, read_index
from ckptz.engines import gpu_unavailable_reason, open_engine
from ckptz.engines.base import Engine
from ckptz.meta import FileMeta
from ckptz.pipeline import compress_file
from ckptz.pipeline.whole import MemoryFile, restore_to_file, restore_to_memory
from ckptz.safeio import atomic_output, try_lock

__all__ = ["CompressedReader", "CompressedWriter"]

#: DCP's metadata file name; a copy restricted to this rank's items sits beside the staged
#: files so that :func:`ckptz.formats.read_layout` names their tensors (per-component ratios).
_METADATA = ".metadata"
_STAGING = ".ckptz-dcp-"


def _rank_device(device: str | None) -> str | None:
    """``device``, else this rank's ``LOCAL_RANK`` GPU where one can code, else ``auto``."""
    if device is not None or "CKPTZ_DEVICE" in settings.overridden():
        return device
    local = os.environ.get("LOCAL_RANK")
    if local is not None and local.isdigit() and gpu_unavailable_reason() is None:
        return f"cuda:{local}"
    return None


class CompressedWriter(FileSystemWriter):
    """A DCP ``StorageWriter`` that stores every ``.distcp`` file as a ckptz container.

    Args:
        path: the checkpoint folder.
        device: where to code: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (default: this rank's
            ``LOCAL_RANK`` GPU when one can code, else ``$CKPTZ_DEVICE`` or ``auto``).
        codec: the ``--codec`` of ``ckptz compress`` (``auto`` picks per stream).
        threads: CPU coding threads (default: the engine's choice).
        level: the zstd level of the CPU engine.
        verify: decode every coded frame back and read each container back before keeping it.
        **kwargs: passed to ``FileSystemWriter`` (``thread_count``, ``sync_files``, ...).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        device: str | None = None,
        codec: str = "auto",
        threads: int | None = None,
        level: int = 3,
        verify: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(path, **kwargs)
        self.device = device
        self.codec = codec
        self.threads = threads
        self.level = level
        self.verify = verify

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Write this rank's files (as ``FileSystemWriter`` does) and code each one."""
        rank = plan.storage_data.prefix.strip("_")
        staging = Path(self.path) / f"{_STAGING}{self.save_id}-{rank}"
        staging.mkdir(parents=True, exist_ok=True)
        held = -1
        try:
            held = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try_lock(held, exclusive=True)  # while this save stages here (see _remove_stale_staging)
            _remove_stale_staging(Path(self.path), rank, staging)
            results = self._write_plain(plan, planner, staging).wait()
            self._compress(staging, results)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            if held >= 0:
                os.close(held)
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    def _write_plain(self, plan: SavePlan, planner: SavePlanner, staging: Path) -> Future[list[WriteResult]]:
        # FileSystemWriter.write_data, with files in ``staging`` under their final names
        # (the names the metadata records).
        prefix = plan.storage_data.prefix
        files: queue.Queue[tuple[Path, str, list[Any]]] = queue.Queue()
        buckets = (
            _split_by_size_and_type(self.thread_count, plan.items)
            if self.single_file_per_rank
            else [[item] for item in plan.items]
        )
        for n, bucket in enumerate(buckets):
            name = f"{prefix}{n}{DEFAULT_SUFFIX}"
            files.put((staging / name, name, bucket))
        # Staged files are deleted once coded and the container is synced in their place
        # (atomic_output): syncing them too would write every original byte to the disk,
        # where unsynced ones mostly live and die in the page cache.
        staged = copy.copy(self)
        staged.sync_files = False
        return staged._write_data(planner, files)

    def _compress(self, staging: Path, results: list[WriteResult]) -> None:
        names = sorted({r.storage_data.relative_path for r in results})
        if not names:
            return
        local = Metadata(state_dict_metadata={}, storage_data={r.index: r.storage_data for r in results})
        (staging / _METADATA).write_bytes(pickle.dumps(local))
        engine, _notice = open_engine(
            _rank_device(self.device),
            threads=self.threads,
            level=self.level,
            codec=self.codec,
            writes=True,
            job_bytes=sum(os.stat(staging / name).st_size for name in names),
        )
        try:
            for name in names:
                self._compress_one(staging / name, name, engine)
        finally:
            engine.close()

    def _compress_one(self, src: Path, name: str, engine: Engine) -> None:
        final = Path(self.path) / name
        meta = FileMeta.of(os.stat(src))
        with atomic_output(final.with_name(name + SUFFIX), meta.container()) as (f, _tmp):
            compress_file(src, name, f, engine, verify=self.verify, source_fields=meta.to_json())
        # A plain file of an earlier save under the same name would shadow the container.
        with contextlib.suppress(FileNotFoundError):
            final.unlink()
        src.unlink()


def _remove_stale_staging(folder: Path, rank: str, mine: Path) -> None:
    """Remove the staging folders of this rank that killed saves left in ``folder`` (each a
    whole uncompressed copy of a shard); one a live save holds locked is left alone."""
    for stale in folder.glob(f"{_STAGING}*-{rank}"):
        if stale == mine or stale.is_symlink() or not stale.is_dir():
            continue
        try:
            fd = os.open(stale, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if try_lock(fd, exclusive=True):
                shutil.rmtree(stale, ignore_errors=True)
        finally:
            os.close(fd)


def _memory_limit() -> int:
    """Largest container decoded in memory: an eighth of the machine's memory."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 8
    except (ValueError, OSError):
        return 1 << 30


class _DecodingFileSystem(FileSystem):
    """DCP's ``FileSystem``; opening ``<name>`` for reading where only ``<name>.ckptz`` exists
    decodes the container into memory (or, above :func:`_memory_limit`, into a temporary
    file in ``tmp_dir``) and yields that."""

    def __init__(self, device: str | None, tmp_dir: str | os.PathLike[str] | None) -> None:
        super().__init__()
        self.device = device
        self.tmp_dir = tmp_dir
        self.memory_limit = _memory_limit()

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[io.IOBase, None, None]:
        plain = Path(path)
        container = plain.with_name(plain.name + SUFFIX)
        if "r" not in mode or plain.exists() or not container.exists():
            with super().create_stream(path, mode) as given:
                yield given
            return
        label = plain.name + SUFFIX
        with contextlib.ExitStack() as stack:
            engine, _notice = open_engine(self.device)
            stack.callback(engine.close)
            c = stack.enter_context(container.open("rb"))
            index = read_index(c, label)
            if index.source_size <= self.memory_limit:
                # Decoded in memory, in parallel: DCP then reads its items from there, and the
                # original bytes never go to storage and back.
                data = restore_to_memory(c, label, engine, index=index)
                stream: io.IOBase = stack.enter_context(MemoryFile(data, str(plain)))
            else:
                stream = stack.enter_context(tempfile.TemporaryFile(dir=self.tmp_dir))
                restore_to_file(c, label, cast(BinaryIO, stream), index=index, engine=engine)
                stream.seek(0)
            yield stream

    def exists(self, path: str | os.PathLike[str]) -> bool:
        plain = Path(path)
        return plain.exists() or plain.with_name(plain.name + SUFFIX).exists()


class CompressedReader(FileSystemReader):
    """A DCP ``StorageReader`` for folders holding ckptz containers (and plain files).

    Each ``.distcp.ckptz`` is decoded, with every checksum checked, into memory when DCP
    first reads from it (one that is larger than an eighth of the machine's memory into a
    temporary file), and released once DCP has read it.

    Args:
        path: the checkpoint folder.
        device: where to decode (as for :class:`CompressedWriter`; default ``auto``).
        tmp_dir: where a decoded file too large for memory lives while DCP reads it
            (default: the system's).
        **kwargs: passed to ``FileSystemReader``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        device: str | None = None,
        tmp_dir: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(path, **kwargs)
        self.fs = _DecodingFileSystem(device, tmp_dir)
