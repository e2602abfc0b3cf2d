"""The C extension (ckptz/native_src/): the transform's bytes as the format defines them, zstd frames
that libzstd decodes exactly whatever the input, and a literal-block decoder that reads
those frames (and libzstd's literal-only ones) exactly and stays in bounds on damaged ones."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zstandard
from damage import damage, decodes_in_bounds
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptz.codecs import bitpack, planes
from ckptz.codecs.bitpack import BitpackCodec
from ckptz.codecs.cpu import ConstCodec, HuffmanZstd, RawCodec, ZstdCodec
from ckptz.codecs.deflate import DeflateCodec
from ckptz.codecs.frames import EncodeOptions, decode_frame, encode_frame
from ckptz.codecs.native import native
from ckptz.codecs.order1 import Order1Codec
from ckptz.dtypes import DTYPES
from ckptz.errors import CodecError

RNG = np.random.default_rng(7)


def test_a_missing_extension_says_what_to_install() -> None:
    """ckptz needs its C extension: an install whose build failed is told what to install
    in one line, at import, rather than running on some slower path."""
    block = "import sys; sys.modules['ckptz._native'] = None; import ckptz.codecs.native"
    done = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, check=False)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ckptz's C extension") and "build-essential python3-dev" in last


def test_module_includes_every_source() -> None:
    """setup.py compiles native_src/module.c and the vendored zstd (a unit of its own): every
    other C file must be included from module.c (directly, or by a file it includes, as
    hash.c includes the vendored xxHash)."""
    source = Path(__file__).resolve().parent.parent / "ckptz" / "native_src"
    included: set[Path] = set()
    todo = [source / "module.c"]
    while todo:
        at = todo.pop()
        names = re.findall(r'^\s*#\s*include "([^"]+)"', at.read_text(), re.MULTILINE)
        found = {(at.parent / name).resolve() for name in names} - included
        included |= found
        todo += sorted(found)
    top = {p.resolve() for p in source.glob("*.[ch]") if p.name != "module.c"}
    assert sorted(top - included) == []


def _reference_split(raw: np.ndarray, name: str) -> list[np.ndarray]:
    """The planes as docs/FORMAT.md defines them: a float word rotated left by one bit, then
    plane ``i`` holds every word's byte ``i`` (little-endian)."""
    dtype = DTYPES[name]
    words = raw.view(f"<u{dtype.word}").copy()
    if dtype.is_float:
        words = (words << 1) | (words >> (8 * dtype.word - 1))
    grid = words.view(np.uint8).reshape(-1, dtype.word)
    return [grid[:, i].copy() for i in range(dtype.word)]


@pytest.mark.parametrize("name", sorted(n for n, d in DTYPES.items() if d.word in (2, 4, 8)))
@pytest.mark.parametrize("words", [0, 1, 3, 4097])
def test_split_and_merge_match_the_format(name: str, words: int) -> None:
    dtype = DTYPES[name]
    raw = RNG.integers(0, 256, words * dtype.word, dtype=np.uint8)
    expected = _reference_split(raw, name)
    got = planes.split(raw, dtype)
    assert all(np.array_equal(g, e) for g, e in zip(got, expected, strict=True))
    assert np.array_equal(planes.merge(got, dtype), raw)


