/*
 * Row-predicted exponents (bitstream 8, `huff2d`; the payload is specified in
 * ckptz/codecs/order2d.py): each byte is predicted from its left neighbour, the byte one
 * row up and the one up and left (x[i-1] + x[i-W] - x[i-W-1], clamped to a byte), the
 * residual byte - prediction is what gets coded, and the residuals are grouped by the
 * bucket of their prediction and coded as huff1's groups are (order1.c: the same header
 * after a 4-byte row width, the same bucket search, the same literal frames).
 *
 * Why rows: an Adam second moment is roughly an outer product of a row scale and a column
 * scale, so its exponent is about the sum of two per-row and per-column terms, which the
 * planar prediction cancels; the element before alone predicts only the row's term.
 *
 * The plane carries no shape, so the encoder finds the row width: the multiple of
 * O2_WIDTH_STEP whose prediction misses least (summed absolute residual) on a sample of the
 * plane, against the left neighbour alone; a plane no width predicts better is declined.
 */
#include "native.h"

/* Widths the search tries, up to a quarter of a segment and at most O2_MAX_WIDTH (a weight
 * matrix's row of up to 32 K elements): multiples of O2_WIDTH_STEP below O2_WIDE_ROW, of
 * O2_WIDE_STEP from there (model widths are multiples of 64), which spares planes without
 * rows six sevenths of the search. */
#define O2_WIDTH_STEP 8
#define O2_WIDE_ROW 1024
#define O2_WIDE_STEP 64
#define O2_MAX_WIDTH 32768
/* Sampled positions per width: O2_PROBES in runs of O2_RUN for every width, then
 * O2_FINE_PROBES for the O2_FINALISTS best. */
#define O2_RUN 16
#define O2_PROBES 256
#define O2_FINE_PROBES 16384
#define O2_FINALISTS 16
/* The best width's summed residual must be below this share of the left neighbour's
 * alone for the plane to be coded: dense weights and first moments reach 0.95-1.0 (no row
 * structure), second moments 0.6-0.8. */
#define O2_LEAST_GAIN 0.9
/* A divisor of the best width whose summed residual is within this factor of the best's
 * is taken instead. */
#define O2_NEAR 1.02

/* The prediction of byte j of a segment x (j > width: planar; else the left byte, 0 at j = 0). */
static inline uint8_t o2_predict(const uint8_t *x, size_t j, size_t width) {
    if (j > width) {
        int v = (int)x[j - 1] + (int)x[j - width] - (int)x[j - width - 1];
        return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
    }
    return j ? x[j - 1] : 0;
}

/* Summed |x[p] - prediction| over `runs` runs of O2_RUN positions spread over
 * [from, n), for row width w (0: the left neighbour alone). */
WIDE static uint64_t o2_miss(const uint8_t *x, size_t n, size_t from, size_t w, size_t runs) {
    uint64_t miss = 0;
    size_t span = n - from - O2_RUN, step = span / runs;
    for (size_t r = 0; r < runs; r++) {
        size_t a = from + r * step;
        for (size_t p = a; p < a + O2_RUN; p++) {
            int pred = x[p - 1];
            if (w) {
                pred += (int)x[p - w] - (int)x[p - w - 1];
                pred = pred < 0 ? 0 : pred > 255 ? 255 : pred;
            }
            int d = (int)x[p] - pred;
            miss += (uint64_t)(d < 0 ? -d : d);
        }
    }
    return miss;
}

/* How far a width's predictions miss on sampled runs (o2_miss's arguments). */
typedef uint64_t (*o2_miss_t)(const uint8_t *x, size_t n, size_t from, size_t w, size_t runs);

/* The row width whose predictions `miss` least on the plane, or 0 where none beats the left
 * neighbour by O2_LEAST_GAIN (or the plane is too short to search). `segment` is its
 * segments' length. Where a width is found, *mean_miss (if not NULL) is its miss per
 * sampled position. */
