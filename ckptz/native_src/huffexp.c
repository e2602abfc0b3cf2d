/*
 * Mantissas given their exponent (bitstream 10, `huffexp`; the payload is specified in
 * ckptz/codecs/huffexp.py): a lower plane of a float frame whose context is the bucket of
 * the same element's byte in the frame's top plane (its exponent), already decoded when
 * this one is. The payload is huff1's (order1.c: the same header, bucket search and
 * literal frames); only where a byte's context comes from differs.
 *
 * Why: within one binade a trained weight's magnitude is not uniform (its density falls
 * with the magnitude), so a mantissa's top bits are skewed by an amount that depends on the
 * exponent: near-uniform for small exponents, clearly skewed for the largest. One code for
 * the whole plane below the exponents sees a mixture that looks like noise.
 *
 * The contexts do not depend on the bytes decoded, so a segment's walk has no chain through
 * the data, only through each group's read position; the segments still interleave, as in
 * order1.c, so that those chains overlap.
 */
#include "native.h"

/* Least estimated saving over one bucket for which the encoder codes the groups: below it
 * the groups would tie with one code of the plane (or with storing it). */
#define HX_LEAST_SAVING 0.002f
/* A bucket's own cost in bytes for the bucket search: less than huff1's (O1_BUCKET_COST),
 * whose estimate on exponents' skewed counts is close; on near-uniform mantissas the
 * entropy of a sample understates what finer buckets save. */
#define HX_BUCKET_COST 40.0f

/* Pair counts (row: the context byte, column: the byte) of runs of O1_RUN bytes starting
 * every `stride` bytes into the zeroed `pairs`, and each row's total into rows; returns the
 * share of the plane sampled. */
static float hx_sample_pairs(const uint8_t *src, const uint8_t *ctx, size_t n, size_t stride, uint32_t (*pairs)[256],
                             uint32_t *rows) {
    for (size_t a = 0; a < n; a += stride) {
        size_t b = a + O1_RUN < n ? a + O1_RUN : n;
        for (size_t i = a; i < b; i++) pairs[ctx[i]][src[i]]++;
    }
    uint64_t sampled = 0;
    for (int v = 0; v < 256; v++) {
        uint32_t t = 0;
        for (int c = 0; c < 256; c++) t += pairs[v][c];
        rows[v] = t;
        sampled += t;
    }
    return n ? (float)sampled / (float)n : 1;
}

/* The payload for the n bytes of src with context bytes ctx into a new buffer (*out,
 * free()d by the caller); returns its size, or 0 where the pair counts estimate a saving
 * below HX_LEAST_SAVING (no context pays), a group's frame cannot be written (a table zstd
 * cannot describe) or memory ran out. `segments` is 1 to O1_MAX_SEGMENTS. */
static size_t huffexp_encode(const uint8_t *src, const uint8_t *ctx, size_t n, int segments, uint8_t **out) {
    *out = NULL;
    if (n > 0xFFFFFFFFu || segments < 1 || segments > O1_MAX_SEGMENTS) return 0;
    uint32_t(*pairs)[256] = calloc(256, sizeof(*pairs));
    uint8_t *grouped = malloc(n ? n : 1);
    size_t size = 0;
    if (!pairs || !grouped) goto done;
    size_t len = o1_segment_len(n, segments);
    uint32_t rows[256], hist[256];
    size_t stride = n >= 16 * O1_RUN * O1_SAMPLE ? O1_RUN * O1_SAMPLE : O1_RUN;
    float scale = hx_sample_pairs(src, ctx, n, stride, pairs, rows);
    uint8_t starts[O1_MAX_BUCKETS + 1], map[256];
    float saving;
    int buckets = o1_choose((const uint32_t(*)[256])pairs, rows, scale, segments, HX_BUCKET_COST, starts, &saving);
    if (saving < HX_LEAST_SAVING) goto done;
    o1_bucket_map(starts, buckets, map);
    /* each segment's share of each group: the histogram of its context bytes */
    uint32_t count[O1_MAX_BUCKETS] = {0}, seg_count[O1_MAX_SEGMENTS][O1_MAX_BUCKETS] = {{0}};
    for (int s = 0; s < segments; s++) {
        size_t a = (size_t)s * len < n ? (size_t)s * len : n, b = a + len < n ? a + len : n;
        if (a == b) continue;
        histogram(ctx + a, b - a, hist);
        for (int v = 0; v < 256; v++) seg_count[s][map[v]] += hist[v];
        for (int k = 0; k < buckets; k++) count[k] += seg_count[s][k];
    }
    uint8_t *at[O1_MAX_SEGMENTS][O1_MAX_BUCKETS];
    o1_group_places(grouped, (const uint32_t(*)[O1_MAX_BUCKETS])seg_count, buckets, segments, at);
    for (int s = 0; s < segments; s++) {
        size_t a = (size_t)s * len < n ? (size_t)s * len : n, b = a + len < n ? a + len : n;
        uint8_t **to = at[s];
        for (size_t i = a; i < b; i++) *to[map[ctx[i]]]++ = src[i];
    }
    size = o1_write_groups(grouped, buckets, segments, starts, count, (const uint32_t(*)[O1_MAX_BUCKETS])seg_count, 0,
                           out);
done:
    free(pairs);
    free(grouped);
    return size;
}

