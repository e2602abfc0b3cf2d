/*
 * Huffman codes for zstd literals: a length-limited canonical code for a histogram, what it
 * costs, and its description as zstd stores it (weights, FSE-compressed or direct).
 */
#include "native.h"

#define MAX_DIRECT 128 /* direct weights: the highest byte value present is at most 128 */

/* Code lengths of an optimal prefix code for weights sorted ascending (Moffat and
 * Katajainen's in-place algorithm): on return a[i] is the length of the i-th symbol. */
static void minimum_redundancy(uint32_t *a, int n) {
    if (n == 1) {
        a[0] = 1;
        return;
    }
    int root = 0, leaf = 2, next;
    a[0] += a[1];
    for (next = 1; next < n - 1; next++) {
        if (leaf >= n || a[root] < a[leaf]) {
            a[next] = a[root];
            a[root++] = (uint32_t)next;
        } else {
            a[next] = a[leaf++];
        }
        if (leaf >= n || (root < next && a[root] < a[leaf])) {
            a[next] += a[root];
            a[root++] = (uint32_t)next;
        } else {
            a[next] += a[leaf++];
        }
    }
    a[n - 2] = 0;
    for (next = n - 3; next >= 0; next--) a[next] = a[a[next]] + 1;
    int avbl = 1, used = 0, depth = 0;
    root = n - 2;
    next = n - 1;
    while (avbl > 0) {
        while (root >= 0 && (int)a[root] == depth) {
            used++;
            root--;
        }
        while (avbl > used) {
            a[next--] = (uint32_t)depth;
            avbl--;
        }
        avbl = 2 * used;
        depth++;
        used = 0;
    }
}

static int cmp_count(const void *x, const void *y) {
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return (a > b) - (a < b);
}

/* A length-limited canonical Huffman table for a histogram with at least two symbols. */
static void build_table(const uint32_t *hist, table_t *t) {
    uint64_t keyed[256]; /* count << 8 | symbol, sorted ascending */
    uint32_t lens[256] = {0}; /* (zeroed: the compiler cannot see n >= 2 fills a[0] and a[1]) */
    int n = 0;
    memset(t, 0, sizeof(*t));
    for (int s = 0; s < 256; s++)
        if (hist[s]) {
            keyed[n++] = ((uint64_t)hist[s] << 8) | (uint64_t)s;
            t->max_symbol = s;
        }
    qsort(keyed, (size_t)n, sizeof(keyed[0]), cmp_count);
    for (int i = 0; i < n; i++) lens[i] = (uint32_t)(keyed[i] >> 8);
    minimum_redundancy(lens, n);
    /* Limit to MAX_BITS (as miniz does): clamp, then lengthen codes until Kraft's sum is 1. */
    int count[64] = {0};
    for (int i = 0; i < n; i++) count[lens[i] < 63 ? lens[i] : 63]++;
    for (int l = MAX_BITS + 1; l < 64; l++) {
        count[MAX_BITS] += count[l];
        count[l] = 0;
    }
    uint32_t total = 0;
    for (int l = MAX_BITS; l > 0; l--) total += (uint32_t)count[l] << (MAX_BITS - l);
    while (total != (1u << MAX_BITS)) {
        count[MAX_BITS]--;
        for (int l = MAX_BITS - 1; l > 0; l--)
            if (count[l]) {
                count[l]--;
                count[l + 1] += 2;
                break;
            }
        total--;
    }
    /* Least frequent symbols get the longest codes. */
    int i = 0, max_len = 0;
    for (int l = MAX_BITS; l > 0; l--)
        for (int k = 0; k < count[l]; k++) {
            t->len[keyed[i++] & 255] = (uint8_t)l;
            if (l > max_len) max_len = l;
        }
    /* Canonical codes (RFC 8878 4.2.1.3): by weight ascending (longest codes first), then by
     * byte value; a code of length l is its first slot in the 2^max_len table >> (max_len - l). */
    uint32_t slot = 0;
    for (int l = max_len; l > 0; l--)
        for (int s = 0; s <= t->max_symbol; s++)
            if (t->len[s] == l) {
                t->code[s] = (uint16_t)(slot >> (max_len - l));
                slot += 1u << (max_len - l);
            }
    t->valid = 1;
}

static int table_max_len(const table_t *t) {
    int m = 0;
    for (int s = 0; s <= t->max_symbol; s++)
        if (t->len[s] > m) m = t->len[s];
    return m;
}

