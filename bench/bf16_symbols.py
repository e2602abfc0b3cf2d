"""bf16 weights: bits per weight of today's byte planes against a 9-bit sign-plus-exponent symbol.

Issue 60 asks whether coding a bf16 word's sign with its 8 exponent bits (one 9-bit symbol, as
BigSmall does) pays against ckptz's planes. ckptz already rotates a float's sign to bit 0, so
its top plane holds the 8 exponent bits whole and its low plane the 7 mantissa bits and the
sign. For the safetensors file of bf16 weights (the first ``--subset`` bytes of tensors, as
``bench/peers.py`` gives z4ai ``effort="max"``, and the whole file), per weight:

* ``coded today``: ckptz's payloads at ``--level`` (both planes, the chosen bitstreams);
* ``planes H0``: order-0 entropy of the two planes (exponent byte, mantissa-and-sign byte),
  and of the unrotated planes (sign and 7 exponent bits; 1 exponent bit and 7 mantissa bits);
* ``9-bit H0``: order-0 entropy of the sign-plus-exponent symbol, plus the 7-bit mantissa's;
* ``exp H0 + raw sign``: the 8 exponent bits' entropy, one bit of sign, the mantissa's;
* ``mantissa | exponent``: as the 9-bit row, the mantissa coded per exponent value;

each also per frame (the CPU coder's frame of the stream), where a coder's tables start over.
Ideal bits leave out the tables' cost: ``mantissa | exponent`` holds up to 256 tables of 128
symbols; the ``adaptive`` rows count it (each table learnt as it codes, an adaptive coder's
cost), the planes first, then exponents, one raw sign bit and mantissas per exponent value.
Usage::

    PYTHONPATH=. python bench/bf16_symbols.py RUN_DIR [--subset 1048576] [--level 19]

where ``RUN_DIR`` holds ``bf16_weights.safetensors`` from ``bench/peers.py``'s training run
(made there with ``--steps 150`` if missing).
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import split_safetensors, train_run

from ckptz.codecs.cpu import HuffmanZstd
from ckptz.codecs.frames import encode_frame
from ckptz.codecs.planes import split
from ckptz.codecs.table import by_id
from ckptz.container import StreamInfo
from ckptz.dtypes import lookup
from ckptz.engines.cpu import CpuEngine


def entropy_bits(symbols: np.ndarray, alphabet: int) -> float:
    """Total order-0 entropy in bits of ``symbols`` (ints below ``alphabet``)."""
    counts = np.bincount(symbols, minlength=alphabet).astype(np.float64)
    counts = counts[counts > 0]
    n = counts.sum()
    return float(-(counts * np.log2(counts / n)).sum())


def adaptive_bits(
    symbols: np.ndarray, alphabet: int, given: np.ndarray | None = None, contexts: int = 1
) -> float:
    """Total bits of an adaptive order-0 coder (Krichevsky-Trofimov counts) per value of
    ``given``: the entropy plus what learning each table costs, which ideal bits leave out."""
    ctx = np.zeros(symbols.size, np.int64) if given is None else given.astype(np.int64)
    counts = np.bincount(ctx * alphabet + symbols, minlength=alphabet * contexts).reshape(contexts, alphabet)
    totals = counts.sum(axis=1)
    lg = np.vectorize(math.lgamma)
    bits = (lg(totals + alphabet / 2) - math.lgamma(alphabet / 2)).sum()
    bits -= (lg(counts + 0.5) - math.lgamma(0.5)).sum()
    return float(bits / math.log(2))


def huffman_lengths(counts: np.ndarray) -> np.ndarray:
    """Huffman code lengths (bits) of symbols with ``counts`` (0 for unused symbols)."""
    lengths = np.zeros(counts.size, np.int64)
    heap = [(int(c), [i]) for i, c in enumerate(counts) if c]
    if len(heap) == 1:
        lengths[heap[0][1]] = 1
    heapq.heapify(heap)
    while len(heap) > 1:
        a, b = heapq.heappop(heap), heapq.heappop(heap)
        lengths[a[1] + b[1]] += 1
        heapq.heappush(heap, (a[0] + b[0], a[1] + b[1]))
    return lengths


def huffman_bits(symbols: np.ndarray, alphabet: int, given: np.ndarray, contexts: int) -> float:
    """Total bits of static Huffman codes, one per value of ``given``, each table at 4 bits a
    symbol of the alphabet (a code-length table); a context's table is sent only if used."""
    counts = np.bincount(given.astype(np.int64) * alphabet + symbols, minlength=alphabet * contexts)
    total = 0.0
    for row in counts.reshape(contexts, alphabet):
        if row.any():
            total += float((row * huffman_lengths(row)).sum()) + 4 * alphabet
    return total


def conditional_bits(symbols: np.ndarray, given: np.ndarray, alphabet: int, contexts: int) -> float:
    """Total entropy in bits of ``symbols`` coded with one order-0 table per value of ``given``."""
    joint = given.astype(np.int64) * alphabet + symbols
    return entropy_bits(joint, alphabet * contexts) - entropy_bits(given.astype(np.int64), contexts)


