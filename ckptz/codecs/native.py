"""The CPU coder's optional C extension, ``ckptz._native`` (source: ``ckptz/native_src/``).

It is built at install time where a C compiler is found. It makes the transform one pass
over the words (:func:`ckptz.codecs.planes.split` and ``merge``) and writes the Huffman
coding of exponent planes as standard zstd frames (:class:`ckptz.codecs.cpu.HuffmanZstd`).
Without it ckptz runs the same container format on numpy and the zstd/deflate bindings,
more slowly and with up to ~1% larger exponent planes. ``CKPTZ_NO_NATIVE=1`` turns it off
(the tests run both paths).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

native: ModuleType | None = None
if os.environ.get("CKPTZ_NO_NATIVE", "") in ("", "0"):
    try:
        native = importlib.import_module("ckptz._native")
    except ImportError:  # pragma: no cover - no compiler at install time
        native = None

__all__ = ["native"]
