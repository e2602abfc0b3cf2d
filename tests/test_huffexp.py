"""Mantissas given their exponent (bitstream 10, ``huffexp``): exact round trips in C against
the spec's own decoder, the gain on real bf16 weights of a short training run, declined where
exponents say nothing of the mantissas, damaged payloads refused within bounds, frames
decoded top plane first by every decoder, the native plane coding it byte for byte as the
Python coder does, and the CLI's levels choosing it by measured size."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
import training
from damage import damage, decodes_in_bounds
from format_reader import FormatViolation, _huffexp, read
from hypothesis import given, settings
from hypothesis import strategies as st
from levels import round_trip_at

from ckptz import api
from ckptz.codecs import cpu_codec, huffexp
from ckptz.codecs.cpu import HuffmanZstd
from ckptz.codecs.frames import MANTISSA_MARGIN, EncodeOptions, decode_frame, encode_frame
from ckptz.codecs.huffexp import HuffexpCodec
from ckptz.codecs.native import native
from ckptz.codecs.planes import split
from ckptz.codecs.table import CONST, HUFFEXP, RAW
from ckptz.container import read_index
from ckptz.dtypes import DTYPES
from ckptz.engines.cpu import CpuEngine
from ckptz.errors import CodecError
from ckptz.pipeline import native_compress
from ckptz.pipeline.compress import compress_file

BFLOAT16 = DTYPES["bfloat16"]
FLOAT16 = DTYPES["float16"]


def bf16_weights_of_a_short_training_run() -> dict[str, torch.Tensor]:
    """The bf16 weights of a small GPT-2 after 30 real AdamW steps, by parameter name."""
    return {n: t.to(torch.bfloat16) for n, t in weights_of_a_short_training_run().items()}


@cache
def weights_of_a_short_training_run() -> dict[str, torch.Tensor]:
    """The fp32 weights of a small GPT-2 after 30 real AdamW steps, by parameter name."""
    model, _ = training.short_run(training.tokens_below(2048))
    return {n: p.detach().contiguous() for n, p in model.named_parameters()}


def _weights_bytes() -> np.ndarray:
    return np.concatenate(
        [t.reshape(-1).view(torch.uint8).numpy() for t in bf16_weights_of_a_short_training_run().values()]
    )


def _skewed(n: int, seed: int, buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """A plane whose bytes' spread depends on the context byte beside each (a mantissa's skew
    on its exponent), and those context bytes, from ``buckets`` values."""
    rng = np.random.default_rng(seed)
    context = rng.integers(100, 100 + buckets, n).astype(np.uint8)
    spread = 1 + (context.astype(np.int64) - 100) * 37 % 256
    return (rng.integers(0, 1 << 30, n) % spread).astype(np.uint8), context


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40_000), st.integers(0, 99), st.integers(2, 40))
def test_payloads_decode_exactly_in_c_and_by_the_spec(n: int, seed: int, buckets: int) -> None:
    """Any plane length (segments of 1, 4 and 8) and number of contexts: the C decoder and the
    reader written from FORMAT.md alone both give the plane back from its top plane."""
    plane, context = _skewed(n, seed, buckets)
    payload = huffexp.encode(plane, context)
    if payload is None:  # too few bytes for a split to pay: declined, never wrong
        return
    out = np.empty(n, np.uint8)
    assert native.huffexp_decode(payload, context, out) is True and np.array_equal(out, plane)
    assert _huffexp(payload, n, context.tobytes()) == plane.tobytes()
    assert np.array_equal(HuffexpCodec().decode_given(payload, n, context), plane)


def test_bf16_weights_save_over_the_stored_plane() -> None:
    """On real bf16 weights the lowest plane (seven mantissa bits and the sign), which looks
    like noise to one code and is stored, codes smaller given its exponents by more than the
    margin the coder asks."""
    raw = _weights_bytes()
    low, top = (np.ascontiguousarray(p) for p in split(raw, BFLOAT16))
    payload = huffexp.encode(low, top)
    assert payload is not None
    assert len(payload) < (1 - 2 * MANTISSA_MARGIN) * low.size, (len(payload), low.size)
    assert len(payload) < len(HuffmanZstd().encode(low))
    assert np.array_equal(HuffexpCodec().decode_given(payload, low.size, top), low)


def test_planes_that_exponents_do_not_predict_are_declined() -> None:
    """Uniform mantissas beside any exponents, and any plane beside a constant one: no split
    pays, so the coder leaves huffexp out (and the codec says why)."""
    rng = np.random.default_rng(3)
    noise = rng.integers(0, 256, 1 << 18).astype(np.uint8)
    assert huffexp.encode(noise, rng.integers(110, 126, noise.size).astype(np.uint8)) is None
    plane, _ = _skewed(1 << 16, 4, 12)
    assert huffexp.encode(plane, np.full(plane.size, 120, np.uint8)) is None
    with pytest.raises(CodecError, match="huffexp"):
        HuffexpCodec().encode_given(noise, np.full(noise.size, 120, np.uint8))


def test_the_plane_only_interface_refuses() -> None:
    """The codec needs its frame's top plane: asked to code or decode a plane alone, it says
    so instead of guessing one."""
    codec = cpu_codec(HUFFEXP.id)
    assert codec.needs_top_plane
    with pytest.raises(CodecError, match="top plane"):
        codec.encode(np.zeros(16, np.uint8))
    with pytest.raises(CodecError, match="top plane"):
        codec.decode(b"\x01\x01\x01\x00", 16)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_damaged_payloads_are_refused_within_bounds(data: st.DataObject) -> None:
    """Flipped bytes (header, frames), cuts and extensions: the C decoder stays in its buffers
    and returns a bool; the codec raises CodecError naming huffexp or returns the size asked;
    the spec's reader refuses cuts and extensions too."""
    plane, context = _skewed(
        data.draw(st.sampled_from([20_000, 60_000, 200_000])), data.draw(st.integers(0, 99)), 9
    )
    coded = huffexp.encode(plane, context)
    assert coded is not None
    how, payload = damage(data, coded, ["header", "flip", "cut", "extend"], header=120)
    result = decodes_in_bounds(lambda p, out: native.huffexp_decode(p, context, out), payload, plane.size)
    if how in ("cut", "extend"):
        assert result is False
        with pytest.raises(FormatViolation):
            _huffexp(payload, plane.size, context.tobytes())
    try:
        back = HuffexpCodec().decode_given(payload, plane.size, context)
    except CodecError as exc:
        assert "huffexp" in str(exc)
        return
    assert back.size == plane.size