static size_t o2_width(const uint8_t *x, size_t n, size_t segment, o2_miss_t o2_miss, double *mean_miss) {
    size_t most = segment / 4 < O2_MAX_WIDTH ? segment / 4 : O2_MAX_WIDTH;
    most -= most % O2_WIDTH_STEP;
    if (most < O2_WIDTH_STEP || n < 2 * most + 2 * O2_RUN * O2_PROBES / 16) return 0;
    size_t from = most + 1, runs = O2_PROBES / O2_RUN;
    if ((n - from - O2_RUN) / runs < O2_RUN) return 0;
    size_t best_w[O2_FINALISTS] = {0};
    uint64_t best_m[O2_FINALISTS];
    for (int f = 0; f < O2_FINALISTS; f++) best_m[f] = UINT64_MAX;
    for (size_t w = O2_WIDTH_STEP; w <= most; w += w < O2_WIDE_ROW ? O2_WIDTH_STEP : O2_WIDE_STEP) {
        uint64_t m = o2_miss(x, n, from, w, runs);
        if (m >= best_m[O2_FINALISTS - 1]) continue;
        int f = O2_FINALISTS - 1; /* insert, keeping the finalists sorted (ties: the narrower first) */
        while (f > 0 && best_m[f - 1] > m) {
            best_m[f] = best_m[f - 1], best_w[f] = best_w[f - 1];
            f--;
        }
        best_m[f] = m, best_w[f] = w;
    }
    size_t fine = O2_FINE_PROBES / O2_RUN;
    if ((n - from - O2_RUN) / fine < O2_RUN) fine = runs;
    size_t width = 0;
    uint64_t least = UINT64_MAX;
    for (int f = 0; f < O2_FINALISTS && best_w[f]; f++) {
        uint64_t m = o2_miss(x, n, from, best_w[f], fine);
        if (m < least || (m == least && best_w[f] < width)) least = m, width = best_w[f];
    }
    /* Every multiple of the row width predicts about as well (two rows up, three...): the
     * narrowest divisor within O2_NEAR of the best is the width itself. */
    for (size_t d = O2_WIDTH_STEP; width && d < width; d += O2_WIDTH_STEP)
        if (width % d == 0 && (double)o2_miss(x, n, from, d, fine) <= O2_NEAR * (double)least) {
            width = d;
            break;
        }
    uint64_t left = o2_miss(x, n, from, 0, fine);
    if (mean_miss) *mean_miss = (double)least / (double)(fine * O2_RUN);
    return width && (double)least < O2_LEAST_GAIN * (double)left ? width : 0;
}

/* The row width that predicts the exponent plane best (o2_width), or 0. */
static size_t order2d_width(const uint8_t *x, size_t n, size_t segment) { return o2_width(x, n, segment, o2_miss, NULL); }

/* The payload for n bytes into a new buffer (*out, free()d by the caller); returns its
 * size, or 0 where no row width pays (width 0: searched), a group's frame cannot be
 * written, or memory ran out. */
static size_t order2d_encode(const uint8_t *src, size_t n, int segments, size_t width, uint8_t **out) {
    *out = NULL;
    if (n > 0xFFFFFFFFu || segments < 1 || segments > O1_MAX_SEGMENTS || width > 0xFFFFFFFFu) return 0;
    size_t len = o1_segment_len(n, segments);
    if (!width && !(width = order2d_width(src, n, len))) return 0;
    uint32_t(*pairs)[256] = calloc(256, sizeof(*pairs));
    uint8_t *pred = malloc(n ? n : 1), *resid = malloc(n ? n : 1), *grouped = malloc(n ? n : 1);
    size_t size = 0;
    if (!pairs || !pred || !resid || !grouped) goto done;
    for (int s = 0; s < segments; s++) {
        size_t a = (size_t)s * len < n ? (size_t)s * len : n, b = a + len < n ? a + len : n;
        for (size_t j = 0; j < b - a; j++) {
            uint8_t p = o2_predict(src + a, j, width);
            pred[a + j] = p;
            resid[a + j] = (uint8_t)(src[a + j] - p);
            pairs[p][resid[a + j]]++;
        }
    }
    uint32_t rows[256];
    for (int v = 0; v < 256; v++) {
        uint32_t t = 0;
        for (int c = 0; c < 256; c++) t += pairs[v][c];
        rows[v] = t;
    }
    uint8_t starts[O1_MAX_BUCKETS + 1], map[256];
    float saving;
    int buckets = o1_choose((const uint32_t(*)[256])pairs, rows, 1, segments, O1_BUCKET_COST, starts, &saving);
    o1_bucket_map(starts, buckets, map);
    uint32_t count[O1_MAX_BUCKETS] = {0}, seg_count[O1_MAX_SEGMENTS][O1_MAX_BUCKETS] = {{0}};
    for (int s = 0; s < segments; s++) {
        size_t a = (size_t)s * len < n ? (size_t)s * len : n, b = a + len < n ? a + len : n;
        for (size_t i = a; i < b; i++) seg_count[s][map[pred[i]]]++;
        for (int k = 0; k < buckets; k++) count[k] += seg_count[s][k];
    }
    uint8_t *at[O1_MAX_BUCKETS];
    size_t base[O1_MAX_BUCKETS];
    for (int k = 0; k < buckets; k++) at[k] = grouped + (base[k] = k ? base[k - 1] + count[k - 1] : 0);
    for (size_t i = 0; i < n; i++) *at[map[pred[i]]]++ = resid[i]; /* segment by segment, in order */
    size = o1_write_groups(grouped, buckets, segments, starts, count, (const uint32_t(*)[O1_MAX_BUCKETS])seg_count, 4,
                           out);
    if (size) o1_put32(*out, (uint32_t)width);
done:
    free(pairs);
    free(pred);
    free(resid);
    free(grouped);
    return size;
}

