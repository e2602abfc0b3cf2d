"""Row-predicted exponents (bitstream 8, ``huff2d``): exact round trips in C against the
spec's own decoder, the gain on real Adam second moments, declined where rows do not
predict, damaged payloads refused within bounds, and the CLI taking it at the default level
as at level 19."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ckptz
from damage import damage, decodes_in_bounds
from format_reader import FormatViolation, _huff2d
from hypothesis import given, settings
from hypothesis import strategies as st
from levels import round_trip_at
from test_cli import second_moments_of_a_short_training_run

from ckptz.codecs import order1, order2d
from ckptz.codecs.cpu import HuffmanZstd
from ckptz.codecs.frames import EncodeOptions, decode_frame, encode_frame
from ckptz.codecs.native import native
from ckptz.codecs.order2d import Order2dCodec
from ckptz.codecs.planes import split
from ckptz.codecs.table import HUFF2D, RAW, ZSTD, Bitstream
from ckptz.dtypes import DTYPES
from ckptz.errors import CodecError

FLOAT32 = DTYPES["float32"]


@pytest.fixture(scope="module")
def moments() -> dict[str, torch.Tensor]:
    """Real AdamW second moments of a small GPT-2 (30 steps), by parameter name."""
    return second_moments_of_a_short_training_run()


def _exponents(tensors: list[torch.Tensor]) -> np.ndarray:
    raw = np.concatenate([t.contiguous().reshape(-1).view(torch.uint8).numpy() for t in tensors])
    return np.ascontiguousarray(split(raw, FLOAT32)[-1])


def _grid(rows: int, width: int, seed: int) -> np.ndarray:
    """Exponent-like bytes: a row term plus a column term plus noise, clipped to a byte (so
    predictions clamp at both ends)."""
    rng = np.random.default_rng(seed)
    terms = rng.integers(0, 200, rows)[:, None] + rng.integers(0, 80, width)[None, :]
    return np.clip(terms + rng.integers(-2, 3, (rows, width)), 0, 255).astype(np.uint8).ravel()


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 300),
    st.integers(1, 200),
    st.integers(0, 99),
    st.sampled_from([1, 2, 4, 8]),
    st.integers(1, 400),
)
def test_payloads_decode_exactly_in_c_and_by_the_spec(
    rows: int, width: int, seed: int, segments: int, coded_width: int
) -> None:
    """Any plane, segment count and row width (wider than a segment or not): the C decoder
    and the reader written from FORMAT.md alone both give the plane back."""
    plane = _grid(rows, width, seed)
    payload = native.order2d_encode(plane, segments, coded_width)
    assert payload is not None and int.from_bytes(payload[:4], "little") == coded_width
    out = np.empty(plane.size, np.uint8)
    assert native.order2d_decode(payload, out) is True and np.array_equal(out, plane)
    assert _huff2d(payload, plane.size) == plane.tobytes()


def test_second_moments_take_row_prediction_and_save_over_order1(moments: dict[str, torch.Tensor]) -> None:
    """On real second moments the encoder finds the rows itself and beats huff1 by far more
    than the margin a slower decoder must save."""
    plane = _exponents(list(moments.values()))
    rowed, ordered = order2d.encode(plane), order1.encode(plane)
    assert rowed is not None and ordered is not None
    assert len(rowed) < 0.93 * len(ordered)
    assert np.array_equal(Order2dCodec().decode(rowed, plane.size), plane)


def test_planes_without_rows_are_declined() -> None:
    """i.i.d. exponents (dense weights) and rows of one scale with no column term (where the
    row above predicts nothing): no width pays, so coders leave huff2d out untried."""
    rng = np.random.default_rng(5)
    weights = (rng.standard_normal(1 << 18) * 0.02).astype(np.float32)
    assert order2d.encode(split(weights.view(np.uint8), FLOAT32)[-1]) is None
    scales = np.repeat(np.exp(rng.uniform(-14, -4, 2048)), 128).astype(np.float32)
    scaled = (np.abs(rng.standard_normal(2048 * 128)).astype(np.float32) * scales).view(np.uint8)
    assert order2d.encode(split(scaled, FLOAT32)[-1]) is None
    # The codec itself still codes such a plane (rows as long as the plane: the left byte).
    plane = split(weights.view(np.uint8), FLOAT32)[-1]
    assert np.array_equal(Order2dCodec().decode(Order2dCodec().encode(plane), plane.size), plane)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_damaged_payloads_are_refused_within_bounds(data: st.DataObject) -> None:
    """Flipped bytes (width, header, frames), cuts and extensions: the C decoder stays in its
    buffers and returns a bool; the codec raises CodecError naming huff2d or returns the
    size asked; a zero width is damage."""
    plane = _grid(data.draw(st.sampled_from([1, 40, 800])), 96, data.draw(st.integers(0, 99)))
    how, payload = damage(
        data,
        native.order2d_encode(plane, data.draw(st.sampled_from([1, 4, 8])), 96),
        ["width", "header", "flip", "cut", "extend"],
        header=200,
    )
    result = decodes_in_bounds(native.order2d_decode, payload, plane.size)
    if how in ("width", "cut", "extend"):
        assert result is False
        with pytest.raises(FormatViolation):
            _huff2d(bytes(payload), plane.size)
    try:
        back = Order2dCodec().decode(bytes(payload), plane.size)
    except CodecError as exc:
        assert "huff2d" in str(exc)
        return
    assert back.size == plane.size


def test_frames_of_second_moments_choose_it_and_decode_natively_and_in_python(
    moments: dict[str, torch.Tensor],
) -> None:
    """With context exponents (level 10 up) a frame of real second moments codes its
    exponent plane huff2d; the one native frame call and the Python path both restore it,
    and a damaged payload is declined by the first and raises CodecError in the second."""
    raw = np.concatenate([t.reshape(-1).view(torch.uint8).numpy() for t in moments.values()])[: 4 << 20]
    raw = raw[: raw.size // 4 * 4]
    chunks = encode_frame(raw, FLOAT32, EncodeOptions(context_exponents=True))
    assert chunks[-1].codec == HUFF2D.id
    assert HUFF2D.id not in [c.codec for c in encode_frame(raw, FLOAT32, EncodeOptions())]
    # Mantissa planes that zstd matched are libzstd's to decode: stored here, so the one
    # native call takes the frame.
    planes = split(raw, FLOAT32)
    frame = [
        (c.codec, c.raw_size, c.payload) if c.codec != ZSTD.id else (RAW.id, c.raw_size, planes[k].tobytes())
        for k, c in enumerate(chunks)
    ]
    out, room = np.empty(raw.size, np.uint8), np.empty(raw.size, np.uint8)
    assert native.decode_frame(frame, out, room, 4, True) is True and np.array_equal(out, raw)
    python = decode_frame(frame, FLOAT32, None)
    assert np.array_equal(python, raw)
    damaged = [*frame[:-1], (HUFF2D.id, raw.size // 4, frame[-1][2][:-3])]
    assert native.decode_frame(damaged, out, room, 4, True) is False
    with pytest.raises(CodecError, match="huff2d"):
        decode_frame(damaged, FLOAT32, np.empty(raw.size, np.uint8))


def test_the_default_level_codes_second_moments_smaller_with_row_prediction(
    tmp_path: Path, moments: dict[str, torch.Tensor]
) -> None:
    """`ckptz compress` of real second moments, at the default level as at level 19 (where a
    sparse sample of the exponents' pairs says contexts pay), writes huff2d exponent planes
    that each code smaller than the Huffman coding the default wrote before, by more than
    order-1 exponents alone did (~0.6% of the container), and restores byte for byte."""
    from safetensors.torch import save_file

    src = tmp_path / "moments.safetensors"
    save_file({f"optimizer.state.{n}.exp_avg_sq": t for n, t in moments.items()}, str(src))
    sizes = {}
    for level in ("default", "19"):
        out, chunks = round_trip_at(level, src, tmp_path)
        sizes[level] = out.stat().st_size
        with open(out, "rb") as f:
            rowed = chunks[chunks["codec"] == HUFF2D.id]
            assert len(rowed), level
            saved = 0
            for chunk in rowed:
                f.seek(int(chunk["offset"]))
                payload = f.read(int(chunk["size"]))
                plane = Order2dCodec().decode(payload, int(chunk["raw_size"]))
                huffman = len(HuffmanZstd().encode(plane))
                assert len(payload) < 0.95 * huffman, (level, len(payload), huffman)
                saved += huffman - len(payload)
        assert saved > 0.012 * sizes[level], (level, saved, sizes[level])
    assert sizes["default"] < sizes["19"] * 1.002, sizes


def _container_of(path: Path, plane: np.ndarray, payload: bytes, codec: Bitstream = HUFF2D) -> None:
    """A container of one uint8 stream, one frame, whose chunk is ``payload`` as ``codec``
    (its checksums and the file's digest made for it, so only decoding can find it wrong)."""
    from ckptz.container import ContainerWriter, Index, StreamInfo, checksum, make_tables
    from ckptz.digest import Hasher, Kind

    with open(path, "wb") as f:
        writer = ContainerWriter(f)
        offset = writer.add_payload(payload)
        hasher = Hasher(Kind("xxh3_tree", 4096))
        hasher.update(plane)
        header = {
            "source": {
                "name": "plane.bin",
                "size": plane.size,
                **hasher.digest().to_json(),
                "format": "opaque",
                "notes": [],
            },
            "created_by": "test",
            "device": "cpu",
            "codecs": {str(codec.id): {"name": codec.name}},
            "tensor_keys": [[]],
        }
        streams = (StreamInfo(0, "other", "uint8", 1, False, 1 << 20, plane.size, 0),)
        frames = [(0, 1, plane.size, checksum(plane.tobytes()))]
        chunks = [(offset, len(payload), plane.size, checksum(payload), codec.id, 0)]
        writer.finish(Index(header, streams, *make_tables([(0, plane.size)], frames, chunks)))


@pytest.mark.parametrize("damage", ["none", "cut", "zero width", "wrong width"])
def test_cli_restores_a_huff2d_container_or_says_it_is_damaged(tmp_path: Path, damage: str) -> None:
    """A container holding a huff2d chunk restores byte for byte; one whose huff2d payload is
    cut short, has a zero row width or the wrong one (checksums made to match) fails with one
    line on stderr, no traceback, and leaves no output."""
    plane = _grid(600, 96, 7)
    payload = bytearray(native.order2d_encode(plane, 4, 96))
    if damage == "cut":
        del payload[-40:]
    elif damage == "zero width":
        payload[:4] = bytes(4)
    elif damage == "wrong width":
        payload[:4] = (95).to_bytes(4, "little")
    src = tmp_path / "plane.ckptz"
    _container_of(src, plane, bytes(payload))
    out = tmp_path / "plane.bin"
    done = ckptz("decompress", str(src), "-o", str(out), "--device", "cpu")
    if damage == "none":
        assert done.returncode == 0, done.stderr
        assert out.read_bytes() == plane.tobytes()
        return
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "damaged" in done.stderr or "huff2d" in done.stderr or "checksum" in done.stderr, done.stderr
    assert not out.exists()
