"""Series deltas in the native planes (ckptz/native_src/delta_plane.c): on a small real
training run, ``compress --series`` writes byte for byte the containers the Python pipeline
writes, against a plain reference and against a reference container, with every delta kind;
the native restore plane undoes them byte for byte; and a damaged reference fails with the
Python pipeline's own message."""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import tree_digests
from safetensors.numpy import save_file
from series_run import make_run

from ckptz import api
from ckptz.container import read_index
from ckptz.digest import Digest
from ckptz.dtypes import lookup
from ckptz.engines.cpu import CpuEngine
from ckptz.errors import ContainerError, CorruptionError
from ckptz.formats import read_layout
from ckptz.formats.layout import FileLayout
from ckptz.pipeline import native_compress, native_restore
from ckptz.pipeline.compress import compress_file
from ckptz.pipeline.restore import restore
from ckptz.pipeline.transform import FrameTransform
from ckptz.series import delta as series_delta
from ckptz.series.delta import layout_tensors
from ckptz.series.kinds import (
    ORDERED_DIFFERENCE,
    SCALED,
    SCALED_DIFFERENCE,
    SCALED_SIGN_MAGNITUDE,
    UNIT_SCALE,
    XOR,
    mantissa_bits,
)
from ckptz.series.reference import PlainReference, RefSpec

STEPS = (10, 20, 30, 40)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four checkpoints of a real training run (AdamW steps between them), and a fifth apart."""
    root = tmp_path_factory.mktemp("series-native")
    make_run(root / "all", (*STEPS, 50))
    four = root / "four"
    four.mkdir()
    for s in STEPS:
        shutil.copytree(root / "all" / f"checkpoint-{s}", four / f"checkpoint-{s}")
    return root


@pytest.fixture
def coded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """Each file the native compress plane coded: (relative path, whether with a series delta)."""
    calls: list[tuple[str, bool]] = []
    real = native_compress.code

    def code(fd: int, out: int, relpath: str, *args: Any, **kwargs: Any) -> native_compress.Coded:
        calls.append((relpath, kwargs.get("delta") is not None))
        return real(fd, out, relpath, *args, **kwargs)

    monkeypatch.setattr(native_compress, "code", code)
    return calls


@pytest.fixture
def attempts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, bool]]:
    """Each file the native restore plane took with a series delta: (its name as shown, the
    last two parts of its path; "file" or "container": what its reference was; whether the
    plane restored it, rather than raising)."""
    calls: list[tuple[str, str, bool]] = []
    real = native_restore.run

    def run(
        fd: int, path: str, decoder: Any, tables: native_restore.Plan, *args: Any, **kwargs: Any
    ) -> Digest | None:
        delta = getattr(tables, "delta", None)  # (a plan of no delta has none)
        where = "/".join(Path(path).parts[-2:])
        reference = "file" if delta is not None and int(delta[2]) >= 0 else "container"
        try:
            digest = real(fd, path, decoder, tables, *args, **kwargs)
        except Exception:
            if delta is not None:
                calls.append((where, reference, False))
            raise
        if digest is not None and delta is not None:
            calls.append((where, reference, True))
        return digest

    monkeypatch.setattr(native_restore, "run", run)
    return calls


@pytest.fixture
def every_kind(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Pairs take each delta kind in turn (XOR, ordered difference, both scaled kinds), where
    the chooser would pick by a sample, so that every kind crosses the planes."""
    real = series_delta.choose_pairs
    order = [XOR, ORDERED_DIFFERENCE, SCALED_DIFFERENCE, SCALED_SIGN_MAGNITUDE]

    def choose(ours: Sequence[series_delta.Tensor], *args: Any) -> list[series_delta.Pair]:
        words = {t.index: lookup(t.dtype) for t in ours}
        out = []
        for n, (s, r, _, _) in enumerate(real(ours, *args)):
            kind = order[n % len(order)] if mantissa_bits(words[s]) is not None else XOR
            out.append((s, r, kind, UNIT_SCALE if kind in SCALED else 0))
        return out

    monkeypatch.setattr(series_delta, "choose_pairs", choose)
    yield


def _python_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compress and restore through the Python pipeline from here on."""
    monkeypatch.setattr(native_compress, "suits", lambda *args, **kwargs: False)
    monkeypatch.setattr(native_restore, "plan", lambda decoder, gpu=False: None)


def _containers(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*.ckptz"))}


def _kinds(root: Path) -> set[int]:
    kinds: set[int] = set()
    for p in root.rglob("*.ckptz"):
        with open(p, "rb") as f:
            ref = read_index(f, str(p)).header.get("reference")
        kinds |= {pair[2] if len(pair) > 2 else XOR for pair in (ref or {}).get("pairs", [])}
    return kinds


def _headers(root: Path) -> dict[str, dict[str, Any]]:
    """Each container's header, by the relative path of its original file."""
    out = {}
    for p in sorted(root.rglob("*.ckptz")):
        with open(p, "rb") as f:
            out[p.relative_to(root).as_posix().removesuffix(".ckptz")] = read_index(f, str(p)).header
    return out


