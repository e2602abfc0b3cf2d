"""Lightning: a ``CheckpointIO`` that writes every checkpoint as a ckptz container.

:class:`CompressedCheckpointIO` is Lightning's ``TorchCheckpointIO`` with ``torch.save`` and
``torch.load`` replaced by :func:`ckptz.save` and :func:`ckptz.load`::

    from lightning.pytorch import Trainer
    from ckptz.integrations.lightning import CompressedCheckpointIO

    trainer = Trainer(plugins=[CompressedCheckpointIO()])
    trainer.fit(model, ckpt_path="checkpoints/last.ckpt")  # a container, or a plain .ckpt

Each ``.ckpt`` keeps the name Lightning gives it (so ``ModelCheckpoint``'s ``best_model_path``,
``save_top_k`` and ``ckpt_path="last"`` work unchanged) and holds a container that
``ckptz decompress`` turns back into exactly the bytes ``torch.save`` writes for that
checkpoint (``TorchCheckpointIO``'s bytes); ``ckptz inspect`` and ``verify`` read it too. A
local path is written atomically, the uncompressed bytes staying in memory as they do in
``TorchCheckpointIO`` (never on disk); another ``fsspec`` URL is written in one stream.

Loading follows ``TorchCheckpointIO``, except for ``weights_only=None``: Lightning passes that
on to ``torch.load``, which on torch 2.6 and later reads it as ``True`` (and on older torch as
``False``). Here ``None`` is always ``True``: only tensors and plain containers are
unpickled. A checkpoint holding other objects (say, hyper-parameters of your own classes)
needs ``weights_only=False`` from ``Trainer.fit``/``validate``/``test``/``predict``, which
executes its pickle: pass it only for checkpoints you trust.

To compress off the training loop's thread, wrap it: ``AsyncCheckpointIO(CompressedCheckpointIO())``.
``LightningModule.load_from_checkpoint`` reads with ``torch.load`` and not through this plugin;
give it ``ckptz.open(path)``, a file object over the original bytes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO

from ckptz.library import load, save
from ckptz.library.writing import Options, compress_to_path
from ckptz.runs.run import check_codec
from ckptz.safeio import remove_temp, stale_temps

log = logging.getLogger(__name__)


def _on_cpu(storage: Any, _location: str) -> Any:
    """Lightning's default ``map_location``: every storage stays where ``torch.load`` puts it
    first, the CPU."""
    return storage


class CompressedCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` that saves and loads ckptz containers.

    Args:
        device: where to compress: ``auto`` (a GPU where nvCOMP can use one), ``cpu``,
            ``cuda[:N]``; default ``$CKPTZ_DEVICE`` or ``auto``.
        codec: ``auto``, ``zstd`` or a GPU codec such as ``ans`` (decodes only on a GPU).
        level: zstd level of the coded planes.
        verify: decode every frame back before finishing, and read a written file back.
    """

    def __init__(
        self, *, device: str | None = None, codec: str = "auto", level: int = 3, verify: bool = False
    ) -> None:
        super().__init__()
        self.device = device
        self.codec = check_codec(codec)
        self.level = level
        self.verify = verify

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None
    ) -> None:
        """Write ``checkpoint`` to ``path`` as a container of what ``torch.save`` writes.

        Raises:
            TypeError: ``storage_options`` were given (as ``TorchCheckpointIO`` raises).
            CkptzError: the container could not be written; an existing file at ``path`` is
                left as it was.
        """
        if storage_options is not None:
            raise TypeError(
                f"`Trainer.save_checkpoint(..., storage_options=...)` is not supported by {type(self).__name__}"
            )
        options: dict[str, Any] = {
            "device": self.device,
            "codec": self.codec,
            "level": self.level,
            "verify": self.verify,
        }
        fs = get_filesystem(path)
        fs.makedirs(os.path.dirname(path), exist_ok=True)
        if not _is_local(fs):
            with fs.transaction, fs.open(str(path), "wb") as f:
                save(checkpoint, f, **options)
            return

        def write(raw: Path) -> None:
            # Through a file object, as TorchCheckpointIO's torch.save into a BytesIO: the
            # same bytes (a path would name the zip's folder after the file).
            with open(raw, "wb") as f:
                torch.save(checkpoint, f)

        # ckptz.save's atomic write, with torch.save's bytes in memory rather than on disk.
        compress_to_path(Path(path), write, Options(**options), memory=True, keep=True)

    def load_checkpoint(
        self,
        path: str | Path,
        map_location: Any | None = _on_cpu,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Load a checkpoint, a container or a plain ``torch.save`` file alike.

        Args:
            path: the checkpoint (a local path or an ``fsspec`` URL).
            map_location: as for ``torch.load`` (``"cuda:0"`` puts the tensors on that GPU).
            weights_only: ``None`` or ``True``: unpickle only tensors and plain containers;
                ``False`` executes the pickle (only for checkpoints you trust).

        Raises:
            FileNotFoundError: there is no file at ``path``.
            CkptzError: the container is damaged (names the chunk and tensor).
            pickle.UnpicklingError: the checkpoint holds objects that ``weights_only`` refuses.
        """
        fs = get_filesystem(path)
        if not fs.exists(path):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        trusted = weights_only is False
        if _is_local(fs):
            return load(Path(path), map_location, weights_only=not trusted)
        with fs.open(str(path), "rb") as f:
            return load(f, map_location, weights_only=not trusted)

    def remove_checkpoint(self, path: str | Path) -> None:
        """Remove the checkpoint, and any temporary file a killed save left for it."""
        fs = get_filesystem(path)
        if fs.exists(path):
            fs.rm(path, recursive=True)
            log.debug("Removed checkpoint: %s", path)
        if _is_local(fs):
            for temp in stale_temps(Path(path)):
                remove_temp(temp)


def _is_local(fs: Any) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


__all__ = ["CompressedCheckpointIO"]
