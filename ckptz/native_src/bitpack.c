/*
 * Bit packing (ckptz.codecs.bitpack): each varying bit position of a plane's bytes as a row
 * of bits, and back, by 8x8 bit-matrix transposes; SSE2 loops, and AVX2 ones chosen at run
 * time (have_avx2).
 */
#include "native.h"

/* An 8x8 bit matrix (byte r = row r) transposed: three delta swaps (Hacker's Delight). */
static inline uint64_t transpose8(uint64_t x) {
    uint64_t t;
    t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AAULL;
    x ^= t ^ (t << 7);
    t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCCULL;
    x ^= t ^ (t << 14);
    t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0ULL;
    x ^= t ^ (t << 28);
    return x;
}

static int varying_list(int fixed, int *bits) {
    int k = 0;
    for (int b = 0; b < 8; b++)
        if (!(fixed >> b & 1)) bits[k++] = b;
    return k;
}

#if AVX2_PATHS
/* The rows' bytes [0, j) for the first 8 * j bytes of in[0..n), 32 bytes at a time (the
 * SSE2 loop below on twice the width); returns j. */
AVX2 static size_t pack_rows_avx2(const uint8_t *in, size_t n, const int *bits, int k, uint8_t *out, size_t m) {
    size_t j = 0;
    for (; 8 * j + 32 <= n; j += 4) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(in + 8 * j));
        for (int i = 0; i < k; i++) {
            uint32_t row = (uint32_t)_mm256_movemask_epi8(_mm256_sll_epi64(x, _mm_cvtsi32_si128(7 - bits[i])));
            memcpy(out + (size_t)i * m + j, &row, 4);
        }
    }
    return j;
}
#endif

static void pack_rows(const uint8_t *in, size_t n, const int *bits, int k, uint8_t *out, size_t m) {
    size_t j = 0;
#if AVX2_PATHS
    if (have_avx2) j = pack_rows_avx2(in, n, bits, k, out, m);
#endif
#ifdef __SSE2__
    /* 16 bytes at a time: bit b of each byte shifted to its top, then gathered by movemask */
    __m128i shift[8];
    for (int i = 0; i < k; i++) shift[i] = _mm_cvtsi32_si128(7 - bits[i]);
    for (; 8 * j + 16 <= n; j += 2) {
        __m128i x = _mm_loadu_si128((const __m128i *)(in + 8 * j));
        for (int i = 0; i < k; i++) {
            uint16_t row = (uint16_t)_mm_movemask_epi8(_mm_sll_epi64(x, shift[i]));
            memcpy(out + (size_t)i * m + j, &row, 2);
        }
    }
#endif
    for (; j < m; j++) {
        uint64_t word = 0;
        memcpy(&word, in + 8 * j, 8 * j + 8 <= n ? 8 : n - 8 * j);
        word = transpose8(word); /* byte b: bit b of the 8 bytes */
        for (int i = 0; i < k; i++) out[(size_t)i * m + j] = (uint8_t)(word >> (8 * bits[i]));
    }
}

/* spread[x]: byte q holds bit q of x (as bit 0), set up at import */
static uint64_t spread[256];

static void init_spread(void) {
    for (int x = 0; x < 256; x++) {
        uint64_t w = 0;
        for (int q = 0; q < 8; q++) w |= (uint64_t)((x >> q) & 1) << (8 * q);
        spread[x] = w;
    }
}

#ifdef __SSE2__
/* transpose8 of both 64-bit halves */
static inline __m128i transpose8x2(__m128i x) {
    static const int shifts[3] = {7, 14, 28};
    static const uint64_t masks[3] = {0x00AA00AA00AA00AAULL, 0x0000CCCC0000CCCCULL, 0x00000000F0F0F0F0ULL};
    for (int s = 0; s < 3; s++) {
        __m128i t = _mm_and_si128(_mm_xor_si128(x, _mm_srli_epi64(x, shifts[s])), _mm_set1_epi64x((long long)masks[s]));
        x = _mm_xor_si128(x, _mm_xor_si128(t, _mm_slli_epi64(t, shifts[s])));
    }
    return x;
}

/* 128 bytes from 16 bytes of each bit's row (or its fixed bit as 0x00/0xFF): an 8x16 byte
 * transpose by unpacks (word j's byte b = row b's byte j), then transpose8 per word. */
static inline void unpack128(__m128i r[8], uint8_t *out) {
    __m128i p[8], q[8];
    for (int b = 0; b < 8; b += 2) {
        p[b] = _mm_unpacklo_epi8(r[b], r[b + 1]); /* rows b, b+1 of bytes 0..7 */
        p[b + 1] = _mm_unpackhi_epi8(r[b], r[b + 1]); /* ... of bytes 8..15 */
    }
    for (int h = 0; h < 2; h++) { /* h = 0: rows 0-3, h = 1: rows 4-7 */
        q[4 * h + 0] = _mm_unpacklo_epi16(p[4 * h], p[4 * h + 2]);     /* bytes 0..3 */
        q[4 * h + 1] = _mm_unpackhi_epi16(p[4 * h], p[4 * h + 2]);     /* bytes 4..7 */
        q[4 * h + 2] = _mm_unpacklo_epi16(p[4 * h + 1], p[4 * h + 3]); /* bytes 8..11 */
        q[4 * h + 3] = _mm_unpackhi_epi16(p[4 * h + 1], p[4 * h + 3]); /* bytes 12..15 */
    }
    for (int t = 0; t < 4; t++) {
        __m128i lo = _mm_unpacklo_epi32(q[t], q[4 + t]), hi = _mm_unpackhi_epi32(q[t], q[4 + t]);
        _mm_storeu_si128((__m128i *)(out + 32 * t), transpose8x2(lo));
        _mm_storeu_si128((__m128i *)(out + 32 * t + 16), transpose8x2(hi));
    }
}
#endif

