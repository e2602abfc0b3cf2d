"""Conformance of every CPU codec of the table of bitstreams and of the CPU frame coder.

One helper, :func:`check_codec`, runs a codec through the same cases (empty, one byte, odd
sizes, constant, random, realistic float planes): every row of
:data:`ckptz.codecs.table.TABLE` with a CPU implementation goes through it.
:func:`check_frame` does the same for whole frames of every dtype in the table. Corrupt payloads must raise ``CodecError``,
never crash, hang or allocate without bound.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptz.codecs import cpu_codec, order1
from ckptz.codecs.base import Codec
from ckptz.codecs.cpu import ZstdCodec
from ckptz.codecs.frames import EncodeOptions, decode_frame, encode_frame, encode_plane, looks_like_noise
from ckptz.codecs.planes import merge, split
from ckptz.codecs.table import CONST, HUFF1, RAW, TABLE, ZSTD, Bitstream
from ckptz.container import StreamInfo
from ckptz.dtypes import DTYPES, DType
from ckptz.engines.cpu import CONTEXT_LEVEL, CpuEngine
from ckptz.errors import CodecError

RNG = np.random.default_rng(20261122)


def _floats(n: int, scale: float = 0.02) -> np.ndarray:
    return (RNG.standard_normal(n) * scale).astype(np.float32)


def _optimizer_like(n: int, rng: np.random.Generator = RNG) -> np.ndarray:
    """Rows of one scale each, with some all-zero rows (a fine-tune's unseen rows)."""
    rows = max(1, n // 64)
    scales = np.exp(rng.uniform(-12, -4, rows)).astype(np.float32)
    scales[rng.random(rows) < 0.2] = 0
    return (rng.standard_normal(rows * 64).astype(np.float32) * np.repeat(scales, 64))[:n]


def _bf16_bytes(values: np.ndarray) -> np.ndarray:
    """bf16 bytes of fp32 values (truncated: the top half of each word)."""
    return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)


def _exponent_plane(values: np.ndarray) -> np.ndarray:
    return split(values.view(np.uint8), DTYPES["float32"])[-1]


def plane_cases() -> dict[str, np.ndarray]:
    """Byte arrays every codec must round-trip."""
    cases = {
        "empty": np.empty(0, np.uint8),
        "one byte": np.array([7], np.uint8),
        "constant": np.full(4097, 3, np.uint8),
        "zeros": np.zeros(1 << 16, np.uint8),
        "random": RNG.integers(0, 256, 100_003, dtype=np.uint8),
        "two symbols": RNG.integers(0, 2, 65_537, dtype=np.uint8),
        "exponents": _exponent_plane(_floats(200_001)),
        "optimizer exponents": _exponent_plane(_optimizer_like(150_000)),
    }
    for n in (2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 255, 1023):
        cases[f"odd size {n}"] = _exponent_plane(_floats(n))
    return cases


def check_codec(codec: Codec) -> None:
    """Every case round-trips exactly; a wrong size or truncation raises CodecError."""
    for name, data in plane_cases().items():
        if codec.name == "const" and data.size and not np.all(data == data[0]):
            with pytest.raises(CodecError):
                codec.encode(data)
            continue
        payload = codec.encode(data)
        out = codec.decode(payload, data.size)
        assert out.dtype == np.uint8 and np.array_equal(out, data), f"{codec.name}: {name}"
        # Payloads that store no per-byte data (const; bitpack of a constant) fit any size.
        if codec.name != "const" and not (codec.name == "bitpack" and len(payload) == 2):
            with pytest.raises(CodecError):
                codec.decode(payload, data.size + 9)
        if len(payload) > 1:
            with pytest.raises(CodecError):
                codec.decode(bytes(payload)[: len(payload) // 2], data.size)


#: Rows of the table with a CPU implementation that codes a plane alone: every one must pass
#: :func:`check_codec` (``huffexp``, which needs its frame's top plane, has test_huffexp.py).
CPU_ROWS = [b for b in TABLE if b.cpu is not None and not b.cpu.needs_top_plane]


@pytest.mark.parametrize("row", CPU_ROWS, ids=lambda b: b.name)
def test_codec_conformance(row: Bitstream) -> None:
    assert row.cpu is not None
    check_codec(row.cpu())


def test_literal_zstd_conformance() -> None:
    """The literal-mostly encoder writes plain zstd frames that bitstream 2 decodes."""
    check_codec(ZstdCodec(literal=True))
    plane = _exponent_plane(_floats(1 << 16))
    payload = ZstdCodec(literal=True).encode(plane)
    assert np.array_equal(cpu_codec(ZSTD.id).decode(payload, plane.size), plane)


def frame_cases(dtype: DType) -> dict[str, np.ndarray]:
    """Frames (whole words) of one dtype."""
    w = dtype.word
    cases = {
        "empty": np.empty(0, np.uint8),
        "one word": RNG.integers(0, 256, w, dtype=np.uint8),
        "odd words": RNG.integers(0, 256, 1001 * w, dtype=np.uint8),
        "zeros": np.zeros(4096 * w, np.uint8),
    }
    if dtype.is_float:
        values = _optimizer_like(300_000 // dtype.itemsize * 4).astype(np.float64)
        typed = {
            "float64": values,
            "float32": values.astype(np.float32),
            "float16": values.astype(np.float16),
        }
        if dtype.name in typed:
            raw = typed[dtype.name].view(np.uint8)
            cases["realistic"] = raw[: raw.size // dtype.itemsize * dtype.itemsize]
    return cases


def check_frame(dtype: DType, options: EncodeOptions) -> None:
    """Every frame case of ``dtype`` round-trips through encode_frame / decode_frame."""
    for name, raw in frame_cases(dtype).items():
        chunks = encode_frame(raw, dtype, options)
        assert len(chunks) == max(dtype.word, 1)
        out = decode_frame([(c.codec, c.raw_size, c.payload) for c in chunks], dtype)
        assert np.array_equal(out, raw), f"{dtype.name}: {name}"


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_frame_conformance(name: str) -> None:
    for options in (
        EncodeOptions(),
        EncodeOptions(level=1),
        EncodeOptions(level=19, context_exponents=True),
    ):
        check_frame(DTYPES[name], options)


def test_many_frames_bf16_exact_fp32() -> None:
    """A stream of fp32 holding bf16 values, cut into frames: the low plane is const."""
    values = _floats(1 << 18).view(np.uint32) & np.uint32(0xFFFF0000)
    raw = values.view(np.uint8)
    dtype = DTYPES["float32"]
    frame = 1 << 16
    coded = [encode_frame(raw[s : s + frame], dtype, EncodeOptions()) for s in range(0, raw.size, frame)]
    assert all(f[1].codec == CONST.id for f in coded)
    out = np.concatenate([decode_frame([(c.codec, c.raw_size, c.payload) for c in f], dtype) for f in coded])
    assert np.array_equal(out, raw)


def test_planes_roundtrip_every_dtype() -> None:
    for dtype in DTYPES.values():
        raw = RNG.integers(0, 256, 64 * dtype.word, dtype=np.uint8)
        planes = split(raw, dtype)
        assert len(planes) == dtype.word
        assert np.array_equal(merge(planes, dtype), raw)


def test_planes_into_given_buffers() -> None:
    """split/merge with ``out`` write the same bytes there; decode_frame decodes in place."""
    for dtype in DTYPES.values():
        raw = RNG.integers(0, 256, 1000 * dtype.word, dtype=np.uint8)
        fresh = split(raw, dtype)
        buf = np.zeros(raw.size, np.uint8)
        planes = split(raw, dtype, out=buf)
        assert all(np.array_equal(a, b) for a, b in zip(planes, fresh, strict=True))
        assert dtype.word == 1 or np.shares_memory(planes[0], buf)
        out = np.zeros(raw.size, np.uint8)
        assert merge(planes, dtype, out=out) is out and np.array_equal(out, raw)
        chunks = encode_frame(raw, dtype, EncodeOptions())
        whole = np.zeros(raw.size + 8, np.uint8)
        decode_frame([(c.codec, c.raw_size, c.payload) for c in chunks], dtype, whole[4:-4])
        assert np.array_equal(whole[4:-4], raw) and not whole[:4].any() and not whole[-4:].any()


def test_payloads_do_not_share_scratch() -> None:
    """Chunks of one frame stay intact after the same thread encodes another frame."""
    dtype = DTYPES["float32"]
    first = _floats(1 << 16).view(np.uint8)
    chunks = encode_frame(first, dtype, EncodeOptions())
    encode_frame(_floats(1 << 16).view(np.uint8), dtype, EncodeOptions())
    assert np.array_equal(decode_frame([(c.codec, c.raw_size, c.payload) for c in chunks], dtype), first)


def test_exponent_plane_is_top_byte() -> None:
    raw = np.array([1.0, -2.0], np.float32).view(np.uint8)
    assert split(raw, DTYPES["float32"])[-1].tolist() == [127, 128]


def test_policy() -> None:
    """Noise stored raw; exponents Huffman-coded as zstd frames."""
    dense_fp32 = ZSTD.id
    assert looks_like_noise(RNG.integers(0, 256, 1 << 18, dtype=np.uint8))
    assert not looks_like_noise(RNG.integers(0, 128, 1 << 18, dtype=np.uint8))
    assert encode_plane(RNG.integers(0, 256, 1 << 16, dtype=np.uint8), EncodeOptions()).codec == RAW.id
    states = _optimizer_like(1 << 16)
    states[: 1 << 14] = 0  # a quarter untouched: zstd's runs are tried, a zstd frame wins
    assert encode_plane(_exponent_plane(states), EncodeOptions(), exponent=True).codec == ZSTD.id
    weights = _floats(1 << 16)
    assert encode_plane(_exponent_plane(weights), EncodeOptions(), exponent=True).codec == dense_fp32
    bf16 = split(_bf16_bytes(weights), DTYPES["bfloat16"])[-1]
    assert encode_plane(bf16, EncodeOptions(), exponent=True).codec == ZSTD.id
    fp32 = weights.view(np.uint8)
    assert encode_frame(fp32, DTYPES["float32"], EncodeOptions())[-1].codec == dense_fp32
    assert encode_frame(_bf16_bytes(weights), DTYPES["bfloat16"], EncodeOptions())[-1].codec == ZSTD.id


def test_context_exponents_policy() -> None:
    """With context_exponents, huff1 is chosen where neighbours share a scale and saves
    more than CONTEXT_MARGIN; not on i.i.d. exponents (a tie)."""
    rows = 4096
    scales = np.exp(RNG.uniform(-14, -4, rows)).astype(np.float32)
    moments = np.abs(RNG.standard_normal(rows * 128)).astype(np.float32) * np.repeat(scales, 128)
    options = EncodeOptions(context_exponents=True)
    chosen = encode_plane(_exponent_plane(moments), options, exponent=True).codec
    assert chosen == HUFF1.id
    assert encode_plane(_exponent_plane(_floats(1 << 18)), options, exponent=True).codec != HUFF1.id
    plain = EncodeOptions()
    assert encode_plane(_exponent_plane(moments), plain, exponent=True).codec == ZSTD.id
    # A third of the rows untouched (zero runs): LZ-matching zstd is still tried beside huff1.
    moments[: moments.size // 3] = 0
    plane = _exponent_plane(moments)
    chosen_chunk = encode_plane(plane, options, exponent=True)
    assert len(chosen_chunk.payload) <= len(ZstdCodec(3).encode(plane))


def test_order1_declines_exponents_without_context_when_asked() -> None:
    """i.i.d. exponents (dense weights) choose one bucket: a coder trying huff1 on every
    float plane is spared its coding there, while moments rows still get their payload."""
    weights = _exponent_plane(_floats(1 << 18))
    assert order1.encode(weights, contextual_only=True) is None
    assert order1.encode(weights) is not None  # the codec itself still writes one bucket
    rows = 4096
    scales = np.exp(RNG.uniform(-14, -4, rows)).astype(np.float32)
    moments = np.abs(RNG.standard_normal(rows * 128)).astype(np.float32) * np.repeat(scales, 128)
    plane = _exponent_plane(moments)
    assert order1.encode(plane, contextual_only=True) == order1.encode(plane)


def test_frame_rejects_wrong_plane_count() -> None:
    with pytest.raises(CodecError):
        decode_frame([(RAW.id, 4, b"abcd")], DTYPES["float32"])


#: Bitstreams whose payloads have structure to damage (not raw or const bytes).
_MUTABLE = [b.id for b in CPU_ROWS if b not in (RAW, CONST)]


@st.composite
def _mutations(draw: st.DrawFn) -> tuple[int, bytes, int, int]:
    codec_id = draw(st.sampled_from(_MUTABLE))
    rng = np.random.default_rng(draw(st.integers(0, 1000)))
    data = _exponent_plane(_optimizer_like(draw(st.integers(0, 3000)), rng))
    payload = bytearray(cpu_codec(codec_id).encode(data))
    for _ in range(draw(st.integers(1, 4))):
        if not payload:
            break
        kind = draw(st.sampled_from(["flip", "cut", "insert"]))
        pos = draw(st.integers(0, len(payload) - 1))
        if kind == "flip":
            payload[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            del payload[pos:]
        else:
            payload[pos:pos] = draw(st.binary(min_size=1, max_size=8))
    return codec_id, bytes(payload), data.size, len(payload)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutations())
def test_mutated_payloads_fail_cleanly(case: tuple[int, bytes, int, int]) -> None:
    """A damaged payload either decodes to the right size or raises CodecError."""
    codec_id, payload, size, _ = case
    try:
        out = cpu_codec(codec_id).decode(payload, size)
    except CodecError:
        return
    assert out.size == size and out.dtype == np.uint8


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=64), st.integers(0, 1 << 22), st.sampled_from([b.id for b in CPU_ROWS]))
def test_garbage_payloads_fail_cleanly(payload: bytes, size: int, codec_id: int) -> None:
    """Arbitrary bytes decode to the asked size or raise CodecError.

    Sizes come from the container, which bounds them by the stream's frame size.
    """
    try:
        out = cpu_codec(codec_id).decode(payload, size)
    except CodecError:
        return
    assert out.size == size


def test_cpu_engine_tries_order1_exponents_on_every_float_stream_from_context_level() -> None:
    """Order-1 exponents only from CONTEXT_LEVEL, on every float stream whatever its
    component (the planes' measured sizes decide), never on integer streams."""

    def stream(component: str, dtype: str = "float32", rotate: bool = True) -> StreamInfo:
        return StreamInfo(0, component, dtype, 4, rotate, 1 << 20, 0, 0)

    with CpuEngine(1) as engine:
        assert not engine.options_for(stream("optimizer.exp_avg_sq")).context_exponents
        assert not engine.options_for(stream("weights")).context_exponents
    with CpuEngine(1, level=CONTEXT_LEVEL - 1) as engine:
        assert not engine.options_for(stream("optimizer.exp_avg_sq")).context_exponents
    with CpuEngine(1, level=CONTEXT_LEVEL) as engine:
        for component in ("optimizer.exp_avg_sq", "optimizer.exp_avg", "gradients", "weights", "other"):
            assert engine.options_for(stream(component)).context_exponents, component
            assert not engine.options_for(stream(component)).measured_contexts, component
        assert not engine.options_for(stream("other", "int32", rotate=False)).context_exponents


def test_cpu_engine_measures_contexts_below_context_level_on_float_streams() -> None:
    """Below CONTEXT_LEVEL every float stream, whatever its component, measures whether
    contexts pay; integer streams never do, nor does a coder that turns it off (the GPU
    engine's coder of its metadata frames)."""

    def stream(component: str, dtype: str = "float32", rotate: bool = True) -> StreamInfo:
        return StreamInfo(0, component, dtype, 4, rotate, 1 << 20, 0, 0)

    for level in (1, 3, CONTEXT_LEVEL - 1):
        with CpuEngine(1, level=level) as engine:
            for component in ("optimizer.exp_avg_sq", "weights", "other"):
                assert engine.options_for(stream(component)).measured_contexts, (level, component)
            assert not engine.options_for(stream("other", "int32", rotate=False)).measured_contexts
        with CpuEngine(1, level=level, measured_contexts=False) as engine:
            assert engine.options_for(stream("optimizer.exp_avg_sq")) == EncodeOptions(level=level)
