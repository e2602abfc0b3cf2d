"""ckptz's C extension, ``ckptz._native`` (source: ``ckptz/native_src/``), built at install.

It holds the coders' inner loops: the transform in one pass over the words
(:func:`ckptz.codecs.planes.split` and ``merge``), the Huffman coding of exponent planes as
standard zstd frames (:class:`ckptz.codecs.cpu.HuffmanZstd`), checksums and file copies.
"""

from __future__ import annotations

from types import ModuleType

#: What to install where the extension could not be built (setup.py prints it too).
BUILD_HINT = "ckptz needs a C compiler and Python headers: apt-get install build-essential python3-dev"

try:
    import ckptz._native as _native
except ImportError as exc:  # pragma: no cover - an install whose build failed
    raise ImportError(
        f"ckptz's C extension ckptz._native is missing ({exc}); {BUILD_HINT}, then reinstall ckptz"
    ) from exc

native: ModuleType = _native

__all__ = ["BUILD_HINT", "native"]
