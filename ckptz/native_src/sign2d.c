/*
 * Row-predicted sign bits (bitstream 9, `sign2d`; the payload is specified in
 * ckptz/codecs/sign2d.py): a rotated float's lowest plane holds its sign in bit 0 beside
 * seven mantissa bits that are noise. The mantissa bits are stored packed (bitpack.c's
 * rows); each sign is XORed with its prediction s[j-1] ^ s[j-W] ^ s[j-W-1] (exact where
 * signs are a product of a row's and a column's, as in Adam's first moments of embedding
 * rows that see no tokens), and the residual bits, packed, are one literal zstd frame.
 *
 * The row width is searched as order2d.c searches it (o2_width), on the sign bits.
 */
#include "native.h"

/* Residual sign bits o2_width's sampled runs would leave for width w (0: the left sign alone). */
WIDE static uint64_t s2_miss(const uint8_t *x, size_t n, size_t from, size_t w, size_t runs) {
    uint64_t miss = 0;
    size_t span = n - from - O2_RUN, step = span / runs;
    for (size_t r = 0; r < runs; r++) {
        size_t a = from + r * step;
        for (size_t p = a; p < a + O2_RUN; p++) {
            uint8_t pred = x[p - 1];
            if (w) pred ^= x[p - w] ^ x[p - w - 1];
            miss += (x[p] ^ pred) & 1;
        }
    }
    return miss;
}

/* Bit 0 of byte j's prediction (j > width: planar XOR; else the left sign, 0 at j = 0). */
static inline uint8_t s2_predict(const uint8_t *x, size_t j, size_t width) {
    if (j > width) return (x[j - 1] ^ x[j - width] ^ x[j - width - 1]) & 1;
    return j ? x[j - 1] & 1 : 0;
}

static const int S2_MANTISSA[7] = {1, 2, 3, 4, 5, 6, 7};

/* The payload for n bytes into a new buffer (*out, free()d by the caller); returns its
 * size, or 0 where no row width predicts the signs (width 0: searched), the residual's frame
 * cannot be written, or memory ran out. A searched width that mispredicts more than
 * `most_miss` of the sampled signs is declined too, before the plane is coded: a coder that
 * tries sign2d on every float keeps it to planes where it saves clearly. */
static size_t sign2d_encode(const uint8_t *src, size_t n, size_t width, double most_miss, uint8_t **out) {
    *out = NULL;
    if (n > 0xFFFFFFFFu || width > 0xFFFFFFFFu) return 0;
    double miss = 0;
    if (!width && (!(width = o2_width(src, n, n, s2_miss, &miss)) || miss > most_miss)) return 0;
    size_t m = (n + 7) / 8, size = 0;
    uint8_t *residual = calloc(m ? m : 1, 1), *buf = NULL;
    if (!residual) return 0;
    for (size_t j = 0; j < n; j++) residual[j >> 3] |= (uint8_t)(((src[j] ^ s2_predict(src, j, width)) & 1) << (j & 7));
    size_t cap = 8 + frame_capacity(m, 0) + 7 * m;
    if (!(buf = malloc(cap))) goto done;
    size_t framed = write_frame(buf + 8, residual, m, 0);
    if (!framed) goto done;
    o1_put32(buf, (uint32_t)width);
    o1_put32(buf + 4, (uint32_t)framed);
    pack_rows(src, n, S2_MANTISSA, 7, buf + 8 + framed, m);
    size = 8 + framed + 7 * m;
done:
    free(residual);
    if (size) *out = buf;
    else free(buf);
    return size;
}

/* 1 if in[0..len) is a well-formed payload for n bytes whose frame literals_frame() reads. */
static int sign2d_usable(const uint8_t *in, size_t len, size_t n, dtable_t *dt) {
    size_t m = (n + 7) / 8;
    if (len < 8 || n > 0xFFFFFFFFu || !o1_get32(in)) return 0;
    uint64_t framed = o1_get32(in + 4);
    if (8 + framed + 7 * (uint64_t)m != len) return 0;
    return literals_frame(in + 8, (size_t)framed, NULL, m, dt, 0);
}

/* Decodes a payload of n bytes into out[0..n), the residual into scratch[0..(n+7)/8); 1 on
 * success, 0 if it is malformed (out may then hold anything). */
static int sign2d_decode(const uint8_t *in, size_t len, uint8_t *out, size_t n, uint8_t *scratch, dtable_t *dt) {
    if (!sign2d_usable(in, len, n, dt)) return 0;
    size_t m = (n + 7) / 8, width = o1_get32(in), framed = o1_get32(in + 4);
    if (!literals_frame(in + 8, framed, scratch, m, dt, 1)) return 0;
    unpack_rows(in + 8 + framed, m, S2_MANTISSA, 7, 0, out, n);
    size_t first = width + 1 < n ? width + 1 : n;
    for (size_t j = 0; j < first; j++) out[j] |= (uint8_t)((scratch[j >> 3] >> (j & 7) & 1) ^ s2_predict(out, j, width));
    /* the left sign stays in a register (out's store would be on every step's chain) */
    uint8_t left = first ? out[first - 1] & 1 : 0;
    for (size_t j = first; j < n; j++) {
        left = (uint8_t)((scratch[j >> 3] >> (j & 7) ^ left ^ out[j - width] ^ out[j - width - 1]) & 1);
        out[j] |= left;
    }
    return 1;
}