#if AVX2_PATHS
/* transpose8 of each 64-bit quarter */
AVX2 static inline __m256i transpose8x4(__m256i x) {
    static const int shifts[3] = {7, 14, 28};
    static const uint64_t masks[3] = {0x00AA00AA00AA00AAULL, 0x0000CCCC0000CCCCULL, 0x00000000F0F0F0F0ULL};
    for (int s = 0; s < 3; s++) {
        __m256i t = _mm256_and_si256(_mm256_xor_si256(x, _mm256_srli_epi64(x, shifts[s])),
                                     _mm256_set1_epi64x((long long)masks[s]));
        x = _mm256_xor_si256(x, _mm256_xor_si256(t, _mm256_slli_epi64(t, shifts[s])));
    }
    return x;
}

/* unpack128 on both 128-bit lanes at once: 32 bytes of each row give 256 bytes (the low
 * lanes the first 128, the high lanes the next); returns how many row bytes it took. */
AVX2 static size_t unpack_rows_avx2(const uint8_t *const row[8], uint8_t value, uint8_t *out, size_t m, size_t n) {
    size_t j = 0;
    for (; j + 32 <= m && 8 * j + 256 <= n; j += 32) {
        __m256i r[8], p[8], q[8];
        for (int b = 0; b < 8; b++)
            r[b] = row[b] ? _mm256_loadu_si256((const __m256i *)(row[b] + j)) : _mm256_set1_epi8((char)-(value >> b & 1));
        for (int b = 0; b < 8; b += 2) {
            p[b] = _mm256_unpacklo_epi8(r[b], r[b + 1]);
            p[b + 1] = _mm256_unpackhi_epi8(r[b], r[b + 1]);
        }
        for (int h = 0; h < 2; h++) {
            q[4 * h + 0] = _mm256_unpacklo_epi16(p[4 * h], p[4 * h + 2]);
            q[4 * h + 1] = _mm256_unpackhi_epi16(p[4 * h], p[4 * h + 2]);
            q[4 * h + 2] = _mm256_unpacklo_epi16(p[4 * h + 1], p[4 * h + 3]);
            q[4 * h + 3] = _mm256_unpackhi_epi16(p[4 * h + 1], p[4 * h + 3]);
        }
        uint8_t *o = out + 8 * j;
        for (int t = 0; t < 4; t++) {
            __m256i lo = transpose8x4(_mm256_unpacklo_epi32(q[t], q[4 + t]));
            __m256i hi = transpose8x4(_mm256_unpackhi_epi32(q[t], q[4 + t]));
            _mm256_storeu_si256((__m256i *)(o + 32 * t), _mm256_permute2x128_si256(lo, hi, 0x20));
            _mm256_storeu_si256((__m256i *)(o + 128 + 32 * t), _mm256_permute2x128_si256(lo, hi, 0x31));
        }
    }
    return j;
}
#endif

/* Bytes from k packed rows of m bytes (row i: bit bits[i] of every byte). With AVX2 or
 * SSE2, 256 or 128 bytes at a time by unpacks and bit transposes; the rest by one table
 * lookup and shift per row and 8 bytes. */
static void unpack_rows(const uint8_t *in, size_t m, const int *bits, int k, uint8_t value, uint8_t *out,
                        size_t n) {
    size_t j = 0;
#ifdef __SSE2__
    const uint8_t *row[8] = {NULL};
    __m128i r[8];
    for (int i = 0; i < k; i++) row[bits[i]] = in + (size_t)i * m;
#if AVX2_PATHS
    if (have_avx2) j = unpack_rows_avx2(row, value, out, m, n);
#endif
    for (; j + 16 <= m && 8 * j + 128 <= n; j += 16) {
        for (int b = 0; b < 8; b++)
            r[b] = row[b] ? _mm_loadu_si128((const __m128i *)(row[b] + j)) : _mm_set1_epi8((char)-(value >> b & 1));
        unpack128(r, out + 8 * j);
    }
#endif
    uint64_t fill = 0x0101010101010101ULL * value;
    for (; j < m; j++) {
        uint64_t word = fill;
        for (int i = 0; i < k; i++) word |= spread[in[(size_t)i * m + j]] << bits[i];
        if (8 * j + 8 <= n)
            memcpy(out + 8 * j, &word, 8); /* a constant size: one store, not a call */
        else
            memcpy(out + 8 * j, &word, n - 8 * j);
    }
}
