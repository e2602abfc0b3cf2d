"""ckptz: lossless, byte-exact compression of PyTorch checkpoints.

The library API lives in :mod:`ckptz.api`; this package import stays light (no torch,
no nvCOMP) so the CLI starts fast.
"""

from __future__ import annotations

__version__ = "0.1.0"
