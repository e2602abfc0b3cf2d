"""Row-predicted signs (bitstream 9, ``sign2d``): exact round trips in C against the spec's
own decoder, the gain on real Adam first moments whose embedding rows see no tokens,
declined on noise, damaged payloads refused within bounds, and the CLI taking it at the
default level as at level 19."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
import training
from conftest import ckptz
from damage import damage, decodes_in_bounds
from format_reader import FormatViolation, _sign2d
from hypothesis import given, settings
from hypothesis import strategies as st
from levels import round_trip_at
from test_order2d import _container_of

from ckptz.codecs import sign2d
from ckptz.codecs.cpu import ZstdCodec
from ckptz.codecs.frames import EncodeOptions, decode_frame, encode_frame
from ckptz.codecs.native import native
from ckptz.codecs.planes import split
from ckptz.codecs.sign2d import Sign2dCodec
from ckptz.codecs.table import RAW, SIGN2D, ZSTD
from ckptz.dtypes import DTYPES
from ckptz.errors import CodecError

FLOAT32 = DTYPES["float32"]


@cache
def first_moments_of_a_short_training_run() -> dict[str, torch.Tensor]:
    """AdamW's ``exp_avg`` of a small GPT-2 after 30 real steps on a quarter of its
    vocabulary, by parameter name: the embedding rows of the tokens never seen move together."""
    return training.moments(*training.short_run(training.repeated_quarter), "exp_avg")


def _stream(moments: dict[str, torch.Tensor]) -> np.ndarray:
    return np.concatenate([t.reshape(-1).view(torch.uint8).numpy() for t in moments.values()])


def _signed_bytes(rows: int, width: int, flips: float, seed: int) -> np.ndarray:
    """Bytes whose bit 0 is a row's sign XOR a column's (``flips`` of them flipped) and whose
    bits 1-7 are noise."""
    rng = np.random.default_rng(seed)
    signs = (rng.integers(0, 2, rows)[:, None] ^ rng.integers(0, 2, width)[None, :]).ravel()
    signs ^= (rng.random(signs.size) < flips).astype(signs.dtype)
    return ((rng.integers(0, 128, signs.size) << 1) | signs).astype(np.uint8)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 200), st.integers(1, 150), st.floats(0, 0.5), st.integers(0, 99), st.integers(1, 300))
def test_payloads_decode_exactly_in_c_and_by_the_spec(
    rows: int, width: int, flips: float, seed: int, coded_width: int
) -> None:
    """Any plane (any length, a partial last packed byte) and row width: the C decoder and
    the reader written from FORMAT.md alone both give the plane back."""
    plane = _signed_bytes(rows, width, flips, seed)
    payload = native.sign2d_encode(plane, coded_width)
    assert payload is not None and int.from_bytes(payload[:4], "little") == coded_width
    out = np.empty(plane.size, np.uint8)
    assert native.sign2d_decode(payload, out) is True and np.array_equal(out, plane)
    assert _sign2d(payload, plane.size) == plane.tobytes()


def test_first_moments_of_unseen_embedding_rows_take_it() -> None:
    """On real first moments the encoder finds the rows itself, and the lowest plane codes
    well below both its raw size and zstd's best."""
    plane = np.ascontiguousarray(split(_stream(first_moments_of_a_short_training_run()), FLOAT32)[0])
    signed = sign2d.encode(plane)
    assert signed is not None
    assert len(signed) < 0.975 * min(plane.size, len(ZstdCodec(19).encode(plane)))
    assert np.array_equal(Sign2dCodec().decode(signed, plane.size), plane)


def test_noise_is_declined() -> None:
    """Signs with no row structure: no width predicts them, so coders leave sign2d out; the
    codec itself still codes such a plane (rows as long as the plane: the left sign)."""
    plane = np.random.default_rng(4).integers(0, 256, 1 << 18, dtype=np.uint8)
    assert sign2d.encode(plane) is None
    assert np.array_equal(Sign2dCodec().decode(Sign2dCodec().encode(plane), plane.size), plane)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_damaged_payloads_are_refused_within_bounds(data: st.DataObject) -> None:
    """Flipped bytes, cuts and extensions: the C decoder stays in its buffers and returns a
    bool; the codec raises CodecError naming sign2d or returns the size asked; a zero width,
    a cut or an extension is damage to the spec's reader too."""
    plane = _signed_bytes(data.draw(st.sampled_from([1, 30, 700])), 72, 0.05, data.draw(st.integers(0, 99)))
    how, payload = damage(
        data, native.sign2d_encode(plane, 72), ["width", "header", "flip", "cut", "extend"], header=12
    )
    result = decodes_in_bounds(native.sign2d_decode, payload, plane.size)
    if how in ("width", "cut", "extend"):
        assert result is False
        with pytest.raises(FormatViolation):
            _sign2d(bytes(payload), plane.size)
    try:
        back = Sign2dCodec().decode(bytes(payload), plane.size)
    except CodecError as exc:
        assert "sign2d" in str(exc)
        return
    assert back.size == plane.size


