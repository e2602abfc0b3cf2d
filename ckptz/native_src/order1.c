/*
 * Order-1 exponent coding (bitstream 7, `huff1`; the payload is specified in
 * ckptz/codecs/order1.py): each byte's context is the bucket of the byte before it, the
 * bytes are grouped by context (stably), and each group is one zstd frame of Huffman-coded
 * literal blocks (literals_encode.c), so every context gets its own adaptive tables.
 *
 * Decoding is the literal decoder on each group, then one pass that walks the plane and
 * takes each byte from the group its predecessor's bucket names. That walk is a chain of
 * dependent loads (byte -> bucket -> the group's read position -> byte), so the plane is
 * cut into up to eight segments, each starting from context byte 0, whose walks run
 * interleaved: eight cost ~0.65 ns per byte, four ~1, one alone 3-25 (on AMD EPYC, whose
 * guesses at the read-after-write of a group's read position often fail).
 *
 * Buckets are ranges of the preceding byte's value (neighbouring exponents predict alike),
 * chosen by dynamic programming over the plane's pair counts: order-0 entropy of each
 * range's successors, plus a fixed cost per bucket for its frame, headers and tables.
 */
#include "native.h"

#define O1_VERSION 1
#define O1_MAX_BUCKETS 16
#define O1_MAX_SEGMENTS 8
/* Units the bucket search works on: at most this many ranges of present byte values. */
#define O1_UNITS 64
/* A bucket's own cost in bytes: a frame header, block headers, a weight table and a
 * decoding table to build (about what literals_encode.c counts per block). */
#define O1_BUCKET_COST 160.0f
/* Pair counts for the bucket search: runs of O1_RUN bytes, one in O1_SAMPLE. */
#define O1_RUN 1024
#define O1_SAMPLE 4
/* Least estimated saving over one bucket for which a contextual_only encoder codes the
 * groups: half of the 1% huff1 must save to be chosen (frames.CONTEXT_MARGIN), since the
 * estimate comes from a sample of the pairs. */
#define O1_LEAST_SAVING 0.005f
/* Runs of O1_RUN bytes, spread over the plane, that order1_saving() estimates from: a
 * sixteenth of a 1 MiB plane, few enough that a coder may ask it of every exponent plane. */
#define O1_SPARSE_RUNS 64

/* Little-endian u32s. */
static uint32_t o1_get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static void o1_put32(uint8_t *p, uint32_t v) {
    for (int k = 0; k < 4; k++) p[k] = (uint8_t)(v >> (8 * k));
}

/* Header bytes of a payload with K buckets and S segments. */
static size_t o1_header_size(int buckets, int segments) {
    return 4 + (size_t)(buckets - 1) + 8 * (size_t)buckets + 4 * (size_t)buckets * (size_t)(segments - 1);
}

/* Segment s of n bytes cut into `segments`: [s * len, min((s + 1) * len, n)). */
static size_t o1_segment_len(size_t n, int segments) { return (n + (size_t)segments - 1) / (size_t)segments; }

/* ---------------------------------------------------------------- choosing buckets */

/* Cost in bytes of coding `total` bytes (entropy from the sum of c log2 c of their counts)
 * as one group that costs `fixed` bytes itself, on counts sampled at `scale` (fixed costs
 * scale with it). */
static float o1_group_cost(float sum_xlogx, uint32_t total, uint32_t distinct, float scale, float fixed) {
    if (!total) return 0;
    float bits = xlog2x((float)total) - sum_xlogx;
    float coded = bits / 8 + (fixed + DESC_COST * (float)distinct) * scale;
    float raw = (float)total + 16 * scale;
    return (float)total < MIN_HUFFMAN * scale || raw < coded ? raw : coded;
}

/* Chooses bucket starts (starts[0] = 0, ascending) from the pair counts `pairs` (row:
 * context byte, column: byte), sampled at `scale`; returns the number of buckets, and in
 * *saving the share of one bucket's estimated cost that they save (0 for one bucket).
 * `rows` are each row's totals; a bucket costs `bucket_cost` bytes itself, and its header
 * fields grow with `segments`. */
