"""``save_file``, ``load_file`` and ``safe_open``, shaped like ``safetensors.torch``'s.

They take containers and plain safetensors files alike. :class:`safe_open` is lazy: it reads
the header through :func:`ckptz.library.reader.open` (which decodes only the frames that
hold it), and ``get_tensor(k)`` decodes only the frames that hold ``k``'s bytes.
:func:`load_file` decodes a whole container at once, in parallel, straight into each
tensor's storage. Writing uses the ``safetensors`` package (``pip install 'ckptz[safetensors]'``);
reading needs only torch.
"""

from __future__ import annotations

import io
import math
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptz.errors import FormatError, UsageError
from ckptz.library import reader
from ckptz.library.safetensors_header import Header, TensorInfo, read_header
from ckptz.library.writing import Options, compress_to_path
from ckptz.pipeline.whole import restore_into

if TYPE_CHECKING:
    import torch


def save_file(
    tensors: dict[str, torch.Tensor],
    filename: str | os.PathLike[str],
    metadata: dict[str, str] | None = None,
    *,
    device: str | None = None,
    codec: str = "auto",
    level: int = 3,
    verify: bool = False,
) -> None:
    """Save ``tensors`` as ``safetensors.torch.save_file`` does, compressed into a container.

    The container decompresses to exactly the bytes ``safetensors.torch.save_file`` writes,
    and is written atomically under ``filename``.

    Args:
        device: where to compress (``auto``, ``cpu``, ``cuda[:N]``; default
            ``$CKPTZ_DEVICE`` or ``auto``).
        codec, level, verify: as for :func:`ckptz.save`.

    Raises:
        UsageError: the ``safetensors`` package is not installed, or a bad device or codec.
        WriteError: the file cannot be written.
    """
    try:
        from safetensors.torch import save_file as write
    except ImportError:
        raise UsageError(
            "ckptz.save_file needs the safetensors package", hint="pip install 'ckptz[safetensors]'"
        ) from None
    compress_to_path(
        Path(filename),
        lambda raw: write(tensors, raw, metadata=metadata),
        Options(device, codec, level, verify),
    )