def _series(run: Path, out: Path, keyframe_every: int) -> Path:
    """The four checkpoints compressed with ``--series`` into ``out`` (their references read
    from their plain sources), then a fifth added and compressed again in place (the previous
    newest re-coded against its container)."""
    api.compress(run / "four", out, series=True, device="cpu", keyframe_every=keyframe_every)
    shutil.copytree(run / "all" / "checkpoint-50", out / "checkpoint-50")
    api.compress(out, in_place=True, series=True, device="cpu", verify=True, keyframe_every=keyframe_every)
    return out


@pytest.mark.parametrize("kinds", ["chosen", "every", "keyframes"])
def test_series_containers_are_the_python_pipelines(
    run: Path,
    tmp_path: Path,
    kinds: str,
    coded: list[tuple[str, bool]],
    attempts: list[tuple[str, str, bool]],
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    if kinds == "every":
        request.getfixturevalue("every_kind")
    keyframe_every = 2 if kinds == "keyframes" else 8

    natively = _series(run, tmp_path / "native", keyframe_every)
    headers = _headers(natively)
    deltas = sorted(name for name, header in headers.items() if "reference" in header)
    # Every delta coded in the plane (checkpoint-40's last, against checkpoint-50's container).
    assert sorted(name for name, delta in coded if delta) == deltas
    assert {name for name, _ in coded} == set(headers)
    if kinds == "every":
        assert _kinds(natively) == {XOR, ORDERED_DIFFERENCE, SCALED_DIFFERENCE, SCALED_SIGN_MAGNITUDE}
    if kinds == "keyframes":
        assert any("series" in header for header in headers.values())
    else:
        assert len(deltas) == 2 * len(STEPS)

    want = tree_digests(run / "all")
    api.decompress(natively, tmp_path / "back", device="cpu")
    assert tree_digests(tmp_path / "back") == want
    # Every delta restored in the plane, each against the next newer container, down its chain.
    assert sorted(attempts) == [(f"{name}.ckptz", "container", True) for name in deltas]

    with monkeypatch.context() as m:
        _python_pipeline(m)
        python = _series(run, tmp_path / "python", keyframe_every)
        api.decompress(natively, tmp_path / "back-python", device="cpu")
    assert _containers(natively) == _containers(python)
    assert tree_digests(tmp_path / "back-python") == want


def test_a_plain_reference_is_read_by_the_restore_plane(
    run: Path, tmp_path: Path, attempts: list[tuple[str, str, bool]]
) -> None:
    work = tmp_path / "run"
    shutil.copytree(run / "four", work)
    api.compress(work, in_place=True, series=True, device="cpu")
    api.decompress(work / "checkpoint-40", in_place=True, device="cpu")  # the newest, plain again
    for step, reference in ((30, "file"), (20, "container")):  # 20 reads 30, which reads 40
        attempts.clear()
        api.decompress(work / f"checkpoint-{step}", tmp_path / f"back-{step}", device="cpu")
        assert tree_digests(tmp_path / f"back-{step}") == tree_digests(run / "four" / f"checkpoint-{step}")
        names = sorted((Path(where).name, kind, ok) for where, kind, ok in attempts)
        assert names == [
            ("model.safetensors.ckptz", reference, True),
            ("optimizer.pt.ckptz", reference, True),
        ]


@pytest.mark.parametrize("step", [30, 20])
def test_a_damaged_reference_fails_as_the_python_pipeline_says(
    run: Path,
    tmp_path: Path,
    step: int,
    attempts: list[tuple[str, str, bool]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """checkpoint-40's container damaged where checkpoint-30's deltas read it, found
    restoring checkpoint-30 (its reference) or checkpoint-20 (down the chain)."""
    work = tmp_path / "run"
    shutil.copytree(run / "four", work)
    api.compress(work, in_place=True, series=True, device="cpu")
    reference = work / "checkpoint-40" / "optimizer.pt.ckptz"
    with open(reference, "rb") as f:
        index = read_index(f, str(reference))
    # The largest payload holds tensor bytes (moments) that the deltas read.
    chunk = index.chunks[int(index.chunks["size"].argmax())]
    data = bytearray(reference.read_bytes())
    data[int(chunk["offset"]) + int(chunk["size"]) // 2] ^= 0x40
    reference.write_bytes(bytes(data))
    restoring = work / f"checkpoint-{step}" / "optimizer.pt.ckptz"

    def failure() -> str:
        with pytest.raises(CorruptionError) as err:
            api.decompress(restoring, tmp_path / "out.pt", device="cpu")
        assert not (tmp_path / "out.pt").exists()
        return str(err.value)

    natively = failure()
    assert [ok for *_, ok in attempts] == [False]  # the native plane found it
    with monkeypatch.context() as m:
        _python_pipeline(m)
        assert failure() == natively
    assert "checkpoint-40" in natively


def test_a_reference_cut_short_while_coding_fails_as_the_python_pipeline_says(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plain reference shrinks after the delta is planned against it (another process
    truncating it): coding fails with the Python pipeline's message."""
    src = run / "four" / "checkpoint-30" / "optimizer.pt"

    def failure(name: str) -> str:
        (tmp_path / name).mkdir()
        ref = tmp_path / name / "reference.pt"
        shutil.copyfile(run / "four" / "checkpoint-40" / "optimizer.pt", ref)
        size = ref.stat().st_size

        def against(layout: FileLayout) -> FrameTransform | None:
            source = PlainReference(ref)
            theirs = layout_tensors(read_layout(ref, ref.name))
            spec = RefSpec(f"{ref.name}.ckptz", size, source.digest())
            change = series_delta.delta_for(layout, src, spec, source, theirs)
            os.truncate(ref, size // 2)
            return change

        with open(tmp_path / name / "optimizer.pt.ckptz", "wb") as out, pytest.raises(ContainerError) as err:
            compress_file(src, "optimizer.pt", out, CpuEngine(2), transform=against)
        return str(err.value)

    coded: list[bool] = []
    real = native_compress.code
    monkeypatch.setattr(native_compress, "code", lambda *a, **k: coded.append(True) or real(*a, **k))
    natively = failure("native")
    assert coded == [True]
    with monkeypatch.context() as m:
        _python_pipeline(m)
        assert failure("python") == natively
    assert "ended early" in natively


def test_a_delta_restores_in_file_order_in_the_plane(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streamed (as to stdout) a window of 64 KiB at a time, each frame decoded whole in every
    window it reaches: a delta, and one down a chain, come out byte for byte."""
    work = tmp_path / "run"
    shutil.copytree(run / "four", work)
    api.compress(work, in_place=True, series=True, device="cpu")
    monkeypatch.setattr(native_restore, "WINDOW", 64 << 10)
    windows: list[tuple[bool, bool]] = []
    real = native_restore.run_in_order

    def in_order(fd: int, path: str, decoder: Any, tables: native_restore.Plan, *args: Any) -> Digest | None:
        digest = real(fd, path, decoder, tables, *args)
        windows.append((getattr(tables, "delta", None) is not None, digest is not None))
        return digest

    monkeypatch.setattr(native_restore, "run_in_order", in_order)
    for step in (30, 20):
        for name in ("model.safetensors", "optimizer.pt"):
            streamed = io.BytesIO()
            with open(work / f"checkpoint-{step}" / f"{name}.ckptz", "rb") as c:
                restore(c, name, CpuEngine(2), streamed.write)
            assert streamed.getvalue() == (run / "four" / f"checkpoint-{step}" / name).read_bytes()
    assert windows == [(True, True)] * 4


def test_a_frame_that_cuts_a_word_fails_as_the_python_pipeline_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tensor coded in value as 4-byte words, in frames of 4099 bytes: its second frame
    starts inside a word, which both pipelines refuse in their own words."""
    rng = np.random.default_rng(0)
    save_file({"w": rng.integers(0, 255, 1 << 14, dtype=np.uint8)}, str(tmp_path / "ours.safetensors"))
    ref = tmp_path / "reference.safetensors"
    save_file({"w": rng.integers(0, 255, 1 << 14, dtype=np.uint8)}, str(ref))

    def against(layout: FileLayout) -> FrameTransform | None:
        source = PlainReference(ref)
        spec = RefSpec(f"{ref.name}.ckptz", ref.stat().st_size, source.digest())
        (ours,) = [i for i, s in enumerate(layout.segments) if s.kind == "tensor"]
        (theirs,) = [s for s in read_layout(ref, ref.name).segments if s.kind == "tensor"]
        starts = [s.offset for s in layout.segments] + [layout.size]
        pairs = [(ours, theirs.offset, ORDERED_DIFFERENCE, 0)]
        return series_delta.XorDelta(starts, pairs, spec, source, {ours: (4, 23)})

    def failure() -> str:
        engine = CpuEngine(2)
        engine.frame_size = engine.largest_frame = 4099
        with open(tmp_path / "ours.safetensors.ckptz", "wb") as out, pytest.raises(ContainerError) as err:
            compress_file(tmp_path / "ours.safetensors", "ours.safetensors", out, engine, transform=against)
        return str(err.value)

    coded: list[bool] = []
    real = native_compress.code
    monkeypatch.setattr(native_compress, "code", lambda *a, **k: coded.append(True) or real(*a, **k))
    natively = failure()
    assert coded == [True]
    with monkeypatch.context() as m:
        _python_pipeline(m)
        assert failure() == natively
    assert "cuts a word" in natively
