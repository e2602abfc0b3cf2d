/*
 * Split and merge: words <-> byte planes in one pass (ckptz.codecs.planes), with each
 * plane's statistics on the way (ckptz.codecs.frames). Loops marked WIDE are also built for
 * AVX2.
 */
#include "native.h"

#define ROTL(v, bits) (((v) << 1) | ((v) >> ((bits)-1)))
#define ROTR(v, bits) (((v) >> 1) | ((v) << ((bits)-1)))

/* Each split also ANDs and ORs the (rotated) words: byte k of the results is the AND and
 * the OR of plane k, which tell a constant plane and the bit positions that never vary. */

WIDE static void split2(const uint8_t *restrict src, uint8_t *const *dst, size_t n, int rotate, uint64_t *and_out,
                   uint64_t *or_out) {
    uint8_t *restrict p0 = dst[0], *restrict p1 = dst[1];
    uint16_t a = 0xFFFF, o = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t v;
        memcpy(&v, src + 2 * i, 2);
        if (rotate) v = (uint16_t)ROTL(v, 16);
        a &= v;
        o |= v;
        p0[i] = (uint8_t)v;
        p1[i] = (uint8_t)(v >> 8);
    }
    *and_out = a, *or_out = o;
}

WIDE static void split4(const uint8_t *restrict src, uint8_t *const *dst, size_t n, int rotate, uint64_t *and_out,
                   uint64_t *or_out) {
    uint8_t *restrict p0 = dst[0], *restrict p1 = dst[1], *restrict p2 = dst[2], *restrict p3 = dst[3];
    uint32_t a = 0xFFFFFFFFu, o = 0;
    for (size_t i = 0; i < n; i++) { /* -O3 unswitches the rotate test out of the loop */
        uint32_t v;
        memcpy(&v, src + 4 * i, 4);
        if (rotate) v = ROTL(v, 32);
        a &= v;
        o |= v;
        p0[i] = (uint8_t)v;
        p1[i] = (uint8_t)(v >> 8);
        p2[i] = (uint8_t)(v >> 16);
        p3[i] = (uint8_t)(v >> 24);
    }
    *and_out = a, *or_out = o;
}

WIDE static void split8(const uint8_t *restrict src, uint8_t *const *dst, size_t n, int rotate, uint64_t *and_out,
                   uint64_t *or_out) {
    /* The planes in locals: stores through dst[k] could alias the table of pointers itself
     * (bytes alias anything), which would reload it for every byte. */
    uint8_t *restrict p0 = dst[0], *restrict p1 = dst[1], *restrict p2 = dst[2], *restrict p3 = dst[3];
    uint8_t *restrict p4 = dst[4], *restrict p5 = dst[5], *restrict p6 = dst[6], *restrict p7 = dst[7];
    uint64_t a = ~0ULL, o = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t v;
        memcpy(&v, src + 8 * i, 8);
        if (rotate) v = ROTL(v, 64);
        a &= v;
        o |= v;
        p0[i] = (uint8_t)v;
        p1[i] = (uint8_t)(v >> 8);
        p2[i] = (uint8_t)(v >> 16);
        p3[i] = (uint8_t)(v >> 24);
        p4[i] = (uint8_t)(v >> 32);
        p5[i] = (uint8_t)(v >> 40);
        p6[i] = (uint8_t)(v >> 48);
        p7[i] = (uint8_t)(v >> 56);
    }
    *and_out = a, *or_out = o;
}

/* A plane's sampled statistics, as ckptz.codecs.frames computes them with numpy: order-0
 * entropy (bits per byte) and share of zeros of bytes 0, step, 2 step, ... with
 * step = max(1, n / sample). */
static void sample_stats(const uint8_t *plane, size_t n, size_t sample, double *bits, double *zeros) {
    size_t step = n / sample > 1 ? n / sample : 1, count = 0;
    uint32_t hist[256] = {0};
    for (size_t i = 0; i < n; i += step, count++) hist[plane[i]]++;
    double sum = 0;
    for (int s = 0; s < 256; s++)
        if (hist[s]) sum += hist[s] * log2((double)hist[s]);
    *bits = count ? log2((double)count) - sum / (double)count : 0;
    *zeros = count ? (double)hist[0] / (double)count : 0;
}

static void plane_stats(const uint8_t *plane, size_t n, size_t sample, uint8_t *and_out, uint8_t *or_out,
                        double *bits, double *zeros) {
    uint8_t a = 0xFF, o = 0;
    for (size_t i = 0; i < n; i++) {
        a &= plane[i];
        o |= plane[i];
    }
    *and_out = a, *or_out = o;
    sample_stats(plane, n, sample, bits, zeros);
}