/* Bits of the four streams' codes for a histogram under a table, or -1 if a symbol has no code. */
static int64_t coded_bits(const uint32_t *hist, const table_t *t) {
    int64_t bits = 0;
    for (int s = 0; s < 256; s++)
        if (hist[s]) {
            if (s > t->max_symbol || !t->len[s]) return -1;
            bits += (int64_t)hist[s] * t->len[s];
        }
    return bits;
}

/* ---- The Huffman table's description: its weights, FSE-compressed or direct (RFC 8878
 * 4.2.1). A code of length l has weight max_len + 1 - l (0: absent); weights are given for
 * byte values 0..N-1 with N = max_symbol, the last one's being implied. */

typedef struct { /* a little-endian bit writer; the decoder reads it backwards */
    uint8_t *op, *end;
    uint64_t acc;
    unsigned nbits;
} bits_t;

static void bits_add(bits_t *b, uint32_t value, unsigned n) {
    b->acc |= (uint64_t)(value & ((1u << n) - 1)) << b->nbits;
    b->nbits += n;
    while (b->nbits >= 8) {
        if (b->op < b->end) *b->op = (uint8_t)b->acc;
        b->op++;
        b->acc >>= 8;
        b->nbits -= 8;
    }
}

/* Closes a stream with its end mark; returns its size, or 0 if it overran `end`. */
static size_t bits_close(bits_t *b, uint8_t *start) {
    bits_add(b, 1, 1);
    if (b->nbits) {
        if (b->op < b->end) *b->op = (uint8_t)b->acc;
        b->op++;
    }
    return b->op <= b->end ? (size_t)(b->op - start) : 0;
}

/* Counts normalised to 2^log, every present symbol keeping at least one state. */
static void fse_normalize(const unsigned *count, int symbols, unsigned total, int log, short *norm) {
    int size = 1 << log, sum = 0, largest = 0;
    for (int s = 0; s < symbols; s++) {
        norm[s] = 0;
        if (!count[s]) continue;
        int v = (int)(((uint64_t)count[s] * (unsigned)size + total / 2) / total);
        norm[s] = (short)(v < 1 ? 1 : v);
        sum += norm[s];
        if (norm[s] > norm[largest] || !count[largest]) largest = s;
    }
    while (sum != size) { /* the largest absorbs the rounding; others give way if it cannot */
        int step = sum < size ? 1 : -1, s = largest;
        if (step < 0 && norm[s] <= 1)
            for (s = 0; s < symbols && norm[s] <= 1; s++) {
            }
        norm[s] = (short)(norm[s] + step);
        sum += step;
    }
}

/* The FSE table description (RFC 8878 4.1.1) of `norm` (symbols 0..symbols-1). */
static void fse_write_ncount(bits_t *b, const short *norm, int symbols, int log) {
    bits_add(b, (uint32_t)(log - 5), 4);
    int remaining = (1 << log) + 1, threshold = 1 << log, nbits = log + 1, prev_zero = 0;
    int s = 0;
    while (s < symbols && remaining > 1) {
        if (prev_zero) { /* a run of zero counts: 2-bit repeat flags, 3 per flag */
            int start = s;
            while (s < symbols && !norm[s]) s++;
            while (s >= start + 3) {
                start += 3;
                bits_add(b, 3, 2);
            }
            bits_add(b, (uint32_t)(s - start), 2);
        }
        int count = norm[s++];
        int max = (2 * threshold - 1) - remaining;
        remaining -= count;
        count++;
        if (count >= threshold) count += max;
        bits_add(b, (uint32_t)count, (unsigned)(count < max ? nbits - 1 : nbits));
        prev_zero = count == 1;
        while (remaining < threshold) {
            nbits--;
            threshold >>= 1;
        }
    }
}

/* FSE-compresses weights w[0..n-1] (n >= 2, at least two distinct values) at accuracy
 * `log`, as libzstd's FSE_compress does: symbols coded last to first on two interleaved
 * states, the last two in the states' initial values. Returns the size, or 0 if over `cap`. */
