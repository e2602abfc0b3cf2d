"""``ckptz.hf.enable()``: real ``transformers`` reads folders compressed in place, in memory.

A tiny GPT-2 built from its config is saved with ``save_pretrained`` (whole, sharded) or as a
``pytorch_model.bin``, or trained by a ``Trainer`` to a ``checkpoint-N``; the CLI compresses
the folder in place; ``from_pretrained`` and ``Trainer.train(resume_from_checkpoint=...)``
then read it with one line of ckptz, and leave the folder as it was.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers reads it: nothing is downloaded

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import ckptz as run_cli
from safetensors import safe_open
from test_integrations_transformers import losses, train
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, modeling_utils, trainer

import ckptz
from ckptz.errors import ContainerError, UsageError
from ckptz.library import is_container

#: Token ids of the fixed input whose logits are compared.
IDS = torch.arange(12).reshape(2, 6)


@pytest.fixture(autouse=True)
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary folder of its own, to prove that reading leaves no decoded file behind;
    and reading off before and after each test (``resume()`` leaves it on)."""
    ckptz.hf.disable()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    yield scratch
    ckptz.hf.disable()


def tiny_model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=16)).eval()


def compress_in_place(folder: Path) -> dict[str, int]:
    """``ckptz compress FOLDER --in-place`` as a user runs it; the folder's files and sizes after."""
    done = run_cli("compress", str(folder), "--in-place")
    assert done.returncode == 0, done.stderr
    return listing(folder)


def listing(folder: Path) -> dict[str, int]:
    return {p.relative_to(folder).as_posix(): p.stat().st_size for p in sorted(folder.rglob("*"))}


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


@pytest.mark.parametrize("shard", [None, "20KB"], ids=["whole", "sharded"])
def test_from_pretrained_reads_a_folder_compressed_in_place(
    tmp_path: Path, private_tmp: Path, shard: str | None
) -> None:
    model = tiny_model()
    folder = tmp_path / "model"
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    weights = sorted(p.name for p in folder.glob("*.safetensors"))
    assert len(weights) == (1 if shard is None else 7)
    after = compress_in_place(folder)
    assert {f"{n}.ckptz" for n in weights} <= set(after) and not set(weights) & set(after)
    with pytest.raises(OSError):  # what a user meets without ckptz
        AutoModelForCausalLM.from_pretrained(folder)

    with ckptz.hf.enable():
        loaded = AutoModelForCausalLM.from_pretrained(folder).eval()

    assert torch.equal(logits(loaded), logits(model))
    assert listing(folder) == after  # no plain shard, no temporary file
    assert not list(private_tmp.iterdir())
    with pytest.raises(OSError):  # the with block's end put transformers back as it was
        AutoModelForCausalLM.from_pretrained(folder)
    assert modeling_utils.os is os and "open" not in vars(modeling_utils) and trainer.torch is torch


def test_from_pretrained_reads_a_compressed_pytorch_model_bin(tmp_path: Path, private_tmp: Path) -> None:
    model = tiny_model()
    folder = tmp_path / "model"
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    after = compress_in_place(folder)
    assert is_container(folder / "pytorch_model.bin.ckptz") and "pytorch_model.bin" not in after

    with ckptz.hf.enable():
        loaded = GPT2LMHeadModel.from_pretrained(folder, dtype="auto").eval()

    assert torch.equal(logits(loaded), logits(model))
    assert listing(folder) == after and not list(private_tmp.iterdir())


def damage(path: Path) -> None:
    """Flip one byte in the middle of ``path``."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_file_in_both_forms_is_read_plain(tmp_path: Path) -> None:
    """A compression killed between a container's rename and the original's removal leaves
    ``X`` beside ``X.ckptz``: ``X`` is read (here its container is damaged, and unread)."""
    model = tiny_model()
    folder = tmp_path / "model"
    model.save_pretrained(folder, max_shard_size="20KB")
    first = "model-00001-of-00007.safetensors"
    kept = (folder / first).read_bytes()
    compress_in_place(folder)
    (folder / first).write_bytes(kept)
    damage(folder / f"{first}.ckptz")
    with ckptz.hf.enable():
        loaded = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert torch.equal(logits(loaded), logits(model))


def test_a_damaged_container_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    tiny_model().save_pretrained(folder, max_shard_size="20KB")
    compress_in_place(folder)
    damage(folder / "model-00002-of-00007.safetensors.ckptz")
    with ckptz.hf.enable(), pytest.raises(ContainerError):
        AutoModelForCausalLM.from_pretrained(folder)


def test_trainer_resumes_from_a_checkpoint_compressed_in_place(tmp_path: Path, private_tmp: Path) -> None:
    straight = train(tmp_path, max_steps=6, save_steps=3)
    checkpoint = tmp_path / "checkpoint-3"
    after = compress_in_place(checkpoint)
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"):
        assert is_container(checkpoint / f"{name}.ckptz") and name not in after
    with pytest.raises(ValueError, match="Can't find a valid checkpoint"):  # without ckptz
        train(tmp_path, max_steps=6, save_steps=3, resume_from=str(checkpoint))

    with ckptz.hf.enable():
        resumed = train(tmp_path, max_steps=6, save_steps=3, resume_from=str(checkpoint))

    assert [log["step"] for log in resumed.state.log_history if "loss" in log] == [1, 2, 3, 4, 5, 6]
    # Steps 1-3 come from trainer_state.json; 4-6, trained again, match only if the weights,
    # the Adam moments, the schedule and the RNG state were all read back.
    assert losses(resumed) == losses(straight)
    for a, b in zip(resumed.model.state_dict().values(), straight.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(resumed.optimizer.state.values(), straight.optimizer.state.values(), strict=True):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
    assert listing(checkpoint) == after  # read in memory: nothing restored, nothing left
    assert not list(private_tmp.iterdir())


def test_resume_turns_reading_on_and_returns_the_last_checkpoint(tmp_path: Path) -> None:
    train(tmp_path, max_steps=4, save_steps=2)
    after = compress_in_place(tmp_path / "checkpoint-4")
    assert not ckptz.hf.enabled()
    assert ckptz.hf.resume(tmp_path) == str(tmp_path / "checkpoint-4")
    assert ckptz.hf.enabled()
    assert listing(tmp_path / "checkpoint-4") == after  # nothing restored
    resumed = train(
        tmp_path, max_steps=5, save_steps=5, resume_from=ckptz.hf.resume(tmp_path / "checkpoint-4")
    )
    assert resumed.state.global_step == 5 and listing(tmp_path / "checkpoint-4") == after
    ckptz.hf.disable()
    assert not ckptz.hf.enabled() and trainer.os is os


def test_handles_nest(tmp_path: Path) -> None:
    outer = ckptz.hf.enable()
    with ckptz.hf.enable():
        assert modeling_utils.os is not os
    assert ckptz.hf.enabled() and modeling_utils.os is not os  # the outer handle still holds it
    outer.close()
    outer.close()  # a second close releases nothing more
    assert not ckptz.hf.enabled() and modeling_utils.os is os


def test_a_transformers_without_a_hooked_name_is_refused_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """A transformers whose ``Trainer`` module no longer imports ``safetensors`` as a module:
    enabling says so, and leaves every module as it was."""
    monkeypatch.delattr(trainer, "safetensors")
    with pytest.raises(UsageError, match=r"transformers\.trainer\.safetensors is missing"):
        ckptz.hf.enable()
    assert not ckptz.hf.enabled() and modeling_utils.os is os and modeling_utils.safe_open is safe_open