@pytest.mark.parametrize("name", sorted(n for n, d in DTYPES.items() if d.word in (2, 4, 8)))
@pytest.mark.parametrize("words", [0, 1, 3, 4097])
def test_split_into_planes_of_their_own_is_the_split(name: str, words: int) -> None:
    """``split_planes``: the same planes and sampled statistics as ``split`` into one buffer,
    each plane a new bytes object."""
    dtype = DTYPES[name]
    raw = RNG.integers(0, 256, words * dtype.word, dtype=np.uint8)
    raw[: raw.size // 3] = 0  # zeros to count, and a plane that is not noise
    one = np.empty(raw.size, np.uint8)
    want = native.split(raw, one, dtype.word, dtype.is_float, 64)
    got, stats = native.split_planes(raw, dtype.word, dtype.is_float, 64)
    assert [type(p) for p in got] == [bytes] * dtype.word
    assert len({id(p) for p in got}) == (dtype.word if words else 1)  # CPython has one empty bytes
    assert b"".join(got) == one.tobytes() and stats == want
    assert native.split_planes(raw, dtype.word, dtype.is_float)[1] is None
    assert planes.split_owned(raw, dtype, 64) == (list(got), list(want))
    with pytest.raises(ValueError, match="whole"):
        native.split_planes(raw[:-1] if raw.size else np.zeros(1, np.uint8), dtype.word, True)
    with pytest.raises(ValueError, match="word size"):
        native.split_planes(raw, 3, True)


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float64"])
def test_a_raw_plane_is_its_own_split_bytes(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A frame split into planes of their own codes to the same chunks as one split into the
    thread's scratch, and a plane stored raw is the split's bytes object itself, not a copy."""
    from ckptz.codecs import frames

    dtype = DTYPES[name]
    values = RNG.standard_normal(200_000).astype(np.float64 if dtype.word == 8 else np.float32)
    raw = (
        values.view(np.uint8) if dtype.word != 2 else values.view(np.uint8).reshape(-1, 4)[:, 2:].reshape(-1)
    )
    raw = np.ascontiguousarray(raw)
    options = frames.EncodeOptions(level=3)
    made: list[bytes] = []
    split_owned = planes.split_owned

    def keep(*args: object, **kw: object) -> object:
        out = split_owned(*args, **kw)  # type: ignore[arg-type]
        assert out is not None
        made.extend(out[0])
        return out

    monkeypatch.setattr(frames, "split_owned", keep)
    owned = frames.encode_frame(raw, dtype, options)
    raws = [c for c in owned if c.codec == frames._RAW.id]
    assert raws and all(any(c.payload is m for m in made) for c in raws)
    monkeypatch.setattr(frames, "split_owned", lambda *a, **k: None)
    assert frames.encode_frame(raw, dtype, options) == owned


@pytest.mark.parametrize("word", [2, 4, 8])
def test_merge_takes_constant_planes(word: int) -> None:
    """An int stands for a plane of that byte: the same words as the full plane gives."""
    dtype = next(d for d in DTYPES.values() if d.word == word and d.is_float)
    raw = RNG.integers(0, 256, 999 * word, dtype=np.uint8)
    split = [p.copy() for p in planes.split(raw, dtype)]
    for k in range(word):
        split[k][:] = k * 37 % 256
        with_ints: list[np.ndarray | int] = list(split)
        with_ints[k] = k * 37 % 256
        assert np.array_equal(
            planes.merge(with_ints, dtype, np.empty(raw.size, np.uint8)), planes.merge(split, dtype)
        )
    out = planes.merge([5] * word, dtype, np.empty(raw.size, np.uint8))
    assert np.array_equal(planes.merge([np.full(999, 5, np.uint8)] * word, dtype), out)


def test_bad_arguments_raise_value_error() -> None:
    buf = np.zeros(12, np.uint8)
    with pytest.raises(ValueError, match="word size"):
        native.split(buf, np.empty(12, np.uint8), 3, True)
    with pytest.raises(ValueError, match="sizes must match"):
        native.split(buf, np.empty(8, np.uint8), 4, True)
    with pytest.raises(ValueError, match="planes for"):
        native.merge([buf[:3]] * 3, np.empty(12, np.uint8), 4, True)
    with pytest.raises(ValueError, match="holds"):
        native.merge([buf[:3], buf[:3], buf[:3], buf[:2]], np.empty(12, np.uint8), 4, True)
    with pytest.raises(ValueError, match="constant plane byte"):
        native.merge([buf[:3], buf[:3], buf[:3], 256], np.empty(12, np.uint8), 4, True)
    with pytest.raises(ValueError, match="block of"):
        native.huffman_zstd(buf, 100)
    with pytest.raises(TypeError):
        native.merge([buf[:3]] * 3 + ["abc"], np.empty(12, np.uint8), 4, True)


def _decode(frame: bytes, size: int) -> bytes:
    assert zstandard.frame_content_size(frame) == size
    return zstandard.ZstdDecompressor().decompress(frame, max_output_size=max(size, 1))


@st.composite
def _planes(draw: st.DrawFn) -> np.ndarray:
    """Byte planes of every shape the coder meets: skewed, flat, sparse, with runs and
    with values above 128 (FSE-described tables), in pieces of different statistics."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        n = draw(st.sampled_from([0, 1, 5, 1023, 1024, 1025, 8191, 8192, 40_000, 150_000]))
        kind = draw(st.sampled_from(["exponent", "uniform", "two", "run", "high", "sparse"]))
        if kind == "exponent":
            scale = float(np.exp(rng.uniform(-12, 2)))
            part = planes.split(
                (rng.standard_normal(n) * scale).astype(np.float32).view(np.uint8), DTYPES["float32"]
            )[-1]
        elif kind == "uniform":
            part = rng.integers(0, draw(st.integers(2, 256)), n, dtype=np.uint8)
        elif kind == "two":
            part = rng.choice(
                np.array(draw(st.lists(st.integers(0, 255), min_size=2, max_size=2)), np.uint8), n
            )
        elif kind == "run":
            part = np.full(n, draw(st.integers(0, 255)), np.uint8)
        elif kind == "high":
            part = (200 + rng.geometric(0.3, n).clip(0, 55)).astype(np.uint8)
        else:
            part = (rng.random(n) < 0.01).astype(np.uint8) * draw(st.integers(1, 255))
        parts.append(part)
    return np.concatenate(parts)


@settings(max_examples=150, deadline=None)
@given(_planes(), st.sampled_from([0, 0, 1024, 16384, 131072]))
def test_huffman_frames_decode_exactly(plane: np.ndarray, block: int) -> None:
    frame = native.huffman_zstd(plane, block)
    if frame is None:  # a table it cannot describe: the codec falls back
        frame = HuffmanZstd().encode(plane)
    assert _decode(frame, plane.size) == plane.tobytes()
    assert len(frame) <= plane.size + 3 * (plane.size // 1024 + 1) + 14
    out = np.empty(plane.size, np.uint8)
    assert native.literals_decode(frame, out) is True  # the C decoder reads every one too
    assert np.array_equal(out, plane)


@settings(max_examples=60, deadline=None)
@given(_planes(), st.sampled_from([1, 3, 19, "literal"]))
def test_literals_decoder_takes_or_declines_libzstd_frames(plane: np.ndarray, level: int | str) -> None:
    """libzstd's own frames: those with only literals (its Huffman tables, one or four
    streams, raw and RLE literals) decode exactly; those with matches are declined, and the
    codec hands them to libzstd."""
    codec = ZstdCodec(literal=True) if level == "literal" else ZstdCodec(int(level))
    frame = codec.encode(plane)
    out = np.empty(plane.size, np.uint8)
    if native.literals_decode(frame, out):
        assert np.array_equal(out, plane)
    assert np.array_equal(codec.decode(frame, plane.size), plane)


def test_literals_decoder_declines_frames_with_matches_or_checksums() -> None:
    data = np.tile(RNG.integers(0, 256, 1000, dtype=np.uint8), 50)  # long repeats
    out = np.empty(data.size, np.uint8)
    assert native.literals_decode(zstandard.ZstdCompressor(level=3).compress(data.tobytes()), out) is False
    noise = RNG.integers(0, 200, 5000, dtype=np.uint8)
    checked = zstandard.ZstdCompressor(write_checksum=True).compress(noise.tobytes())
    assert native.literals_decode(checked, np.empty(noise.size, np.uint8)) is False
    frame = native.huffman_zstd(noise)
    assert native.literals_decode(frame, np.empty(noise.size + 1, np.uint8)) is False  # wrong size


@settings(max_examples=300, deadline=None)
@given(_planes(), st.data())
def test_damaged_frames_are_declined_or_decoded_in_bounds(plane: np.ndarray, data: st.DataObject) -> None:
    """Flipped bytes, cuts and extensions anywhere: the decoder reads and writes only
    within its buffers (guard bytes around the output stay put) and returns a bool; the
    codec then raises CodecError or returns the right number of bytes."""
    frame = bytearray(native.huffman_zstd(plane) or HuffmanZstd().encode(plane))
    how = data.draw(st.sampled_from(["flip", "cut", "extend"]))
    if how == "flip":
        for _ in range(data.draw(st.integers(1, 4))):
            at = data.draw(st.integers(0, len(frame) - 1))
            frame[at] ^= data.draw(st.integers(1, 255))
    elif how == "cut":
        del frame[data.draw(st.integers(0, len(frame) - 1)) :]
    else:
        frame += bytes(data.draw(st.integers(1, 16)))
    guarded = np.full(plane.size + 64, 0xA5, np.uint8)
    result = native.literals_decode(bytes(frame), guarded[32 : 32 + plane.size])
    assert isinstance(result, bool)
    assert (guarded[:32] == 0xA5).all() and (guarded[32 + plane.size :] == 0xA5).all()
    try:
        back = HuffmanZstd().decode(bytes(frame), plane.size)
    except CodecError:
        return
    assert back.size == plane.size


def test_huffman_frames_beat_deflate_and_literal_zstd_on_exponents() -> None:
    """Rows of different scales (as in trained weights and optimizer states): the planned
    blocks follow them, and the frame is smaller than Huffman-only deflate's stream."""
    rows = np.repeat(np.exp(RNG.uniform(-10, -3, 256)), 4096)
    values = (RNG.standard_normal(rows.size) * rows).astype(np.float32)
    plane = planes.split(values.view(np.uint8), DTYPES["float32"])[-1]
    frame = HuffmanZstd().encode(plane)
    assert _decode(frame, plane.size) == plane.tobytes()
    assert len(frame) < len(DeflateCodec().encode(plane))
    assert len(frame) < len(ZstdCodec(literal=True).encode(plane))


def test_block_plan_counts_the_code_length_limit() -> None:
    """7-bit values with 0.3% of them rare high ones (fp32 gradients holding some non-bf16
    values): one table for 128 KiB must give the rare values 11-bit codes and lengthen
    others; the plan splits where that costs more than a table, and lands within 1% of
    level-3 zstd's (block-splitting) frame instead of 1.5% above it (0.7% with the block
    cost at 128 bytes)."""
    plane = RNG.integers(0, 128, 1 << 18, dtype=np.uint8)
    plane[RNG.random(plane.size) < 0.003] |= 0x80
    planned = native.huffman_zstd(plane)
    assert planned is not None and _decode(planned, plane.size) == plane.tobytes()
    assert len(planned) < 0.995 * len(native.huffman_zstd(plane, 131072))
    assert len(planned) <= 1.01 * len(ZstdCodec(3).encode(plane))


def test_huffman_frame_block_kinds() -> None:
    """Constant blocks become RLE blocks (4 bytes), incompressible ones raw blocks."""
    zeros = np.zeros(300_000, np.uint8)
    frame = native.huffman_zstd(zeros)
    assert _decode(frame, zeros.size) == zeros.tobytes() and len(frame) < 64
    high = (200 + RNG.geometric(0.3, 100_000).clip(0, 55)).astype(np.uint8)
    frame = native.huffman_zstd(high)  # byte values above 128: FSE-described tables
    assert frame is not None and _decode(frame, high.size) == high.tobytes() and len(frame) < high.size / 2
    noise = RNG.integers(0, 256, 100_000, dtype=np.uint8)
    frame = native.huffman_zstd(noise)
    assert _decode(frame, noise.size) == noise.tobytes() and len(frame) <= noise.size + 64


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 4096, 100_003])
@pytest.mark.parametrize("mask", [0x00, 0x01, 0x7F, 0xFE, 0x81])
def test_bitpack_matches_the_format(size: int, mask: int) -> None:
    """The payload bitpack.py's docstring defines, and it decodes back."""
    data = RNG.integers(0, 256, size, dtype=np.uint8) & mask | 0x40 & ~mask
    codec = bitpack.BitpackCodec()
    payload = codec.encode(data)
    assert payload == reference_bitpack(data)
    assert np.array_equal(codec.decode(payload, size), data)


def reference_bitpack(data: np.ndarray) -> bytes:
    """A bitpack payload as the format defines it: the fixed mask and values, then each
    varying bit's plane packed LSB first."""
    if not data.size:
        return bytes([0xFF, 0])
    ones, any_set = int(np.bitwise_and.reduce(data)), int(np.bitwise_or.reduce(data))
    fixed = ~(ones ^ any_set) & 0xFF
    parts = [bytes([fixed, ones & fixed])]
    for b in range(8):
        if not fixed >> b & 1:
            parts.append(np.packbits((data >> b) & 1, bitorder="little").tobytes())
    return b"".join(parts)


@pytest.mark.skipif(not native.avx2, reason="no AVX2 here: the SSE2 loops are the ones tested")
def test_bitpack_sse2_loops_match_the_format() -> None:
    """With the AVX2 loops turned off the extension runs its SSE2 bit loops, as on CPUs
    without AVX2: the same payloads, decoded back."""
    rng = np.random.default_rng(3)
    codec = bitpack.BitpackCodec()
    assert native.use_avx2(False)
    try:
        for size in (0, 9, 255, 256, 4096, 100_003):
            for mask in (0x01, 0x7F, 0xFE, 0x81):
                data = rng.integers(0, 256, size, dtype=np.uint8) & mask | 0x40 & ~mask
                payload = codec.encode(data)
                assert payload == reference_bitpack(data)
                assert np.array_equal(codec.decode(payload, size), data)
        assert not native.use_avx2(False)  # they stay off until turned back on
    finally:
        native.use_avx2(True)


def _frame_values(kind: str, n: int, rng: np.random.Generator = RNG) -> tuple[np.ndarray, str]:
    """n words of a frame kind the coder meets, as bytes, and the dtype name."""
    values = (rng.standard_normal(n) * np.exp(rng.uniform(-8, 0, n))).astype(np.float32)
    if kind == "fp32":
        return values.view(np.uint8), "float32"
    if kind == "fp32 holding bf16":
        return (values.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.uint8), "float32"
    if kind == "bf16":
        return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8), "bfloat16"
    if kind == "fp64 holding fp32":
        return values.astype(np.float64).view(np.uint8), "float64"
    return rng.integers(0, 1000, n).astype(np.int64).view(np.uint8), "int64"