static void split_words(const uint8_t *src, uint8_t *const *dst, size_t n, int word, int rotate,
                           uint64_t *and_out, uint64_t *or_out) {
    if (word == 2)
        split2(src, dst, n, rotate, and_out, or_out);
    else if (word == 4)
        split4(src, dst, n, rotate, and_out, or_out);
    else
        split8(src, dst, n, rotate, and_out, or_out);
}

/* Planes given as constants are read from a small buffer of that byte instead, so the
 * loops below need no branch: `stride` is 1 for real planes, 0 for constants. */
WIDE static void merge2(const plane_t *planes, uint8_t *restrict dst, size_t n, int rotate) {
    const uint8_t *p0 = planes[0].bytes ? planes[0].bytes : &planes[0].value;
    const uint8_t *p1 = planes[1].bytes ? planes[1].bytes : &planes[1].value;
    size_t s0 = planes[0].bytes != NULL, s1 = planes[1].bytes != NULL;
    if (s0 && s1) {
        for (size_t i = 0; i < n; i++) {
            uint16_t v = (uint16_t)(p0[i] | (p1[i] << 8));
            if (rotate) v = (uint16_t)ROTR(v, 16);
            memcpy(dst + 2 * i, &v, 2);
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint16_t v = (uint16_t)(p0[i * s0] | (p1[i * s1] << 8));
        if (rotate) v = (uint16_t)ROTR(v, 16);
        memcpy(dst + 2 * i, &v, 2);
    }
}

#ifdef __SSE2__
/* 16 bytes of a plane, or its constant byte 16 times (the test is the same every call of
 * a merge, so the branch predicts). */
static inline __m128i plane16(const plane_t *pl, size_t i) {
    return pl->bytes ? _mm_loadu_si128((const __m128i *)(pl->bytes + i)) : _mm_set1_epi8((char)pl->value);
}
#endif

WIDE static void merge4(const plane_t *planes, uint8_t *restrict dst, size_t n, int rotate) {
    size_t i = 0;
#ifdef __SSE2__
    /* 16 words at a time: interleave bytes (planes 0+1, 2+3), then the byte pairs */
    for (; i + 16 <= n; i += 16) {
        __m128i a = plane16(&planes[0], i), b = plane16(&planes[1], i);
        __m128i c = plane16(&planes[2], i), d = plane16(&planes[3], i);
        __m128i ab0 = _mm_unpacklo_epi8(a, b), ab1 = _mm_unpackhi_epi8(a, b);
        __m128i cd0 = _mm_unpacklo_epi8(c, d), cd1 = _mm_unpackhi_epi8(c, d);
        __m128i w[4] = {_mm_unpacklo_epi16(ab0, cd0), _mm_unpackhi_epi16(ab0, cd0), _mm_unpacklo_epi16(ab1, cd1),
                        _mm_unpackhi_epi16(ab1, cd1)};
        for (int k = 0; k < 4; k++) {
            if (rotate) w[k] = _mm_or_si128(_mm_srli_epi32(w[k], 1), _mm_slli_epi32(w[k], 31));
            _mm_storeu_si128((__m128i *)(dst + 4 * i + 16 * (size_t)k), w[k]);
        }
    }
#endif
    for (; i < n; i++) {
        uint32_t v = 0;
        for (int k = 0; k < 4; k++) v |= (uint32_t)(planes[k].bytes ? planes[k].bytes[i] : planes[k].value) << (8 * k);
        if (rotate) v = ROTR(v, 32);
        memcpy(dst + 4 * i, &v, 4);
    }
}

WIDE static void merge8(const plane_t *planes, uint8_t *restrict dst, size_t n, int rotate) {
    for (size_t i = 0; i < n; i++) {
        uint64_t v = 0;
        for (int k = 0; k < 8; k++)
            v |= (uint64_t)(planes[k].bytes ? planes[k].bytes[i] : planes[k].value) << (8 * k);
        if (rotate) v = ROTR(v, 64);
        memcpy(dst + 8 * i, &v, 8);
    }
}

static void merge_words(const plane_t *planes, uint8_t *dst, size_t n, int word, int rotate) {
    if (word == 2)
        merge2(planes, dst, n, rotate);
    else if (word == 4)
        merge4(planes, dst, n, rotate);
    else
        merge8(planes, dst, n, rotate);
}