static int o1_choose(const uint32_t (*pairs)[256], const uint32_t *rows, float scale, int segments, float bucket_cost,
                     uint8_t *starts, float *saving) {
    *saving = 0;
    /* units: consecutive runs of present preceding values, at most O1_UNITS of them */
    int present[256], m = 0;
    for (int v = 0; v < 256; v++)
        if (rows[v]) present[m++] = v;
    if (m <= 1) {
        starts[0] = 0;
        return 1;
    }
    int per = (m + O1_UNITS - 1) / O1_UNITS, units = (m + per - 1) / per;
    int first[O1_UNITS + 1]; /* unit u covers present[first[u] .. first[u + 1]) */
    for (int u = 0; u <= units; u++) first[u] = u * per < m ? u * per : m;
    /* each unit's successor counts, sparse: the DP below adds units to ranges O(units^2)
     * times, and a unit's successors are a few dozen of the 256 byte values */
    static const float INF = 3e38f;
    uint32_t(*count)[256] = calloc((size_t)units, sizeof(*count));
    uint8_t(*sym)[256] = malloc((size_t)units * sizeof(*sym));
    int used[O1_UNITS];
    if (!count || !sym) {
        free(count);
        free(sym);
        starts[0] = 0;
        return 1;
    }
    for (int u = 0; u < units; u++) {
        for (int r = first[u]; r < first[u + 1]; r++)
            for (int s = 0; s < 256; s++) count[u][s] += pairs[present[r]][s];
        used[u] = 0;
        for (int s = 0; s < 256; s++)
            if (count[u][s]) sym[u][used[u]++] = (uint8_t)s;
    }
    float fixed = bucket_cost + 4.0f * (float)(segments + 1);
    float best[O1_MAX_BUCKETS + 1][O1_UNITS + 1];
    uint8_t from[O1_MAX_BUCKETS + 1][O1_UNITS + 1];
    for (int k = 0; k <= O1_MAX_BUCKETS; k++)
        for (int j = 0; j <= units; j++) best[k][j] = INF;
    best[0][0] = 0;
    uint32_t acc[256];
    for (int i = 0; i < units; i++) {
        memset(acc, 0, sizeof(acc));
        float sum_xlogx = 0;
        uint32_t total = 0, distinct = 0;
        for (int j = i + 1; j <= units; j++) {
            const uint8_t *ss = sym[j - 1];
            const uint32_t *c = count[j - 1];
            for (int q = 0; q < used[j - 1]; q++) {
                int s = ss[q];
                uint32_t was = acc[s], now = was + c[s];
                acc[s] = now;
                sum_xlogx += xlog2x((float)now) - (was ? xlog2x((float)was) : 0);
                distinct += !was;
                total += c[s];
            }
            float cost = o1_group_cost(sum_xlogx, total, distinct, scale, fixed);
            for (int k = 0; k < O1_MAX_BUCKETS; k++)
                if (best[k][i] < INF && best[k][i] + cost < best[k + 1][j]) {
                    best[k + 1][j] = best[k][i] + cost;
                    from[k + 1][j] = (uint8_t)i;
                }
        }
    }
    free(count);
    free(sym);
    int buckets = 1;
    for (int k = 2; k <= O1_MAX_BUCKETS; k++)
        if (best[k][units] < best[buckets][units]) buckets = k;
    if (best[1][units] > 0) *saving = 1 - best[buckets][units] / best[1][units];
    int unit[O1_MAX_BUCKETS + 1]; /* the first unit of each bucket */
    unit[buckets] = units;
    for (int k = buckets; k > 0; k--) unit[k - 1] = from[k][unit[k]];
    for (int k = 0; k < buckets; k++) starts[k] = (uint8_t)(k ? present[first[unit[k]]] : 0);
    return buckets;
}

/* ---------------------------------------------------------------- encoding */

/* map[v]: the bucket of byte value v, for buckets starting at starts[0..buckets). */
static void o1_bucket_map(const uint8_t *starts, int buckets, uint8_t *map) {
    for (int v = 0, k = 0; v < 256; v++) {
        while (k + 1 < buckets && v >= starts[k + 1]) k++;
        map[v] = (uint8_t)k;
    }
}

