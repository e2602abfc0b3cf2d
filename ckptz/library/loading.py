"""``ckptz.load``: ``torch.load`` for containers and plain files alike.

A safetensors container loads as ``torch.load`` loads a ``.safetensors`` file: as
``safetensors.torch.load_file`` (:func:`ckptz.load_file`) does. A ``torch.save`` container
is decoded by the pipeline's restore loop (every check it makes)
straight into the storages the loaded tensors use, on the GPU that ``map_location`` names
or in host memory (:mod:`ckptz.library.storages`). Any other container is decoded into one
buffer, which ``torch.load`` then reads as a file; with ``mmap=True`` it is decoded into an
unlinked temporary file instead, which the loaded tensors map. Pickles are unpickled by
``torch.load`` itself with ``weights_only=True`` unless the caller passes ``False``: ckptz
never executes a pickle the caller did not explicitly trust.
"""

from __future__ import annotations

import builtins
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, BinaryIO, cast

from ckptz.container import Index, read_index
from ckptz.library.safetensors_api import load_container
from ckptz.library.sources import Source, opened
from ckptz.library.writing import original_name
from ckptz.pipeline.whole import MemoryFile, restore_to_file, restore_to_memory
from ckptz.pipeline.workers import tuned_interpreter

if TYPE_CHECKING:
    import torch

MapLocation = Callable[..., Any] | str | dict[str, str] | None


def load(
    f: Source,
    map_location: torch.device | MapLocation = None,
    pickle_module: Any = None,
    *,
    weights_only: bool | None = True,
    mmap: bool | None = None,
    **pickle_load_args: Any,
) -> Any:
    """Load what ``torch.save`` saved, from a ``.ckptz`` container or from the plain file.

    Takes the arguments of ``torch.load`` and returns what ``torch.load`` returns on the
    original file. A container is recognised by its first bytes, whatever its name; a plain
    file goes straight to ``torch.load``. A safetensors container gives its tensors, as
    ``torch.load`` gives those of a path named ``.safetensors``.

    Args:
        f: a path, or a binary file object, read from its position: a container takes
            exactly its own bytes and leaves the position after them, so objects saved one
            after another into one stream load in order (a container that is not in a real
            file, such as one in ``BytesIO`` or a ``gzip`` file, is first copied to a
            private temporary file).
        map_location: as for ``torch.load``.
        pickle_module: as for ``torch.load`` (it refuses one with ``weights_only=True``).
        weights_only: unpickle only tensors and plain containers (``torch.load``'s safe
            unpickler); ``None`` means ``True``. ``False`` executes the pickle: pass it only
            for files you trust. ``TORCH_FORCE_WEIGHTS_ONLY_LOAD=1`` overrides ``False``, as
            it does for ``torch.load``.
        mmap: as for ``torch.load`` (which takes it for paths only); a container is then
            decoded into an unlinked temporary file (in ``$TMPDIR``) that the tensors map,
            instead of into memory.
        pickle_load_args: passed on to ``torch.load`` (e.g. ``encoding="latin1"``).

    Raises:
        ContainerError: the container is unreadable.
        CorruptionError: some of its bytes fail their checksum (names the chunk and tensor).
        pickle.UnpicklingError: ``weights_only=True`` met something it will not unpickle.
        RuntimeError: ``pickle_module`` with ``weights_only=True``, or a safetensors container
            with a ``map_location`` that does not name one device (as ``torch.load``).
        ValueError: ``mmap=True`` on a file object holding a zip checkpoint (as ``torch.load``).
    """
    import torch

    from ckptz.library.storages import load_storages

    weights_only = _weights_only(weights_only)
    if weights_only and pickle_module is not None:  # torch.load's check, before any reading
        raise RuntimeError("Can not safely load weights when explicit pickle_module is specified")
    kwargs: dict[str, Any] = {"weights_only": weights_only, "mmap": mmap, **pickle_load_args}
    if pickle_module is not None:
        kwargs["pickle_module"] = pickle_module
    with opened(f) as src:
        if src.container is None:
            return torch.load(src.plain, map_location, **kwargs)  # type: ignore[arg-type]
        index = read_index(src.container, src.name)
        if _is_safetensors(index, f):
            return load_container(src.container, src.name, _safetensors_device(map_location))
        with tuned_interpreter():  # many small objects, freed as they go: no full collections
            if mmap:
                if (
                    not isinstance(f, str | os.PathLike)
                    and index.header["source"].get("format") == "torch-zip"
                ):
                    # torch.load's refusal, before decoding what it would refuse
                    raise ValueError("f must be a file path in order to use the mmap argument")
                return _load_mapped(src.container, src.name, f, map_location, kwargs)
            done, obj = load_storages(
                src.container, src.name, map_location, pickle_module, weights_only, pickle_load_args, index
            )
            if done:
                return obj
            data = restore_to_memory(src.container, src.name, index=index)
            return torch.load(cast(IO[bytes], MemoryFile(data, src.name)), map_location, **kwargs)


def _weights_only(asked: bool | None) -> bool:
    """Whether to unpickle with torch's safe unpickler: unless the caller passed ``False``
    (``None`` is torch.load's default, which is safe), and always where
    ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` is set, which torch.load obeys for the plain file."""
    forced = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0").lower() in ("1", "y", "yes", "true")
    return forced or asked is not False


def _is_safetensors(index: Index, f: Source) -> bool:
    """Whether ``torch.load`` would read the original as safetensors: it does for a path
    named ``.safetensors``; a container also says what it holds, and a safetensors file is
    never a pickle, whatever the name."""
    if index.header.get("source", {}).get("format") == "safetensors":
        return True
    return isinstance(f, str | os.PathLike) and original_name(Path(f)).endswith(".safetensors")


def _safetensors_device(map_location: Any) -> str:
    """The device ``torch.load`` hands ``safetensors`` for ``map_location`` (it refuses the
    mappings that cannot name one device)."""
    import torch

    if map_location is None:
        return "cpu"
    if isinstance(map_location, str | bytes | torch.device):
        return str(map_location)
    kind = "dict" if isinstance(map_location, dict) else "callable"
    raise RuntimeError(
        f"Loading safetensors file with {kind} map_location is not supported. "
        "Use a device string or torch.device instead."
    )


def _load_mapped(container: BinaryIO, name: str, f: Source, map_location: Any, kwargs: dict[str, Any]) -> Any:
    """Decode into a private temporary file, ``torch.load`` it mapped, and unlink it (the
    mapping keeps its pages). It is handed over as the caller gave ``f``, a path or a file
    object, so ``torch.load`` accepts or refuses ``mmap`` as it would for the original."""
    import torch

    fd, tmp = tempfile.mkstemp(prefix=".ckptz-load-", suffix=".pt")
    try:
        with os.fdopen(fd, "wb") as out:
            restore_to_file(container, name, out)
        if isinstance(f, str | os.PathLike):
            return torch.load(tmp, map_location, **kwargs)
        with builtins.open(tmp, "rb") as file:
            return torch.load(file, map_location, **kwargs)
    finally:
        os.unlink(tmp)


__all__ = ["load"]