@pytest.mark.parametrize("kind", ["fp32", "fp32 holding bf16", "bf16", "fp64 holding fp32", "int64"])
@pytest.mark.parametrize("n", [1, 7, 4099, 65536])
def test_frame_decoder_decodes_coded_frames(kind: str, n: int) -> None:
    """Frames as the coder writes them (raw, const, bitpack and literal-only zstd planes)
    decode in one native call, exactly as plane by plane."""
    raw, name = _frame_values(kind, n)
    dtype = DTYPES[name]
    chunks = [(c.codec, c.raw_size, c.payload) for c in encode_frame(raw, dtype, EncodeOptions())]
    guarded = np.full(raw.size + 64, 0xA5, np.uint8)
    room = np.empty(raw.size, np.uint8)
    assert native.decode_frame(chunks, guarded[32:-32], room, dtype.word, dtype.is_float) is True
    assert np.array_equal(guarded[32:-32], raw)
    assert (guarded[:32] == 0xA5).all() and (guarded[-32:] == 0xA5).all()


def test_frame_decoder_covers_every_bitstream_it_claims() -> None:
    """The cases above reach each bitstream the native frame decoder handles."""
    seen = set()
    for kind in ("fp32", "fp32 holding bf16", "bf16", "fp64 holding fp32", "int64"):
        raw, name = _frame_values(kind, 65536)
        seen |= {c.codec for c in encode_frame(raw, DTYPES[name], EncodeOptions())}
    assert {RawCodec.id, ConstCodec.id, ZstdCodec.id, BitpackCodec.id} <= seen


