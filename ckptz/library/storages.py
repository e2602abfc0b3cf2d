"""``ckptz.load`` of a ``torch.save`` container: decoded straight into the storages that the
loaded tensors use, on the GPU that ``map_location`` names or else in host memory.

The container's index says where each storage's bytes lie in the original file (the
``torch.save`` zip's stored records: one tensor segment each). One storage is made per
record, and the restore loop (:func:`ckptz.pipeline.restore`, every check it makes) runs
with a :class:`~ckptz.pipeline.device.DeviceRanges` sink: decoded record bytes go straight
into their storages (device to device on the GPU engine, where they were decoded);
everything else (the zip's headers and directory, the pickle) into a host buffer.
``torch.load``'s own loader then unpickles from that buffer (with its ``weights_only``
unpickler unless the caller trusts the file) through a zip reader that hands it those
storages, and moves each where ``map_location`` says, as ``torch.load`` does: a storage
already on that GPU stays where it is. So decoded bytes are written once, where they stay.

This uses torch's loader below ``torch.load`` (``torch.serialization._load`` and the zip
reader's record offsets). Where those are not as expected, or the file is not a plain
``torch.save`` zip (TorchScript, a legacy pickle), :func:`load_storages` declines and
``ckptz.load`` decodes the whole file into one buffer that ``torch.load`` reads.
"""

from __future__ import annotations

import atexit
import inspect
import mmap
import pickle
import threading
from typing import IO, Any, BinaryIO, cast

import numpy as np
import torch

from ckptz import trace
from ckptz.container import Index, read_index
from ckptz.engines.base import Engine
from ckptz.engines.cpu import CpuEngine
from ckptz.errors import FormatError
from ckptz.pipeline.device import DeviceRanges
from ckptz.pipeline.restore import restore
from ckptz.pipeline.whole import MemoryFile, memory_for

_engines: dict[int, Engine] = {}
_engines_lock = threading.Lock()


def _cuda_target(map_location: Any) -> torch.device | None:
    """The one CUDA device ``map_location`` sends every storage to, or None."""
    if isinstance(map_location, str | torch.device):
        try:
            dev = torch.device(map_location)
        except (RuntimeError, TypeError):
            return None
        if dev.type != "cuda" or not torch.cuda.is_available():
            return None
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return torch.device("cuda", index) if index < torch.cuda.device_count() else None
    return None


def _gpu_engine(device: torch.device) -> Engine | None:
    """The process's GPU engine on ``device`` (kept for later loads: starting one costs more
    than a small load), or None where nvCOMP cannot run there."""
    from ckptz.engines import gpu_unavailable_reason, nvcomp_installed

    if not nvcomp_installed() or gpu_unavailable_reason() is not None:
        return None
    with _engines_lock:
        engine = _engines.get(device.index)
        if engine is None:
            from ckptz.engines.gpu.engine import GpuEngine

            try:
                engine = GpuEngine(device.index)
            except (RuntimeError, OSError):
                return None
            if not _engines:
                atexit.register(_close_engines)
            _engines[device.index] = engine
        return engine


def _close_engines() -> None:
    with _engines_lock:
        for engine in _engines.values():
            engine.close()
        _engines.clear()


def _loader_fits() -> bool:
    """Whether torch's loader below ``torch.load`` is the one this module drives."""
    load = getattr(torch.serialization, "_load", None)
    reader = getattr(torch._C, "PyTorchFileReader", None)
    if load is None or reader is None or not hasattr(reader, "get_record_offset"):
        return False
    try:
        params = inspect.signature(load).parameters
    except (TypeError, ValueError):
        return False
    return list(params)[:3] == ["zip_file", "map_location", "pickle_module"]


class _StorageZip:
    """A ``torch.save`` zip reader whose stored records come from the storages decoded for
    them (everything else is the wrapped reader's)."""

    def __init__(self, reader: Any, storages: dict[int, torch.Tensor]) -> None:
        self._reader = reader
        self._storages = storages

    def get_storage_from_record(self, name: str, numel: int, dtype: Any) -> torch.Tensor:
        offset = self._reader.get_record_offset(name)
        storage = self._storages.get(offset)
        if storage is None:
            return self._reader.get_storage_from_record(name, numel, dtype)
        if storage.numel() != numel:
            raise FormatError(f"record {name} holds {storage.numel()} bytes, its tensor {numel}")
        return storage

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)


