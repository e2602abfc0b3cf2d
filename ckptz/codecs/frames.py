"""Frames: a run of a stream's bytes, transformed into planes, each plane coded as one chunk.

This is the CPU frame coder. Per plane, cheapest first:

1. a plane of one repeated byte (zero rows, the low planes of fp32 tensors that hold
   bf16-exact values) becomes ``const``: one byte;
2. a plane that looks like noise on a strided sample (near 8 bits of order-0 entropy and
   no more zeros than noise has: trained mantissas) is stored ``raw`` without trying a
   coder, which is where most of the time would otherwise go;
3. a float's exponent plane gets Huffman coding:
   :class:`~ckptz.codecs.cpu.HuffmanZstd`, zstd frames of Huffman-coded literal blocks
   whose ends follow the plane's statistics, 0.2-1.6% smaller than deflate and decoded
   2-3x faster. Where the sample is at least 20% zeros (a fine-tune's unseen rows)
   level-``level`` zstd is tried as well. With
   ``context_exponents`` (the CPU engine sets it on float streams from ``--level`` 10;
   below, ``measured_contexts`` sets it per plane where a sparse sample of the plane's byte
   pairs estimates that order-1 contexts save clearly: Adam second moments),
   ``huff1`` is tried too: each exponent coded given the bucket of the one before it
   (:mod:`ckptz.codecs.order1`), and ``huff2d``, each exponent's residual from a prediction
   by its neighbours in the row and the row above (:mod:`ckptz.codecs.order2d`), which
   stands in for ``huff1`` where it is smaller (Adam second moments); and with either
   option a float's lowest plane (its sign in bit 0) tries ``sign2d``, each sign coded given
   the signs left, up and up-left (:mod:`ckptz.codecs.sign2d`), kept where it saves the
   margin over the plane's other coding (first moments of rows that move together);
4. any other plane in which only ``k`` bit positions vary and that has about ``k`` bits of
   entropy (sign bits of bf16-exact fp32, ``exp_avg_sq``'s low plane) is ``bitpack``-ed;
5. any other plane (zero runs, 7-bit mantissas) gets ``zstd``; a low-entropy one that is
   not mostly zeros (sign bits) Huffman-coded zstd too, and so does any plane not mostly
   zeros of a float coded with either context option (mantissas that are not noise);

and any coded chunk not smaller than its plane is stored ``raw`` instead. The ``ctx``
bitstream (neighbour-context coding) still decodes but is no longer chosen: on trained
data it saved < 1% over block-adaptive Huffman at a third of the speed; nor is
``deflate``, which older containers hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ckptz.codecs import cpu_codec, huffexp, order1, order2d, sign2d
from ckptz.codecs.base import Codec
from ckptz.codecs.bitpack import BitpackCodec, packed_size
from ckptz.codecs.cpu import ConstCodec, HuffmanZstd, RawCodec, ZstdCodec
from ckptz.codecs.huffexp import HuffexpCodec
from ckptz.codecs.native import native
from ckptz.codecs.order1 import Order1Codec
from ckptz.codecs.order2d import Order2dCodec
from ckptz.codecs.planes import merge, scratch, split_owned, split_sampled
from ckptz.codecs.sign2d import Sign2dCodec
from ckptz.dtypes import DType
from ckptz.errors import CodecError

#: Bytes sampled to judge whether a plane is noise; enough for an entropy estimate
#: within ~0.02 bit of 8 on uniform bytes.
SAMPLE = 16384
#: Estimated bits per byte above which a plane is stored raw: Huffman could save at most
#: ~1% there, and zstd would spend most of the frame's time finding that out.
NOISE_BITS = 7.9
#: Share of zero bytes in the sample above which a noisy plane is still worth zstd:
#: noise has 1/256 (0.39%) zeros, 4 sigma above that on a 16 K sample is ~0.6%; a
#: fine-tune's zero rows add more, and zstd codes their runs nearly free.
NOISE_ZERO_SHARE = 0.008

#: Share of zeros in an exponent plane's sample from which level-``level`` zstd is tried
#: beside Huffman coding: its runs save ~log2(1/share) bits per zero, its matches cost
#: ~25% more on the rest. Measured on trained checkpoints: zstd won at 23-34% zeros (Adam
#: states with untouched rows), lost by 17-20% at 9-19% (gradients).
ZSTD_ZEROS = 0.2
#: Share of the best order-0 payload that ``huff1`` must save to be chosen: it decodes
#: 2-3x slower (bench/context.py), so a tie goes to the faster bitstream.
CONTEXT_MARGIN = 0.01
#: With ``measured_contexts``, the estimated saving of order-1 buckets over one table
#: (:func:`ckptz.codecs.order1.saving`, a sparse sample) from which an exponent plane tries
#: ``huff1`` and ``huff2d``: Adam second moments score 0.29-0.4 and come out 10-12% smaller
#: than Huffman coding alone; first moments score 0.11-0.13 and weights 0.01-0.04, where
#: ``huff1`` saves at most ~1% and would cost 2.5x the plane's coding time (first moments
#: whose embedding rows see no tokens score ~0.27 and save ~3%).
CLEAR_CONTEXT_SAVING = 0.2
#: With ``measured_contexts``, the most sampled signs that ``sign2d``'s row width may
#: mispredict for a lowest plane to be coded with it: first moments of embedding rows that
#: see no tokens miss ~0.27 (the plane 4% smaller), weights and first moments of a run over
#: the whole vocabulary 0.42-0.43 where a width is found at all (about 1% of the plane, for
#: a third of a frame's coding and decoding time).
CLEAR_SIGN_MISS = 0.35
#: Share of a float's plane below its exponents that ``huffexp`` (its bytes given their
#: exponent's bucket) must save over the plane's other coding to be chosen: it decodes at
#: about the speed of Huffman-coded zstd, where a stored plane costs a copy, so a fifth of
#: :data:`CONTEXT_MARGIN`; trained weights save 0.5-0.7% of the plane (bf16: its mantissa and
#: sign; fp32: the mantissa's top byte).
MANTISSA_MARGIN = 0.002
#: The finest block the Huffman frames plan (literals_encode.c's SUB).
BLOCK = 8192
#: Bits per byte that bit packing may cost above the sample's entropy estimate.
PACK_SLACK = 0.1
#: Below this many sampled bits per byte a non-exponent plane may favour Huffman ...
LOW_BITS = 4.0
#: ... unless zeros are this common: then zstd's runs win (a mostly-zero low plane).
RUN_SHARE = 0.75


@dataclass(frozen=True, slots=True)
class EncodeOptions:
    """How hard to try (a second coder is tried only where the sample says it may win).

    Attributes:
        level: zstd level for the planes worth coding (1-22).
        context_exponents: also try ``huff1`` (each exponent coded
            given the one before it) and ``huff2d`` (given its row neighbours) on exponent
            planes, and ``sign2d`` (signs given the row above) on a float's lowest plane, and
            keep the smaller payload.
        measured_contexts: as ``context_exponents``, but an exponent plane tries ``huff1``
            and ``huff2d`` only where a sparse sample estimates that order-1 contexts save at
            least :data:`CLEAR_CONTEXT_SAVING` (Adam second moments), and a lowest plane
            ``sign2d`` only where the row width found mispredicts at most
            :data:`CLEAR_SIGN_MISS` of the sampled signs; the measurements cost a few percent
            of the coding time of the planes that do not pay. Either option also tries
            Huffman coding beside zstd on a float's planes that are neither noise nor
            mostly zeros.
    """

    level: int = 3
    context_exponents: bool = False
    measured_contexts: bool = False


@dataclass(frozen=True, slots=True)
class EncodedChunk:
    """One coded plane of a frame."""

    codec: int
    raw_size: int
    payload: bytes


_RAW = RawCodec()
_CONST = ConstCodec()
_ZSTD: dict[int, ZstdCodec] = {}
_HUFFMAN = HuffmanZstd()
_BITPACK = BitpackCodec()
_ORDER1 = Order1Codec()
_ORDER2D = Order2dCodec()
_SIGN2D = Sign2dCodec()
_HUFFEXP = HuffexpCodec()


def _zstd(level: int) -> ZstdCodec:
    codec = _ZSTD.get(level)
    if codec is None:
        codec = _ZSTD.setdefault(level, ZstdCodec(level))
    return codec


@dataclass(frozen=True, slots=True)
class PlaneStats:
    """What the coder chooses a plane's bitstream from.

    Attributes:
        bits: order-0 entropy (bits per byte) of a strided sample of ~16 K bytes.
        zeros: share of zero bytes in that sample.
        ones: AND of every byte (the bits set everywhere).
        any: OR of every byte (the bits set somewhere).
    """

    bits: float
    zeros: float
    ones: int
    any: int

    @property
    def constant(self) -> bool:
        return self.ones == self.any

    @property
    def fixed(self) -> int:
        """Bit positions that are the same in every byte."""
        return ~(self.ones ^ self.any) & 0xFF

    @property
    def noise(self) -> bool:
        """Near 8 bits of entropy and no more zeros than noise has: not worth coding."""
        return self.bits > NOISE_BITS and self.zeros <= NOISE_ZERO_SHARE


def plane_stats(plane: np.ndarray) -> PlaneStats:
    """A non-empty plane's :class:`PlaneStats` (one C pass)."""
    return PlaneStats(*native.plane_stats(plane, SAMPLE))


