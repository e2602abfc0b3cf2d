"""Series delta kinds 2 and 3: words predicted as scale * reference invert exactly on every bit
pattern, the chooser finds the scale AdamW's decay sets, and series of real optimizer states
(NaN, infinities, subnormals, -0.0, bf16 moments, changed shapes) restore byte for byte; a
wrong scale is caught by the whole-file digest."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ckptz, tree_digests
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ckptz.container import FOOTER, Index, index_bytes, read_index
from ckptz.series.delta import Tensor, choose_pairs
from ckptz.series.kinds import (
    ORDERED_DIFFERENCE,
    SCALED,
    SCALED_DIFFERENCE,
    SCALED_SIGN_MAGNITUDE,
    apply,
    coded,
)

#: (word, mantissa bits) of float32, bfloat16 and float16.
FORMATS = [(4, 23), (2, 7), (2, 10)]
_SPECIALS = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1.1754942e-38, 3.4e38, -3.4e38], np.float32
)


def _scale(value: float) -> int:
    return int(np.float32(value).view(np.uint32))


@settings(max_examples=300, deadline=None)
@given(
    fmt=st.sampled_from(FORMATS),
    kind=st.sampled_from([ORDERED_DIFFERENCE, SCALED_DIFFERENCE, SCALED_SIGN_MAGNITUDE]),
    scale=st.integers(min_value=0x00800000, max_value=0x7F7FFFFF),  # every positive normal float32
    ours=st.binary(max_size=256),
    theirs=st.binary(max_size=256),
)
@example(fmt=(4, 23), kind=2, scale=0x7F7FFFFF, ours=_SPECIALS.tobytes(), theirs=_SPECIALS[::-1].tobytes())
@example(fmt=(4, 23), kind=3, scale=0x00800000, ours=_SPECIALS[::-1].tobytes(), theirs=_SPECIALS.tobytes())
@example(
    fmt=(2, 7), kind=2, scale=0x3FFFFFFF, ours=b"\x7f\x7f\x80\xff\x01\x00", theirs=b"\x7f\x7f\x7f\x7f\x01\x80"
)
def test_kinds_invert_on_any_bit_pattern(
    fmt: tuple[int, int], kind: int, scale: int, ours: bytes, theirs: bytes
) -> None:
    word, mant = fmt
    n = min(len(ours), len(theirs)) // word * word
    a = np.frombuffer(ours[:n], np.uint8)
    b = np.frombuffer(theirs[:n], np.uint8)
    stored = coded(a, b, kind, word, mant, scale)
    assert stored.size == n
    apply(stored, b, kind, word, mant, scale, False)
    assert stored.tobytes() == a.tobytes()


@pytest.mark.parametrize("scale", [0.9, 1 / 0.9**10, 1.0000001, 0.999**-30, 7.5e-20])
def test_a_word_that_is_the_float32_product_codes_to_zero(scale: float) -> None:
    """The prediction is IEEE float32 multiplication rounded to nearest-even (where normal)."""
    rng = np.random.default_rng(0)
    theirs = (rng.standard_normal(65536) * 1e-3).astype(np.float32)
    ours = theirs * np.float32(scale)
    normal = np.abs(ours) >= np.finfo(np.float32).tiny
    for kind in sorted(SCALED):
        stored = coded(ours.view(np.uint8), theirs.view(np.uint8), kind, 4, 23, _scale(scale)).view(np.uint32)
        assert not stored[normal].any()


def test_bf16_prediction_rounds_the_exact_product_to_nearest_even() -> None:
    rng = np.random.default_rng(1)
    theirs = torch.from_numpy(rng.standard_normal(65536).astype(np.float32)).to(torch.bfloat16)
    scale = np.float32(0.95**-7)
    # float64 holds the 8-bit by 24-bit product exactly; one rounding to bf16 follows.
    exact = theirs.to(torch.float64) * float(scale)
    ours = exact.to(torch.bfloat16)
    assert bool(
        (ours.to(torch.float64) == exact.to(torch.float32).to(torch.bfloat16).to(torch.float64)).all()
    )
    a, b = (t.view(torch.uint8).numpy() for t in (ours, theirs))
    stored = coded(a, b, SCALED_DIFFERENCE, 2, 7, _scale(float(scale)))
    assert not stored.any()


def _pair_one(
    ours: np.ndarray, theirs: np.ndarray, dtype: str = "float32"
) -> list[tuple[int, int, int, int]]:
    a, b = ours.tobytes(), theirs.tobytes()
    t = Tensor(0, 0, len(a), ("state", "0", "exp_avg_sq"), dtype)
    return choose_pairs([t], [t], lambda at, n: a[at : at + n], lambda at, n: b[at : at + n])


def test_chooser_finds_the_decay_of_moments_that_saw_no_gradient() -> None:
    """Rows that saw no gradient between two snapshots only decay: older = newer / beta^k."""
    rng = np.random.default_rng(2)
    newer = (rng.random(1 << 16) * 1e-6).astype(np.float32)
    older = (newer.astype(np.float64) / 0.999**50).astype(np.float32)
    # A third of the rows did see gradients: their values moved unpredictably.
    older[: 1 << 14] = (rng.random(1 << 14) * 1e-6).astype(np.float32)
    [(_, _, kind, scale)] = _pair_one(older, newer)
    assert kind in SCALED
    assert np.uint32(scale).view(np.float32) == pytest.approx(0.999**-50, rel=1e-6)


def test_chooser_scales_by_about_one_where_no_scale_predicts() -> None:
    rng = np.random.default_rng(3)
    v = (rng.random(1 << 15) * 1e-4).astype(np.float32)
    newer = (v * (1 + 1e-3 * rng.standard_normal(v.size))).astype(np.float32)
    [(_, _, kind, scale)] = _pair_one(v, newer)
    assert kind in SCALED
    assert np.uint32(scale).view(np.float32) == pytest.approx(1.0, abs=1e-4)


def test_chooser_keeps_xor_where_only_signs_flip() -> None:
    v = np.random.default_rng(5).standard_normal(1 << 14).astype(np.float32)
    [(_, _, kind, scale)] = _pair_one(-v, v)
    assert (kind, scale) == (0, 0)


# --------------------------------------------------------------------------- real optimizer runs


def _adamw_run(root: Path, *, dtype: torch.dtype = torch.float32, specials: bool = False) -> None:
    """``checkpoint-N/optimizer.pt`` and ``model.safetensors`` of a small model under AdamW with
    weight decay: tokens seen early and never again leave embedding rows (and their moments)
    that only decay. With ``specials``, moments also hold NaN, infinities, subnormals and -0.0;
    the last checkpoint adds a tensor whose shape changed (same key, other length)."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(512, 64), torch.nn.Linear(64, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    done = 0
    for step in (10, 20, 30, 40):
        while done < step:
            vocab = 512 if done < 5 else 128  # most rows get no gradient after step 5
            tokens = torch.randint(0, vocab, (32, 8))
            opt.zero_grad()
            model(tokens).pow(2).mean().backward()
            opt.step()
            done += 1
        folder = root / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        state = opt.state_dict()
        moments = {
            i: {k: v.clone().to(dtype) if v.is_floating_point() and v.dim() else v for k, v in s.items()}
            for i, s in state["state"].items()
        }
        if specials:
            flat = moments[0]["exp_avg"].view(-1)
            flat[:11] = torch.tensor(_SPECIALS.tolist(), dtype=torch.float32).to(dtype)
            moments[0]["exp_avg_sq"].view(-1)[100:103] = torch.tensor([float("nan"), 1e-45, -0.0]).to(dtype)
            moments["changed"] = {"exp_avg": torch.ones(1000 + step, dtype=dtype)}
        torch.save({"state": moments, "param_groups": state["param_groups"]}, folder / "optimizer.pt")
        save_file(
            {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()},
            str(folder / "model.safetensors"),
        )


