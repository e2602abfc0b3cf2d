"""Checkpoint series: a run's checkpoints coded as reverse deltas of each other.

:mod:`.detect` finds a run folder's checkpoints and each file's history across them,
:mod:`.delta` codes a file's tensors against a newer checkpoint's (the pipeline's
one transform, :mod:`ckptz.pipeline.transform`; :mod:`.kinds` codes float words in value,
against the newer word or a scaled prediction of it), :mod:`.reference` finds and checks what a
container is coded against, and :mod:`.run` plans ``compress --series``, re-codes the
previous newest file when a checkpoint is added, and detaches.
"""

from __future__ import annotations

from typing import Any

from ckptz.extensions import register_transform


def _open_delta(index: Any, fd: int, path: str) -> Any:
    from ckptz.series.delta import open_delta

    return open_delta(index, fd, path)


register_transform("reference", _open_delta)