def looks_like_noise(plane: np.ndarray) -> bool:
    """True if a strided sample of ``plane`` has near 8 bits of entropy and few zeros."""
    return plane_stats(plane).noise


def encode_plane(
    plane: np.ndarray,
    options: EncodeOptions,
    *,
    exponent: bool = False,
    signs: bool = False,
    stats: PlaneStats | None = None,
    owned: bytes | None = None,
) -> EncodedChunk:
    """Code one plane with the cheapest bitstream.

    Args:
        plane: the plane's bytes (1-D uint8).
        options: how hard to try.
        exponent: the plane holds float exponents (Huffman coding is the first choice).
        signs: the plane holds float signs in bit 0 (a rotated float's lowest plane).
        stats: the plane's statistics if already known (computed here otherwise).
        owned: the plane's bytes as an object of their own, which a plane stored raw
            becomes without a copy (else it is copied out of ``plane``).
    """
    chunk = _encode_plane(plane, options, exponent=exponent, stats=stats, owned=owned)
    if signs and (options.context_exponents or options.measured_contexts) and plane.size:
        # Row-predicted signs replace the plane's choice only where they save the margin a
        # slower decoder must; declined (None) where no row width predicts the signs.
        signed = sign2d.encode(plane, most_miss=1.0 if options.context_exponents else CLEAR_SIGN_MISS)
        if signed is not None and len(signed) < (1 - CONTEXT_MARGIN) * len(chunk.payload):
            return EncodedChunk(_SIGN2D.id, plane.size, signed)
    return chunk