/* A huff1-shaped payload (after `prefix` bytes left for the caller) into a new buffer
 * (*out, free()d by the caller) from its groups: group k is count[k] bytes of grouped[],
 * groups end to end, each segment's share of it (seg_count[s][k]) in segment order. Writes
 * each group's literal frame, then the header before them; returns the payload's size with
 * the prefix, or 0 where a group's frame cannot be written or memory ran out. */
static size_t o1_write_groups(const uint8_t *grouped, int buckets, int segments, const uint8_t *starts,
                              const uint32_t *count, const uint32_t (*seg_count)[O1_MAX_BUCKETS], size_t prefix,
                              uint8_t **out) {
    *out = NULL;
    size_t head = prefix + o1_header_size(buckets, segments), cap = head;
    for (int k = 0; k < buckets; k++) cap += frame_capacity(count[k], 0);
    uint8_t *buf = malloc(cap);
    if (!buf) return 0;
    uint8_t *op = buf + head;
    uint32_t frame_size[O1_MAX_BUCKETS];
    for (int k = 0; k < buckets; k++) {
        size_t got = count[k] ? write_frame(op, grouped, count[k], 0) : 0;
        if (count[k] && !got) return free(buf), 0;
        frame_size[k] = (uint32_t)got;
        grouped += count[k];
        op += got;
    }
    uint8_t *hp = buf + prefix;
    *hp++ = O1_VERSION;
    *hp++ = (uint8_t)buckets;
    *hp++ = (uint8_t)segments;
    *hp++ = 0;
    for (int k = 1; k < buckets; k++) *hp++ = starts[k];
    for (int k = 0; k < buckets; k++, hp += 4) o1_put32(hp, count[k]);
    for (int k = 0; k < buckets; k++, hp += 4) o1_put32(hp, frame_size[k]);
    for (int s = 0; s + 1 < segments; s++)
        for (int k = 0; k < buckets; k++, hp += 4) o1_put32(hp, seg_count[s][k]);
    *out = buf;
    return (size_t)(op - buf);
}

/* Pair counts (row: the preceding byte, 0 at a segment's start; column: the byte) of runs
 * of O1_RUN bytes starting every `stride` bytes into the zeroed `pairs`, and each row's
 * total into rows; returns the share of the plane sampled. `len` is the segments' length. */
