"""ckptz.dcp: DCP save and load through CompressedWriter and CompressedReader (CPU, gloo)."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from conftest import ckptz  # noqa: E402

from ckptz.container import read_index  # noqa: E402
from ckptz.dcp import CompressedReader, CompressedWriter  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {
        "model": {
            "w": torch.randn(256, 64, generator=g),
            "b": torch.randn(64, generator=g).bfloat16(),
        },
        "optim": {"state": {"0": {"exp_avg": torch.zeros(4096), "step": torch.tensor(7.0)}}},
        "step": 3,
    }


def _blank() -> dict[str, Any]:
    return {
        "model": {"w": torch.empty(256, 64), "b": torch.empty(64, dtype=torch.bfloat16)},
        "optim": {"state": {"0": {"exp_avg": torch.ones(4096), "step": torch.tensor(0.0)}}},
        "step": 0,
    }


def _assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, dict):
            _assert_same(got[key], value)
        elif isinstance(value, torch.Tensor):
            assert value.dtype == got[key].dtype and torch.equal(got[key], value), key
        else:
            assert got[key] == value, key


def _save(path: Path, writer: Any = None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(_state(), storage_writer=writer or CompressedWriter(path, device="cpu"))


def _load(path: Path, reader: Any = None) -> dict[str, Any]:
    target = _blank()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(target, storage_reader=reader or CompressedReader(path, device="cpu"))
    return target


def _names(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    _save(ckpt)
    assert _names(ckpt) == [".metadata", "__0_0.distcp.ckptz"]
    _assert_same(_load(ckpt), _state())


_KILLED_SAVE = """
import sys, torch, warnings
import torch.distributed.checkpoint as dcp
from ckptz.dcp import CompressedWriter
warnings.simplefilter("ignore")
state = {"w": torch.randn(2 << 20, generator=torch.Generator().manual_seed(1))}
dcp.save(state, storage_writer=CompressedWriter(sys.argv[1], device="cpu", thread_count=1))
"""


def test_a_save_killed_while_staging_leaves_no_plain_copy_behind_the_next_save(tmp_path: Path) -> None:
    """SIGKILL a DCP save while its staging folder holds the plain shard: the next save to
    that folder removes it (else every killed save left a whole uncompressed shard there,
    which ``ckptz verify --against`` then reports as an extra folder), and loads see the
    new checkpoint."""
    import signal
    import subprocess
    import sys
    import time

    from conftest import CLI_ENV

    ckpt = tmp_path / "ckpt"
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, "-c", _KILLED_SAVE, str(ckpt)], env=CLI_ENV)
        end = time.monotonic() + 120
        staged: list[Path] = []
        while proc.poll() is None and time.monotonic() < end and not staged:
            staged = [p for p in ckpt.glob(".ckptz-dcp-*/*.distcp") if p.stat().st_size > 0]
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        if [p for p in ckpt.glob(".ckptz-dcp-*")]:
            break
    else:
        pytest.fail("the save could not be killed while staging")

    _save(ckpt)
    assert _names(ckpt) == [".metadata", "__0_0.distcp.ckptz"]
    _assert_same(_load(ckpt), _state())


def test_a_container_above_the_memory_limit_is_read_through_a_temporary_file(tmp_path: Path) -> None:
    ckpt, spill = tmp_path / "ckpt", tmp_path / "spill"
    spill.mkdir()
    _save(ckpt)
    reader = CompressedReader(ckpt, device="cpu", tmp_dir=spill)
    assert reader.fs.memory_limit > 0  # normally decoded in memory
    reader.fs.memory_limit = 0
    _assert_same(_load(ckpt, reader), _state())
    assert list(spill.iterdir()) == []  # the temporary file is gone


def test_cli_decompress_gives_the_plain_checkpoint(tmp_path: Path) -> None:
    ours, plain, out = tmp_path / "ours", tmp_path / "plain", tmp_path / "out"
    _save(ours)
    _save(plain, dcp.FileSystemWriter(plain))
    done = ckptz("decompress", str(ours), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert _names(out) == [".metadata", "__0_0.distcp"]
    # DCP writes a .distcp deterministically (only .metadata holds a save id).
    assert (out / "__0_0.distcp").read_bytes() == (plain / "__0_0.distcp").read_bytes()
    _assert_same(_load(out, dcp.FileSystemReader(out)), _state())


def _components(path: Path) -> list[tuple[str, int, int]]:
    done = ckptz("inspect", "--json", str(path))
    assert done.returncode == 0, done.stderr
    return [(c["name"], c["tensors"], c["bytes"]) for c in json.loads(done.stdout)["components"]]


def test_cli_inspect_and_verify_work_per_component(tmp_path: Path) -> None:
    ours, plain = tmp_path / "ours", tmp_path / "plain"
    _save(ours)
    _save(plain, dcp.FileSystemWriter(plain))
    shutil.copytree(plain, tmp_path / "cli")
    assert ckptz("compress", str(tmp_path / "cli"), "--in-place").returncode == 0
    # The writer names every tensor from the metadata, as the CLI does on a whole folder.
    container = "__0_0.distcp.ckptz"
    assert _components(ours / container) == _components(tmp_path / "cli" / container)
    assert "optimizer.exp_avg" in [name for name, _, _ in _components(ours)]
    done = ckptz("verify", str(ours / "__0_0.distcp.ckptz"), "--against", str(plain / "__0_0.distcp"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "byte-identical" in done.stdout


def test_reader_reads_a_folder_the_cli_compressed(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    _save(ckpt, dcp.FileSystemWriter(ckpt))
    done = ckptz("compress", str(ckpt), "--in-place")
    assert done.returncode == 0, done.stderr
    assert all(name.endswith(".ckptz") for name in _names(ckpt))
    _assert_same(_load(ckpt), _state())


def test_reader_reads_a_plain_folder(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    _save(ckpt, dcp.FileSystemWriter(ckpt))
    _assert_same(_load(ckpt), _state())


def test_save_over_a_plain_checkpoint_leaves_no_plain_file(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    _save(ckpt, dcp.FileSystemWriter(ckpt))
    _save(ckpt)
    assert _names(ckpt) == [".metadata", "__0_0.distcp.ckptz"]
    _assert_same(_load(ckpt), _state())


def test_writer_passes_options_to_file_system_writer(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    _save(ckpt, CompressedWriter(ckpt, device="cpu", thread_count=2, verify=True))
    assert _names(ckpt) == [".metadata", "__0_0.distcp.ckptz", "__0_1.distcp.ckptz"]
    _assert_same(_load(ckpt), _state())


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
def test_staged_files_are_not_synced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    fsync = os.fsync

    def record(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", record)
    ckpt = tmp_path / "ckpt"
    _save(ckpt)
    assert any(".distcp.ckptz" in p for p in synced), synced  # the container is synced
    assert not [p for p in synced if ".ckptz-dcp-" in p]  # its staged source is not
    _assert_same(_load(ckpt), _state())


@pytest.fixture
def one_rank_group(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("one_rank_group")
@pytest.mark.parametrize("executor", ["thread", "process"])
def test_async_save(tmp_path: Path, executor: str) -> None:
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    ckpt = tmp_path / "ckpt"
    state = _state()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        future = dcp.async_save(
            state,
            storage_writer=CompressedWriter(ckpt, device="cpu"),
            async_checkpointer_type=AsyncCheckpointerType(executor),
        )
        future.result(timeout=60)
    assert _names(ckpt) == [".metadata", "__0_0.distcp.ckptz"]
    _assert_same(_load(ckpt), _state())


def _save_sharded(rank: int, world: int, store: str, ckpt: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        full = _state()
        state = {
            "model": {
                "w": distribute_tensor(full["model"]["w"], mesh, [Shard(0)]),
                "b": full["model"]["b"],
            },
            "optim": {
                "state": {
                    "0": {
                        "exp_avg": distribute_tensor(
                            full["optim"]["state"]["0"]["exp_avg"], mesh, [Shard(0)]
                        ),
                        "step": full["optim"]["state"]["0"]["step"],
                    }
                }
            },
            "step": full["step"],
        }
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(state, storage_writer=CompressedWriter(ckpt, device="cpu"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_save_shards_one_rank_loads(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    torch.multiprocessing.spawn(
        _save_sharded, args=(2, str(tmp_path / "store"), str(ckpt)), nprocs=2, join=True
    )
    assert _names(ckpt) == [".metadata", "__0_0.distcp.ckptz", "__1_0.distcp.ckptz"]
    _assert_same(_load(ckpt), _state())
    out = tmp_path / "out"
    assert ckptz("decompress", str(ckpt), "-o", str(out)).returncode == 0
    _assert_same(_load(out, dcp.FileSystemReader(out)), _state())
    shutil.rmtree(out)


def _to(state: dict[str, Any], device: str) -> dict[str, Any]:
    return {
        k: _to(v, device) if isinstance(v, dict) else v.to(device) if isinstance(v, torch.Tensor) else v
        for k, v in state.items()
    }


@pytest.mark.gpu
@pytest.mark.parametrize("codec", ["auto", "ans"])
def test_gpu_writer_saves_cuda_tensors(tmp_path: Path, codec: str) -> None:
    ours, plain, out = tmp_path / "ours", tmp_path / "plain", tmp_path / "out"
    state = _to(_state(), "cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=CompressedWriter(ours, device="cuda", codec=codec))
        # From the same CUDA state: DCP orders a file's items by size when CUDA is there.
        dcp.save(state, storage_writer=dcp.FileSystemWriter(plain))
    assert _names(ours) == [".metadata", "__0_0.distcp.ckptz"]
    with (ours / "__0_0.distcp.ckptz").open("rb") as f:
        device = str(read_index(f, "__0_0.distcp.ckptz").header["device"])
    if codec == "ans":  # GPU-only bitstream: the GPU engine coded every frame
        assert device.startswith("cuda"), device
    done = ckptz("decompress", str(ours), "-o", str(out), env={"CKPTZ_DEVICE": "cuda"})
    assert done.returncode == 0, done.stderr
    assert (out / "__0_0.distcp").read_bytes() == (plain / "__0_0.distcp").read_bytes()
    target = _to(_blank(), "cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(target, storage_reader=CompressedReader(ours, device="cuda"))
    assert target["model"]["w"].is_cuda
    _assert_same(_to(target, "cpu"), _state())


@pytest.mark.gpu
def test_gpu_writer_takes_the_local_rank_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.delenv("CKPTZ_DEVICE", raising=False)
    ckpt = tmp_path / "ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(_to(_state(), "cuda"), storage_writer=CompressedWriter(ckpt, codec="ans"))
    with (ckpt / "__0_0.distcp.ckptz").open("rb") as f:
        assert read_index(f, "__0_0.distcp.ckptz").header["device"] == "cuda:0"
    target = _to(_blank(), "cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(target, storage_reader=CompressedReader(ckpt, device="cuda:0"))
    _assert_same(_to(target, "cpu"), _state())
