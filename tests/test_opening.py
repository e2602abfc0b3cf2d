"""A run opens its engine on a thread of its own (:class:`ckptz.runs.run.OpeningEngine`):
a restore makes its output meanwhile, a compression lays out its file meanwhile, and an
engine that cannot open is still one clear error that leaves nothing behind."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptz import api
from ckptz.engines.cpu import CpuEngine
from ckptz.errors import DeviceError
from ckptz.pipeline import compress as compress_module
from ckptz.runs import run as run_module
from ckptz.safeio import is_temp
from tests.conftest import tree_digests

#: How long an opener waits for the run to get ahead of it before giving up.
WAIT_S = 20


def _opener_waiting_for(seen: threading.Event, what: list[str]) -> Callable[..., tuple[CpuEngine, None]]:
    """An ``open_engine`` that opens a CPU engine only once ``seen`` is set (or after
    :data:`WAIT_S`), recording in ``what`` whether the run got there without it."""

    def open_engine(*_args: object, **_kwargs: object) -> tuple[CpuEngine, None]:
        what.append("ahead" if seen.wait(WAIT_S) else "waited for the engine")
        return CpuEngine(2), None

    return open_engine


def test_a_restore_makes_its_output_while_the_engine_opens(
    small_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    packed = tmp_path / "packed"
    api.compress(small_checkpoint, packed, device="cpu")
    out = tmp_path / "out"
    made = threading.Event()
    real_sink = api.FileSink

    def sink(*args: object, **kwargs: object) -> object:
        made_here = real_sink(*args, **kwargs)  # type: ignore[arg-type]
        assert any(is_temp(p) for p in out.rglob("*")), "the sink writes the run's temp output"
        made.set()
        return made_here

    what: list[str] = []
    monkeypatch.setattr(api, "FileSink", sink)
    monkeypatch.setattr(run_module, "open_engine", _opener_waiting_for(made, what))
    api.decompress(packed, out)
    assert what == ["ahead"]
    assert tree_digests(out) == tree_digests(small_checkpoint)


def test_a_compression_lays_out_its_file_while_the_engine_opens(
    small_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    laid_out = threading.Event()
    real = compress_module.read_layout

    def read_layout(*args: object, **kwargs: object) -> object:
        layout = real(*args, **kwargs)  # type: ignore[arg-type]
        laid_out.set()
        return layout

    what: list[str] = []
    monkeypatch.setattr(compress_module, "read_layout", read_layout)
    monkeypatch.setattr(run_module, "open_engine", _opener_waiting_for(laid_out, what))
    packed = tmp_path / "packed"
    api.compress(small_checkpoint, packed)
    assert what == ["ahead"]
    laid_out.clear()
    assert api.compress(small_checkpoint, None, discard=True).files  # writes nothing
    assert what == ["ahead", "ahead"]
    api.decompress(packed, tmp_path / "back", device="cpu")
    assert tree_digests(tmp_path / "back") == tree_digests(small_checkpoint)


@pytest.mark.parametrize(
    "operation",
    [
        "compress",
        "decompress",
        "compress in place",
        "decompress in place",
        "compress discard",
        "decompress discard",
    ],
)
def test_an_engine_that_cannot_open_is_one_error_and_leaves_nothing(
    operation: str, small_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    if operation.startswith("decompress"):
        api.compress(small_checkpoint, src, device="cpu")
    else:
        api.compress(small_checkpoint, tmp_path / "unused", device="cpu")
        api.decompress(tmp_path / "unused", src, device="cpu")
    before = tree_digests(src)

    def no_gpu(*_args: object, **_kwargs: object) -> tuple[CpuEngine, None]:
        raise DeviceError("cannot use cuda: no CUDA device is visible", hint="use --device cpu")

    monkeypatch.setattr(run_module, "open_engine", no_gpu)
    run = api.compress if operation.startswith("compress") else api.decompress
    out = tmp_path / "out"
    in_place = operation.endswith("in place")
    discard = operation.endswith("discard")
    with pytest.raises(DeviceError, match="no CUDA device"):
        run(src, None if in_place or discard else out, in_place=in_place, discard=discard)
    assert tree_digests(src) == before
    assert not out.exists() or not [p for p in out.rglob("*") if p.is_file()]
    assert not [p for p in tmp_path.rglob("*") if is_temp(p)]