static float o1_sample_pairs(const uint8_t *src, size_t n, size_t len, size_t stride, uint32_t (*pairs)[256],
                             uint32_t *rows) {
    for (size_t a = 0; a < n; a += stride) {
        size_t b = a + O1_RUN < n ? a + O1_RUN : n, s = a / len;
        uint8_t prev = a == s * len ? 0 : src[a - 1];
        for (size_t i = a; i < b; i++) {
            if (i == s * len + len) prev = 0, s++;
            pairs[prev][src[i]]++;
            prev = src[i];
        }
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

/* The share of one bucket's estimated cost that order-1 buckets save on n bytes cut into
 * `segments` (o1_choose's saving), from a sparse sample of the pairs: a cheap measurement of
 * whether contexts may pay, which a coder asks before it tries huff1 at all (-1 where memory
 * ran out). */
static float order1_saving(const uint8_t *src, size_t n, int segments) {
    if (segments < 1 || segments > O1_MAX_SEGMENTS) return -1;
    uint32_t(*pairs)[256] = calloc(256, sizeof(*pairs));
    if (!pairs) return -1;
    uint32_t rows[256];
    size_t stride = n / O1_SPARSE_RUNS / O1_RUN * O1_RUN;
    float scale = o1_sample_pairs(src, n, o1_segment_len(n, segments), stride > O1_RUN ? stride : O1_RUN, pairs, rows);
    float saving;
    uint8_t starts[O1_MAX_BUCKETS + 1];
    o1_choose((const uint32_t(*)[256])pairs, rows, scale, segments, O1_BUCKET_COST, starts, &saving);
    free(pairs);
    return saving;
}

/* Where each segment's bytes of each group go: the groups one after another in grouped,
 * each one's segments in order within it. */
static void o1_group_places(uint8_t *grouped, const uint32_t (*seg_count)[O1_MAX_BUCKETS], int buckets, int segments,
                            uint8_t *at[O1_MAX_SEGMENTS][O1_MAX_BUCKETS]) {
    uint8_t *q = grouped;
    for (int k = 0; k < buckets; k++)
        for (int s = 0; s < segments; s++) {
            at[s][k] = q;
            q += seg_count[s][k];
        }
}

/* The payload for n bytes into a new buffer (*out, free()d by the caller); returns its size,
 * or 0 if a group's frame cannot be written (a table zstd cannot describe) or memory ran
 * out. `segments` is 1 to O1_MAX_SEGMENTS. With `contextual_only`, also 0 where the pair
 * counts estimate a saving below O1_LEAST_SAVING: no context pays there (dense weights, and
 * frames of several weight tensors), and declining before the grouping and coding spares a
 * coder that tries huff1 on every float most of its cost. */
static size_t order1_encode(const uint8_t *src, size_t n, int segments, int contextual_only, uint8_t **out) {
    *out = NULL;
    if (n > 0xFFFFFFFFu || segments < 1 || segments > O1_MAX_SEGMENTS) return 0;
    uint32_t(*pairs)[256] = calloc(256, sizeof(*pairs));
    uint8_t *grouped = malloc(n ? n : 1);
    size_t size = 0;
    if (!pairs || !grouped) goto done;
    size_t len = o1_segment_len(n, segments);
    /* The buckets are chosen from a sample of the pairs (every fourth run of O1_RUN bytes
     * of a large plane): the choice needs their shape, not exact counts. */
    uint32_t rows[256], hist[256];
    size_t stride = n >= 16 * O1_RUN * O1_SAMPLE ? O1_RUN * O1_SAMPLE : O1_RUN;
    float scale = o1_sample_pairs(src, n, len, stride, pairs, rows);
    uint8_t starts[O1_MAX_BUCKETS + 1], map[256];
    float saving;
    int buckets = o1_choose((const uint32_t(*)[256])pairs, rows, scale, segments, O1_BUCKET_COST, starts, &saving);
    if (contextual_only && saving < O1_LEAST_SAVING) goto done;
    o1_bucket_map(starts, buckets, map);
    /* each segment's share of each group: the counts of its preceding bytes (its byte
     * histogram, less its last byte, plus the 0 before its first) */
    uint32_t count[O1_MAX_BUCKETS] = {0}, seg_count[O1_MAX_SEGMENTS][O1_MAX_BUCKETS] = {{0}};
    for (int s = 0; s < segments; s++) {
        size_t a = (size_t)s * len < n ? (size_t)s * len : n, b = a + len < n ? a + len : n;
        if (a == b) continue;
        histogram(src + a, b - a, hist);
        hist[src[b - 1]]--;
        hist[0]++;
        for (int v = 0; v < 256; v++) seg_count[s][map[v]] += hist[v];
        for (int k = 0; k < buckets; k++) count[k] += seg_count[s][k];
    }
    /* the segments' scatters run interleaved (each one's write positions are a chain
     * through memory) */
    uint8_t *at[O1_MAX_SEGMENTS][O1_MAX_BUCKETS];
    o1_group_places(grouped, (const uint32_t(*)[O1_MAX_BUCKETS])seg_count, buckets, segments, at);
    size_t last = n - (size_t)(segments - 1) * len < len ? n - (size_t)(segments - 1) * len : len;
    if (n < (size_t)(segments - 1) * len) last = 0;
    uint8_t prev[O1_MAX_SEGMENTS] = {0};
    if (segments == O1_MAX_SEGMENTS) {
        for (size_t i = 0; i < last; i++)
            for (int s = 0; s < O1_MAX_SEGMENTS; s++) {
                uint8_t x = src[(size_t)s * len + i];
                *at[s][map[prev[s]]]++ = x;
                prev[s] = x;
            }
    } else {
        last = 0;
    }
    for (int s = 0; s < segments; s++) {
        size_t a = (size_t)s * len < n ? (size_t)s * len : n, b = a + len < n ? a + len : n;
        for (size_t i = a + last; i < b; i++) {
            *at[s][map[prev[s]]]++ = src[i];
            prev[s] = src[i];
        }
    }
    size = o1_write_groups(grouped, buckets, segments, starts, count, (const uint32_t(*)[O1_MAX_BUCKETS])seg_count, 0,
                           out);
done:
    free(pairs);
    free(grouped);
    return size;
}

/* Sum over blocks of `sub` bytes of each block's order-0 entropy, in bytes: a lower bound
 * on any code of the plane with one table per whole number of such blocks (the zstd
 * frames of literals_encode.c plan their blocks on 8 KiB steps). */
static double blocked_entropy(const uint8_t *src, size_t n, size_t sub) {
    double bits = 0;
    uint32_t hist[256];
    for (size_t a = 0; a < n; a += sub) {
        size_t m = a + sub < n ? sub : n - a;
        histogram(src + a, m, hist);
        double sum = 0;
        for (int s = 0; s < 256; s++)
            if (hist[s]) sum += hist[s] * log2((double)hist[s]);
        bits += (double)m * log2((double)m) - sum;
    }
    return bits / 8;
}

/* ---------------------------------------------------------------- decoding */

/* A payload's header, read and checked against n. */
typedef struct {
    int buckets, segments;
    uint8_t map[256];
    uint32_t count[O1_MAX_BUCKETS];
    const uint8_t *frame[O1_MAX_BUCKETS];
    size_t frame_size[O1_MAX_BUCKETS];
    uint32_t seg_count[O1_MAX_SEGMENTS][O1_MAX_BUCKETS]; /* every segment's, the last one's derived */
} o1_header_t;

/* 1 if in[0..len) is a well-formed header for n bytes, its frames within the payload. */
static int o1_read_header(const uint8_t *in, size_t len, size_t n, o1_header_t *h) {
    if (len < 4 || in[0] != O1_VERSION || in[3] != 0) return 0;
    int buckets = in[1], segments = in[2];
    if (buckets < 1 || buckets > O1_MAX_BUCKETS || segments < 1 || segments > O1_MAX_SEGMENTS) return 0;
    size_t head = o1_header_size(buckets, segments);
    if (len < head || n > 0xFFFFFFFFu) return 0;
    h->buckets = buckets;
    h->segments = segments;
    const uint8_t *p = in + 4;
    int start = 0;
    for (int k = 0, v = 0; k < buckets; k++) {
        int end = k + 1 < buckets ? p[k] : 256;
        if (end <= start) return 0; /* starts strictly ascending, the first above 0 */
        for (v = start; v < end; v++) h->map[v] = (uint8_t)k;
        start = end;
    }
    p += buckets - 1;
    uint64_t total = 0, frames = 0;
    for (int k = 0; k < buckets; k++, p += 4) total += h->count[k] = o1_get32(p);
    for (int k = 0; k < buckets; k++, p += 4) frames += h->frame_size[k] = o1_get32(p);
    if (total != n || frames != len - head) return 0;
    const uint8_t *f = in + head;
    for (int k = 0; k < buckets; k++) {
        if (!h->frame_size[k] != !h->count[k]) return 0; /* an empty group has no frame */
        h->frame[k] = f;
        f += h->frame_size[k];
    }
    size_t seg = o1_segment_len(n, segments);
    uint64_t used[O1_MAX_BUCKETS] = {0};
    for (int s = 0; s < segments; s++) {
        size_t a = (size_t)s * seg < n ? (size_t)s * seg : n, b = a + seg < n ? a + seg : n;
        uint64_t sum = 0;
        for (int k = 0; k < buckets; k++) {
            uint32_t c;
            if (s + 1 < segments) {
                c = o1_get32(p);
                p += 4;
                if (used[k] + c > h->count[k]) return 0;
            } else {
                c = (uint32_t)(h->count[k] - used[k]);
            }
            h->seg_count[s][k] = c;
            used[k] += c;
            sum += c;
        }
        if (sum != b - a) return 0;
    }
    return 1;
}

/* One segment's walk: out[0..len) from the groups, starting from context byte 0. p/e are
 * its read positions and ends per bucket. 0 if a group runs out (a malformed header). */
#define O1_STEP(map, p, e, v, o)                                                         \
    do {                                                                                 \
        uint8_t k_ = (map)[v];                                                           \
        if ((p)[k_] == (e)[k_]) return 0;                                                \
        (v) = *(p)[k_]++;                                                                \
        (o) = (v);                                                                       \
    } while (0)

static int o1_walk(const uint8_t *map, const uint8_t **p, const uint8_t *const *e, uint8_t *out, size_t len) {
    uint8_t v = 0;
    for (size_t i = 0; i < len; i++) O1_STEP(map, p, e, v, out[i]);
    return 1;
}

/* `W` (4 or 8) segments' walks interleaved (their chains overlap: eight run about 1.5x
 * as fast as four), for the first `len` bytes of each; then each segment's rest alone. */
#define O1_WALK(W)                                                                                                   \
    static int o1_walk##W(const uint8_t *map, const uint8_t *(*p)[O1_MAX_BUCKETS],                                   \
                          const uint8_t *const (*e)[O1_MAX_BUCKETS], uint8_t *const *out, const size_t *lens) {      \
        size_t len = lens[0];                                                                                        \
        for (int s = 1; s < W; s++)                                                                                  \
            if (lens[s] < len) len = lens[s];                                                                        \
        uint8_t v[W] = {0};                                                                                          \
        for (size_t i = 0; i < len; i++)                                                                             \
            for (int s = 0; s < W; s++) O1_STEP(map, p[s], e[s], v[s], out[s][i]);                                  \
        for (int s = 0; s < W; s++) {                                                                                \
            uint8_t x = v[s];                                                                                        \
            for (size_t i = len; i < lens[s]; i++) O1_STEP(map, p[s], e[s], x, out[s][i]);                           \
        }                                                                                                            \
        return 1;                                                                                                    \
    }
O1_WALK(4)
O1_WALK(8)
#undef O1_WALK
#undef O1_STEP

/* Checks that every group's frame is one literals_frame() decodes (with decode 0, touches
 * nothing else); 1 if so. */
static int order1_usable(const uint8_t *in, size_t len, size_t n, dtable_t *dt) {
    o1_header_t h;
    if (!o1_read_header(in, len, n, &h)) return 0;
    for (int k = 0; k < h.buckets; k++)
        if (h.count[k] && !literals_frame(h.frame[k], h.frame_size[k], NULL, h.count[k], dt, 0)) return 0;
    return 1;
}

/* Decodes a payload of n bytes into out[0..n), the groups into scratch[0..n); 1 on success,
 * 0 if it is malformed or a group's frame needs libzstd (out may then hold anything). */
static int order1_decode(const uint8_t *in, size_t len, uint8_t *out, size_t n, uint8_t *scratch, dtable_t *dt) {
    o1_header_t h;
    if (!o1_read_header(in, len, n, &h)) return 0;
    const uint8_t *group[O1_MAX_BUCKETS];
    size_t at = 0;
    for (int k = 0; k < h.buckets; k++) {
        group[k] = scratch + at;
        if (h.count[k] && !literals_frame(h.frame[k], h.frame_size[k], scratch + at, h.count[k], dt, 1)) return 0;
        at += h.count[k];
    }
    const uint8_t *p[O1_MAX_SEGMENTS][O1_MAX_BUCKETS], *e[O1_MAX_SEGMENTS][O1_MAX_BUCKETS];
    uint8_t *o[O1_MAX_SEGMENTS];
    size_t lens[O1_MAX_SEGMENTS], seg = o1_segment_len(n, h.segments);
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
    }
    int s = 0;
    const uint8_t *const(*ends)[O1_MAX_BUCKETS] = (const uint8_t *const(*)[O1_MAX_BUCKETS])e;
    if (s + 8 <= h.segments && !o1_walk8(h.map, p + s, ends + s, o + s, lens + s)) return 0;
    if (s + 8 <= h.segments) s += 8;
    for (; s + 4 <= h.segments; s += 4)
        if (!o1_walk4(h.map, p + s, ends + s, o + s, lens + s)) return 0;
    for (; s < h.segments; s++)
        if (!o1_walk(h.map, p[s], e[s], o[s], lens[s])) return 0;
    return 1;
}
