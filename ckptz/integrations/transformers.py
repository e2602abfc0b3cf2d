"""Hugging Face Transformers: compress each saved checkpoint in the background, read it compressed.

:class:`CkptzCallback` compresses every ``checkpoint-N`` folder the ``Trainer`` saves, in
place (:func:`ckptz.integrations.folders.compress_folder`), on a worker thread while training
goes on. :func:`enable` (also ``ckptz.hf.enable()``) lets Transformers read such folders, and
any model folder compressed by ``ckptz compress --in-place``, without restoring them: the
containers are decoded in memory
(:mod:`ckptz.integrations.transformers_reading`)::

    import ckptz
    from ckptz.integrations.transformers import CkptzCallback

    ckptz.hf.enable()
    model = AutoModelForCausalLM.from_pretrained("model_dir")  # shards read from their containers
    trainer = Trainer(model, args, train_dataset=data, callbacks=[CkptzCallback()])
    trainer.train()
    trainer.train(resume_from_checkpoint="out/checkpoint-500")  # or True: the last one

When the work happens, and why it cannot race the ``Trainer``:

- ``Trainer._save_checkpoint`` writes the folder, then deletes old ones
  (``save_total_limit``), then calls ``on_save``; only then does the compression start.
- The one job in flight is waited for at ``on_step_end``/``on_epoch_end`` when the
  ``Trainer`` is about to save (``DefaultFlowCallback``, which runs first, has decided by
  then), and again in ``on_save`` and ``on_train_end``, which raise its error if it failed. So the next save, and the rotation
  that may delete the folder being compressed, never start while a compression runs; the
  wait is only as long as a compression outlasts the interval between two saves.
- The last save of a run (``max_steps`` reached, or ``should_training_stop``) is compressed
  before ``on_save`` returns: training is over, and ``Trainer`` still deletes and loads
  checkpoints after it (``save_total_limit=1``, ``load_best_model_at_end``) without a hook.
- With ``load_best_model_at_end``, the best checkpoint so far stays plain until it is no
  longer the best, or until ``on_train_end`` (after ``Trainer`` has loaded it).
- A folder keeps its modification time, which ``save_total_limit`` rotation sorts by.

What a resume sees: each file of a folder is, at any moment, whole in one form, ``X`` or
``X.ckptz`` (both, if the process died between a container's rename and the original's
removal). With :func:`enable` on, the ``Trainer`` reads ``X`` where it is plain and
``X.ckptz`` where it is not, whatever point a compression reached or was killed at. A
compression that fails restores the files it had converted and logs the error, which is
raised in the next ``on_save`` (after that checkpoint is written, which stays plain) or in
``on_train_end``.

Not supported: ``push_to_hub`` with ``hub_strategy`` ``checkpoint`` or ``all_checkpoints``
(the ``Trainer`` uploads the folder in the background while it would be compressed; a
warning says so and the callback then leaves checkpoints plain), and hyper-parameter search
(checkpoints under ``run-*/`` folders are not found and stay plain, with a warning).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from ckptz.integrations.folders import compress_folder
from ckptz.integrations.transformers_reading import Reading, disable, enable, enabled
from ckptz.runs.run import check_codec

log = logging.getLogger(__name__)

#: The ``Trainer``'s own record of a checkpoint folder, written plain (ckptz leaves JSON alone).
_TRAINER_STATE = "trainer_state.json"
#: ``hub_strategy`` values under which the ``Trainer`` uploads checkpoint folders in the background.
_UPLOADS_CHECKPOINTS = ("checkpoint", "all_checkpoints")


class CkptzCallback(TrainerCallback):
    """Compress each checkpoint folder the ``Trainer`` saves, in place, in the background.

    Every checkpoint file of ``checkpoint-N`` (model weights, optimizer, scheduler, RNG
    state, ``training_args.bin``) becomes ``X.ckptz``; JSON files stay as they are. Call
    :func:`enable` (or pass ``resume(path)`` as ``resume_from_checkpoint``) to train on from a
    compressed folder.

    Args:
        device: where to compress: ``cpu`` (the default, leaving the GPU to training),
            ``auto``, ``cuda`` or ``cuda:N`` (nvCOMP, sharing the GPU with training).
        codec: ``auto``, ``zstd`` or a GPU codec such as ``ans`` (decodes only on a GPU).
        level: zstd level of the coded planes.
        threads: CPU threads for the compression (default: all cores).
        memory: byte budget of the GPU pipeline's buffers.
        background: compress on a worker thread while training goes on (``False``: before
            ``on_save`` returns).

    Raises:
        CkptzError: from a later callback (the next save, or ``on_train_end``) when a
            compression failed; the folder then holds the files the ``Trainer`` wrote.
    """

    def __init__(
        self,
        *,
        device: str | None = "cpu",
        codec: str = "auto",
        level: int = 3,
        threads: int | None = None,
        memory: int | None = None,
        background: bool = True,
    ) -> None:
        self.device = device
        self.codec = check_codec(codec)
        self.level = level
        self.threads = threads
        self.memory = memory
        self.background = background
        self._job = _Job()
        self._deferred: list[Path] = []  # folders the Trainer will read again (the best one)
        self._disabled = False

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if args.push_to_hub and args.hub_strategy in _UPLOADS_CHECKPOINTS:
            log.warning(
                "ckptz: push_to_hub with hub_strategy=%s uploads checkpoint folders in the background; "
                "they are left uncompressed (run `ckptz compress --in-place` on them after training)",
                args.hub_strategy,
            )
            self._disabled = True

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if _saves_next(args, control):
            self._job.join()  # a failure is raised in on_save, once this save is on disk

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if _saves_next(args, control):
            self._job.join()  # a failure is raised in on_save, once this save is on disk

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._job.wait()
        if not args.should_save or self._disabled or args.output_dir is None:
            return
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if not folder.is_dir():
            log.warning("ckptz: no checkpoint folder at %s; leaving this checkpoint uncompressed", folder)
            return
        best = _best(args, state)
        pending = [*self._deferred, folder]
        self._deferred = [f for f in pending if f == best]
        todo = [f for f in pending if f != best]
        if not todo:
            return
        last = control.should_training_stop or state.global_step >= state.max_steps
        if self.background and not last:
            self._job.start(lambda: self._compress(todo), name=f"compressing {folder.name}")
        else:
            self._compress(todo)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._job.wait()
        todo, self._deferred = self._deferred, []
        self._compress(todo)

    def _compress(self, folders: list[Path]) -> None:
        for folder in folders:
            if folder.is_dir():  # the Trainer may have deleted it meanwhile (rotation)
                compress_folder(
                    folder,
                    device=self.device,
                    codec=self.codec,
                    level=self.level,
                    threads=self.threads,
                    memory=self.memory,
                )


def resume(path: str | os.PathLike[str]) -> str:
    """The checkpoint folder to pass as ``resume_from_checkpoint``, read compressed.

    Turns on :func:`enable` for the rest of the process (until :func:`disable`), so that the
    ``Trainer`` reads the folder's containers in memory; nothing is restored or written. ``path`` is a
    ``checkpoint-N`` folder, or an output folder, whose last ``checkpoint-N`` is taken (as
    ``resume_from_checkpoint=True`` takes it).

    Args:
        path: the checkpoint folder, or the output folder holding ``checkpoint-N`` folders.

    Returns:
        The checkpoint folder, as a string for ``Trainer.train(resume_from_checkpoint=...)``.

    Raises:
        UsageError: the installed transformers lacks a function that ckptz hooks into.
    """
    folder = Path(path)
    if not (folder / _TRAINER_STATE).is_file() and (last := get_last_checkpoint(str(folder))) is not None:
        folder = Path(last)
    if not enabled():
        enable()  # left open: the Trainer reads the folder after this returns
    return str(folder)


def _saves_next(args: TrainingArguments, control: TrainerControl) -> bool:
    """Whether the ``Trainer`` may save right after this callback (``best``: after evaluating)."""
    return bool(control.should_save or (control.should_evaluate and args.save_strategy == "best"))


def _best(args: TrainingArguments, state: TrainerState) -> Path | None:
    """The checkpoint ``load_best_model_at_end`` will load at the end, which must stay plain."""
    if args.load_best_model_at_end and state.best_model_checkpoint:
        return Path(state.best_model_checkpoint)
    return None


class _Job:
    """At most one task on a worker thread; its failure is logged at once and raised by ``wait``.

    The thread is not a daemon: an interpreter that exits mid-compression first lets the
    file in hand finish (the folder is consistent either way).
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, task: Callable[[], None], *, name: str) -> None:
        self.wait()
        self._thread = threading.Thread(target=self._run, args=(task, name), name=f"ckptz: {name}")
        self._thread.start()

    def _run(self, task: Callable[[], None], name: str) -> None:
        try:
            task()
        except BaseException as exc:
            log.error("ckptz: %s failed: %s", name, exc)
            exc.add_note(f"ckptz: raised by the background job {name!r}")
            self._error = exc

    def join(self) -> None:
        """Wait for the task in flight."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def wait(self) -> None:
        """Wait for the task in flight, and raise its error if it failed."""
        self.join()
        if (error := self._error) is not None:
            self._error = None
            raise error


__all__ = ["CkptzCallback", "Reading", "disable", "enable", "enabled", "resume"]