def test_frame_decoder_leaves_other_frames_to_the_codecs() -> None:
    """A plane libzstd must decode (matches), another bitstream, or a malformed header:
    False, and the Python path decodes the frame or raises CodecError."""
    dtype = DTYPES["float32"]
    raw, _ = _frame_values("fp32 holding bf16", 4096)
    good = [(c.codec, c.raw_size, c.payload) for c in encode_frame(raw, dtype, EncodeOptions())]
    size = raw.size // 4
    planes_ = [p.copy() for p in planes.split(raw, dtype)]
    matches = zstandard.ZstdCompressor(level=3).compress(planes_[1].tobytes())
    deflated = DeflateCodec().encode(planes_[3])
    out, room = np.empty(raw.size, np.uint8), np.empty(raw.size, np.uint8)
    for swap in [(1, (ZstdCodec.id, size, matches)), (3, (DeflateCodec.id, size, deflated))]:
        frame = list(good)
        frame[swap[0]] = swap[1]
        assert native.decode_frame(frame, out, room, 4, True) is False
        assert np.array_equal(decode_frame(frame, dtype), raw)
    bad_bitpack = next(i for i, c in enumerate(good) if c[0] == BitpackCodec.id)
    broken = [
        (1, (ConstCodec.id, size, b"\0\0")),
        (0, (RawCodec.id, size, bytes(size - 1))),
        (bad_bitpack, (BitpackCodec.id, size, good[bad_bitpack][2][:-1])),
        (bad_bitpack, (BitpackCodec.id, size, bytes([0x0F, 0xF0]) + bytes(size // 8 * 4))),
        (2, (RawCodec.id, size + 1, bytes(size + 1))),
    ]
    for at, chunk in broken:
        frame = list(good)
        frame[at] = chunk
        assert native.decode_frame(frame, out, room, 4, True) is False
        with pytest.raises(CodecError):
            decode_frame(frame, dtype, np.empty(raw.size, np.uint8))
    assert native.decode_frame(good[:3], out, room, 4, True) is False
    assert native.decode_frame(good, out, room[:-1], 4, True) is False
    with pytest.raises(TypeError):
        native.decode_frame([list(c) for c in good], out, room, 4, True)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["fp32", "fp32 holding bf16", "bf16"]), st.data())
def test_frame_decoder_stays_in_bounds_on_damaged_planes(kind: str, data: st.DataObject) -> None:
    raw, name = _frame_values(kind, 20_000, np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))))
    dtype = DTYPES[name]
    chunks = [(c.codec, c.raw_size, bytearray(c.payload)) for c in encode_frame(raw, dtype, EncodeOptions())]
    k = data.draw(st.integers(0, len(chunks) - 1))
    payload = chunks[k][2]
    for _ in range(data.draw(st.integers(1, 4))):
        if payload:
            payload[data.draw(st.integers(0, len(payload) - 1))] ^= data.draw(st.integers(1, 255))
    frame = [(c, s, bytes(p)) for c, s, p in chunks]
    out = np.full(raw.size + 64, 0xA5, np.uint8)
    room = np.full(raw.size + 64, 0x5A, np.uint8)
    result = native.decode_frame(frame, out[32:-32], room[32:-32], dtype.word, dtype.is_float)
    assert isinstance(result, bool)
    assert (out[:32] == 0xA5).all() and (out[-32:] == 0xA5).all()
    assert (room[:32] == 0x5A).all() and (room[-32:] == 0x5A).all()


