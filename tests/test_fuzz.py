"""Damaged containers and checkpoints: the only outcomes are a byte-exact restore or a CkptzError.

* Every single-bit flip of a small container, exhaustively, is caught by restore (what
  ``verify`` and ``decompress`` run); a random sample of flips covers a larger container.
* Hypothesis mutates containers (bit flips, truncations, insertions, deletions, overwrites)
  and checkpoint files (which are then compressed and restored): never another exception,
  never a wrong byte, never a hang (bounded examples, a deadline).

Set ``CKPTZ_FUZZ_REPORT=path`` to get the figures quoted in RELIABILITY.md as JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptz.engines.cpu import CpuEngine
from ckptz.errors import CkptzError
from ckptz.pipeline import compress_file, restore

FUZZ = settings(
    max_examples=int(os.environ.get("CKPTZ_FUZZ_EXAMPLES", "150")),
    deadline=timedelta(seconds=10),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
_FIGURES: Counter[str] = Counter()


@pytest.fixture(scope="module")
def engine() -> Iterator[CpuEngine]:
    with CpuEngine(1) as e:
        yield e


def _safetensors(path: Path) -> Path:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(1)
    save_file(
        {
            "w": (rng.standard_normal(40) * 0.1).astype(np.float32),
            "mask": np.zeros(16, np.uint8),
            "ids": np.arange(5, dtype=np.int64),
        },
        str(path),
    )
    return path


def _torch_file(path: Path, legacy: bool = False) -> Path:
    import torch

    torch.manual_seed(2)
    obj = {"state": {0: {"exp_avg": torch.randn(64), "step": torch.tensor(3.0)}}, "lr": 0.1}
    torch.save(obj, path, _use_new_zipfile_serialization=not legacy)
    return path


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fuzz-src")
    return {
        "safetensors": _safetensors(root / "m.safetensors"),
        "torch": _torch_file(root / "opt.pt"),
        "legacy": _torch_file(root / "old.pt", legacy=True),
    }


def _compress(src: Path, out: Path, engine: CpuEngine) -> bytes:
    with open(out, "wb") as f:
        compress_file(src, src.name, f, engine)
    return out.read_bytes()


def _outcome(path: Path, engine: CpuEngine, want: str) -> str:
    """Restore ``path``; 'restored' if byte-exact, else the CkptzError class; anything else fails."""
    sink = hashlib.sha256()
    try:
        with open(path, "rb", buffering=0) as f:
            restore(f, str(path), engine, sink.update)
    except CkptzError as exc:
        assert str(path) in str(exc), f"error does not name the file: {exc}"
        return type(exc).__name__
    assert sink.hexdigest() == want, "restore succeeded with wrong bytes"
    return "restored"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _flip_all(container: Path, engine: CpuEngine, bits: list[int]) -> Counter[str]:
    """Flip each bit in place (then flip it back) and restore; count the outcomes."""
    data = container.read_bytes()
    outcomes: Counter[str] = Counter()
    fd = os.open(container, os.O_RDWR)
    try:
        for bit in bits:
            i = bit // 8
            os.pwrite(fd, bytes([data[i] ^ (1 << (bit % 8))]), i)
            try:
                with open(container, "rb", buffering=0) as f:
                    restore(f, str(container), engine, lambda _v: None)
                outcomes["missed"] += 1
            except CkptzError as exc:
                outcomes[type(exc).__name__] += 1
            finally:
                os.pwrite(fd, data[i : i + 1], i)
    finally:
        os.close(fd)
    return outcomes


def test_every_single_bit_flip_is_caught(sources: dict[str, Path], tmp_path: Path, engine: CpuEngine) -> None:
    """Exhaustive over every bit of a small container: header, payloads, padding, index, footer."""
    container = tmp_path / "m.safetensors.ckptz"
    data = _compress(sources["safetensors"], container, engine)
    outcomes = _flip_all(container, engine, list(range(len(data) * 8)))
    _FIGURES["exhaustive_bits"] += len(data) * 8
    _FIGURES["exhaustive_container_bytes"] = len(data)
    _FIGURES.update({f"exhaustive_{k}": v for k, v in outcomes.items()})
    assert outcomes["missed"] == 0, outcomes
    assert sum(outcomes.values()) == len(data) * 8


@pytest.mark.parametrize("kind", ["torch", "legacy"])
def test_sampled_bit_flips_are_caught(
    kind: str, sources: dict[str, Path], tmp_path: Path, engine: CpuEngine
) -> None:
    container = tmp_path / "c.ckptz"
    data = _compress(sources[kind], container, engine)
    rng = random.Random(7)
    bits = rng.sample(range(len(data) * 8), min(1500, len(data) * 8))
    outcomes = _flip_all(container, engine, bits)
    _FIGURES["sampled_bits"] += len(bits)
    _FIGURES.update({f"sampled_{k}": v for k, v in outcomes.items()})
    assert outcomes["missed"] == 0, outcomes


def test_every_truncation_is_caught(sources: dict[str, Path], tmp_path: Path, engine: CpuEngine) -> None:
    data = _compress(sources["torch"], tmp_path / "full.ckptz", engine)
    cut = tmp_path / "cut.ckptz"
    for n in range(len(data)):
        cut.write_bytes(data[:n])
        with pytest.raises(CkptzError, match=r"cut\.ckptz"), open(cut, "rb", buffering=0) as f:
            restore(f, str(cut), engine, lambda _v: None)
    _FIGURES["truncations"] += len(data)


_MUTATION = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 30), st.integers(0, 7)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 30), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 30), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 30), st.integers(1, 64)),
    st.tuples(st.just("overwrite"), st.integers(0, 1 << 30), st.binary(min_size=1, max_size=32)),
)


def _mutate(data: bytes, mutations: list[tuple[str, int, object]]) -> bytes:
    buf = bytearray(data)
    for op, where, arg in mutations:
        at = where % (len(buf) + 1)
        if op == "flip" and buf:
            buf[at % len(buf)] ^= 1 << int(arg)  # type: ignore[call-overload]
        elif op == "truncate":
            del buf[at:]
        elif op == "insert":
            buf[at:at] = arg  # type: ignore[assignment]
        elif op == "delete":
            del buf[at : at + int(arg)]  # type: ignore[call-overload]
        elif op == "overwrite":
            buf[at : at + len(arg)] = arg  # type: ignore[arg-type]
    return bytes(buf)


@pytest.fixture(scope="module")
def containers(
    sources: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, engine: CpuEngine
) -> dict[str, tuple[bytes, str]]:
    root = tmp_path_factory.mktemp("fuzz-ckptz")
    return {k: (_compress(p, root / f"{k}.ckptz", engine), _sha(p)) for k, p in sources.items()}


@FUZZ
@given(
    kind=st.sampled_from(["safetensors", "torch", "legacy"]),
    mutations=st.lists(_MUTATION, min_size=1, max_size=4),
)
def test_mutated_containers(
    kind: str,
    mutations: list[tuple[str, int, object]],
    containers: dict[str, tuple[bytes, str]],
    tmp_path: Path,
    engine: CpuEngine,
) -> None:
    data, want = containers[kind]
    mutated = _mutate(data, mutations)
    path = tmp_path / "x.ckptz"
    path.write_bytes(mutated)
    outcome = _outcome(path, engine, want)
    _FIGURES["container_mutations"] += 1
    _FIGURES[f"container_mutations_{outcome}"] += 1
    if mutated != data:
        assert outcome != "restored", "a changed container restored without complaint"


@FUZZ
@given(
    kind=st.sampled_from(["safetensors", "torch", "legacy"]),
    mutations=st.lists(_MUTATION, min_size=1, max_size=4),
)
def test_mutated_checkpoints_round_trip(
    kind: str,
    mutations: list[tuple[str, int, object]],
    sources: dict[str, Path],
    tmp_path: Path,
    engine: CpuEngine,
) -> None:
    """Whatever a damaged checkpoint holds, compressing it restores it byte-exact."""
    src = tmp_path / sources[kind].name
    src.write_bytes(_mutate(sources[kind].read_bytes(), mutations))
    out = tmp_path / "x.ckptz"
    try:
        _compress(src, out, engine)
    except CkptzError:
        _FIGURES["checkpoint_mutations_refused"] += 1
        return
    assert _outcome(out, engine, _sha(src)) == "restored"
    _FIGURES["checkpoint_mutations_restored"] += 1


def test_zz_report() -> None:
    """Writes the figures of this module (runs last, by name)."""
    report = os.environ.get("CKPTZ_FUZZ_REPORT")
    if report:
        Path(report).write_text(json.dumps(dict(sorted(_FIGURES.items())), indent=2))
