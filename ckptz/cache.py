"""Where ckptz keeps what it can rebuild: compiled kernels, bytecode.

Light on purpose (no numpy, nothing of the pipeline): ``python -m ckptz`` asks for its
bytecode folder before it imports anything else (:mod:`ckptz.__main__`).
"""

from __future__ import annotations

import os


def cache_folder(name: str) -> str:
    """``$XDG_CACHE_HOME/ckptz/<name>`` (by default ``~/.cache/ckptz/<name>``); not created here."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "ckptz", name)
