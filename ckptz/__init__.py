"""ckptz: lossless, byte-exact compression of PyTorch checkpoints.

The library API lives in :mod:`ckptz.api` (files and folders) and :mod:`ckptz.library`
(saving and loading from Python: ``ckptz.save``, ``load``, ``open``, ``save_file``,
``load_file``, ``safe_open``, ``save_model``, ``load_model``; ``ckptz.safetensors`` for
the whole of ``safetensors.torch``, bytes included). ``ckptz.hf`` is
:mod:`ckptz.integrations.transformers` (``ckptz.hf.enable()``: Transformers reads folders
compressed in place). This package import stays light (no torch, no nvCOMP) so the CLI starts
fast: those names are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ckptz import series as _series  # noqa: F401  (registers the series transform: ckptz.extensions)
from ckptz._version import __version__ as __version__

_LIBRARY = frozenset(
    {
        "ContainerReader",
        "SafeSlice",
        "load",
        "load_file",
        "load_model",
        "open",
        "safe_open",
        "safetensors",
        "save",
        "save_file",
        "save_model",
    }
)

if TYPE_CHECKING:  # the names as type checkers and editors see them
    from ckptz.integrations import transformers as hf  # noqa: F401  (the lazy ckptz.hf)
    from ckptz.library import ContainerReader as ContainerReader
    from ckptz.library import SafeSlice as SafeSlice
    from ckptz.library import load as load
    from ckptz.library import load_file as load_file
    from ckptz.library import load_model as load_model
    from ckptz.library import open as open
    from ckptz.library import safe_open as safe_open
    from ckptz.library import safetensors as safetensors
    from ckptz.library import save as save
    from ckptz.library import save_file as save_file
    from ckptz.library import save_model as save_model


def __getattr__(name: str) -> Any:
    if name in _LIBRARY:
        from ckptz import library

        return getattr(library, name)
    if name == "hf":
        import importlib

        return importlib.import_module("ckptz.integrations.transformers")
    raise AttributeError(f"module 'ckptz' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LIBRARY, "hf"})
