"""A second reader of the `.ckptz` format, written from docs/FORMAT.md alone.

It imports nothing of ckptz: only the standard library, numpy, ``zstandard`` (RFC 8878
frames) and ``xxhash``. tests/test_conformance.py decodes the conformance vectors and the
frozen fixtures with it, so a gap between FORMAT.md and what ckptz writes fails a test. It
is a reference, not fast: every chunk is decoded on its own, in Python.
"""

from __future__ import annotations

import itertools
import json
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash
import zstandard

MAGIC, END_MAGIC = b"CKPTZ\x00\r\n", b"CKPTZEND"
HEADER = struct.Struct("<8sHHI")
FOOTER = struct.Struct("<QQQQHHI8s")
SEGMENT = struct.Struct("<IQ")
FRAME = struct.Struct("<IHHQQ")
CHUNK = struct.Struct("<QQQQBB")


class FormatViolation(ValueError):
    """The file breaks a MUST of FORMAT.md."""


def _need(condition: bool, what: str) -> None:
    if not condition:
        raise FormatViolation(what)


def _zstd(payload: bytes, size: int) -> bytes:
    declared = zstandard.frame_content_size(payload)
    _need(declared in (-1, size), "zstd frame declares another size")
    out = zstandard.ZstdDecompressor().decompress(payload, max_output_size=max(size, 1))
    _need(len(out) == size, "zstd frame decodes to another size")
    return out


def _bitpack(payload: bytes, n: int) -> bytes:
    _need(len(payload) >= 2, "bitpack payload too short")
    fixed, value = payload[0], payload[1]
    _need(value & ~fixed & 0xFF == 0, "bitpack value outside its fixed mask")
    varying = [b for b in range(8) if not fixed >> b & 1]
    m = (n + 7) // 8
    _need(len(payload) == 2 + len(varying) * m, "bitpack payload size")
    out = np.full(n, value, dtype=np.uint8)
    for row, bit in enumerate(varying):
        packed = np.frombuffer(payload, np.uint8, m, 2 + row * m)
        bits = np.unpackbits(packed, bitorder="little")[:n]
        out |= (bits << bit).astype(np.uint8)
    return out.tobytes()


