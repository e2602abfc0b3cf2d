"""``save_file``, ``load_file``, ``safe_open`` and the rest of ``safetensors.torch``'s API.

They take containers and plain safetensors files alike. :class:`safe_open` is lazy: it reads
the header through :func:`ckptz.library.reader.open` (which decodes only the frames that
hold it), and ``get_tensor(k)`` decodes only the frames that hold ``k``'s bytes.
:func:`load_file` decodes a whole container at once, in parallel, straight into each
tensor's storage. ``save``/``load`` do the same with bytes, and ``save_model``/``load_model``
handle a module's shared tensors as safetensors' own do. Writing uses the ``safetensors``
package (``pip install 'ckptz[safetensors]'``); reading needs only torch.

Every dtype safetensors 0.8 knows is read; a tensor of a dtype this torch has no type for
(``F6_E2M3``, ``F6_E3M2``) is refused when it is asked for, and the file's other tensors
still load. The ``backend`` argument is taken for compatibility: a container is decoded
the same way whichever is named.
"""

from __future__ import annotations

import builtins
import functools
import io
import math
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, BinaryIO, TypeVar, cast

from ckptz.container import MAGIC
from ckptz.errors import CkptzError, FormatError, UsageError
from ckptz.library import reader
from ckptz.library.safetensors_header import Header, TensorInfo, read_header
from ckptz.library.writing import Options, compress_to_path, compress_to_stream
from ckptz.pipeline.whole import restore_into

if TYPE_CHECKING:
    import torch

#: The storage backends ``safetensors.safe_open`` takes.
BACKENDS = ("mmap", "pread")
#: The names ``safetensors.safe_open`` takes for PyTorch and for NumPy, and its other frameworks.
TORCH_NAMES = ("pt", "torch", "pytorch")
NUMPY_NAMES = ("np", "numpy")
OTHER_FRAMEWORKS = ("tf", "tensorflow", "jax", "flax", "mlx", "paddle")


F = TypeVar("F", bound=Callable[..., Any])

#: ckptz's error types mixed with ``safetensors.SafetensorError``, made once each.
_MIXED: dict[type[BaseException], type[BaseException]] = {}


def _as_safetensors_error(exc: CkptzError | KeyError) -> BaseException:
    """``exc`` as an instance of its own type and of ``safetensors.SafetensorError`` too
    (where safetensors is installed), so code written for safetensors catches what ckptz
    raises where safetensors would raise its one error type."""
    try:
        from safetensors import SafetensorError
    except ImportError:
        return exc
    kind = type(exc)
    mixed = _MIXED.get(kind)
    if mixed is None:
        mixed = _MIXED[kind] = type(kind.__name__, (kind, SafetensorError), {"__module__": kind.__module__})
    out = mixed.__new__(mixed, *exc.args)
    out.__dict__.update(getattr(exc, "__dict__", {}))
    out.args = exc.args
    return out


def _safetensors_errors(fn: F) -> F:
    """Raise what ``fn`` raises for a bad file, a bad argument or a missing name as
    ``safetensors.SafetensorError`` too (:func:`_as_safetensors_error`)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (CkptzError, KeyError) as exc:
            raise _as_safetensors_error(exc) from None

    return cast(F, call)


def _safetensors_torch() -> Any:
    try:
        import safetensors.torch
    except ImportError:
        raise UsageError(
            "writing safetensors needs the safetensors package", hint="pip install 'ckptz[safetensors]'"
        ) from None
    return safetensors.torch


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
    write = _safetensors_torch().save_file
    compress_to_path(
        Path(filename),
        lambda raw: write(tensors, raw, metadata=metadata),
        Options(device, codec, level, verify),
    )


def save(
    tensors: dict[str, torch.Tensor],
    metadata: dict[str, str] | None = None,
    *,
    device: str | None = None,
    codec: str = "auto",
    level: int = 3,
) -> bytes:
    """A container of what ``safetensors.torch.save(tensors, metadata)`` returns, as bytes.

    Args:
        device, codec, level: as for :func:`save_file`.

    Raises:
        UsageError: the ``safetensors`` package is not installed, or a bad device or codec.
    """
    write = _safetensors_torch().save_file
    out = io.BytesIO()
    compress_to_stream(
        out,
        "tensors.safetensors",
        lambda raw: write(tensors, raw, metadata=metadata),
        Options(device, codec, level, False),
    )
    return out.getvalue()


@_safetensors_errors
def load(data: bytes | bytearray | memoryview) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file or container given as bytes, on the CPU, as
    ``safetensors.torch.load`` gives them.

    Raises:
        FormatError: the bytes are not a safetensors file (or one of its tensors has a dtype
            this torch lacks).
        ContainerError: the container is unreadable (``CorruptionError``: damaged bytes).
    """
    view = memoryview(data).cast("B")
    if bytes(view[: len(MAGIC)]) == MAGIC:
        fd, name = tempfile.mkstemp(prefix=".ckptz-load-", suffix=".safetensors")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(view)
            return load_file(name)
        finally:
            os.unlink(name)
    with safe_open(cast(Any, _Bytes(view)), "pt") as f:
        return f.get_tensors()