def test_frames_of_first_moments_choose_it_and_decode_natively_and_in_python() -> None:
    """With context coding (level 10 up) a frame of real first moments codes its lowest
    plane sign2d, and without it does not; the one native frame call and the Python path
    both restore it, and a damaged payload is declined by the first and raises CodecError in
    the second."""
    raw = _stream(first_moments_of_a_short_training_run())
    chunks = encode_frame(raw, FLOAT32, EncodeOptions(context_exponents=True))
    assert chunks[0].codec == SIGN2D.id
    assert SIGN2D.id not in [c.codec for c in encode_frame(raw, FLOAT32, EncodeOptions())]
    # Planes that zstd matched are libzstd's to decode: stored here, so the one native call
    # takes the frame.
    planes = split(raw, FLOAT32)
    frame = [
        (c.codec, c.raw_size, c.payload) if c.codec != ZSTD.id else (RAW.id, c.raw_size, planes[k].tobytes())
        for k, c in enumerate(chunks)
    ]
    out, room = np.empty(raw.size, np.uint8), np.empty(raw.size, np.uint8)
    assert native.decode_frame(frame, out, room, 4, True) is True and np.array_equal(out, raw)
    assert np.array_equal(decode_frame(frame, FLOAT32, None), raw)
    damaged = [(SIGN2D.id, raw.size // 4, frame[0][2][:-3]), *frame[1:]]
    assert native.decode_frame(damaged, out, room, 4, True) is False
    with pytest.raises(CodecError, match="sign2d"):
        decode_frame(damaged, FLOAT32, np.empty(raw.size, np.uint8))


def test_the_default_level_codes_first_moments_smaller_with_row_predicted_signs(tmp_path: Path) -> None:
    """`ckptz compress` of real first moments, at the default level as at level 19, writes a
    sign2d plane that codes below the plane's raw bytes (what the default stored before) by
    more than 2%, and restores byte for byte."""
    from safetensors.torch import save_file

    moments = first_moments_of_a_short_training_run()
    src = tmp_path / "moments.safetensors"
    save_file({f"optimizer.state.{n}.exp_avg": t for n, t in moments.items()}, str(src))
    sizes = {}
    for level in ("default", "19"):
        out, chunks = round_trip_at(level, src, tmp_path)
        sizes[level] = out.stat().st_size
        signed = chunks[chunks["codec"] == SIGN2D.id]
        assert len(signed) and set(signed["plane"].tolist()) == {0}, level
        assert (signed["size"] < 0.98 * signed["raw_size"]).all(), signed
    assert sizes["default"] < sizes["19"] * 1.002, sizes


@pytest.mark.parametrize("damage", ["none", "cut", "zero width", "wrong frame size"])
def test_cli_restores_a_sign2d_container_or_says_it_is_damaged(tmp_path: Path, damage: str) -> None:
    """A container holding a sign2d chunk restores byte for byte; one whose sign2d payload is
    cut short, has a zero row width or a residual frame size that does not add up (checksums
    made to match) fails with one line on stderr, no traceback, and leaves no output."""
    plane = _signed_bytes(300, 72, 0.05, 7)
    payload = bytearray(native.sign2d_encode(plane, 72))
    if damage == "cut":
        del payload[-40:]
    elif damage == "zero width":
        payload[:4] = bytes(4)
    elif damage == "wrong frame size":
        payload[4:8] = (int.from_bytes(payload[4:8], "little") + 1).to_bytes(4, "little")
    src = tmp_path / "plane.ckptz"
    _container_of(src, plane, bytes(payload), SIGN2D)
    out = tmp_path / "plane.bin"
    done = ckptz("decompress", str(src), "-o", str(out), "--device", "cpu")
    if damage == "none":
        assert done.returncode == 0, done.stderr
        assert out.read_bytes() == plane.tobytes()
        return
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "sign2d" in done.stderr and "damaged" in done.stderr, done.stderr
    assert not out.exists()
