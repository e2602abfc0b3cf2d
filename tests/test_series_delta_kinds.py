"""Series delta kinds: the ordered difference inverts exactly, the chooser keeps the smaller
kind, and a series coded with it restores byte for byte through the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import ckptz, tree_digests
from hypothesis import example, given, settings
from hypothesis import strategies as st
from series_run import make_run

from ckptz.container import read_index
from ckptz.series.delta import (
    ORDERED_DIFFERENCE,
    XOR,
    Tensor,
    choose_pairs,
    delta_costs,
    diff_backward,
    diff_forward,
)
from ckptz.series.kinds import SCALED

_SPECIALS = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 3.4e38, -3.4e38], np.float32
)


@settings(max_examples=300, deadline=None)
@given(word=st.sampled_from([2, 4]), ours=st.binary(min_size=0, max_size=256), theirs=st.binary(max_size=256))
@example(word=4, ours=_SPECIALS.tobytes(), theirs=_SPECIALS[::-1].tobytes())
@example(
    word=4, ours=np.array([np.nan], np.float32).view(np.uint32).__or__(7).tobytes(), theirs=b"\0\0\x80\x80"
)
@example(word=2, ours=b"\x00\x80\x80\x7f\xc0\x7f\x80\xff", theirs=b"\xff\xff\x00\x00\x01\x80\x00\x80")
def test_ordered_difference_inverts_on_any_bit_pattern(word: int, ours: bytes, theirs: bytes) -> None:
    n = min(len(ours), len(theirs)) // word * word
    a = np.frombuffer(ours[:n], np.uint8)
    b = np.frombuffer(theirs[:n], np.uint8)
    coded = diff_forward(a.copy(), b, word)
    assert coded.dtype == np.uint8 and coded.size == n
    assert diff_backward(coded, b, word).tobytes() == a.tobytes()


def test_ordered_difference_of_nearby_floats_is_small_across_signs() -> None:
    x = np.linspace(-1, 1, 4096, dtype=np.float32)
    y = np.nextafter(x, np.float32(2))  # one ulp up, through -0.0/+0.0
    coded = diff_forward(y.view(np.uint8), x.view(np.uint8), 4).view(np.uint32)
    assert int(coded.max()) <= 4  # zigzag of a step of at most two ordered units


def _pair_one(ours: np.ndarray, theirs: np.ndarray) -> list[tuple[int, int, int, int]]:
    a, b = ours.tobytes(), theirs.tobytes()
    t = Tensor(0, 0, len(a), ("w",), "float32")
    return choose_pairs([t], [t], lambda at, n: a[at : at + n], lambda at, n: b[at : at + n])


def test_chooser_picks_the_kind_that_codes_smaller() -> None:
    rng = np.random.default_rng(0)
    v = (rng.random(16384, dtype=np.float32) * 1e-4).astype(np.float32)
    # Second moments: the newer snapshot a little larger in value, so XOR flips many mantissa bits.
    newer = (v * np.float32(0.999) + np.float32(1e-7) * rng.random(16384, dtype=np.float32)).astype(
        np.float32
    )
    sign_flip = -v  # XOR is one constant bit; the ordered difference is as wide as the values
    for ours, theirs, expect in ((v, newer, ORDERED_DIFFERENCE), (sign_flip, v, XOR)):
        costs = delta_costs(ours.tobytes(), theirs.tobytes(), 4, True)
        assert min((c, k) for k, c in costs.items() if k >= 0)[1] == expect
        [(_, _, kind, _)] = _pair_one(ours, theirs)
        # In value, the kinds that store the words grouped by exponent win ties with kind 1.
        assert kind == XOR if expect == XOR else kind in (ORDERED_DIFFERENCE, *SCALED)


def test_chooser_leaves_unrelated_tensors_plain() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 16384)).astype(np.float32)
    assert _pair_one(a, b) == []


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("kinds") / "run"
    make_run(root)
    return root


def test_series_with_ordered_differences_restores_byte_for_byte(run: Path, tmp_path: Path) -> None:
    before = tree_digests(run)
    out = tmp_path / "packed"
    r = ckptz("compress", "--series", str(run), "-o", f"{out}/", "-q", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    kinds = set()
    for path in out.rglob("*.ckptz"):
        with open(path, "rb") as f:
            ref = read_index(f, str(path)).header.get("reference")
        kinds |= {p[2] if len(p) > 2 else XOR for p in (ref or {}).get("pairs", [])}
    # AdamW moments and weights of a real run are predicted in value: a kind in value is used.
    assert kinds & {ORDERED_DIFFERENCE, *SCALED}
    back = tmp_path / "back"
    r = ckptz("decompress", str(out), "-o", f"{back}/", "-q", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert tree_digests(back) == before
    assert tree_digests(run) == before


def test_unknown_delta_kind_fails_cleanly(run: Path, tmp_path: Path) -> None:
    """A reader meeting a kind it does not know writes nothing and says so in one line."""
    out = tmp_path / "packed"
    shutil.copytree(run, tmp_path / "src")
    assert (
        ckptz(
            "compress", "--series", str(tmp_path / "src"), "-o", f"{out}/", "-q", "--device", "cpu"
        ).returncode
        == 0
    )
    victim = next(
        p for p in sorted(out.rglob("*.ckptz")) if "checkpoint-10" in str(p) and "optimizer" in p.name
    )
    _rewrite_kinds(victim, 7)
    dest = tmp_path / "one.pt"
    r = ckptz("decompress", str(victim), "-o", str(dest), "--device", "cpu")
    assert r.returncode != 0
    assert "delta kind 7" in r.stderr and "Traceback" not in r.stderr
    assert not dest.exists()


def _rewrite_kinds(path: Path, kind: int) -> None:
    """Rewrite a container's header with every pair's delta kind set to ``kind``."""
    from ckptz.container import Index, index_bytes

    with open(path, "rb") as f:
        index = read_index(f, str(path))
    data_end = path.stat().st_size
    raw = path.read_bytes()
    # The data area ends where the index blob starts: the footer's first field.
    import struct

    from ckptz.container import FOOTER

    offset = struct.unpack_from("<Q", raw, data_end - FOOTER.size)[0]
    header = json.loads(json.dumps(index.header))
    header["reference"]["pairs"] = [[p[0], p[1], kind] for p in header["reference"]["pairs"]]
    new = Index(header, index.streams, index.segments, index.frames, index.chunks)
    path.write_bytes(raw[:offset] + index_bytes(new, offset))
