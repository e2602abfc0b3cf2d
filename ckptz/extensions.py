"""What opens a container's frame transform, by the header field that names it.

The pipeline restores every container through one decoder; a container whose frames were
coded through a transform (:mod:`ckptz.pipeline.transform`) says so in its JSON header,
and the package that writes such containers registers here how to open that transform
(:mod:`ckptz.series` registers ``reference``, its reverse deltas). The registry sits below
both, so the pipeline never imports the packages built on it. ``import ckptz`` registers
every transform ckptz writes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: header field -> opener(index, fd, path) returning the transform.
_OPENERS: dict[str, Callable[[Any, int, str], Any]] = {}


def register_transform(field: str, opener: Callable[[Any, int, str], Any]) -> None:
    """Have containers whose header holds ``field`` decoded through ``opener``'s transform."""
    _OPENERS[field] = opener


def transform_opener(header: dict[str, Any]) -> Callable[[Any, int, str], Any] | None:
    """The opener for the first registered field ``header`` holds, or None."""
    for field, opener in _OPENERS.items():
        if field in header:
            return opener
    return None


__all__ = ["register_transform", "transform_opener"]
