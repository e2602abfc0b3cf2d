"""Let Hugging Face Transformers read a folder compressed in place, without restoring it.

``ckptz compress --in-place`` turns each checkpoint file ``X`` of a folder into ``X.ckptz``
and leaves the JSON files (``config.json``, ``model.safetensors.index.json``,
``trainer_state.json``) as they were, so the folder still names its files ``X``.
:func:`enable` makes Transformers take such an ``X`` as there, read from ``X.ckptz``:

- ``PreTrainedModel.from_pretrained`` finds ``model.safetensors`` (or ``pytorch_model.bin``)
  and the shards an index names, and reads them through :class:`ckptz.safe_open` and
  :func:`ckptz.load`, which decode in memory;
- ``Trainer.train(resume_from_checkpoint=...)`` finds the model, optimizer, scheduler, scaler
  and RNG files of ``checkpoint-N`` and reads them the same way (and so does
  ``load_best_model_at_end``).

Nothing is written to disk. The change is confined to the names those modules look up at
call time (their ``os``, ``open``, ``torch``, ``safetensors``, ``safe_open``,
``load_state_dict``), which see through to the real ones for every path except a missing
``X`` whose ``X.ckptz`` is a container; a file left in both forms by an interrupted
compression is read plain. The last handle to close puts every name back.
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import os
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ckptz.errors import UsageError

#: What ``ckptz compress --in-place`` appends to a file's name.
SUFFIX = ".ckptz"
#: A module attribute the module did not have (``open`` falls through to the builtin).
_ABSENT = object()


def stand_in(path: object) -> str | None:
    """The container that stands for ``path`` compressed in place: ``path.ckptz``, when
    ``path`` itself is missing and that file is a container; else ``None``."""
    from ckptz.library.reader import is_container

    if not isinstance(path, str | os.PathLike):
        return None
    name = os.fspath(path)
    if not isinstance(name, str) or os.path.lexists(name):
        return None
    container = name + SUFFIX
    try:
        return container if is_container(container) else None
    except OSError:  # missing, a folder, unreadable: not a stand-in
        return None


class _ModuleView(types.ModuleType):
    """A module whose listed attributes are replaced and whose others are the module's own."""

    def __init__(self, module: types.ModuleType, **replaced: Any) -> None:
        super().__init__(module.__name__, module.__doc__)
        self.__dict__.update(replaced)
        self.__dict__["_ckptz_viewed"] = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_ckptz_viewed"], name)


def _os_view(real: types.ModuleType) -> types.ModuleType:
    """``os`` whose ``path.isfile`` and ``path.exists`` also see files compressed in place."""

    def isfile(path: Any) -> bool:
        return real.path.isfile(path) or stand_in(path) is not None

    def exists(path: Any) -> bool:
        return real.path.exists(path) or stand_in(path) is not None

    return _ModuleView(real, path=_ModuleView(real.path, isfile=isfile, exists=exists))