class _Bytes:
    """Bytes given to :func:`load`, as the file :class:`safe_open` opens."""

    def __init__(self, view: memoryview) -> None:
        self.view = view


@_safetensors_errors
def load_file(
    filename: str | os.PathLike[str],
    device: str | int | torch.device | None = "cpu",
    *,
    backend: str = "mmap",
) -> dict[str, torch.Tensor]:
    """Load every tensor of a safetensors file or container, as ``safetensors.torch.load_file``
    does (in the order of their bytes in the file).

    A container is decoded once, in parallel, each tensor's bytes straight into its storage,
    with every check a full restore makes (the whole file's digest included).

    Raises:
        UsageError: an unknown ``backend``.
        FormatError: the file is not a safetensors file, or one of its tensors has a dtype
            this torch lacks.
        ContainerError: the container is unreadable (``CorruptionError``: damaged bytes).
    """
    _check_backend(backend)
    _device(device)
    if not reader.is_container(filename):
        with safe_open(filename, "pt", device) as f:
            return f.get_tensors()
    with builtins.open(filename, "rb") as c:
        return load_container(cast(BinaryIO, c), os.fspath(filename), device)


@_safetensors_errors
def load_container(
    container: BinaryIO, name: str, device: str | int | torch.device | None = "cpu"
) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors container open as ``container`` (a real file), as
    :func:`load_file` loads them."""
    import torch

    from ckptz.container import read_index

    target = _device(device)
    index = read_index(container, name)
    with reader.ContainerReader(name, fileobj=container) as r:
        header = read_header(r, r.size, name)
    infos = _by_offset(header)
    for k, t in infos.items():
        _torch_type(t, k)  # a tensor torch cannot hold fails the whole load, as safetensors' does
    storages = {k: torch.empty(t.end - t.begin, dtype=torch.uint8) for k, t in infos.items()}
    targets = [(infos[k].begin, s.numpy()) for k, s in storages.items() if s.numel()]
    restore_into(container, name, targets, index=index)
    return {k: _typed(s, infos[k], k).to(target) for k, s in storages.items()}


def save_model(
    model: torch.nn.Module,
    filename: str | os.PathLike[str],
    metadata: dict[str, str] | None = None,
    force_contiguous: bool = True,
    *,
    device: str | None = None,
    codec: str = "auto",
    level: int = 3,
    verify: bool = False,
) -> None:
    """Save a module's tensors as ``safetensors.torch.save_model`` does (tensors that share
    memory are saved once), compressed into a container.

    Raises:
        UsageError: the ``safetensors`` package is not installed, or a bad device or codec.
        ValueError: a tensor is not contiguous and ``force_contiguous`` is False.
        WriteError: the file cannot be written.
    """
    write = _safetensors_torch().save_model
    compress_to_path(
        Path(filename),
        lambda raw: write(model, str(raw), metadata=metadata, force_contiguous=force_contiguous),
        Options(device, codec, level, verify),
    )


def load_model(
    model: torch.nn.Module,
    filename: str | os.PathLike[str],
    strict: bool = True,
    device: str | int | None = "cpu",
    *,
    backend: str = "mmap",
) -> tuple[set[str], list[str]]:
    """Load a safetensors file or container into ``model``, as ``safetensors.torch.load_model``.

    Returns:
        ``(missing, unexpected)``: the model's names the file did not fill (a set, as
        safetensors returns it), and the file's names the model has no place for.

    Raises:
        RuntimeError: ``strict`` and some names are missing or unexpected.
        FormatError, ContainerError: as for :func:`load_file`.
    """
    st = _safetensors_torch()
    state_dict = load_file(filename, device=device, backend=backend)
    to_removes = st._remove_duplicate_names(model.state_dict(), preferred_names=state_dict.keys())
    missing_keys, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = set(missing_keys)
    for group in to_removes.values():
        for name in group:
            if name in missing:
                missing.remove(name)
            else:
                unexpected.append(name)
    if strict and (missing or unexpected):
        error = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            error += "\n    Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(missing))
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + ", ".join(
                f'"{k}"' for k in sorted(unexpected)
            )
        raise RuntimeError(error)
    return missing, list(unexpected)


class safe_open:
    """A safetensors file or container, opened lazily, as ``safetensors.safe_open``.

    Use it as a context manager. ``get_tensor(k)`` reads and decodes only the frames that
    hold ``k``; the header is read once, at opening.

    Args:
        filename: a safetensors file, or a container of one.
        framework: ``pt`` (PyTorch tensors) or ``np`` (NumPy arrays, on the CPU).
        device: where tensors go (``cpu``, ``cuda:N``, a device index).
        backend: ``mmap`` or ``pread``, as safetensors takes them; both read the same way.

    Raises:
        UsageError: another framework, or an unknown backend.
        FormatError: not a safetensors file.
        ContainerError: the container's index is damaged.
    """

    @_safetensors_errors
    def __init__(
        self,
        filename: str | os.PathLike[str],
        framework: str = "pt",
        device: str | int | torch.device | None = "cpu",
        *,
        backend: str = "mmap",
    ) -> None:
        if framework not in TORCH_NAMES + NUMPY_NAMES:
            known = framework in OTHER_FRAMEWORKS
            raise UsageError(
                f"framework {framework!r} is {'not supported' if known else 'invalid'}",
                hint="use framework='pt' or 'np'",
            )
        _check_backend(backend)
        self._numpy = framework in NUMPY_NAMES
        self._device = _device(device)
        self._lock = threading.Lock()
        self._closed = False
        if isinstance(filename, _Bytes):
            name = "<bytes>"
            self._file: reader.ContainerReader | IO[bytes] = io.BytesIO(filename.view)
            self._size = len(filename.view)
        else:
            name = os.fspath(filename)
            self._file = reader.open(filename)
            self._size = (
                self._file.size if isinstance(self._file, reader.ContainerReader) else _size(self._file)
            )
        try:
            self._header: Header = read_header(self._file, self._size, name)
        except BaseException:
            self._file.close()
            raise
        self._name = name

    def __enter__(self) -> safe_open:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the file (a ``with`` block does it); the object answers nothing after."""
        self._closed = True
        self._file.close()

    @property
    def file(self) -> reader.ContainerReader | IO[bytes]:
        """The file object underneath (a :class:`~ckptz.library.reader.ContainerReader`, whose
        ``stats`` count frames decoded and bytes read, for a container)."""
        return self._file

    @_safetensors_errors
    def keys(self) -> list[str]:
        """The tensors' names, sorted."""
        return sorted(self._open_header().tensors)

    @_safetensors_errors
    def offset_keys(self) -> list[str]:
        """The tensors' names in the order of their bytes in the file."""
        return list(_by_offset(self._open_header()))

    @_safetensors_errors
    def metadata(self) -> dict[str, str] | None:
        """The header's ``__metadata__``, if it has one."""
        metadata = self._open_header().metadata
        return None if metadata is None else dict(metadata)

    @_safetensors_errors
    def get_tensor(self, name: str) -> Any:
        """The tensor ``name`` (a NumPy array with ``framework="np"``), reading only its bytes.

        Raises:
            KeyError: no tensor of that name.
            FormatError: its dtype has no torch type here.
            CorruptionError: its bytes fail their checks.
        """
        info = self._info(name)
        _torch_type(info, name)
        return self._out(_typed(self._read(info.begin, info.end), info, name))

    @_safetensors_errors
    def get_tensors(self) -> dict[str, Any]:
        """Every tensor, by name, in the order of their bytes in the file.

        Raises:
            FormatError: a tensor's dtype has no torch type here.
            CorruptionError: some bytes fail their checks.
        """
        infos = _by_offset(self._open_header())
        for k, info in infos.items():
            _torch_type(info, k)
        return {k: self.get_tensor(k) for k in infos}

    @_safetensors_errors
    def get_slice(self, name: str) -> SafeSlice:
        """A lazy view of tensor ``name``; indexing it reads only the rows it needs."""
        return SafeSlice(self, self._info(name), name)

    def _out(self, tensor: torch.Tensor) -> Any:
        """``tensor`` as this file hands it out: on its device, or as a NumPy array (which
        refuses the dtypes NumPy lacks, ``bfloat16`` and the float8s, with ``TypeError``, as
        safetensors' NumPy framework does)."""
        return tensor.numpy() if self._numpy else tensor.to(self._device)

    def _open_header(self) -> Header:
        if self._closed:
            raise UsageError("the file is closed", path=self._name, hint="use it inside its with block")
        return self._header

    def _info(self, name: str) -> TensorInfo:
        try:
            return self._open_header().tensors[name]
        except KeyError:
            raise KeyError(f"no tensor named {name!r} in the file") from None

    def _read(self, begin: int, end: int) -> torch.Tensor:
        """Bytes ``[begin, end)`` of the original file, as a new uint8 tensor."""
        import torch

        self._open_header()  # a slice kept past the with block says so clearly
        out = torch.empty(end - begin, dtype=torch.uint8)
        view = out.numpy().data
        got = 0
        with self._lock:
            self._file.seek(begin)
            while got < len(view):
                n = self._file.readinto(view[got:])  # type: ignore[union-attr]
                if not n:
                    raise FormatError("file ends inside a tensor", path=self._name)
                got += n
        return out