def _encode_plane(
    plane: np.ndarray,
    options: EncodeOptions,
    *,
    exponent: bool,
    stats: PlaneStats | None,
    owned: bytes | None,
) -> EncodedChunk:
    size = plane.size
    if size == 0:
        return EncodedChunk(_RAW.id, 0, b"")
    if stats is None:
        stats = plane_stats(plane)
    if stats.constant:
        return EncodedChunk(_CONST.id, size, bytes([stats.ones]))
    if stats.noise:
        return EncodedChunk(_RAW.id, size, _RAW.encode(plane) if owned is None else owned)
    bits, zeros = stats.bits, stats.zeros
    context = False
    zstd = _zstd(options.level)
    if exponent:
        # Zero runs: level-3 matching wins where they fill whole rows (optimizer states of a
        # fine-tune).
        candidates: list[Codec] = [_HUFFMAN, zstd] if zeros >= ZSTD_ZEROS else [_HUFFMAN]
        context = options.context_exponents or (
            options.measured_contexts and order1.saving(plane) >= CLEAR_CONTEXT_SAVING
        )
    else:
        fixed = stats.fixed
        if fixed and 8 - bin(fixed).count("1") < bits + PACK_SLACK:
            # Only k bits vary and the sample's entropy is about k: packing them is
            # as small as any entropy coder gets, exact and faster.
            payload = _BITPACK.encode(plane, (fixed, stats.ones & fixed))
            assert len(payload) == packed_size(size, fixed)
            return EncodedChunk(_BITPACK.id, size, payload)
        # A low-entropy plane without long zero runs (the sign bits of bf16-exact fp32) is
        # where zstd's short LZ matches cost more than Huffman's one bit per byte: literal
        # zstd is within 0.3% of deflate there, at twice its speed. A float's coder with
        # either context option tries it on every such plane: block-adaptive Huffman codes
        # mantissa bytes that are not noise (a MiniLM's) 1.5-5% below level-3 zstd.
        low = bits < LOW_BITS or options.context_exponents or options.measured_contexts
        candidates = [zstd, _HUFFMAN] if low and zeros < RUN_SHARE else [zstd]
    ordered, ordered_id = None, _ORDER1.id
    if context:
        # huff1 decodes at a third to half the speed of Huffman-coded zstd, so it must save
        # CONTEXT_MARGIN. Where it saves that below the entropy of the plane's 8 KiB blocks,
        # no order-0 code (one table per run of blocks) can catch up: if that is the only
        # other candidate (no LZ matching, which can go below, for zero runs), it is not
        # tried, which halves the cost of trying huff1.
        # A plane whose pair counts choose no context split (dense weights) is declined
        # before it is coded: huff1 would tie with Huffman coding there at twice the time.
        ordered = order1.encode(plane, contextual_only=True)
        # Row-predicted exponents take huff1's place where smaller; declined (None) where no
        # row width predicts better than the left neighbour, so other planes code as before.
        rowed = order2d.encode(plane)
        if rowed is not None and (ordered is None or len(rowed) < len(ordered)):
            ordered, ordered_id = rowed, _ORDER2D.id
        alone = candidates == [_HUFFMAN]
        if (
            ordered is not None
            and alone
            and len(ordered) < (1 - CONTEXT_MARGIN) * native.blocked_entropy(plane, BLOCK)
        ):
            return EncodedChunk(ordered_id, size, ordered)
    best_id, best = _RAW.id, b""
    for codec in candidates:
        payload = codec.encode(plane)
        if len(payload) < (len(best) if best else size):
            best_id, best = codec.id, payload
    if ordered is not None and len(ordered) < (1 - CONTEXT_MARGIN) * (len(best) if best else size):
        best_id, best = ordered_id, ordered
    if not best:
        return EncodedChunk(_RAW.id, size, _RAW.encode(plane) if owned is None else owned)
    return EncodedChunk(best_id, size, best)


