"""The pipeline: a file's bytes through planning, coding and writing, into or out of a container.

:mod:`.plan` says which bytes form each stream and frame. On the CPU a whole file is then
coded or restored in one native call (:mod:`.native_compress`, :mod:`.native_restore`);
GPU engines and series deltas take :mod:`.compress` and :mod:`.restore`'s per-frame
pipeline, which runs frames through reader threads, an engine (:mod:`ckptz.engines`) and
writer threads (:mod:`.workers`). Either way the container is written by
:mod:`ckptz.container`'s rules.
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
