"""Standard input as a source: spooled to a private temporary file, since format readers seek."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from ckptz.safeio import os_error

_BLOCK = 8 << 20


@contextmanager
def spooled(stream: BinaryIO, near: Path | None = None) -> Iterator[Path]:
    """Copy ``stream`` to a temporary file (mode 0600, in ``near`` or ``$TMPDIR``); yield its path.

    The file is removed when the block ends, however it ends.
    """
    folder = near if near is not None and near.is_dir() else None
    try:
        fd, name = tempfile.mkstemp(prefix=".ckptz-stdin-", dir=folder)
    except OSError as exc:
        raise os_error(exc, Path(folder or tempfile.gettempdir())) from None
    path = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            while block := stream.read(_BLOCK):
                f.write(block)
        yield path
    finally:
        path.unlink(missing_ok=True)
