"""ckptz.integrations.lightning with a real Lightning ``Trainer`` on the CPU."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import stat
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from torch.utils.data import DataLoader, TensorDataset
from typer.testing import CliRunner

import ckptz
from ckptz.cli import app
from ckptz.integrations.lightning import CompressedCheckpointIO
from ckptz.library import is_container


class Regression(pl.LightningModule):
    """Two linear layers, SGD with momentum and a step schedule: state in every part of a checkpoint."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        self.losses: list[float] = []

    def training_step(self, batch: list[torch.Tensor], _index: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=3)]

    def train_dataloader(self) -> DataLoader[tuple[torch.Tensor, ...]]:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(32, 8, generator=g)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)


def fit(root: Path, epochs: int, plugins: list[Any], ckpt_path: Path | None = None) -> Regression:
    """Fit from a fixed seed, keeping a checkpoint per epoch in ``root/ckpt``."""
    pl.seed_everything(0, verbose=False)
    model = Regression()
    trainer = pl.Trainer(
        default_root_dir=root,
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        plugins=plugins,
        callbacks=[ModelCheckpoint(dirpath=root / "ckpt", save_top_k=-1, save_last=True)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, ckpt_path=ckpt_path)
    return model


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same 2-epoch fit twice at the same path: ``plain`` (TorchCheckpointIO), ``packed``."""
    base = tmp_path_factory.mktemp("lightning")
    fit(base / "run", 2, [])
    shutil.move(base / "run", base / "plain")
    fit(base / "run", 2, [CompressedCheckpointIO()])
    shutil.move(base / "run", base / "packed")
    return base


NAMES = ["epoch=0-step=4.ckpt", "epoch=1-step=8.ckpt", "last.ckpt"]


def test_checkpoints_are_containers_of_torch_save_bytes(runs: Path, tmp_path: Path) -> None:
    assert sorted(p.name for p in (runs / "packed" / "ckpt").iterdir()) == NAMES
    for name in NAMES:
        packed, plain = runs / "packed" / "ckpt" / name, runs / "plain" / "ckpt" / name
        assert is_container(packed)
        assert packed.stat().st_size < plain.stat().st_size
        restored = tmp_path / name
        result = CliRunner().invoke(app, ["decompress", str(packed), "-o", str(restored)])
        assert result.exit_code == 0, result.output
        assert restored.read_bytes() == plain.read_bytes()  # exactly what TorchCheckpointIO writes
        state = ckptz.load(packed)  # weights_only: a Lightning checkpoint is plain data
        assert state.keys() == torch.load(plain).keys()


def test_a_folder_of_lightning_containers_decompresses_in_place_around_them(
    runs: Path, tmp_path: Path
) -> None:
    """``ckptz decompress DIR --in-place`` on Lightning's checkpoint folder, which also holds
    a ``.ckptz`` container: the ``.ckpt`` containers keep their names (there is no other
    name to restore them to) and are left as they are with a note; the run does the rest
    instead of refusing the whole folder."""
    from conftest import ckptz as cli

    folder = tmp_path / "ckpt"
    shutil.copytree(runs / "packed" / "ckpt", folder)
    extra = folder / "extra.pt"
    torch.save({"w": torch.arange(64.0)}, extra)
    want = extra.read_bytes()
    assert cli("compress", str(extra), "--in-place", "-q").returncode == 0
    before = {name: (folder / name).read_bytes() for name in NAMES}

    done = cli("decompress", str(folder), "--in-place")
    assert done.returncode == 0, done.stderr
    assert "3 files: a container whose name does not end in .ckptz" in done.stderr, done.stderr
    assert extra.read_bytes() == want and not (folder / "extra.pt.ckptz").exists()
    assert {name: (folder / name).read_bytes() for name in NAMES} == before
    restored = tmp_path / "last.ckpt"
    assert cli("decompress", str(folder / "last.ckpt"), "-o", str(restored), "-q").returncode == 0
    assert restored.read_bytes() == (runs / "plain" / "ckpt" / "last.ckpt").read_bytes()


def test_verify_against_the_plain_checkpoints_compares_what_they_restore_to(runs: Path) -> None:
    """``verify`` of Lightning's containers against the checkpoints ``TorchCheckpointIO``
    wrote: each restores to exactly them (the same seeds), so all match; a wrong pairing
    is still changed."""
    from conftest import ckptz as cli

    packed, plain = runs / "packed" / "ckpt", runs / "plain" / "ckpt"
    done = cli("verify", str(packed), "--against", str(plain), "--json")
    assert done.returncode == 0, done.stdout
    assert [f["status"] for f in json.loads(done.stdout)["files"]] == ["ok"] * len(NAMES)
    wrong = cli("verify", str(packed / "last.ckpt"), "--against", str(plain / NAMES[0]), "--json")
    assert wrong.returncode == 1
    assert [f["status"] for f in json.loads(wrong.stdout)["files"]] == ["changed"]


def test_resume_from_a_compressed_checkpoint(runs: Path, tmp_path: Path) -> None:
    first = "epoch=0-step=4.ckpt"
    plain = fit(tmp_path / "plain", 3, [], ckpt_path=runs / "plain" / "ckpt" / first)
    packed = fit(
        tmp_path / "packed", 3, [CompressedCheckpointIO()], ckpt_path=runs / "packed" / "ckpt" / first
    )
    assert len(packed.losses) == 8  # epochs 1 and 2
    assert packed.losses == plain.losses
    for a, b in zip(packed.state_dict().values(), plain.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    # A plain checkpoint resumes through the plugin too, and an async one writes containers.
    again = fit(
        tmp_path / "again", 3, [AsyncCheckpointIO(CompressedCheckpointIO())], runs / "plain" / "ckpt" / first
    )
    assert again.losses == plain.losses
    assert all(is_container(p) for p in (tmp_path / "again" / "ckpt").iterdir())


def test_load_from_checkpoint_through_ckptz_open(runs: Path) -> None:
    with ckptz.open(runs / "packed" / "ckpt" / "last.ckpt") as f:
        model = Regression.load_from_checkpoint(f, weights_only=True)
    plain = Regression.load_from_checkpoint(runs / "plain" / "ckpt" / "last.ckpt", weights_only=True)
    for a, b in zip(model.state_dict().values(), plain.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_remove_checkpoint(tmp_path: Path) -> None:
    io = CompressedCheckpointIO()
    path = tmp_path / "sub" / "x.ckpt"
    io.save_checkpoint({"w": torch.ones(3)}, path)
    assert torch.equal(io.load_checkpoint(path)["w"], torch.ones(3))
    stale = path.parent / f".x.ckpt{ckptz.safeio.TMP_MARK}1-0123abcd"  # what a killed save leaves
    stale.write_bytes(b"partial")
    io.remove_checkpoint(path)
    assert list(path.parent.iterdir()) == []
    io.remove_checkpoint(path)  # gone already: nothing to do
    with pytest.raises(FileNotFoundError):
        io.load_checkpoint(path)


def test_unsafe_objects_need_weights_only_false(tmp_path: Path) -> None:
    io = CompressedCheckpointIO()
    path = tmp_path / "x.ckpt"
    io.save_checkpoint({"p": Path("a")}, path)  # not something the safe unpickler takes
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        io.load_checkpoint(path)
    assert io.load_checkpoint(path, weights_only=False) == {"p": Path("a")}


def test_a_container_gets_the_bits_a_new_file_gets(tmp_path: Path) -> None:
    umask = os.umask(0o027)
    try:
        path = tmp_path / "x.ckpt"
        CompressedCheckpointIO().save_checkpoint({"w": torch.ones(3)}, path)
    finally:
        os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["x.ckpt"]  # nothing left beside it
    restored = tmp_path / "restored.ckpt"
    assert CliRunner().invoke(app, ["decompress", str(path), "-o", str(restored)]).exit_code == 0
    assert stat.S_IMODE(restored.stat().st_mode) == 0o640


def test_saving_over_a_private_checkpoint_keeps_it_private(tmp_path: Path) -> None:
    """TorchCheckpointIO writes into an existing last.ckpt, so its 0600 bits stay; so must ours."""
    path = tmp_path / "last.ckpt"
    CompressedCheckpointIO().save_checkpoint({"w": torch.ones(3)}, path)
    path.chmod(0o600)
    CompressedCheckpointIO().save_checkpoint({"w": torch.zeros(3)}, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert torch.equal(CompressedCheckpointIO().load_checkpoint(path)["w"], torch.zeros(3))


def test_other_file_systems(tmp_path: Path) -> None:
    io = CompressedCheckpointIO()
    io.save_checkpoint({"w": torch.arange(4.0)}, "memory://ckptz-test/x.ckpt")
    assert torch.equal(io.load_checkpoint("memory://ckptz-test/x.ckpt")["w"], torch.arange(4.0))
    io.remove_checkpoint("memory://ckptz-test/x.ckpt")
    with pytest.raises(FileNotFoundError):
        io.load_checkpoint("memory://ckptz-test/x.ckpt")