@pytest.mark.parametrize("dtype", [BFLOAT16, FLOAT16], ids=["bf16", "fp16"])
def test_frames_decode_top_plane_first_natively_and_in_python(dtype: object) -> None:
    """With context exponents (level 10 up) a frame of real bf16 weights codes its lowest
    plane huffexp; the one native frame call and the Python path both restore it (also with
    a constant or stored top plane), a damaged payload is declined by the first and raises
    CodecError in the second, and a huffexp top plane is refused by both. So too for fp16
    copies of those weights, whose top byte holds five exponent bits and three of the mantissa
    (their low plane, with the mantissa's zero low bits, is zstd-coded alone)."""
    weights = bf16_weights_of_a_short_training_run()
    tensors = list(weights.values()) if dtype is BFLOAT16 else [t.to(torch.float16) for t in weights.values()]
    raw = np.concatenate([t.reshape(-1).view(torch.uint8).numpy() for t in tensors])[: 4 << 20]
    chunks = encode_frame(raw, dtype, EncodeOptions(level=19, context_exponents=True))  # type: ignore[arg-type]
    assert chunks[0].codec == HUFFEXP.id
    assert HUFFEXP.id not in [c.codec for c in encode_frame(raw, dtype, EncodeOptions())]  # type: ignore[arg-type]
    frame = [(c.codec, c.raw_size, c.payload) for c in chunks]
    out, room = np.empty(raw.size, np.uint8), np.empty(raw.size, np.uint8)
    assert native.decode_frame(frame, out, room, 2, True) is True and np.array_equal(out, raw)
    assert np.array_equal(decode_frame(frame, dtype, None), raw)  # type: ignore[arg-type]
    assert np.array_equal(decode_frame(frame, dtype, np.empty(raw.size, np.uint8)), raw)  # type: ignore[arg-type]
    top = split(raw, dtype)[-1]  # type: ignore[arg-type]
    stored = [frame[0], (RAW.id, top.size, top.tobytes())]
    assert native.decode_frame(stored, out, room, 2, True) is True and np.array_equal(out, raw)
    damaged = [(HUFFEXP.id, frame[0][1], frame[0][2][:-3]), frame[1]]
    assert native.decode_frame(damaged, out, room, 2, True) is False
    with pytest.raises(CodecError, match="huffexp"):
        decode_frame(damaged, dtype, np.empty(raw.size, np.uint8))  # type: ignore[arg-type]
    upside = [frame[1], (HUFFEXP.id, frame[0][1], frame[0][2])]
    assert native.decode_frame(upside, out, room, 2, True) is False
    with pytest.raises(CodecError, match="huffexp"):
        decode_frame(upside, dtype, np.empty(raw.size, np.uint8))  # type: ignore[arg-type]


def test_a_constant_top_plane_gives_every_byte_one_context() -> None:
    """A frame whose top plane is constant (valid, though ckptz's coder declines a huffexp
    plane there: one bucket saves nothing): both decoders give every byte that plane's byte
    as its context. A one-bucket payload (huff1's layout, K = 1) holds the plane in order."""
    plane = np.random.default_rng(8).integers(0, 256, 70_000).astype(np.uint8)
    assert native.huffexp_encode(plane, np.full(plane.size, 121, np.uint8), 4) is None
    payload = native.order1_encode(plane, 4)
    assert payload[1] == 1  # one bucket: noise has no order-1 context either
    raw = np.empty(plane.size * 2, np.uint8)
    raw[0::2], raw[1::2] = plane, 121
    frame = [(HUFFEXP.id, plane.size, payload), (CONST.id, plane.size, bytes([121]))]
    out, room = np.empty(raw.size, np.uint8), np.empty(raw.size, np.uint8)
    assert native.decode_frame(frame, out, room, 2, False) is True and np.array_equal(out, raw)
    assert np.array_equal(decode_frame(frame, DTYPES["uint16"], np.empty(raw.size, np.uint8)), raw)