def encode_frame(raw: np.ndarray, dtype: DType, options: EncodeOptions) -> list[EncodedChunk]:
    """Transform one frame (a 1-D uint8 array of whole words) and code each plane.

    With the C extension each plane is a bytes object of its own, and a plane stored raw is
    its payload as it is (no copy: a pass over its memory and a wait for the GIL fewer);
    otherwise the planes live in this thread's scratch buffer and every payload
    is a copy.
    """
    owned = split_owned(raw, dtype, SAMPLE)
    if owned is not None:
        blobs: list[bytes | None] = list(owned[0])
        planes = [np.frombuffer(b, np.uint8) for b in owned[0]]
        sampled = owned[1]
    else:
        planes, sampled = split_sampled(raw, dtype, scratch("planes", raw.size), SAMPLE)
        blobs = [None] * len(planes)
    stats = [PlaneStats(*s) for s in sampled] if sampled else [None] * len(planes)
    top = len(planes) - 1
    chunks = [
        encode_plane(
            p,
            options,
            exponent=dtype.is_float and i == top,
            signs=dtype.is_float and i == 0,
            stats=st,
            owned=blob,
        )
        for i, (p, st, blob) in enumerate(zip(planes, stats, blobs, strict=True))
    ]
    if dtype.is_float and len(planes) >= 2 and planes[0].size:
        chunks[-2] = _given_exponents(planes[-2], planes[-1], chunks[-2], options)
    return chunks


