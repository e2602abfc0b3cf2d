"""Saving and loading from Python, shaped like ``torch`` and ``safetensors.torch``.

``ckptz.save``/``ckptz.load`` take ``torch.save``/``torch.load``'s place,
``ckptz.save_file``/``load_file``/``safe_open`` safetensors', and ``ckptz.open`` gives any
library a file object over a container's original bytes. Every function that reads takes
containers and plain files alike, told apart by content. ``ckptz.safetensors`` mirrors
``safetensors.torch`` whole (``save``/``load`` of bytes included). The package ``ckptz`` exports these
lazily, so ``import ckptz`` stays light.
"""

from __future__ import annotations

from ckptz.library import safetensors_api as safetensors
from ckptz.library.loading import load
from ckptz.library.reader import ContainerReader, ReadStats, is_container, open
from ckptz.library.safetensors_api import SafeSlice, load_file, load_model, safe_open, save_file, save_model
from ckptz.library.saving import save

__all__ = [
    "ContainerReader",
    "ReadStats",
    "SafeSlice",
    "is_container",
    "load",
    "load_file",
    "load_model",
    "open",
    "safe_open",
    "safetensors",
    "save",
    "save_file",
    "save_model",
]
