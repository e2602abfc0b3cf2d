"""Measuring the bandwidth of the storage checkpoints are written to."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np

from ckptz.bench.savings import StorageSpeed
from ckptz.errors import UsageError

#: Bytes written by default: large enough to pass small write-back caches, small enough to be quick.
PROBE_BYTES = 256 << 20
BLOCK = 8 << 20


def measure_storage(folder: str | Path, size: int = PROBE_BYTES) -> StorageSpeed:
    """Write a temporary file in ``folder`` with fsync, read it back, remove it.

    The write is timed until ``fsync`` returns. Before reading, the file's pages are dropped
    from the page cache with ``posix_fadvise(DONTNEED)`` where the OS has it; a kernel may
    keep some anyway, so the read figure is an upper bound for cold reads. The probe uses at
    most a tenth of the free space.

    Raises:
        UsageError: ``folder`` is not a folder or has too little free space.
        OSError: writing or reading failed.
    """
    path = Path(folder)
    if not path.is_dir():
        raise UsageError("--storage must name an existing folder", path=str(path))
    size = min(size, shutil.disk_usage(path).free // 10) // BLOCK * BLOCK
    if size < BLOCK:
        raise UsageError("too little free space to measure the storage", path=str(path))
    # Random bytes: storage that compresses or deduplicates must not flatter the figure.
    block = np.random.default_rng(0).integers(0, 256, BLOCK, dtype=np.uint8)
    probe = path / f".ckptz-bench-{os.getpid()}.tmp"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            start = time.perf_counter()
            for _ in range(size // BLOCK):
                _write_all(fd, memoryview(block.data))
            os.fsync(fd)
            write_s = time.perf_counter() - start
        finally:
            os.close(fd)
        dropped = _drop_cache(probe)
        buf = np.empty(BLOCK, np.uint8)
        with open(probe, "rb", buffering=0) as f:
            start = time.perf_counter()
            while f.readinto(buf.data):
                pass
            read_s = time.perf_counter() - start
    finally:
        probe.unlink(missing_ok=True)
    how = "after posix_fadvise(DONTNEED)" if dropped else "without dropping the page cache (may be cached)"
    method = f"wrote {size >> 20} MiB with fsync, read it back {how}, removed it"
    return StorageSpeed(size / write_s / 1e9, size / read_s / 1e9, method, str(path))


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view) :]


def _drop_cache(path: Path) -> bool:
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True
