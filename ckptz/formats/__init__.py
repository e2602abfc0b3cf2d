"""Format readers: cut a checkpoint file into tensor and meta segments without executing it.

:func:`read_layout` detects the format from the file's first bytes (never from its name) and
dispatches to the torch zip, legacy torch or safetensors reader. Anything unrecognised, or that a
reader rejects, becomes one opaque meta segment: still compressed and restored byte-exact, only
without per-tensor treatment. :func:`is_checkpoint` decides which files of a folder are worth
compressing (the others are copied unchanged): a known suffix, or content that starts like a
torch zip, a legacy torch file, a safetensors file or a pickle, so suffix-less blobs (the
Hugging Face hub cache) are recognised too.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

from ckptz.errors import FormatError
from ckptz.formats import legacy, safetensors
from ckptz.formats.layout import FileLayout, Segment
from ckptz.formats.pickle_walk import Stub, load_stub
from ckptz.formats.torchzip import ZIP_MAGIC, read_concatenated, read_torch_zip

CHECKPOINT_SUFFIXES: tuple[str, ...] = (
    ".pt",
    ".pth",
    ".bin",
    ".ckpt",
    ".safetensors",
    ".distcp",
    ".pkl",
    ".pth.tar",
)
"""File name endings that :func:`is_checkpoint` accepts (``.pth.tar`` is a common torch.save name)."""

#: Bytes :func:`sniff` looks at: a zip local header with a member name of up to 34 bytes.
SNIFF_BYTES = 64
_PICKLE_PROTOCOLS = (2, 3, 4, 5)

_MAX_DCP_METADATA = 64 << 20

__all__ = [
    "CHECKPOINT_SUFFIXES",
    "SNIFF_BYTES",
    "FileLayout",
    "Segment",
    "is_checkpoint",
    "opaque",
    "read_layout",
    "sniff",
]


def sniff(head: bytes, size: int) -> str | None:
    """The checkpoint format that ``head`` (a file's first :data:`SNIFF_BYTES`) starts like, or None.

    A zip counts only if its first member sits in a folder and is named like torch.save's
    (``<archive>/data.pkl``, ``<archive>/.format_version``, ...): other zips are not checkpoints.
    A bare pickle (protocol 2-5) counts: ``torch.save`` with pickle_module, or a plain state dict.
    """
    if head.startswith(ZIP_MAGIC) and len(head) >= 30:
        n = int.from_bytes(head[26:28], "little")
        name = head[30 : 30 + n]
        if b"/" in name and name.rsplit(b"/", 1)[1] in (
            b"data.pkl",
            b".format_version",
            b"version",
            b"byteorder",
        ):
            return "torch-zip"
        return None
    if legacy.sniff(head[:16]):
        return "torch-legacy"
    if safetensors.sniff(head[:16], size):
        return "safetensors"
    if len(head) >= 3 and head[0] == 0x80 and head[1] in _PICKLE_PROTOCOLS:
        return "pickle"
    return None


def is_checkpoint(path: Path, head: bytes | None = None) -> bool:
    """Whether a folder walker should compress ``path`` rather than copy it unchanged.

    True for a known suffix (:data:`CHECKPOINT_SUFFIXES`) or for content :func:`sniff` knows;
    ``head`` is the file's first bytes if the caller already read them. An unreadable file is
    not a checkpoint (copying it reports the error).
    """
    if path.name.lower().endswith(CHECKPOINT_SUFFIXES):
        return True
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            return False  # opening a FIFO or a device to sniff it could block or have effects
        size = st.st_size
        if head is None:
            with path.open("rb") as f:
                head = f.read(SNIFF_BYTES)
    except OSError:
        return False
    return sniff(head, size) is not None


def opaque(size: int, reason: str) -> FileLayout:
    """A layout with the whole file as one meta segment charged to ``other``."""
    segments = (Segment(0, size, "meta", component="other"),) if size else ()
    return FileLayout("opaque", size, segments, (f"opaque: {reason}",))


def _state(obj: Any) -> dict[str, Any]:
    """The attribute dict a stub of a (data)class got from BUILD."""
    state = obj.state if isinstance(obj, Stub) else None
    if isinstance(state, tuple):  # (dict, slots) for slotted classes
        merged: dict[str, Any] = {}
        for part in state:
            merged.update(part or {})
        return merged
    return state if isinstance(state, dict) else {}


def _dcp_items(path: Path) -> dict[int, tuple[str, ...]] | None:
    """Start offset → fully qualified names of the items of a ``.distcp``, from its ``.metadata``.

    The sibling ``.metadata`` is a plain pickle of ``torch.distributed.checkpoint.metadata.Metadata``;
    it is read with the stub unpickler. Any surprise means no names (the file still splits).
    """
    meta = path.parent / ".metadata"
    try:
        if not meta.is_file() or meta.stat().st_size > _MAX_DCP_METADATA:
            return None
        storage = _state(load_stub(meta.read_bytes())).get("storage_data")
    except (OSError, FormatError):
        return None
    if not isinstance(storage, dict):
        return None
    items: dict[int, tuple[str, ...]] = {}
    for index, info in storage.items():
        fqn, where = _state(index).get("fqn"), _state(info)
        offset = where.get("offset")
        if where.get("relative_path") == path.name and isinstance(fqn, str) and isinstance(offset, int):
            items[offset] = (*items.get(offset, ()), fqn)
    return items


def read_layout(path: Path, relpath: str) -> FileLayout:
    """Cut the file at ``path`` into segments.

    Args:
        path: the file to read.
        relpath: its path relative to the checkpoint folder (used to classify components).

    Returns:
        The file's layout; an ``opaque`` one, with a note saying why, if the file is not a
        checkpoint ckptz understands or is malformed.

    Raises:
        OSError: the file cannot be read.
    """
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(16)
        try:
            if head.startswith(ZIP_MAGIC):
                if relpath.endswith(".distcp"):
                    return read_concatenated(f, size, relpath, _dcp_items(path))
                return read_torch_zip(f, size, relpath)
            if legacy.sniff(head):
                return legacy.read_legacy(f, size, relpath)
            if safetensors.sniff(head, size):
                return safetensors.read_safetensors(f, size, relpath)
        except FormatError as exc:
            return opaque(size, exc.message)
    return opaque(size, "not a torch.save zip, legacy torch file or safetensors file")