class SafeSlice:
    """A tensor of a :class:`safe_open` file, read in part: ``s[a:b]`` reads rows ``a`` to ``b``.

    Indexing whose first item is an integer or a slice reads only the rows it covers; any
    other index (``...``, ``None``, tensors) reads the whole tensor first. An ``F4`` tensor
    (two values a byte) is indexed in its torch shape, whose last dimension is halved, and
    only along its other dimensions.
    """

    def __init__(self, owner: safe_open, info: TensorInfo, name: str = "") -> None:
        self._owner = owner
        self._info = info
        self._name = name

    def get_shape(self) -> list[int]:
        """The shape as the header gives it."""
        return list(self._info.shape)

    def get_dtype(self) -> str:
        """The safetensors dtype (``F32``, ``BF16``)."""
        return self._info.dtype

    def __getitem__(self, index: Any) -> Any:
        info = self._info
        _torch_type(info, self._name)
        shape = _torch_shape(info, self._name)
        items = index if isinstance(index, tuple) else (index,)
        if shape != info.shape and (
            len(items) >= len(shape) or any(i is Ellipsis or i is None for i in items)
        ):
            raise UsageError(
                f"tensor {self._name!r} packs two {info.dtype} values a byte; its last dimension"
                " cannot be indexed",
                hint="index its other dimensions, or get_tensor it whole",
            )
        first = items[0] if items else None
        if not shape or isinstance(first, bool) or not isinstance(first, int | slice):
            return self._owner._out(self._rows(0, shape[0] if shape else 1)[index])
        rows = shape[0]
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
        return self._owner._out(self._rows(lo, hi)[(local, *items[1:])])

    def _rows(self, lo: int, hi: int) -> torch.Tensor:
        """Rows ``[lo, hi)`` of the tensor (all of a 0-d one), read and typed."""
        info = self._info
        row = math.prod(info.shape[1:]) * info.bits // 8
        data = self._owner._read(info.begin + lo * row, info.begin + hi * row)
        shape = (hi - lo, *info.shape[1:]) if info.shape else ()
        return _typed(data, TensorInfo(info.dtype, shape, 0, 0), self._name)