def _kinds(out: Path) -> set[int]:
    kinds = set()
    for path in out.rglob("*.ckptz"):
        with open(path, "rb") as f:
            ref = read_index(f, str(path)).header.get("reference")
        kinds |= {p[2] if len(p) > 2 else 0 for p in (ref or {}).get("pairs", [])}
    return kinds


def _round_trip(run: Path, tmp_path: Path) -> set[int]:
    before = tree_digests(run)
    out, back = tmp_path / "packed", tmp_path / "back"
    r = ckptz("compress", "--series", str(run), "-o", f"{out}/", "-q", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    r = ckptz("decompress", str(out), "-o", f"{back}/", "-q", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert tree_digests(back) == before
    assert tree_digests(run) == before
    return _kinds(out)


@pytest.fixture(scope="module")
def adamw_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("adamw") / "run"
    _adamw_run(root)
    return root


def test_adamw_series_uses_scaled_kinds_and_restores_byte_for_byte(adamw_run: Path, tmp_path: Path) -> None:
    assert SCALED & _round_trip(adamw_run, tmp_path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_moments_with_special_values_and_changed_shapes_restore_byte_for_byte(
    dtype: torch.dtype, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    _adamw_run(run, dtype=dtype, specials=True)
    assert _round_trip(run, tmp_path / "trip")


def _rewrite_pairs(path: Path, edit: object) -> None:
    """Rewrite a container's header with each pair replaced by ``edit(pair)`` (the index's own
    checksum recomputed, so only the series checks can notice)."""
    with open(path, "rb") as f:
        index = read_index(f, str(path))
    raw = path.read_bytes()
    offset = struct.unpack_from("<Q", raw, len(raw) - FOOTER.size)[0]
    header = json.loads(json.dumps(index.header))
    header["reference"]["pairs"] = [edit(p) for p in header["reference"]["pairs"]]  # type: ignore[operator]
    new = Index(header, index.streams, index.segments, index.frames, index.chunks)
    path.write_bytes(raw[:offset] + index_bytes(new, offset))


def _scaled_container(adamw_run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "packed"
    r = ckptz("compress", "--series", str(adamw_run), "-o", f"{out}/", "-q", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    for path in sorted(out.rglob("optimizer.pt.ckptz")):
        with open(path, "rb") as f:
            ref = read_index(f, str(path)).header.get("reference")
        if any(len(p) == 4 for p in (ref or {}).get("pairs", [])):
            return path
    raise AssertionError("no container with a scaled pair")


def test_a_wrong_scale_fails_the_digest_and_writes_nothing(adamw_run: Path, tmp_path: Path) -> None:
    """A header whose scale is valid but not the one coded: the frames decode, the restored
    bytes differ, and the whole-file digest says so before any file is left behind."""
    victim = _scaled_container(adamw_run, tmp_path)
    _rewrite_pairs(victim, lambda p: [*p[:3], p[3] + 1] if len(p) == 4 else p)
    dest = tmp_path / "one.pt"
    r = ckptz("decompress", str(victim), "-o", str(dest), "--device", "cpu")
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and r.stderr.strip()
    assert not dest.exists()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: [*p[:3], 0] if len(p) == 4 else p, "no positive normal float32"),
        (lambda p: [*p[:3], 0xFF800000] if len(p) == 4 else p, "no positive normal float32"),
        (lambda p: p[:3] if len(p) == 4 else p, "reference pairs unreadable"),
        (lambda p: [*p[:2], 1, p[3]] if len(p) == 4 else p, "reference pairs unreadable"),
    ],
    ids=["zero scale", "negative infinity", "scale missing", "scale on kind 1"],
)
def test_a_malformed_scaled_pair_fails_in_one_line(
    adamw_run: Path, tmp_path: Path, edit: object, message: str
) -> None:
    victim = _scaled_container(adamw_run, tmp_path)
    _rewrite_pairs(victim, edit)
    dest = tmp_path / "one.pt"
    r = ckptz("decompress", str(victim), "-o", str(dest), "--device", "cpu")
    assert r.returncode != 0
    assert message in r.stderr and "Traceback" not in r.stderr
    assert not dest.exists()


def test_a_flipped_byte_in_a_scaled_delta_is_detected(adamw_run: Path, tmp_path: Path) -> None:
    victim = _scaled_container(adamw_run, tmp_path)
    blob = bytearray(victim.read_bytes())
    blob[64] ^= 0x04  # inside the first chunk's payload
    victim.write_bytes(bytes(blob))
    dest = tmp_path / "one.pt"
    r = ckptz("decompress", str(victim), "-o", str(dest), "--device", "cpu")
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert not dest.exists()


def test_a_scale_that_fits_only_the_sample_still_restores_byte_for_byte(tmp_path: Path) -> None:
    """The scale is chosen on a few sampled pieces; where the rest of the tensor follows another
    beta, or none, it codes larger but restores the same bytes."""
    from safetensors.numpy import save_file

    from ckptz.series.delta import _PIECE, _PIECES

    rng = np.random.default_rng(4)
    n = 1 << 18
    newer = (rng.random(n) * 1e-6).astype(np.float32)
    older = (rng.random(n) * 1e-6).astype(np.float32)  # unrelated, except in the sampled pieces
    step = (n * 4 - _PIECE) // (_PIECES - 1) // 4
    for i in range(_PIECES):
        at = slice(i * step, i * step + _PIECE // 4)
        older[at] = (newer[at].astype(np.float64) / 0.95**20).astype(np.float32)
    older[-1000:] = (newer[-1000:].astype(np.float64) / 0.9**20).astype(np.float32)  # another beta
    run = tmp_path / "run"
    for step_no, tensor in ((10, older), (20, newer)):
        (run / f"checkpoint-{step_no}").mkdir(parents=True)
        save_file({"state.0.exp_avg_sq": tensor}, str(run / f"checkpoint-{step_no}" / "moments.safetensors"))
    assert SCALED & _round_trip(run, tmp_path / "trip")