def _torch_load(real: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.load`` that reads ``X.ckptz`` for a missing ``X`` (same arguments, same result)."""
    from ckptz.library.loading import load

    def torch_load(f: Any, *args: Any, **kwargs: Any) -> Any:
        container = stand_in(f)
        return real(f, *args, **kwargs) if container is None else load(container, *args, **kwargs)

    return torch_load


def _torch_view(real: types.ModuleType) -> types.ModuleType:
    return _ModuleView(real, load=_torch_load(real.load))


def _safe_open(real: Callable[..., Any]) -> Callable[..., Any]:
    """``safetensors.safe_open`` that opens ``X.ckptz`` for a missing ``X``, decoding lazily."""
    from ckptz.library.safetensors_api import safe_open

    def opener(filename: Any, framework: str = "pt", device: Any = "cpu", **options: Any) -> Any:
        container = stand_in(filename)
        if container is None:
            return real(filename, framework, device=device, **options)
        return safe_open(container, framework, device)  # its own reads: no mmap or backend to pick

    return opener


def _load_file(real: Callable[..., Any]) -> Callable[..., Any]:
    """``safetensors.torch.load_file`` that decodes ``X.ckptz`` for a missing ``X``."""
    from ckptz.library.safetensors_api import load_file

    def loader(filename: Any, device: Any = "cpu") -> dict[str, Any]:
        container = stand_in(filename)
        return real(filename, device=device) if container is None else load_file(container, device)

    return loader


def _safetensors_view(real: types.ModuleType) -> types.ModuleType:
    return _ModuleView(real, torch=_ModuleView(real.torch, load_file=_load_file(real.torch.load_file)))


def _open(real: Any) -> Callable[..., Any]:
    """``open`` that reads ``X.ckptz``'s original bytes for a missing ``X`` opened ``rb``."""
    from ckptz.library.reader import open as open_container

    opener = builtins.open if real is _ABSENT else real

    def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        container = stand_in(file) if mode == "rb" and not args and not kwargs else None
        return opener(file, mode, *args, **kwargs) if container is None else open_container(container)

    return open_


def _load_state_dict(real: Callable[..., Any]) -> Callable[..., Any]:
    """``modeling_utils.load_state_dict`` that reads a ``torch.save`` file from its container.

    A ``.safetensors`` name goes to the real function, whose ``safe_open`` is replaced too.
    """
    import torch

    from ckptz.library.loading import load

    signature = inspect.signature(real)

    def load_state_dict(checkpoint_file: Any, *args: Any, **kwargs: Any) -> Any:
        container = stand_in(checkpoint_file)
        if container is None or os.fspath(checkpoint_file).endswith(".safetensors"):
            return real(checkpoint_file, *args, **kwargs)
        call = signature.bind(checkpoint_file, *args, **kwargs)
        call.apply_defaults()
        place = call.arguments.get("map_location", "cpu")
        weights_only = call.arguments.get("weights_only", True)
        if str(place) != "meta":
            return load(container, map_location=place, weights_only=weights_only)
        # The "meta" load only wants names, shapes and dtypes: decode on the host, keep no data.
        loaded = load(container, map_location="cpu", weights_only=weights_only)
        return {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in loaded.items()}

    return load_state_dict


@dataclass(frozen=True, slots=True)
class _Replacement:
    """``module.name`` is replaced by ``make(original)`` while reading is enabled."""

    module: str
    name: str
    make: Callable[[Any], Any]
    #: Whether enabling fails without it (the others serve paths that not every version has).
    required: bool = True


_REPLACEMENTS = (
    _Replacement("transformers.modeling_utils", "os", _os_view),
    _Replacement("transformers.modeling_utils", "open", _open),
    _Replacement("transformers.modeling_utils", "safe_open", _safe_open),
    _Replacement("transformers.modeling_utils", "load_state_dict", _load_state_dict),
    _Replacement("transformers.integrations.accelerate", "safe_open", _safe_open, required=False),
    _Replacement("transformers.trainer", "os", _os_view),
    _Replacement("transformers.trainer", "torch", _torch_view),
    _Replacement("transformers.trainer", "safetensors", _safetensors_view),
    _Replacement("transformers.trainer_utils", "safe_load_file", _load_file, required=False),
)


class _Installed:
    """The replacements in place, counted by the handles that asked for them.

    ``generation`` changes when :func:`disable` takes them out regardless of handles, so that
    handles from before then release nothing.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.handles = 0
        self.generation = 0
        self.undo: list[tuple[types.ModuleType, str, Any, Any]] = []  # module, name, original, ours

    def acquire(self) -> int:
        with self.lock:
            if self.handles == 0:
                self.undo = _install()
            self.handles += 1
            return self.generation

    def release(self, generation: int) -> None:
        with self.lock:
            if generation != self.generation:
                return
            self.handles -= 1
            if self.handles == 0:
                self._take_out()

    def reset(self) -> None:
        with self.lock:
            if self.handles:
                self._take_out()

    def _take_out(self) -> None:
        _uninstall(self.undo)
        self.undo = []
        self.handles = 0
        self.generation += 1


_installed = _Installed()


def _install() -> list[tuple[types.ModuleType, str, Any, Any]]:
    """Put every replacement in place (all or none), and return how to undo them."""
    import transformers

    found: list[tuple[types.ModuleType, str, Any, Callable[[Any], Any]]] = []
    for r in _REPLACEMENTS:
        try:
            module = importlib.import_module(r.module)
        except ImportError:
            module = None
        original = _ABSENT if module is None else module.__dict__.get(r.name, _ABSENT)
        if module is None or (original is _ABSENT and r.name != "open"):
            if r.required:
                raise UsageError(
                    f"ckptz cannot read compressed folders with transformers {transformers.__version__}: "
                    f"{r.module}.{r.name} is missing",
                    hint="restore the folder with `ckptz decompress --in-place`, or use a supported transformers",
                )
            continue
        found.append((module, r.name, original, r.make))
    undo = [(module, name, original, make(original)) for module, name, original, make in found]
    for module, name, _, ours in undo:
        setattr(module, name, ours)
    return undo


def _uninstall(undo: list[tuple[types.ModuleType, str, Any, Any]]) -> None:
    for module, name, original, ours in reversed(undo):
        if module.__dict__.get(name) is not ours:
            continue  # replaced again by someone else since: theirs stays
        if original is _ABSENT:
            delattr(module, name)
        else:
            setattr(module, name, original)


class Reading:
    """A handle on the reading of compressed folders that :func:`enable` turned on.

    Closing it (or leaving its ``with`` block) turns the reading off again once no other
    handle holds it; a handle never closed keeps it on for the life of the process.
    """

    def __init__(self) -> None:
        self._generation = _installed.acquire()
        self._open = True

    def __enter__(self) -> Reading:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release this handle (closing it again does nothing)."""
        if self._open:
            self._open = False
            _installed.release(self._generation)


def enable() -> Reading:
    """Make Transformers read folders compressed in place by ``ckptz compress --in-place``.

    One line, before ``from_pretrained`` or ``Trainer.train(resume_from_checkpoint=...)``::

        ckptz.hf.enable()                         # on for the rest of the process
        with ckptz.hf.enable():                   # or only inside the block
            model = AutoModelForCausalLM.from_pretrained("model_dir")

    Every file ``X`` that a folder names but holds only as ``X.ckptz`` is decoded in memory
    (checked, as ``ckptz verify`` checks it); no plain file is written. Only local folders:
    files on the Hub are not looked for as containers.

    Returns:
        A handle; closing it (or its ``with`` block's end) turns the reading off again.

    Raises:
        UsageError: the installed transformers lacks a function that ckptz hooks into.
    """
    return Reading()


def enabled() -> bool:
    """Whether Transformers reads folders compressed in place now (a handle is open)."""
    return _installed.handles > 0


def disable() -> None:
    """Turn the reading of compressed folders off, whichever handles turned it on."""
    _installed.reset()


__all__ = ["Reading", "disable", "enable", "enabled", "stand_in"]