@pytest.fixture
def python_pipeline(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], None]]:
    """Call it to send every file through the Python pipeline from there on."""
    yield lambda: monkeypatch.setattr(native_compress, "suits", lambda *args, **kwargs: False)


def _compress(src: Path, out: Path, engine: CpuEngine) -> bytes:
    with open(out, "wb+") as f:
        compress_file(src, src.name, f, engine, verify=True)
    return out.read_bytes()


@pytest.mark.parametrize(("level", "frame"), [(19, None), (19, 64 << 10), (3, None)])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_native_plane_codes_it_as_the_python_pipeline(
    tmp_path: Path, level: int, frame: int | None, dtype: str, python_pipeline: Callable[[], None]
) -> None:
    """Real weights: at level 19 the native plane writes huffexp planes below the exponents
    (bf16: the lowest; fp32: the mantissa's top byte; verified there, decoded top plane first)
    byte for byte as the Python coder does, on large frames and small ones (where fp32's
    planes are too short for it to pay, and neither writes it); the default level never tries
    it. Both containers restore byte for byte, natively and through the Python pipeline."""
    from safetensors.torch import save_file

    src = tmp_path / "weights.safetensors"
    tensors = bf16_weights_of_a_short_training_run() if dtype == "bf16" else weights_of_a_short_training_run()
    save_file(tensors, str(src))
    below_top = 0 if dtype == "bf16" else 2

    def engine() -> CpuEngine:
        made = CpuEngine(2, level=level)
        if frame is not None:
            made.frame_size = made.largest_frame = frame
        return made

    natively = _compress(src, tmp_path / "native.ckptz", engine())
    with open(tmp_path / "native.ckptz", "rb") as f:
        chunks = read_index(f, src.name).chunks
    below = chunks["codec"][chunks["plane"] == below_top]
    # fp32 planes of 16 KiB (frames of 64 KiB) are too short for its buckets to pay.
    assert (HUFFEXP.id in below) == (level == 19 and (dtype == "bf16" or frame is None))
    assert HUFFEXP.id not in chunks["codec"][chunks["plane"] != below_top]
    python_pipeline()
    assert natively == _compress(src, tmp_path / "python.ckptz", engine())
    api.decompress(tmp_path / "native.ckptz", tmp_path / "back.safetensors", device="cpu")
    assert (tmp_path / "back.safetensors").read_bytes() == src.read_bytes()
    assert read((tmp_path / "native.ckptz").read_bytes()).data == src.read_bytes()


def test_level_19_codes_bf16_weights_smaller_with_it(tmp_path: Path) -> None:
    """`ckptz compress --level 19` of real bf16 weights writes huffexp lowest planes that code
    smaller than the plane stored by more than the margin, the container smaller than the
    default's by more than the plane's measured share; it restores byte for byte."""
    from safetensors.torch import save_file

    src = tmp_path / "weights.safetensors"
    save_file(bf16_weights_of_a_short_training_run(), str(src))
    sizes = {}
    for level in ("default", "19"):
        out, chunks = round_trip_at(level, src, tmp_path)
        sizes[level] = out.stat().st_size
        coded = chunks[chunks["codec"] == HUFFEXP.id]
        assert (len(coded) > 0) == (level == "19")
        assert all(int(c["size"]) < (1 - MANTISSA_MARGIN) * int(c["raw_size"]) for c in coded)
    assert sizes["19"] < 0.997 * sizes["default"], sizes


@pytest.mark.gpu
@pytest.mark.parametrize("native_gpu", [True, False], ids=["native plane", "python pipeline"])
def test_gpu_restores_decode_it_on_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native_gpu: bool
) -> None:
    """A level-19 CPU container of bf16 weights restores byte for byte with `--device cuda`:
    the GPU engine has no coder for huffexp (as for huff1, huff2d and sign2d), so its frames
    are decoded on the host, top plane first, through the native GPU plane and through the
    Python GPU pipeline alike."""
    import importlib

    from safetensors.torch import save_file

    monkeypatch.setattr(importlib.import_module("ckptz.pipeline.restore"), "NATIVE_GPU", native_gpu)
    src = tmp_path / "weights.safetensors"
    save_file(bf16_weights_of_a_short_training_run(), str(src))
    packed = tmp_path / "weights.ckptz"
    api.compress(src, packed, device="cpu", level=19)
    with open(packed, "rb") as f:
        assert HUFFEXP.id in read_index(f, str(packed)).chunks["codec"]
    api.decompress(packed, tmp_path / "back.safetensors", device="cuda")
    assert (tmp_path / "back.safetensors").read_bytes() == src.read_bytes()
