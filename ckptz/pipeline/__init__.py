"""The pipeline: a file's bytes through planning, parallel reads, an engine and parallel writes.

:mod:`.plan` says which bytes form each stream and frame; :mod:`.compress` and
:mod:`.restore` run a file's frames through reader threads, an engine
(:mod:`ckptz.engines`) and writer threads (:mod:`.workers`), and into or out of a
container (:mod:`ckptz.container`).
"""

from ckptz.pipeline.compress import WrittenContainer, compress_file
from ckptz.pipeline.plan import (
    FRAME_SIZE,
    META_FRAME_SIZE,
    Frame,
    frame_map,
    plan_streams,
    sampled_class,
    value_class,
)
from ckptz.pipeline.restore import Comparer, DiscardSink, FileSink, Sink, restore
from ckptz.pipeline.workers import Workers

__all__ = [
    "FRAME_SIZE",
    "META_FRAME_SIZE",
    "Comparer",
    "DiscardSink",
    "FileSink",
    "Frame",
    "Sink",
    "Workers",
    "WrittenContainer",
    "compress_file",
    "frame_map",
    "plan_streams",
    "restore",
    "sampled_class",
    "value_class",
]
