"""How ckptz starts Python processes of its own (the ranks of ``--nproc``).

A child runs the very ``ckptz`` its parent imported: the package's folder leads its
``PYTHONPATH``, and ``-P`` keeps ``python -m`` from putting the working directory first on
the path, where another checkout of ckptz (or a planted ``ckptz`` folder) would be imported
instead.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

#: The folder that holds the ``ckptz`` package this process imported.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def command(module: str, *args: str) -> list[str]:
    """``python -P -m module args...`` with this interpreter."""
    return [sys.executable, "-P", "-m", module, *args]


def environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment, ``extra`` added, with :data:`ROOT` first on ``PYTHONPATH``."""
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return env


__all__ = ["ROOT", "command", "environment"]