static size_t fse_weights(uint8_t *out, size_t cap, const uint8_t *w, int n, int log) {
    enum { SYMBOLS = MAX_BITS + 2 };
    unsigned count[SYMBOLS] = {0};
    for (int i = 0; i < n; i++) count[w[i]]++;
    int symbols = 0;
    for (int s = 0; s < SYMBOLS; s++)
        if (count[s]) symbols = s + 1;
    short norm[SYMBOLS];
    fse_normalize(count, symbols, (unsigned)n, log, norm);
    int size = 1 << log;
    /* spread symbols over the states, then the encoder's tables (FSE_buildCTable) */
    uint8_t spread[1 << FSE_MAX_LOG];
    int pos = 0, step = (size >> 1) + (size >> 3) + 3;
    for (int s = 0; s < symbols; s++)
        for (int k = 0; k < norm[s]; k++) {
            spread[pos] = (uint8_t)s;
            pos = (pos + step) & (size - 1);
        }
    int cumul[SYMBOLS + 1];
    cumul[0] = 0;
    for (int s = 0; s < symbols; s++) cumul[s + 1] = cumul[s] + norm[s];
    uint16_t state_table[1 << FSE_MAX_LOG];
    int next[SYMBOLS];
    memcpy(next, cumul, sizeof(int) * (size_t)symbols);
    for (int u = 0; u < size; u++) state_table[next[spread[u]]++] = (uint16_t)(size + u);
    int32_t delta_bits[SYMBOLS], delta_state[SYMBOLS];
    for (int s = 0, total = 0; s < symbols; s++) {
        if (!norm[s]) continue;
        if (norm[s] == 1) {
            delta_bits[s] = (log << 16) - size;
            delta_state[s] = total - 1;
        } else {
            int max_out = log - highbit((uint32_t)norm[s] - 1);
            delta_bits[s] = (max_out << 16) - (norm[s] << max_out);
            delta_state[s] = total - norm[s];
        }
        total += norm[s];
    }
    bits_t b = {out, out + cap, 0, 0};
    fse_write_ncount(&b, norm, symbols, log);
    if (b.nbits) bits_add(&b, 0, 8 - b.nbits); /* the description ends on a byte */
    uint8_t *stream = b.op;
    uint32_t state[2];
    /* initCState2: the state of the symbol's largest bit count, so the decoder's step
     * after it always reads past the stream's start and ends. */
#define INIT_STATE(st, sym)                                                              \
    do {                                                                                 \
        uint32_t nb = (uint32_t)((delta_bits[sym] + (1 << 15)) >> 16);                   \
        uint32_t v = (nb << 16) - (uint32_t)delta_bits[sym];                             \
        (st) = state_table[(int)(v >> nb) + delta_state[sym]];                           \
    } while (0)
#define ENCODE(st, sym)                                                                  \
    do {                                                                                 \
        uint32_t nb = (uint32_t)(((int64_t)(st) + delta_bits[sym]) >> 16);               \
        bits_add(&b, (st), nb);                                                          \
        (st) = state_table[(int)((st) >> nb) + delta_state[sym]];                        \
    } while (0)
    int i = n;
    /* state[0] decodes even positions, state[1] odd ones */
    INIT_STATE(state[(n - 1) & 1], w[n - 1]);
    INIT_STATE(state[(n - 2) & 1], w[n - 2]);
    for (i = n - 3; i >= 0; i--) ENCODE(state[i & 1], w[i]);
#undef INIT_STATE
#undef ENCODE
    bits_add(&b, state[1], (unsigned)log); /* state 2 first: the decoder reads state 1 first */
    bits_add(&b, state[0], (unsigned)log);
    size_t tail = bits_close(&b, stream);
    return tail ? (size_t)(stream - out) + tail : 0;
}

/* The table's description into `out` (room for 129 bytes); returns its size, or 0 if it
 * has none (more than 128 weights that FSE cannot fit in 127 bytes). */
static size_t describe_table(uint8_t *out, const table_t *t) {
    int max_len = table_max_len(t), n = t->max_symbol;
    uint8_t w[256];
    int distinct = 0, seen[MAX_BITS + 2] = {0};
    for (int s = 0; s < n; s++) {
        w[s] = (uint8_t)(t->len[s] ? max_len + 1 - t->len[s] : 0);
        distinct += !seen[w[s]]++;
    }
    size_t best = 0;
    if (n >= 2 && distinct >= 2) {
        uint8_t trial[256];
        for (int log = 5; log <= FSE_MAX_LOG; log++) {
            size_t size = fse_weights(trial, 127, w, n, log);
            if (size && (!best || size + 1 < best)) {
                best = size + 1;
                out[0] = (uint8_t)size;
                memcpy(out + 1, trial, size);
            }
        }
    }
    size_t direct = 1 + ((size_t)n + 1) / 2;
    if (n <= MAX_DIRECT && (!best || direct <= best)) {
        out[0] = (uint8_t)(127 + n);
        for (int s = 0; s < n; s += 2) out[1 + s / 2] = (uint8_t)((w[s] << 4) | (s + 1 < n ? w[s + 1] : 0));
        best = direct;
    }
    return best;
}