/* ---------------------------------------------------------------- decoding */

/* The row width and huff1-shaped header of a payload for n bytes; 1 if well formed. */
static int o2_read_header(const uint8_t *in, size_t len, size_t n, size_t *width, o1_header_t *h) {
    if (len < 4 || !(*width = o1_get32(in))) return 0;
    return o1_read_header(in + 4, len - 4, n, h);
}

/* Checks that the payload is well formed and every group's frame is one literals_frame()
 * decodes; 1 if so. */
static int order2d_usable(const uint8_t *in, size_t len, size_t n, dtable_t *dt) {
    o1_header_t h;
    size_t width;
    if (!o2_read_header(in, len, n, &width, &h)) return 0;
    for (int k = 0; k < h.buckets; k++)
        if (h.count[k] && !literals_frame(h.frame[k], h.frame_size[k], NULL, h.count[k], dt, 0)) return 0;
    return 1;
}

/* Byte j of segment o: the next residual of its prediction's group, plus the prediction. */
#define O2_STEP(map, p, e, o, j, width)                                                  \
    do {                                                                                 \
        uint8_t pr_ = o2_predict((o), (j), (width)), k_ = (map)[pr_];                    \
        if ((p)[k_] == (e)[k_]) return 0;                                                \
        (o)[j] = (uint8_t)(*(p)[k_]++ + pr_);                                            \
    } while (0)

/* Decodes a payload of n bytes into out[0..n), the groups into scratch[0..n); 1 on success,
 * 0 if it is malformed or a group's frame is not literal-only (out may then hold anything).
 * The segments' walks run interleaved (each is a chain of dependent loads). */
static int order2d_decode(const uint8_t *in, size_t len, uint8_t *out, size_t n, uint8_t *scratch, dtable_t *dt) {
    o1_header_t h;
    size_t width;
    if (!o2_read_header(in, len, n, &width, &h)) return 0;
    const uint8_t *group[O1_MAX_BUCKETS];
    size_t at = 0;
    for (int k = 0; k < h.buckets; k++) {
        group[k] = scratch + at;
        if (h.count[k] && !literals_frame(h.frame[k], h.frame_size[k], scratch + at, h.count[k], dt, 1)) return 0;
        at += h.count[k];
    }
    const uint8_t *p[O1_MAX_SEGMENTS][O1_MAX_BUCKETS], *e[O1_MAX_SEGMENTS][O1_MAX_BUCKETS];
    uint8_t *o[O1_MAX_SEGMENTS];
    size_t lens[O1_MAX_SEGMENTS], seg = o1_segment_len(n, h.segments), common = n;
    for (int k = 0; k < h.buckets; k++) {
        const uint8_t *q = group[k];
        for (int s = 0; s < h.segments; s++) {
            p[s][k] = q;
            q += h.seg_count[s][k];
            e[s][k] = q;
        }
    }
    for (int s = 0; s < h.segments; s++) {
        size_t a = (size_t)s * seg < n ? (size_t)s * seg : n, b = a + seg < n ? a + seg : n;
        o[s] = out + a;
        lens[s] = b - a;
        if (lens[s] < common) common = lens[s];
    }
    if (h.segments == O1_MAX_SEGMENTS) {
        /* the first row (left bytes only), then the rest, where every byte has a row above */
        size_t first = width + 1 < common ? width + 1 : common;
        for (size_t j = 0; j < first; j++)
            for (int s = 0; s < O1_MAX_SEGMENTS; s++) O2_STEP(h.map, p[s], e[s], o[s], j, width);
        /* the left byte stays in a register: reading it back from out would put a store's
         * forwarding on every step's chain */
        int left[O1_MAX_SEGMENTS];
        for (int s = 0; s < O1_MAX_SEGMENTS; s++) left[s] = first ? o[s][first - 1] : 0;
        for (size_t j = first; j < common; j++)
            for (int s = 0; s < O1_MAX_SEGMENTS; s++) {
                uint8_t *x = o[s];
                int v = left[s] + (int)x[j - width] - (int)x[j - width - 1];
                uint8_t pr = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v), k = h.map[pr];
                if (p[s][k] == e[s][k]) return 0;
                x[j] = (uint8_t)(*p[s][k]++ + pr);
                left[s] = x[j];
            }
    } else {
        common = 0;
    }
    for (int s = 0; s < h.segments; s++)
        for (size_t j = common; j < lens[s]; j++) O2_STEP(h.map, p[s], e[s], o[s], j, width);
    return 1;
}
#undef O2_STEP
