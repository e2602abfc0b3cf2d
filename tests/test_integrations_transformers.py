"""ckptz.integrations.transformers with a real ``transformers.Trainer`` on a tiny GPT-2, on the CPU."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers reads it: nothing is downloaded

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from ckptz import api
from ckptz.errors import CkptzError
from ckptz.integrations.transformers import CkptzCallback, disable, resume
from ckptz.library import is_container, load_file
from ckptz.safeio import TMP_MARK

#: What the Trainer writes into a checkpoint folder that ckptz compresses (JSON stays plain).
COMPRESSED = ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin")
PLAIN = ("trainer_state.json", "config.json")


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Fixed random token sequences, their own labels."""

    def __init__(self) -> None:
        self.ids = torch.randint(0, 64, (32, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def train(
    out: Path,
    *,
    max_steps: int,
    save_steps: int,
    callbacks: list[TrainerCallback] = (),  # type: ignore[assignment]
    resume_from: str | None = None,
    **args: Any,
) -> Trainer:
    """Train a 2-layer GPT-2 from its config."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=16))
    arguments = TrainingArguments(
        output_dir=str(out),
        max_steps=max_steps,
        save_steps=save_steps,
        logging_steps=1,
        per_device_train_batch_size=4,
        use_cpu=True,
        report_to=[],
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
        **args,
    )
    evaluated = Tokens() if arguments.eval_strategy != "no" else None
    trainer = Trainer(
        model=model, args=arguments, train_dataset=Tokens(), eval_dataset=evaluated, callbacks=list(callbacks)
    )
    trainer.train(resume_from_checkpoint=resume_from)
    return trainer


def losses(trainer: Trainer) -> list[float]:
    """The training loss logged at every step."""
    return [log["loss"] for log in trainer.state.log_history if "loss" in log]


def assert_compressed(folder: Path) -> None:
    names = {p.name for p in folder.iterdir()}
    for name in COMPRESSED:
        assert name not in names
        assert is_container(folder / f"{name}.ckptz"), name
    for name in PLAIN:
        assert name in names
    assert not [n for n in names if TMP_MARK in n]


def test_compressed_checkpoints_resume_to_the_same_losses(tmp_path: Path) -> None:
    plain = losses(train(tmp_path / "plain", max_steps=6, save_steps=3))
    packed = losses(train(tmp_path / "packed", max_steps=6, save_steps=3, callbacks=[CkptzCallback()]))
    assert packed == plain  # compressing in the background does not disturb training
    for step in (3, 6):
        assert_compressed(tmp_path / "packed" / f"checkpoint-{step}")
    folder = tmp_path / "packed" / "checkpoint-3"
    mtime = folder.stat().st_mtime_ns
    # The folder as a kill mid-compression can leave it: a file in both forms (between the
    # container's rename and the original's removal), a file not reached yet, a temp file.
    api.decompress(folder / "optimizer.pt.ckptz", folder / "optimizer.pt")
    api.decompress(folder / "model.safetensors.ckptz", in_place=True)
    (folder / f".scheduler.pt.ckptz{TMP_MARK}1-0123abcd").write_bytes(b"partial")
    os.utime(folder, ns=(mtime, mtime))

    left = sorted(p.name for p in folder.iterdir())

    path = resume(folder)
    assert path == str(tmp_path / "packed" / "checkpoint-3")
    from_packed = losses(train(tmp_path / "packed", max_steps=6, save_steps=3, resume_from=path))
    disable()
    assert sorted(p.name for p in folder.iterdir()) == left  # read as it was: nothing restored
    assert Path(path).stat().st_mtime_ns == mtime  # the rotation's order is kept
    plain_3 = str(tmp_path / "plain" / "checkpoint-3")
    from_plain = losses(train(tmp_path / "plain", max_steps=6, save_steps=3, resume_from=plain_3))
    assert from_packed == from_plain == plain  # steps 1-3 from trainer_state.json, 4-6 trained again


def test_resume_takes_the_last_checkpoint_of_an_output_folder(tmp_path: Path) -> None:
    train(tmp_path, max_steps=4, save_steps=2, callbacks=[CkptzCallback(background=False)])
    assert resume(tmp_path) == str(tmp_path / "checkpoint-4")
    assert resume(tmp_path / "checkpoint-2") == str(tmp_path / "checkpoint-2")
    disable()
    for step in (2, 4):
        assert_compressed(tmp_path / f"checkpoint-{step}")  # nothing restored


def test_rotation_keeps_the_newest_compressed(tmp_path: Path) -> None:
    train(tmp_path, max_steps=5, save_steps=1, save_total_limit=2, callbacks=[CkptzCallback()])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4", "checkpoint-5"]
    for folder in tmp_path.iterdir():
        assert_compressed(folder)


def test_best_checkpoint_stays_plain_until_loaded(tmp_path: Path) -> None:
    trainer = train(
        tmp_path,
        max_steps=4,
        save_steps=2,
        eval_steps=2,
        eval_strategy="steps",
        load_best_model_at_end=True,
        metric_for_best_model="loss",
        greater_is_better=True,  # the earlier checkpoint is the "best": not the last one
        callbacks=[CkptzCallback()],
    )
    best = tmp_path / "checkpoint-2"
    assert trainer.state.best_model_checkpoint == str(best)
    for folder in tmp_path.iterdir():
        assert_compressed(folder)  # the best one too, once the Trainer has loaded it
    weights = load_file(best / "model.safetensors.ckptz")
    assert all(torch.equal(t, weights[k]) for k, t in trainer.model.state_dict().items() if k in weights)


def test_a_failed_compression_is_raised_at_the_next_save(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    in_the_way = tmp_path / "checkpoint-2" / "optimizer.pt.ckptz" / "x"
    in_the_way.mkdir(parents=True)  # a folder where the container should go: compressing fails
    with pytest.raises(CkptzError) as failed:
        train(tmp_path, max_steps=6, save_steps=2, callbacks=[CkptzCallback()])
    assert "checkpoint-2" in str(failed.value) + "".join(failed.value.__notes__)
    assert "compressing checkpoint-2 failed" in caplog.text  # logged when it happened
    assert not (tmp_path / "checkpoint-6").exists()  # raised at the next save, once it is written:
    assert {p.name for p in (tmp_path / "checkpoint-4").iterdir()} >= set(COMPRESSED)  # plain
    folder = tmp_path / "checkpoint-2"
    assert sorted(p.name for p in folder.iterdir() if p.name.endswith(".ckptz")) == ["optimizer.pt.ckptz"]
    for name in COMPRESSED:  # every file as the Trainer wrote it
        assert (folder / name).is_file()