def _given_exponents(
    plane: np.ndarray, top: np.ndarray, chunk: EncodedChunk, options: EncodeOptions
) -> EncodedChunk:
    """A float's plane below its exponents (a bf16's mantissa and sign, an fp32's top mantissa
    byte) coded ``huffexp`` (each byte given the bucket of its element's exponent byte,
    ``top``) in place of ``chunk`` where it saves :data:`MANTISSA_MARGIN`; tried with
    ``context_exponents`` only. The default level (``measured_contexts``) leaves it out: on
    trained weights it saves 0.5-0.7% of the plane, short of what would pay for restores 3x
    slower that leave the GPU, and even the sparse estimate of the buckets' saving cost the
    default a tenth of its coding time on every float frame."""
    if not options.context_exponents:
        return chunk
    payload = huffexp.encode(plane, top)
    if payload is not None and len(payload) < (1 - MANTISSA_MARGIN) * len(chunk.payload):
        return EncodedChunk(_HUFFEXP.id, plane.size, payload)
    return chunk


def decode_frame(
    chunks: list[tuple[int, int, bytes | memoryview]], dtype: DType, out: np.ndarray | None = None
) -> np.ndarray:
    """Decode ``(codec id, raw size, payload)`` per plane and undo the transform.

    Args:
        chunks: one per plane, lowest first.
        dtype: the stream's transform.
        out: a 1-D uint8 array of the frame's size to decode into (e.g. a slice of the
            whole tensor); by default a new array.

    Returns:
        ``out``, or the new array.

    Raises:
        CodecError: a payload is malformed, or the planes disagree in size.
        CodecUnavailableError: a plane's bitstream has no CPU decoder.
    """
    if len(chunks) != max(dtype.word, 1) or len({size for _, size, _ in chunks}) > 1:
        raise CodecError("frame planes do not match the stream's dtype", codec="frame")
    if out is not None and out.size != chunks[0][1] * len(chunks):
        raise ValueError(f"output of {out.size} bytes for a frame of {chunks[0][1] * len(chunks)}")
    if out is None and dtype.word > 1:
        out = np.empty(chunks[0][1] * len(chunks), np.uint8)
    # Planes decode into this thread's scratch where their codec can: merge() copies them
    # out, and fresh plane-sized arrays would fault in new pages on every frame.
    room = scratch("decoded", chunks[0][1] * len(chunks)) if out is not None else None
    # The usual frame (raw, const, bitpack and literal-only zstd planes) in one call that
    # holds no GIL: Python per plane cost as much as a bitpack plane's decoding.
    if (
        out is not None
        and room is not None
        and dtype.word in (2, 4, 8)
        and native.decode_frame(chunks, out, room, dtype.word, dtype.is_float)
    ):
        return out
    planes: list[np.ndarray | int] = [0] * len(chunks)
    # The top plane first: a huffexp plane's contexts are its bytes.
    for k in reversed(range(len(chunks))):
        codec, size, payload = chunks[k]
        if codec == _HUFFEXP.id:
            if k == len(chunks) - 1:
                raise CodecError(
                    "huffexp chunk in a frame's top plane, which has no context", codec=_HUFFEXP.name
                )
            top = planes[-1]
            context = np.full(size, top, np.uint8) if isinstance(top, int) else top
            into = room[k * size : (k + 1) * size] if room is not None else None
            planes[k] = _HUFFEXP.decode_given(payload, size, context, into)
        elif codec == _CONST.id and size and out is not None:
            if len(payload) != 1:
                raise CodecError(
                    f"constant chunk payload is {len(payload)} bytes, expected 1", codec=_CONST.name
                )
            planes[k] = payload[0]  # merge() fills it in: no plane-sized array
        elif codec == _RAW.id and out is not None:
            # merge() copies the plane anyway: skip the codec's defensive copy.
            if len(payload) != size:
                raise CodecError(f"stored chunk holds {len(payload)} bytes, expected {size}", codec=_RAW.name)
            planes[k] = np.frombuffer(payload, dtype=np.uint8)
        else:
            into = room[k * size : (k + 1) * size] if room is not None else None
            planes[k] = cpu_codec(codec).decode_into(payload, size, into)
    return merge(planes, dtype, out)