/* The segments' walks, interleaved for the first `len` bytes of each (the shortest), then
 * each segment's rest alone: byte i of segment s is the next unread byte of the group that
 * the bucket of its context byte names. The contexts are known before the walk, so the
 * header's counts were checked against them first (hx_counts_hold): no group runs out, and
 * a walk needs no check per byte. */
static void hx_walk(const uint8_t *map, uint32_t (*at)[O1_MAX_BUCKETS], const uint8_t *restrict groups,
                    const uint8_t *const *ctx, uint8_t *restrict const *out, const size_t *lens, int segments) {
    size_t len = lens[0];
    for (int s = 1; s < segments; s++)
        if (lens[s] < len) len = lens[s];
    if (segments == O1_MAX_SEGMENTS) {
        for (size_t i = 0; i < len; i++)
            for (int s = 0; s < O1_MAX_SEGMENTS; s++) out[s][i] = groups[at[s][map[ctx[s][i]]]++];
    } else {
        len = 0;
    }
    for (int s = 0; s < segments; s++)
        for (size_t i = len; i < lens[s]; i++) out[s][i] = groups[at[s][map[ctx[s][i]]]++];
}

/* Whether each segment's counts per group are those of its context bytes' buckets: what lets
 * hx_walk take bytes without a check. */
static int hx_counts_hold(const o1_header_t *h, const uint8_t *ctx, size_t n) {
    size_t seg = o1_segment_len(n, h->segments);
    uint32_t hist[256];
    for (int s = 0; s < h->segments; s++) {
        size_t a = (size_t)s * seg < n ? (size_t)s * seg : n, b = a + seg < n ? a + seg : n;
        uint32_t got[O1_MAX_BUCKETS] = {0};
        if (a < b) histogram(ctx + a, b - a, hist);
        else memset(hist, 0, sizeof hist);
        for (int v = 0; v < 256; v++) got[h->map[v]] += hist[v];
        for (int k = 0; k < h->buckets; k++)
            if (got[k] != h->seg_count[s][k]) return 0;
    }
    return 1;
}

/* Decodes a payload of n bytes into out[0..n) given the n context bytes ctx, the groups into
 * scratch[0..n); 1 on success, 0 if it is malformed or a group's frame is not made of
 * literal blocks only (out may then hold anything). */
static int huffexp_decode(const uint8_t *in, size_t len, uint8_t *out, size_t n, const uint8_t *ctx,
                          uint8_t *scratch, dtable_t *dt) {
    o1_header_t h;
    if (!o1_read_header(in, len, n, &h) || !hx_counts_hold(&h, ctx, n)) return 0;
    size_t base = 0;
    uint32_t at[O1_MAX_SEGMENTS][O1_MAX_BUCKETS];
    for (int k = 0; k < h.buckets; k++) {
        if (h.count[k] && !literals_frame(h.frame[k], h.frame_size[k], scratch + base, h.count[k], dt, 1)) return 0;
        for (int s = 0; s < h.segments; s++) {
            at[s][k] = (uint32_t)base;
            base += h.seg_count[s][k];
        }
    }
    const uint8_t *c[O1_MAX_SEGMENTS];
    uint8_t *o[O1_MAX_SEGMENTS];
    size_t lens[O1_MAX_SEGMENTS], seg = o1_segment_len(n, h.segments);
    for (int s = 0; s < h.segments; s++) {
        size_t a = (size_t)s * seg < n ? (size_t)s * seg : n, b = a + seg < n ? a + seg : n;
        o[s] = out + a;
        c[s] = ctx + a;
        lens[s] = b - a;
    }
    hx_walk(h.map, at, scratch, c, o, lens, h.segments);
    return 1;
}

/* The context bytes of a frame's `huffexp` plane: its top plane, decoded before it; a
 * constant top plane is written out into `room` (its own, unused slot) first, and points
 * there from then on. */
static const uint8_t *huffexp_context(plane_t *top, uint8_t *room, size_t n) {
    if (!top->bytes) {
        memset(room, top->value, n);
        top->bytes = room;
    }
    return top->bytes;
}