def _moments(n: int, rng: np.random.Generator = RNG) -> np.ndarray:
    """The exponent plane of optimizer-moment-like fp32: rows of one scale, within-row noise."""
    rows = max(1, n // 256)
    scales = np.exp(rng.uniform(-14, -4, rows)).astype(np.float32)
    values = np.abs(rng.standard_normal(rows * 256).astype(np.float32)) * np.repeat(scales, 256)
    return planes.split(values[:n].view(np.uint8), DTYPES["float32"])[-1].copy()


@settings(max_examples=60, deadline=None)
@given(_planes(), st.integers(1, 8))
def test_order1_payloads_decode_exactly_both_ways(plane: np.ndarray, segments: int) -> None:
    """The C writer's payloads, any segment count, decode in C and in numpy."""
    codec = Order1Codec()
    payload = native.order1_encode(plane, segments)
    assert payload is not None
    out = np.empty(plane.size, np.uint8)
    assert native.order1_decode(payload, out) is True and np.array_equal(out, plane)
    assert np.array_equal(codec._decode_numpy(memoryview(payload), plane.size, np.empty_like(plane)), plane)


def test_order1_beats_order0_huffman_on_moments() -> None:
    """Where neighbours share a scale, coding each exponent given the one before pays."""
    plane = _moments(1 << 20)
    assert len(Order1Codec().encode(plane)) < 0.97 * len(HuffmanZstd().encode(plane))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_damaged_order1_payloads_are_declined_or_decoded_in_bounds(data: st.DataObject) -> None:
    """Flipped bytes (header and frames), cuts and extensions: the C decoder stays within
    its buffers and returns a bool; the codec raises CodecError or returns the size asked."""
    plane = _moments(
        data.draw(st.sampled_from([1, 300, 70_000, 200_000])),
        np.random.default_rng(data.draw(st.integers(0, 99))),
    )
    _, payload = damage(data, Order1Codec().encode(plane), ["header", "flip", "cut", "extend"])
    decodes_in_bounds(native.order1_decode, payload, plane.size)
    try:
        back = Order1Codec().decode(bytes(payload), plane.size)
    except CodecError:
        return
    assert back.size == plane.size


def test_frame_decoder_decodes_order1_planes() -> None:
    """A frame whose exponent plane is huff1 decodes in the one native call; damaged, it is
    declined and the Python path raises CodecError."""
    dtype = DTYPES["float32"]
    rows = 2048
    rng = np.random.default_rng(3)
    scales = np.exp(rng.uniform(-14, -4, rows)).astype(np.float32)
    raw = (np.abs(rng.standard_normal(rows * 128)).astype(np.float32) * np.repeat(scales, 128)).view(np.uint8)
    chunks = encode_frame(raw, dtype, EncodeOptions(context_exponents=True))
    assert chunks[-1].codec == Order1Codec.id
    frame = [(c.codec, c.raw_size, c.payload) for c in chunks]
    out, room = np.empty(raw.size, np.uint8), np.empty(raw.size, np.uint8)
    assert native.decode_frame(frame, out, room, 4, True) is True and np.array_equal(out, raw)
    damaged = list(frame)
    damaged[-1] = (Order1Codec.id, raw.size // 4, frame[-1][2][:-3])
    assert native.decode_frame(damaged, out, room, 4, True) is False
    with pytest.raises(CodecError):
        decode_frame(damaged, dtype, np.empty(raw.size, np.uint8))


def test_pread_many_reads_like_pread(tmp_path: Path) -> None:
    """Each read as ``os.pread`` gives it: short only past the end, empty reads, repeats."""
    path = tmp_path / "f"
    path.write_bytes(np.random.default_rng(3).integers(0, 256, 100_000, dtype=np.uint8).tobytes())
    fd = os.open(path, os.O_RDONLY)
    try:
        spans = [(0, 10), (99_990, 50), (5, 0), (200_000, 8), (0, 100_000), (17, 4096), (17, 4096)]
        offsets, sizes = (np.array(c, np.int64) for c in zip(*spans, strict=True))
        assert native.pread_many(fd, offsets, sizes) == [os.pread(fd, n, at) for at, n in spans]
        assert native.pread_many(fd, np.zeros(0, np.int64), np.zeros(0, np.int64)) == []
        with pytest.raises(ValueError, match="negative"):
            native.pread_many(fd, np.array([-1], np.int64), np.array([1], np.int64))
        with pytest.raises(ValueError, match="one length"):
            native.pread_many(fd, np.array([0, 1], np.int64), np.array([1], np.int64))
    finally:
        os.close(fd)
    with pytest.raises(OSError):
        native.pread_many(fd, np.array([0], np.int64), np.array([1], np.int64))  # closed


def test_checksums_are_xxh3_64() -> None:
    """The vendored xxHash and python xxhash (an independent implementation) agree on every length class of xxh3_64 (0-16,
    17-128, 129-240, long with and without a partial stripe and block), one range at a time
    or many at once, and both refuse a range outside the buffer."""
    import xxhash

    from ckptz import checksums

    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, 3 << 20, dtype=np.uint8)
    sizes = [0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1023, 1024, 1025, 16 << 10, (1 << 20) + 7]
    offsets = [int(o) for o in rng.integers(0, 1 << 20, len(sizes))]
    want = [xxhash.xxh3_64_intdigest(data[o : o + n].tobytes()) for o, n in zip(offsets, sizes, strict=True)]
    assert [checksums.xxh3_64(data[o : o + n]) for o, n in zip(offsets, sizes, strict=True)] == want
    got = checksums.xxh3_64_ranges(data, np.array(offsets), np.array(sizes))
    assert got.dtype == np.uint64 and got.tolist() == want
    assert (
        checksums.xxh3_64_ranges(memoryview(data.tobytes()), np.array(offsets), np.array(sizes)).tolist()
        == want
    )
    for o, n in ((0, data.size + 1), (data.size, 1), (-1, 2), (5, -1)):
        with pytest.raises(ValueError, match="outside"):
            checksums.xxh3_64_ranges(data, np.array([0, o]), np.array([1, n]))
    # Each of many separate buffers (bytes, memoryviews, arrays; small and large), one call.
    parts = [
        data[o : o + n]
        if k % 3 == 0
        else data[o : o + n].tobytes()
        if k % 3 == 1
        else memoryview(data[o : o + n])
        for k, (o, n) in enumerate(zip(offsets, sizes, strict=True))
    ]
    assert checksums.xxh3_64_each(parts) == want
    assert checksums.xxh3_64_each(tuple(parts[:3])) == want[:3]
    assert checksums.xxh3_64_each([]) == []
    with pytest.raises(TypeError):
        checksums.xxh3_64_each([b"x", 1])
    # Streamed in parts over several calls, many inputs at once on states taken and given
    # back (more than one table of them): the same hashes, after every call.
    streams = checksums.Streams()
    states = [streams.take() for _ in sizes] + [streams.take() for _ in range(300)]
    assert len(set(states)) == len(states)
    cuts = [sorted({0, n, *(int(c) for c in rng.integers(0, n + 1, 3))}) for n in sizes]
    for k in range(5):
        jobs = [
            (s, [data[o + cut[k] : o + cut[k + 1]], b""], k == 0)
            for s, o, cut in zip(states, offsets, cuts, strict=False)
            if k + 1 < len(cut)
        ]
        want = [
            xxhash.xxh3_64_intdigest(data[o : o + cut[k + 1]].tobytes())
            for o, cut in zip(offsets, cuts, strict=True)
            if k + 1 < len(cut)
        ]
        assert streams.update(jobs) == want
    assert streams.update([]) == []
    for s in states:
        streams.give(s)
    assert streams.take() in states
    table = np.zeros((2, native.xxh3_state_bytes), np.uint8)
    with pytest.raises(IndexError, match="row outside"):
        native.xxh3_64_streams([(table, 2, True, [b"x"])])
    with pytest.raises(TypeError):
        native.xxh3_64_streams([(table, 0, True, [1])])
    with pytest.raises(TypeError, match="a job is"):
        native.xxh3_64_streams([(table, 0)])


def test_pread_into_fills_each_place_as_pread_would(tmp_path: Path) -> None:
    """Each read lands at its place in the buffer (reads that follow on in file and buffer
    made as one); the count is short only where the file ends, and reads stop there; bad
    tables and places outside the buffer are refused."""
    data = np.random.default_rng(4).integers(0, 256, 100_000, dtype=np.uint8)
    path = tmp_path / "f"
    path.write_bytes(data.tobytes())
    fd = os.open(path, os.O_RDONLY)
    try:
        # (file offset, buffer offset, bytes): back to back in both, apart, empty, reordered.
        reads = [(0, 0, 10), (10, 10, 20), (500, 40, 7), (5, 60, 0), (90_000, 64, 4096), (17, 5000, 100)]
        at, to, n = (np.array(c, np.int64) for c in zip(*reads, strict=True))
        buf = np.zeros(6000, np.uint8)
        assert native.pread_into(fd, buf, at, to, n) == sum(r[2] for r in reads)
        want = np.zeros(6000, np.uint8)
        for a, t, k in reads:
            want[t : t + k] = data[a : a + k]
        assert np.array_equal(buf, want)
        # Past the end: short, and the reads after it are not made.
        buf[:] = 0
        got = native.pread_into(
            fd,
            buf,
            np.array([99_990, 0], np.int64),
            np.array([0, 100], np.int64),
            np.array([50, 5], np.int64),
        )
        assert got == 10 and np.array_equal(buf[:10], data[99_990:]) and not buf[100:105].any()
        with pytest.raises(ValueError, match="outside"):
            native.pread_into(
                fd, buf, np.array([0], np.int64), np.array([5990], np.int64), np.array([11], np.int64)
            )
        with pytest.raises(ValueError, match="one length"):
            native.pread_into(
                fd, buf, np.array([0, 1], np.int64), np.array([0], np.int64), np.array([1], np.int64)
            )
        with pytest.raises(TypeError):
            native.pread_into(fd, bytes(10), at[:1], to[:1], n[:1])  # not writable
    finally:
        os.close(fd)
    with pytest.raises(OSError):
        native.pread_into(fd, buf, np.array([0], np.int64), np.array([0], np.int64), np.array([1], np.int64))


# -- pickle_scan: the opcode pass of ckptz.formats.pickle_walk ---------------------------------


def _genops_view(data: bytes) -> tuple[int, int, int] | None:
    """What pickle_scan should say of ``data``: pickletools.genops' opcode count, largest
    binary memo index and protocol (-1: none), or None where genops raises."""
    import pickletools

    count, put, proto = 0, 0, -1
    try:
        for count, (op, arg, _) in enumerate(pickletools.genops(data), 1):  # noqa: B007
            if op.name in ("BINPUT", "LONG_BINPUT"):
                put = max(put, arg)
            elif op.name == "PUT":
                return None  # a text memo index: the native pass leaves it to genops
            elif op.name == "PROTO":
                proto = max(proto, arg)
    except ValueError:
        return None
    return count, put, proto


_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=300),
)
_objects = st.recursive(
    _leaves,
    lambda kids: st.one_of(
        st.lists(kids, max_size=5),
        st.tuples(kids, kids),
        st.dictionaries(st.text(max_size=8), kids, max_size=5),
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(_objects, st.integers(0, 5), st.data())
def test_pickle_scan_agrees_with_genops(obj: object, protocol: int, data: st.DataObject) -> None:
    """On pickles of every protocol, whole or damaged (bytes changed, cut short), the native
    pass gives genops' own count, memo index and protocol, or is unsure; it never passes a
    pickle genops rejects. Protocol 2+ pickles of plain objects pass natively."""
    import pickle

    from ckptz.formats import pickle_walk

    whole = pickle.dumps(obj, protocol=protocol)
    damaged = bytearray(whole)
    for _ in range(data.draw(st.integers(0, 3))):
        damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    cut = whole[: data.draw(st.integers(0, len(whole)))]
    for pkl in (whole, bytes(damaged), cut):
        got = native.pickle_scan(pkl, pickle_walk._KINDS)
        want = _genops_view(pkl)
        if got is not None:
            assert got == want
    if protocol >= 2 and not any(c in whole for c in (b"\\",)):
        assert native.pickle_scan(whole, pickle_walk._KINDS) == _genops_view(whole)


def test_pickle_scan_cases() -> None:
    """A torch pickle passes natively; a huge memo index, a protocol from the future, an
    unknown opcode, text arguments and a missing STOP are left to genops, which rejects
    them with its own messages."""
    import io
    import pickle
    import struct
    import zipfile

    import torch

    from ckptz.errors import FormatError
    from ckptz.formats import pickle_walk

    buf = io.BytesIO()
    torch.save({"w": torch.zeros(3), "step": 7, "name": "layer"}, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as zf:
        pkl = zf.read(next(n for n in zf.namelist() if n.endswith("data.pkl")))
    assert native.pickle_scan(pkl, pickle_walk._KINDS) == _genops_view(pkl)
    assert pickle_walk._opcodes_fine(pkl)
    huge = b"\x80\x02N" + b"r" + struct.pack("<I", 0xFFFFFFF0) + b"."
    assert native.pickle_scan(huge, pickle_walk._KINDS) == (4, 0xFFFFFFF0, 2)
    assert not pickle_walk._opcodes_fine(huge)
    with pytest.raises(FormatError, match="memo index"):
        pickle_walk._check_opcodes(huge)
    future = b"\x80\x09N."
    assert not pickle_walk._opcodes_fine(future)
    with pytest.raises(FormatError, match="protocol"):
        pickle_walk._check_opcodes(future)
    for unsure in (b"\x80\x02\xffN.", b"(p99999999999999\n.", b"cos\nsystem\n\\.", b"\x80\x02N", b"I12\n."):
        assert native.pickle_scan(unsure, pickle_walk._KINDS) is None
    with pytest.raises(FormatError, match="memo index"):
        pickle_walk._check_opcodes(b"(p99999999999999\n.")
    assert native.pickle_scan(pickle.dumps([1, 2], protocol=2), pickle_walk._KINDS) is not None
    # Text: surrogates pass as genops lets them; bytes that are not UTF-8 are its to reject.
    for text in ("\ud800x", "é€\U0001f600"):
        pkl = pickle.dumps(text, protocol=4)
        assert native.pickle_scan(pkl, pickle_walk._KINDS) == _genops_view(pkl) is not None
    for bad in (b"\xc0\xaf", b"\xe0\x80\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80"):
        pkl = b"\x80\x04\x8c" + bytes([len(bad)]) + bad + b"."
        assert native.pickle_scan(pkl, pickle_walk._KINDS) is None and _genops_view(pkl) is None
    with pytest.raises(ValueError, match="256"):
        native.pickle_scan(pkl, b"short")


def test_a_build_without_a_compiler_says_what_to_install(tmp_path: Path) -> None:
    """The extension is required: where it cannot be compiled the install fails with one line
    naming what to install, not with an install that silently lacks it."""
    repo = Path(__file__).resolve().parent.parent
    (tmp_path / "ckptz").mkdir()
    (tmp_path / "setup.py").write_text((repo / "setup.py").read_text())
    subprocess.run(["cp", "-r", str(repo / "ckptz" / "native_src"), str(tmp_path / "ckptz")], check=True)
    done = subprocess.run(
        [sys.executable, "setup.py", "build_ext", "--build-lib", "lib", "--build-temp", "tmp"],
        cwd=tmp_path,
        env={**os.environ, "CC": str(tmp_path / "no-such-compiler")},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "error: ckptz needs a C compiler and Python headers: apt-get install build-essential"
    )
    assert not list(tmp_path.rglob("_native*.so"))