def load_storages(
    container: BinaryIO,
    name: str,
    map_location: Any,
    pickle_module: Any,
    weights_only: bool,
    pickle_load_args: dict[str, Any],
    index: Index | None = None,
) -> tuple[bool, Any]:
    """Load a ``torch.save`` container as the module docstring says; ``(False, None)`` where
    this path does not apply and the caller should decode the whole file instead.

    Raises:
        ContainerError: the container is unreadable.
        CorruptionError: some of its bytes fail their checksum.
        pickle.UnpicklingError: ``weights_only`` met something it will not unpickle.
    """
    if not _loader_fits():
        return False, None
    if index is None:
        with trace.span("load: index"):
            index = read_index(container, name)
    if index.header.get("source", {}).get("format") != "torch-zip":
        return False, None
    device = _cuda_target(map_location)
    engine = _gpu_engine(device) if device is not None else None
    with trace.span("load: storages"):
        host, storages = _targets(index, device if engine is not None else None)
    targets: list[tuple[int, Any]] = [(at, s if s.is_cuda else s.numpy()) for at, s in storages.items()]
    targets += [(at, host[at : at + n]) for at, n in _gaps(index.source_size, storages)]
    with trace.span("load: restore"):
        if engine is not None:
            restore(container, name, engine, DeviceRanges(targets), index=index)
        else:
            with CpuEngine() as cpu:
                restore(container, name, cpu, DeviceRanges(targets), index=index)
    try:
        reader = torch._C.PyTorchFileReader(cast(IO[bytes], MemoryFile(host, name)))
        records = {reader.get_record_offset(r) for r in reader.get_all_records()}  # type: ignore[attr-defined]
    except RuntimeError:
        # The index's tensor_keys put a storage where the zip's own structure lies (a
        # hostile index; the bytes passed their digest): decode the whole file instead.
        return False, None
    for at in [at for at in storages if at not in records]:
        # Bytes at no record's start are read from the host buffer: they must be there.
        stray = storages.pop(at)
        host[at : at + stray.numel()] = stray.cpu().numpy()
    if reader.has_record("constants.pkl"):  # type: ignore[attr-defined]  # TorchScript: torch.load hands it to torch.jit
        return False, None
    if weights_only:
        if pickle_module is not None:
            raise RuntimeError("Can not safely load weights when explicit pickle_module is specified")
        pickle_module = torch.serialization._weights_only_unpickler
    pickle_module = pickle_module or pickle
    args = {"encoding": "utf-8", **pickle_load_args}
    try:
        with trace.span("load: unpickle"):
            return True, torch.serialization._load(
                _StorageZip(reader, storages), map_location, pickle_module, **args
            )
    except pickle.UnpicklingError as exc:
        if not weights_only:
            raise
        # torch.load's own wording, which callers match on.
        raise pickle.UnpicklingError(
            "Weights only load failed. Re-running `ckptz.load` with `weights_only` set to `False`"
            " will likely succeed, but it can result in arbitrary code execution. Do it only if"
            f" you got the file from a trusted source.\n{exc}"
        ) from None


def _targets(index: Index, device: torch.device | None) -> tuple[np.ndarray, dict[int, torch.Tensor]]:
    """A host buffer for the whole file (its pages are only touched where written) and one
    storage per tensor segment on ``device`` (None: the CPU), by file offset."""
    keys = index.header.get("tensor_keys") or []
    lengths = index.segments["length"].astype(np.int64)
    starts = (np.cumsum(lengths) - lengths).tolist()
    storages: dict[int, torch.Tensor] = {}
    for at, n, seg_keys in zip(starts, lengths.tolist(), keys, strict=False):
        if n and seg_keys:
            storages[at] = torch.empty(n, dtype=torch.uint8, device=device or "cpu")
    return _sparse_zeros(index.source_size), storages


def _sparse_zeros(size: int) -> np.ndarray:
    """``size`` zero bytes of which only a few pages will be written (the zip's headers and
    pickle between the storages). Without transparent huge pages: with them (Linux's
    default on many hosts), each first write zero-fills 2 MiB, a cost paid again for every
    small gap between storages."""
    if size == 0 or not hasattr(mmap, "MADV_NOHUGEPAGE"):
        return np.zeros(size, np.uint8)
    try:
        area = mmap.mmap(-1, size)
    except (OSError, OverflowError, MemoryError):
        # A container may declare any size: what cannot be mapped gets the same clean error.
        return memory_for(size, "<container>")
    area.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(area, np.uint8)


def _gaps(size: int, storages: dict[int, torch.Tensor]) -> list[tuple[int, int]]:
    """The ranges of a ``size``-byte file that no storage covers."""
    out, at = [], 0
    for start in sorted(storages):
        if start > at:
            out.append((at, start - at))
        at = start + storages[start].numel()
    if size > at:
        out.append((at, size - at))
    return out


__all__ = ["load_storages"]