def load_file(
    filename: str | os.PathLike[str], device: str | int | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """Load every tensor of a safetensors file or container, as ``safetensors.torch.load_file``.

    A container is decoded once, in parallel, each tensor's bytes straight into its storage,
    with every check a full restore makes (the whole file's digest included).

    Raises:
        FormatError: the file is not a safetensors file.
        ContainerError: the container is unreadable (``CorruptionError``: damaged bytes).
    """
    if not reader.is_container(filename):
        with safe_open(filename, "pt", device) as f:
            return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
    import torch

    name = os.fspath(filename)
    with reader.ContainerReader(filename) as r:
        header = read_header(r, r.size, name)
        index = r.index
    storages = {k: torch.empty(t.end - t.begin, dtype=torch.uint8) for k, t in header.tensors.items()}
    targets = [(header.tensors[k].begin, s.numpy()) for k, s in storages.items() if s.numel()]
    with open(filename, "rb") as c:
        restore_into(c, name, targets, index=index)
    return {k: _typed(s, header.tensors[k]).to(_device(device)) for k, s in storages.items()}


class safe_open:
    """A safetensors file or container, opened lazily, as ``safetensors.safe_open``.

    Use it as a context manager. ``get_tensor(k)`` reads and decodes only the frames that
    hold ``k``; the header is read once, at opening.

    Args:
        filename: a safetensors file, or a container of one.
        framework: ``pt`` (PyTorch tensors; the only one supported).
        device: where tensors go (``cpu``, ``cuda:N``, a device index).

    Raises:
        UsageError: another framework.
        FormatError: not a safetensors file.
        ContainerError: the container's index is damaged.
    """

    def __init__(
        self,
        filename: str | os.PathLike[str],
        framework: str = "pt",
        device: str | int | torch.device = "cpu",
    ) -> None:
        if framework not in ("pt", "torch"):
            raise UsageError(f"framework {framework!r} is not supported", hint="use framework='pt'")
        self._device = device
        self._lock = threading.Lock()
        self._file = reader.open(filename)
        try:
            self._size = (
                self._file.size if isinstance(self._file, reader.ContainerReader) else _size(self._file)
            )
            self._header: Header = read_header(self._file, self._size, os.fspath(filename))
        except BaseException:
            self._file.close()
            raise

    def __enter__(self) -> safe_open:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the file (a ``with`` block does it)."""
        self._file.close()

    @property
    def file(self) -> reader.ContainerReader | io.BufferedReader:
        """The file object underneath (a :class:`~ckptz.library.reader.ContainerReader`, whose
        ``stats`` count frames decoded and bytes read, for a container)."""
        return self._file

    def keys(self) -> list[str]:
        """The tensors' names, sorted."""
        return sorted(self._header.tensors)

    def metadata(self) -> dict[str, str] | None:
        """The header's ``__metadata__``, if it has one."""
        return None if self._header.metadata is None else dict(self._header.metadata)

    def get_tensor(self, name: str) -> torch.Tensor:
        """The tensor ``name``, reading only its bytes.

        Raises:
            KeyError: no tensor of that name.
            CorruptionError: its bytes fail their checks.
        """
        info = self._info(name)
        return _typed(self._read(info.begin, info.end), info).to(_device(self._device))

    def get_slice(self, name: str) -> SafeSlice:
        """A lazy view of tensor ``name``; indexing it reads only the rows it needs."""
        return SafeSlice(self, self._info(name))

    def _info(self, name: str) -> TensorInfo:
        try:
            return self._header.tensors[name]
        except KeyError:
            raise KeyError(f"no tensor named {name!r} in the file") from None

    def _read(self, begin: int, end: int) -> torch.Tensor:
        """Bytes ``[begin, end)`` of the original file, as a new uint8 tensor."""
        import torch

        out = torch.empty(end - begin, dtype=torch.uint8)
        view = out.numpy().data
        got = 0
        with self._lock:
            self._file.seek(begin)
            while got < len(view):
                n = self._file.readinto(view[got:])
                if not n:
                    raise FormatError("file ends inside a tensor", path=self._file.name)
                got += n
        return out


class SafeSlice:
    """A tensor of a :class:`safe_open` file, read in part: ``s[a:b]`` reads rows ``a`` to ``b``.

    Indexing whose first item is an integer or a slice reads only the rows it covers; any
    other index (``...``, ``None``, tensors) reads the whole tensor first.
    """

    def __init__(self, owner: safe_open, info: TensorInfo) -> None:
        self._owner = owner
        self._info = info

    def get_shape(self) -> list[int]:
        return list(self._info.shape)

    def get_dtype(self) -> str:
        """The safetensors dtype (``F32``, ``BF16``)."""
        return self._info.dtype

    def __getitem__(self, index: Any) -> torch.Tensor:
        info = self._info
        items = index if isinstance(index, tuple) else (index,)
        first = items[0] if items else None
        if not info.shape or isinstance(first, bool) or not isinstance(first, int | slice):
            return self._rows(0, info.shape[0] if info.shape else 1)[index].to(_device(self._owner._device))
        rows = info.shape[0]
        if isinstance(first, int):
            i = first + rows if first < 0 else first
            if not 0 <= i < rows:
                raise IndexError(f"index {first} is out of bounds for dimension 0 with size {rows}")
            local: int | slice = 0
            lo, hi = i, i + 1
        else:
            r = range(*first.indices(rows))
            if r.step <= 0:
                raise ValueError("step must be greater than zero")
            lo = r.start if r else 0
            hi = r[-1] + 1 if r else 0
            local = slice(0, hi - lo, r.step)
        return self._rows(lo, hi)[(local, *items[1:])].to(_device(self._owner._device))

    def _rows(self, lo: int, hi: int) -> torch.Tensor:
        """Rows ``[lo, hi)`` of the tensor (all of a 0-d one), read and typed."""
        info = self._info
        row = info.itemsize * math.prod(info.shape[1:])
        data = self._owner._read(info.begin + lo * row, info.begin + hi * row)
        shape = (hi - lo, *info.shape[1:]) if info.shape else ()
        return _typed(data, TensorInfo(info.dtype, shape, 0, 0))


def _typed(data: torch.Tensor, info: TensorInfo) -> torch.Tensor:
    """uint8 bytes as the tensor they hold."""
    import torch

    dtype = getattr(torch, info.torch_dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise FormatError(f"this torch has no dtype {info.torch_dtype}", hint="upgrade torch")
    if data.numel() == 0:
        return torch.empty(info.shape, dtype=dtype)
    return data.view(dtype).reshape(info.shape)


def _device(device: str | int | torch.device) -> str | torch.device:
    return f"cuda:{device}" if isinstance(device, int) else device


def _size(f: io.BufferedReader) -> int:
    return os.fstat(f.fileno()).st_size


__all__ = ["SafeSlice", "load_file", "safe_open", "save_file"]