def ideal_bits(words: np.ndarray) -> dict[str, float]:
    """Total ideal bits of one run of bf16 words (uint16) under each split."""
    sign = (words >> 15).astype(np.int64)
    exponent = ((words >> 7) & 0xFF).astype(np.int64)
    mantissa = (words & 0x7F).astype(np.int64)
    return {
        "planes H0": entropy_bits(exponent, 256) + entropy_bits((mantissa << 1) | sign, 256),
        "unrotated planes H0": entropy_bits((words >> 8).astype(np.int64), 256)
        + entropy_bits((words & 0xFF).astype(np.int64), 256),
        "9-bit H0": entropy_bits((sign << 8) | exponent, 512) + entropy_bits(mantissa, 128),
        "exp H0 + raw sign": entropy_bits(exponent, 256) + words.size + entropy_bits(mantissa, 128),
        "mantissa | exponent": entropy_bits((sign << 8) | exponent, 512)
        + conditional_bits(mantissa, exponent, 128, 256),
        "planes adaptive": adaptive_bits(exponent, 256) + adaptive_bits((mantissa << 1) | sign, 256),
        "mantissa | exp adaptive": adaptive_bits(exponent, 256)
        + words.size
        + adaptive_bits(mantissa, 128, exponent, 256),
    }


def coded_bits(raw: np.ndarray, level: int) -> tuple[list[int], list[str]]:
    """ckptz's payload bits per plane (low, high) for a bf16 stream's bytes at ``level``, and
    the bitstreams chosen per frame."""
    dtype = lookup("bfloat16")
    total, chosen = [0, 0], []
    with CpuEngine(1, level) as engine:
        stream = StreamInfo(0, "tensors", "BF16", dtype.word, dtype.is_float, engine.frame_size, raw.size, 1)
        options = engine.options_for(stream)
        for at in range(0, raw.size, engine.frame_size):
            chunks = encode_frame(raw[at : at + engine.frame_size], dtype, options)
            for k, c in enumerate(chunks):
                total[k] += 8 * len(c.payload)
            chosen.append("/".join(by_id(c.codec).name for c in chunks))  # type: ignore[union-attr]
    return total, chosen


def report(name: str, raw: np.ndarray, level: int, frame: int) -> None:
    words = raw.view(np.uint16)
    n = words.size
    (coded_low, coded_high), chosen = coded_bits(raw, level)
    coded = coded_low + coded_high
    # The low plane as Huffman-coded zstd would code it (today it is stored where it looks
    # like noise): what a better mantissa coding has to beat.
    low = np.ascontiguousarray(split(raw, lookup("bfloat16"))[0])
    huffman = 8 * len(HuffmanZstd().encode(low))
    # The same plane as one raw bit of sign and an adaptive coder's mantissas, a table per
    # exponent value (BigSmall's split): what it would save against today's coding.
    exponents = (words >> 7 & 0xFF).astype(np.int64)
    per_exponent = n + adaptive_bits((words & 0x7F).astype(np.int64), 128, exponents, 256)
    per_exponent_huffman = n + huffman_bits((words & 0x7F).astype(np.int64), 128, exponents, 256)
    whole = ideal_bits(words)
    framed: dict[str, float] = dict.fromkeys(whole, 0.0)
    for at in range(0, n, frame // 2):
        for key, bits in ideal_bits(words[at : at + frame // 2]).items():
            framed[key] += bits
    print(f"\n{name}: {n} weights, {raw.size} bytes; codecs per frame (low/high plane): {chosen}")
    print(f"  {'split':24s} {'bits/weight':>11s} {'per frame':>10s} {'vs planes':>10s} {'of file':>8s}")
    print(f"  {'coded today (level ' + str(level) + ')':24s} {coded / n:11.4f}")
    print(
        f"    exponent plane {coded_high / n:.4f}, mantissa-and-sign plane {coded_low / n:.4f}"
        f" (Huffman-coded: {huffman / n:.4f}; order-0 entropy: {entropy_bits(low.astype(np.int64), 256) / n:.4f})"
    )
    print(
        f"    that plane as raw signs + mantissas per exponent value (adaptive): {per_exponent / n:.4f},"
        f" {100 * (per_exponent - coded_low) / coded:+.2f}% of the file;"
        f" Huffman-coded per exponent value: {per_exponent_huffman / n:.4f},"
        f" {100 * (per_exponent_huffman - coded_low) / coded:+.2f}%"
    )
    base = framed["planes H0"]
    for key in whole:
        print(
            f"  {key:24s} {whole[key] / n:11.4f} {framed[key] / n:10.4f}"
            f" {framed[key] / n - base / n:+10.4f} {100 * (framed[key] - base) / coded:+7.2f}%"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--subset", type=int, default=1 << 20)
    ap.add_argument("--level", type=int, default=19)
    ap.add_argument("--frame", type=int, default=0, help="frame bytes (default: the CPU engine's)")
    args = ap.parse_args()
    path = args.run_dir / "bf16_weights.safetensors"
    if not path.exists():
        train_run(args.run_dir, 150, 0)
    _, parts = split_safetensors(path.read_bytes())
    chosen, total = [], 0
    for dt, raw in parts:
        assert dt == "BF16"
        if total and total + len(raw) > args.subset:
            break
        chosen.append(raw)
        total += len(raw)
    frame = args.frame or CpuEngine.frame_size
    report("first tensors (peers.py subset)", np.frombuffer(b"".join(chosen), np.uint8), args.level, frame)
    report("whole file", np.frombuffer(b"".join(r for _, r in parts), np.uint8), args.level, frame)


if __name__ == "__main__":
    main()