def _ctx(payload: bytes, n: int) -> bytes:
    _need(len(payload) >= 9, "ctx payload too short")
    version, a, b = struct.unpack_from("<BII", payload)
    _need(version == 1 and 9 + a + b <= len(payload), "ctx header")
    sizes = ((n + 3) // 4, (n + 1) // 4, n // 2)
    frames = (payload[9 : 9 + a], payload[9 + a : 9 + a + b], payload[9 + a + b :])
    p0, p1, p2 = (np.frombuffer(_zstd(f, s), np.uint8) for f, s in zip(frames, sizes, strict=True))
    out = np.zeros(n, dtype=np.uint8)
    out[0::4] = p0

    def contexts(known: np.ndarray, count: int) -> np.ndarray:
        left = known[:count].astype(np.int32)
        right = known[1 : count + 1].astype(np.int32)
        right = np.concatenate((right, left[right.size :]))  # no right neighbour: the left one
        return ((left + right + 1) >> 1).astype(np.uint8)

    def place(grouped: np.ndarray, ctx: np.ndarray) -> np.ndarray:
        target = np.empty(ctx.size, dtype=np.uint8)
        target[np.argsort(ctx, kind="stable")] = grouped
        return target

    out[2::4] = place(p1, contexts(p0, sizes[1]))
    out[1::2] = place(p2, contexts(out[0::2], sizes[2]))
    return out.tobytes()


def _huff2d(payload: bytes, n: int) -> bytes:
    _need(len(payload) >= 4, "huff2d payload too short")
    (width,) = struct.unpack_from("<I", payload)
    _need(width >= 1, "huff2d row width")
    return _huff1(payload[4:], n, width)


def _sign2d(payload: bytes, n: int) -> bytes:
    m = -(-n // 8)
    _need(len(payload) >= 8, "sign2d payload too short")
    width, framed = struct.unpack_from("<II", payload)
    _need(width >= 1 and len(payload) == 8 + framed + 7 * m, "sign2d width or sizes")
    residual = np.unpackbits(np.frombuffer(_zstd(payload[8 : 8 + framed], m), np.uint8), bitorder="little")
    rows = np.frombuffer(payload[8 + framed :], np.uint8).reshape(7, m) if m else np.zeros((7, 0), np.uint8)
    out = np.zeros(n, np.uint8)
    for b in range(1, 8):
        out |= np.unpackbits(rows[b - 1], bitorder="little")[:n] << b
    signs = bytearray(n)
    for j in range(n):
        if j > width:
            pred = signs[j - 1] ^ signs[j - width] ^ signs[j - width - 1]
        else:
            pred = signs[j - 1] if j else 0
        signs[j] = int(residual[j]) ^ pred
    return (out | np.frombuffer(bytes(signs), np.uint8)).tobytes()


def _huffexp(payload: bytes, n: int, top: bytes) -> bytes:
    """huffexp: huff1's payload whose contexts are the bytes of the frame's top plane."""
    _need(len(top) == n, "huffexp top plane")
    return _huff1(payload, n, top=top)


def _huff1(payload: bytes, n: int, width: int = 0, top: bytes | None = None) -> bytes:
    """huff1, or with a row ``width`` the huff1 part of huff2d (contexts are predictions,
    bytes are residuals), or with a ``top`` plane huffexp (contexts are its bytes)."""
    _need(len(payload) >= 4, "huff1 payload too short")
    version, k, s, reserved = payload[:4]
    _need(version == 1 and 1 <= k <= 16 and 1 <= s <= 8 and reserved == 0, "huff1 header")
    _need(len(payload) >= 4 + (k - 1) + 8 * k + 4 * k * (s - 1), "huff1 payload shorter than its header")
    starts = [0, *payload[4 : 3 + k], 256]
    _need(all(x < y for x, y in itertools.pairwise(starts)), "huff1 bucket starts")
    at = 3 + k
    counts = struct.unpack_from(f"<{k}I", payload, at)
    sizes = struct.unpack_from(f"<{k}I", payload, at + 4 * k)
    at += 8 * k
    per_segment = [struct.unpack_from(f"<{k}I", payload, at + 4 * k * i) for i in range(s - 1)]
    at += 4 * k * (s - 1)
    _need(sum(counts) == n and at + sum(sizes) == len(payload), "huff1 counts or sizes")
    groups = []
    for count, size in zip(counts, sizes, strict=True):
        groups.append(_zstd(payload[at : at + size], count) if count else b"")
        at += size
    bucket_of = np.zeros(256, dtype=np.int64)
    for b in range(k):
        bucket_of[starts[b] : starts[b + 1]] = b
    length = -(-n // s) if n else 0
    read = [0] * k  # where segment ``seg`` starts reading each group
    out = bytearray(n)
    for seg in range(s):
        lo, hi = min(seg * length, n), min((seg + 1) * length, n)
        taken = (
            per_segment[seg]
            if seg < s - 1
            else [counts[g] - sum(p[g] for p in per_segment) for g in range(k)]
        )
        pos = list(read)
        prev = 0
        for i in range(lo, hi):
            if width and i - lo > width:
                prev = min(max(out[i - 1] + out[i - width] - out[i - width - 1], 0), 255)
            if top is not None:
                prev = top[i]
            g = int(bucket_of[prev])
            _need(pos[g] < read[g] + taken[g], "huff1 walk exhausts a group")
            out[i] = (groups[g][pos[g]] + (prev if width else 0)) & 0xFF
            prev = out[i]
            pos[g] += 1
        read = [r + t for r, t in zip(read, taken, strict=True)]
    return bytes(out)


def decode_chunk(codec: int, payload: bytes, size: int, top: bytes | None = None) -> bytes:
    """Bitstream ``codec``'s decoding of ``payload`` into ``size`` bytes (FORMAT.md); ``top`` is
    the frame's decoded top plane for a lower plane's chunk (None for the top plane)."""
    if codec == 0:
        _need(len(payload) == size, "raw payload size")
        return payload
    if codec == 1:
        _need(len(payload) == (1 if size else 0), "const payload size")
        return payload * size
    if codec == 2:
        return _zstd(payload, size)
    if codec == 4:
        return _ctx(payload, size)
    if codec == 5:
        inflater = zlib.decompressobj(-15)
        out = inflater.decompress(payload, size + 1)
        _need(len(out) == size and inflater.eof and not inflater.unused_data, "deflate stream")
        return out
    if codec == 6:
        return _bitpack(payload, size)
    if codec == 7:
        return _huff1(payload, size)
    if codec == 8:
        return _huff2d(payload, size)
    if codec == 9:
        return _sign2d(payload, size)
    if codec == 10:
        _need(top is not None, "huffexp in a frame's top plane")
        assert top is not None
        return _huffexp(payload, size, top)
    raise FormatViolation(f"bitstream {codec} has no CPU decoder")


def _merge(planes: list[bytes], word: int, rotate: bool) -> bytes:
    if word == 1:
        return planes[0]
    kind = {2: np.uint16, 4: np.uint32, 8: np.uint64}[word]
    grid = np.stack([np.frombuffer(p, np.uint8) for p in planes], axis=1)
    words = np.ascontiguousarray(grid).view(np.dtype(kind).newbyteorder("<")).astype(kind).ravel()
    if rotate:  # rotate right by one bit: bit 0 back to the sign
        words = (words >> kind(1)) | (words << kind(8 * word - 1))
    return words.astype(np.dtype(kind).newbyteorder("<")).tobytes()


def whole_file_digest(data: bytes, source: dict[str, Any]) -> tuple[str, str]:
    """``(recorded, computed)`` whole-file digest of ``data`` by the kind ``source`` records."""
    if "xxh3_tree" in source:
        leaf = source["xxh3_tree"]["leaf"]
        leaves = b"".join(
            xxhash.xxh3_64_intdigest(data[i : i + leaf]).to_bytes(8, "little")
            for i in range(0, len(data), leaf)
        )
        return source["xxh3_tree"]["digest"], xxhash.xxh3_128_hexdigest(leaves)
    return source["xxh3_128"], xxhash.xxh3_128_hexdigest(data)


#: Exponent bits of the dtypes series delta kinds 1-3 code (FORMAT.md "Scaled prediction").
EXPONENT_BITS = {"float32": 8, "complex64": 8, "bfloat16": 8, "float16": 5, "complex32": 5}


def _ordered(u: np.ndarray, b: int) -> np.ndarray:
    t = u.dtype.type
    return u ^ ((u >> t(b - 1)) * t((1 << (b - 1)) - 1))


def _unzigzag(z: np.ndarray, mask: int) -> np.ndarray:
    t = z.dtype.type
    return ((z >> t(1)) ^ (t(0) - (z & t(1)))) & t(mask)


def predict(r: np.ndarray, c: int, b: int, e_bits: int) -> np.ndarray:
    """FORMAT.md's P(r, c), steps 1-6, on uint64 copies of the words."""
    m_bits = b - 1 - e_bits
    emax = (1 << e_bits) - 1
    u = r.astype(np.uint64)
    sign = u & np.uint64(1 << (b - 1))
    e = ((u >> np.uint64(m_bits)) & np.uint64(emax)).astype(np.int64)
    m = (u & np.uint64((1 << m_bits) - 1)) | np.uint64(1 << m_bits)
    q = m * np.uint64((c & ((1 << 23) - 1)) | (1 << 23))
    wide = (q >= np.uint64(1 << (m_bits + 24))).astype(np.uint64)
    shift = np.uint64(23) + wide
    t = (q + (np.uint64(1) << (shift - np.uint64(1))) - np.uint64(1) + ((q >> shift) & np.uint64(1))) >> shift
    carry = t == np.uint64(2 << m_bits)
    t = np.where(carry, np.uint64(1 << m_bits), t)
    k = e + ((c >> 23) & 255) - 127 + wide.astype(np.int64) + carry
    normal = (
        sign | (np.clip(k, 0, emax).astype(np.uint64) << np.uint64(m_bits)) | (t - np.uint64(1 << m_bits))
    )
    p = np.where(k >= emax, sign | np.uint64(emax << m_bits), np.where(k <= 0, sign, normal))
    return np.where((e == 0) | (e == emax), u, p).astype(r.dtype)


def undo_delta(stored: bytes, ref: bytes, kind: int, scale: int, word: int, dtype: str) -> bytes:
    """A part of a paired segment (what one frame holds of it): its original bytes from its
    stored bytes and the reference's (FORMAT.md "Delta kinds", "Scaled prediction")."""
    if kind == 0:
        return (np.frombuffer(stored, np.uint8) ^ np.frombuffer(ref, np.uint8)).tobytes()
    _need(word in (2, 4) and len(stored) % word == 0, f"kind {kind} on a segment of no float words")
    t = np.dtype({2: np.uint16, 4: np.uint32}[word]).newbyteorder("<")
    s, r = np.frombuffer(stored, t).astype(t.type), np.frombuffer(ref, t).astype(t.type)
    b = word * 8
    if kind == 1:
        p = r
    else:
        _need(dtype in EXPONENT_BITS and EXPONENT_BITS[dtype] < b - 1, f"kind {kind} on a {dtype} segment")
        _need(0 <= scale < 2**31 and 0 < scale >> 23 < 255, "scale is no positive normal float32")
        e_bits = EXPONENT_BITS[dtype]
        p = predict(r, scale, b, e_bits)
        # Stored grouped by the reference words' exponent field, stably: put each word back.
        group = (r >> t.type(b - 1 - e_bits)) & t.type((1 << e_bits) - 1)
        ungrouped = np.empty_like(s)
        ungrouped[np.argsort(group, kind="stable")] = s
        s = ungrouped
    top, low = t.type(1 << (b - 1)), (1 << (b - 1)) - 1
    if kind == 3:
        x = ((_unzigzag(s & t.type(low), low) + p) & t.type(low)) | ((s ^ p) & top)
    else:
        x = _ordered(_unzigzag(s, (1 << b) - 1) + _ordered(p, b), b)
    return x.astype(t).tobytes()


def _pairs(header: dict[str, Any], lengths: list[int], ref: bytes) -> list[tuple[int, int, int, int]]:
    spec = header["reference"]
    _need(spec["size"] == len(ref), "reference size")
    recorded, computed = whole_file_digest(ref, spec)
    _need(recorded == computed, "reference digest")
    out = []
    for p in spec["pairs"]:
        _need(len(p) in (2, 3, 4) and all(isinstance(x, int) for x in p), "pair form")
        kind = p[2] if len(p) > 2 else 0
        _need(kind in (0, 1, 2, 3), f"delta kind {kind}")
        _need(len(p) == {0: 2, 1: 3, 2: 4, 3: 4}[kind], f"kind {kind} pair of {len(p)} elements")
        segment, offset = p[0], p[1]
        _need(0 <= segment < len(lengths) and 0 <= offset <= len(ref) - lengths[segment], "pair range")
        out.append((segment, offset, kind, p[3] if len(p) == 4 else 0))
    _need(len({p[0] for p in out}) == len(out), "pairs name a segment twice")
    return out


@dataclass
class Container:
    header: dict[str, Any]
    version: tuple[int, int]
    data: bytes


def read(blob: bytes, reference: bytes | None = None) -> Container:
    """Decode a whole container held in memory; every check of FORMAT.md is made. A series
    delta needs ``reference``: the original bytes of the file its header names."""
    _need(len(blob) >= HEADER.size + FOOTER.size, "too short")
    magic, major, minor, flags = HEADER.unpack_from(blob)
    off, isize, raw_size, isum, fmajor, fminor, fflags, end = FOOTER.unpack_from(
        blob, len(blob) - FOOTER.size
    )
    _need(magic == MAGIC and end == END_MAGIC, "magic")
    _need((major, minor, flags) == (fmajor, fminor, fflags) and major == 1 and flags == 0, "version")
    _need(off + isize == len(blob) - FOOTER.size, "index position")
    compressed = blob[off : off + isize]
    _need(xxhash.xxh3_64_intdigest(compressed) == isum, "index checksum")
    raw = zstandard.ZstdDecompressor().decompress(compressed, max_output_size=raw_size)
    _need(len(raw) == raw_size, "index size")
    (jsize,) = struct.unpack_from("<I", raw)
    header = json.loads(raw[4 : 4 + jsize])
    _need("reference" not in header or reference is not None, "a series delta needs its reference")
    counts = header["counts"]
    at = 4 + jsize
    segments = [SEGMENT.unpack_from(raw, at + i * SEGMENT.size) for i in range(counts["segments"])]
    at += counts["segments"] * SEGMENT.size
    frames = [FRAME.unpack_from(raw, at + i * FRAME.size) for i in range(counts["frames"])]
    at += counts["frames"] * FRAME.size
    chunks = [CHUNK.unpack_from(raw, at + i * CHUNK.size) for i in range(counts["chunks"])]
    _need(at + counts["chunks"] * CHUNK.size == len(raw), "table sizes")

    tiles = sorted((c[0], c[1]) for c in chunks)
    pos = 16
    for offset, size in tiles:
        _need(offset == pos, "payloads tile the data area")
        pos = offset + size + (-(offset + size) % 16)
        _need(blob[offset + size : pos] == bytes(pos - offset - size), "zero padding")
    _need(pos == off, "data area ends at the index")

    streams = header["streams"]
    decoded: list[list[bytes]] = [[] for _ in streams]
    next_chunk = 0
    for stream, n_chunks, reserved, length, frame_sum in frames:
        s = streams[stream]
        _need(reserved == 0 and n_chunks == s["word"] and length % s["word"] == 0, "frame record")
        records = chunks[next_chunk : next_chunk + n_chunks]
        next_chunk += n_chunks
        planes = [b""] * n_chunks
        for plane in reversed(range(n_chunks)):  # the top plane first: huffexp's contexts
            _need(plane < len(records), "chunk record")
            offset, size, raw_len, chunk_sum, codec, plane_no = records[plane]
            _need(plane_no == plane and raw_len == length // s["word"], "chunk record")
            payload = blob[offset : offset + size]
            _need(xxhash.xxh3_64_intdigest(payload) == chunk_sum, "payload checksum")
            top = planes[-1] if plane < n_chunks - 1 else None
            planes[plane] = decode_chunk(codec, payload, raw_len, top)
        frame = _merge(planes, s["word"], s["rotate"])
        _need(xxhash.xxh3_64_intdigest(frame) == frame_sum, "frame checksum")
        decoded[stream].append(frame)
    _need(next_chunk == len(chunks), "every chunk belongs to a frame")

    joined = [b"".join(parts) for parts in decoded]
    _need([len(j) for j in joined] == [s["length"] for s in streams], "stream lengths")
    cuts: list[list[int]] = [[] for _ in streams]  # where each stream's frames end
    for stream, _, _, length, _ in frames:
        cuts[stream].append((cuts[stream][-1] if cuts[stream] else 0) + length)
    cursor = [0] * len(streams)
    pairs = {}
    if "reference" in header:
        assert reference is not None
        pairs = {p[0]: p[1:] for p in _pairs(header, [length for _, length in segments], reference)}
    out = bytearray()
    for i, (stream, length) in enumerate(segments):
        part = joined[stream][cursor[stream] : cursor[stream] + length]
        cursor[stream] += length
        if i in pairs:
            offset, kind, scale = pairs[i]
            start = cursor[stream] - length
            # A delta is undone on each part of the segment one frame holds.
            edges = [start] + [c for c in cuts[stream] if start < c < start + length] + [start + length]
            part = b"".join(
                undo_delta(
                    part[lo - start : hi - start],
                    reference[offset + lo - start : offset + hi - start],  # type: ignore[index]
                    kind,
                    scale,
                    streams[stream]["word"],
                    streams[stream]["dtype"],
                )
                for lo, hi in itertools.pairwise(edges)
            )
        out += part
    _need(len(out) == header["source"]["size"], "source size")
    recorded, computed = whole_file_digest(bytes(out), header["source"])
    _need(recorded == computed, "whole-file digest")
    return Container(header, (major, minor), bytes(out))