def _by_offset(header: Header) -> dict[str, TensorInfo]:
    """The header's tensors in the order of their bytes (an empty one first where it shares
    an offset), as safetensors orders them."""
    return dict(sorted(header.tensors.items(), key=lambda kv: (kv[1].begin, kv[1].end, kv[0])))


def _torch_type(info: TensorInfo, name: str) -> torch.dtype:
    """The torch dtype of tensor ``name``.

    Raises:
        FormatError: this torch has none for it.
    """
    import torch

    dtype = getattr(torch, info.torch_dtype or "", None)
    if not isinstance(dtype, torch.dtype):
        raise FormatError(
            f"tensor {name!r} has dtype {info.dtype}, which this torch has no type for",
            hint="upgrade torch, or load the other tensors one by one with safe_open",
        )
    return dtype


def _torch_shape(info: TensorInfo, name: str) -> tuple[int, ...]:
    shape = info.torch_shape
    if shape is None:
        raise FormatError(
            f"tensor {name!r} of dtype {info.dtype} has shape {list(info.shape)}, whose last"
            " dimension does not split into whole torch elements",
            hint="its bytes are intact: read them with ckptz.open",
        )
    return shape


def _typed(data: torch.Tensor, info: TensorInfo, name: str) -> torch.Tensor:
    """uint8 bytes as the tensor they hold."""
    import torch

    dtype = _torch_type(info, name)
    shape = _torch_shape(info, name)
    if data.numel() == 0:
        return torch.empty(shape, dtype=dtype)
    return data.view(dtype).reshape(shape)


def _device(device: str | int | torch.device | None) -> torch.device:
    """The torch device ``device`` names (an int is a CUDA device's index; None the CPU, as
    safetensors takes it).

    Raises:
        UsageError: it names none.
    """
    import torch

    if device is None:
        return torch.device("cpu")
    try:
        return torch.device(f"cuda:{device}" if isinstance(device, int) else device)
    except (RuntimeError, TypeError, ValueError):
        raise UsageError(f"device {device} is invalid", hint="use cpu, cuda:N or a device index") from None


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise UsageError(f'backend "{backend}" is invalid (expected one of: "mmap", "pread")')


def _size(f: IO[bytes]) -> int:
    return os.fstat(f.fileno()).st_size


__all__ = [
    "BACKENDS",
    "SafeSlice",
    "load",
    "load_container",
    "load_file",
    "load_model",
    "safe_open",
    "save",
    "save_file",
    "save_model",
]
