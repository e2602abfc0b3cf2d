/*
 * The zstd frame of Huffman-coded literal blocks (see module.c): the four streams of a
 * block, the cheapest kind of each block, where blocks end, and the whole frame.
 */
#include "native.h"

/* A Huffman stream's bit writer. (Four written in lockstep measured no faster than one
 * after another: four writers' state does not fit the registers.) */
typedef struct {
    uint64_t acc;
    unsigned nbits;
    uint8_t *op;
} stream_t;

/* code | length << 16 per byte value: one load per symbol */
#define PUT(st, s)                                                      \
    do {                                                                \
        uint32_t e_ = ce[s];                                            \
        (st).acc |= (uint64_t)(e_ & 0xFFFF) << (st).nbits;              \
        (st).nbits += e_ >> 16;                                         \
    } while (0)
/* after at most 4 codes of <= 11 bits on <= 7 pending bits: whole bytes out, 8 stored */
#define FLUSH(st)                                                       \
    do {                                                                \
        memcpy((st).op, &(st).acc, 8);                                  \
        (st).op += (st).nbits >> 3;                                     \
        (st).acc >>= (st).nbits & ~7u;                                  \
        (st).nbits &= 7;                                                \
    } while (0)

/* Four codes src[i-1] .. src[i-4] joined (first in the lowest bits), so the writer's state
 * advances once per four; `len` gets their total length. */
static inline __attribute__((always_inline)) uint64_t join4(const uint8_t *src, size_t i, const uint32_t *ce,
                                                            unsigned *len) {
    uint32_t e0 = ce[src[i - 1]], e1 = ce[src[i - 2]], e2 = ce[src[i - 3]], e3 = ce[src[i - 4]];
    unsigned l0 = e0 >> 16, l01 = l0 + (e1 >> 16), l012 = l01 + (e2 >> 16);
    *len = l012 + (e3 >> 16);
    return (uint64_t)(e0 & 0xFFFF) | (uint64_t)(e1 & 0xFFFF) << l0 | (uint64_t)(e2 & 0xFFFF) << l01 |
           (uint64_t)(e3 & 0xFFFF) << l012;
}

/* Codes src[count-1] down to src[0] (the decoder reads backwards, so it sees them first
 * to last). */
static inline __attribute__((always_inline)) void encode_run(stream_t *st, const uint8_t *src, size_t count,
                                                             const uint32_t *ce) {
    size_t i = count;
    for (; i >= 4; i -= 4) {
        unsigned len;
        uint64_t codes = join4(src, i, ce, &len);
        st->acc |= codes << st->nbits;
        st->nbits += len;
        FLUSH(*st);
    }
    while (i > 0) PUT(*st, src[--i]);
    FLUSH(*st);
}

/* Two codes by the two bytes that give them (little-endian: src[i-1] << 8 | src[i-2]):
 * code(src[i-1]) | code(src[i-2]) << len(src[i-1]) in the low 24 bits, their total length
 * above. Built for the byte values of a block (PAIR_DISTINCT at most), it halves the loads
 * and joins per symbol, so exponent planes code faster with every byte the same. */
#define PAIR_DISTINCT 96
#define PAIR_BITS 24

/* encode_run with the pair table; the last count % 4 symbols one at a time, by encode_run. */
static inline __attribute__((always_inline)) void encode_run_pairs(stream_t *st, const uint8_t *src, size_t count,
                                                                   const uint32_t *ce, const uint32_t *pair) {
    size_t i = count;
    for (; i >= 4; i -= 4) {
        uint16_t v1, v2;
        memcpy(&v1, src + i - 2, 2);
        memcpy(&v2, src + i - 4, 2);
        uint32_t p1 = pair[v1], p2 = pair[v2];
        unsigned l1 = p1 >> PAIR_BITS;
        st->acc |= ((uint64_t)(p1 & ((1u << PAIR_BITS) - 1)) | (uint64_t)(p2 & ((1u << PAIR_BITS) - 1)) << l1)
                   << st->nbits;
        st->nbits += l1 + (p2 >> PAIR_BITS);
        FLUSH(*st);
    }
    encode_run(st, src, i, ce);
}

/* The four streams of a block of n >= MIN_HUFFMAN bytes (RFC 8878 4.2.2: streams 1-3 hold
 * ceil(n / 4) symbols each, stream 4 the rest), each into its own `region`-byte part of
 * `scratch`; sizes[] gets their sizes. BMI2's shifts by a register help the bit writer. */
SHIFTS static void write_streams(const uint8_t *src, size_t n, const uint32_t *ce, const uint32_t *pair,
                                 uint8_t *scratch, size_t region, size_t *sizes) {
    size_t seg = (n + 3) / 4;
    for (int k = 0; k < 4; k++) {
        stream_t st = {0, 0, scratch + (size_t)k * region};
        if (pair)
            encode_run_pairs(&st, src + (size_t)k * seg, k < 3 ? seg : n - 3 * seg, ce, pair);
        else
            encode_run(&st, src + (size_t)k * seg, k < 3 ? seg : n - 3 * seg, ce);
        st.acc |= (uint64_t)1 << st.nbits; /* the end mark */
        st.nbits++;
        memcpy(st.op, &st.acc, 8);
        sizes[k] = (size_t)(st.op - (scratch + (size_t)k * region)) + ((st.nbits + 7) >> 3);
    }
}

#undef PUT
#undef FLUSH

/* Bytes a stream region needs: 11 bits per symbol of a quarter block, and 8 of slack. */
#define REGION ((BLOCK_MAX / 4 + 1) * MAX_BITS / 8 + 16)
/* Where the pair table starts in the scratch, after the four regions. */
#define PAIR_AT ((4 * REGION + 63) & ~(size_t)63)

static void put_le(uint8_t *op, uint64_t v, int bytes) {
    for (int k = 0; k < bytes; k++) op[k] = (uint8_t)(v >> (8 * k));
}

/* Byte counts of src, on four tables: runs of one value would otherwise wait on each
 * increment. */
static void histogram(const uint8_t *src, size_t n, uint32_t *hist) {
    uint32_t h[4][256];
    memset(h, 0, sizeof(h));
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        h[0][src[i]]++;
        h[1][src[i + 1]]++;
        h[2][src[i + 2]]++;
        h[3][src[i + 3]]++;
    }
    for (; i < n; i++) h[0][src[i]]++;
    for (int s = 0; s < 256; s++) hist[s] = h[0][s] + h[1][s] + h[2][s] + h[3][s];
}

/* With blocks of a fixed size (their ends not planned from the statistics):
 * - a new table costs its decoder a 2048-entry lookup table to build, as long as decoding a
 *   few KB of literals (the planned blocks' BLOCK_COST), so it is written only where it saves
 *   FRESH_COST bytes over the previous one;
 * - Huffman-coded literals decode at ~1.3 GB/s a thread where they are nearly 8 bits a byte,
 *   against a copy for raw ones, so a block is coded only where it saves a 64th of itself
 *   (libzstd's minimum gain: a plane of fp32 mantissas, 0.8 % smaller coded, decoded 12x
 *   slower than stored). */
#define FRESH_COST 128
#define MIN_GAIN(n) (((n) >> 6) + 2)

/* Writes one block of n input bytes with byte counts `hist`; returns the end, or NULL if
 * its table cannot be described. `prev` is the table a treeless block may reuse; `fixed`:
 * blocks of a fixed size (FRESH_COST, MIN_GAIN). */
static uint8_t *write_block(uint8_t *op, const uint8_t *src, size_t n, const uint32_t *hist, int last,
                            table_t *prev, uint8_t *scratch, int fixed) {
    const size_t fresh_cost = fixed ? FRESH_COST : 0;
    uint8_t present[256]; /* the byte values of the block */
    int distinct = 0;
    for (int s = 0; s < 256; s++)
        if (hist[s]) present[distinct++] = (uint8_t)s;
    if (distinct == 1) { /* RLE block: Block_Size is the regenerated size */
        put_le(op, (uint64_t)last | (1u << 1) | ((uint64_t)n << 3), 3);
        op[3] = src[0];
        return op + 4;
    }
    size_t best = fixed && n > MIN_GAIN(n) ? n - MIN_GAIN(n) : n; /* raw, less the gain asked for */
    int mode = 0;    /* 0 raw, 1 new table, 2 treeless (the previous table) */
    table_t fresh;
    uint8_t desc[160];
    size_t desc_size = 0, lit_header = n <= 16383 ? 4 : 5;
    /* literals header, four streams (each rounded up to bytes after its end bit), the
     * jump table, and the sequences section (one byte: no sequences) */
#define COMPRESSED(bits) (lit_header + (size_t)((bits) + 4 * 8) / 8 + 6 + 1)
    if (n >= MIN_HUFFMAN) {
        build_table(hist, &fresh);
        desc_size = describe_table(desc, &fresh);
        size_t size = COMPRESSED(coded_bits(hist, &fresh));
        if (desc_size && size + desc_size < best) {
            best = size + desc_size;
            mode = 1;
        }
        int64_t reused = prev->valid ? coded_bits(hist, prev) : -1;
        if (reused >= 0 && COMPRESSED(reused) < (mode == 1 ? best + fresh_cost : best)) {
            best = COMPRESSED(reused);
            mode = 2;
        }
        if (!desc_size && mode == 0 && size + 64 < n) return NULL;
    }
#undef COMPRESSED
    if (mode == 0) {
        put_le(op, (uint64_t)last | ((uint64_t)n << 3), 3);
        memcpy(op + 3, src, n);
        return op + 3 + n;
    }
    const table_t *t = mode == 1 ? &fresh : prev;
    uint32_t ce[256];
    for (int s = 0; s < 256; s++) ce[s] = s <= t->max_symbol ? (uint32_t)t->code[s] | ((uint32_t)t->len[s] << 16) : 0;
    uint8_t *block = op + 3, *lit = block + lit_header, *body = lit;
    if (mode == 1) {
        memcpy(body, desc, desc_size);
        body += desc_size;
    }
    /* The pair table, for the byte values of this block (it costs distinct^2 writes,
     * against n / 2 pairs coded). */
    uint32_t *pair = distinct <= PAIR_DISTINCT && (size_t)distinct * (size_t)distinct <= n
                         ? (uint32_t *)(scratch + PAIR_AT)
                         : NULL;
    for (int a = 0; pair && a < distinct; a++) {
        uint32_t hi = ce[present[a]], hi_len = hi >> 16, hi_code = hi & 0xFFFF;
        for (int b = 0; b < distinct; b++) {
            uint32_t lo = ce[present[b]];
            pair[(uint32_t)present[a] << 8 | present[b]] =
                (hi_code | (lo & 0xFFFF) << hi_len) | (hi_len + (lo >> 16)) << PAIR_BITS;
        }
    }
    size_t sizes[4];
    write_streams(src, n, ce, pair, scratch, REGION, sizes);
    uint8_t *sp = body + 6;
    for (int k = 0; k < 4; k++) {
        if (k < 3) put_le(body + 2 * k, sizes[k], 2); /* the jump table */
        memcpy(sp, scratch + (size_t)k * REGION, sizes[k]);
        sp += sizes[k];
    }
    size_t compressed = (size_t)(sp - lit);
    uint64_t type = mode == 1 ? 2 : 3, header;
    if (lit_header == 4)
        header = type | (2u << 2) | ((uint64_t)n << 4) | ((uint64_t)compressed << 18);
    else
        header = type | (3u << 2) | ((uint64_t)n << 4) | ((uint64_t)compressed << 22);
    put_le(block, header, (int)lit_header);
    *sp++ = 0; /* Number_of_Sequences = 0 */
    put_le(op, (uint64_t)last | (2u << 1) | ((uint64_t)(sp - block) << 3), 3);
    if (mode == 1) *prev = fresh;
    return sp;
}

/* ---- Where blocks end. A block pays ~14 bytes of headers and its table's description; a
 * plane's statistics drift (tensors of different scales, rows, a fine-tune's untouched
 * rows), and a table per block follows them. Block ends are chosen on SUB-byte steps by
 * dynamic programming over an estimate of each candidate's cost: its order-0 entropy plus
 * BLOCK_COST bytes plus DESC_COST per distinct byte value. */

#define SUB 8192
#define MAX_SUBS (BLOCK_MAX / SUB)
/* A block's fixed cost: ~30 bytes of headers, jump table and a weight table's fixed part,
 * and its decoding: a new table is a 2048-entry lookup table to build, as long as decoding
 * a few KB of literals. Counted as 128 bytes in all, against 48 the exponent planes of
 * bench/ratios.py decode 1.02-1.18x faster for 0.06-0.3% more bytes (fewer tables). */
#define BLOCK_COST 128.0f
#define DESC_COST 0.6f   /* a weight table's cost per distinct byte value (bytes) */

/* c * log2(c), within 0.0013 * c: exponent bits plus a cubic for the mantissa's log. */
static inline float xlog2x(float c) {
    union {
        float f;
        uint32_t i;
    } u = {c};
    float e = (float)((int)(u.i >> 23) - 127);
    u.i = (u.i & 0x7FFFFF) | 0x3F800000; /* the mantissa, in [1, 2) */
    float m = u.f;
    return c * (e + ((0.15824871f * m - 1.05187502f) * m + 3.04788415f) * m - 2.15419310f);
}

/* The blocks of n > 0 input bytes: ends[k] and byte counts hist[k] of each; returns their
 * number, or 0 if out of memory. ends and hist need n / SUB + 1 entries. */
static size_t plan_blocks(const uint8_t *src, size_t n, size_t *ends, uint32_t (*hist)[256]) {
    size_t subs = (n + SUB - 1) / SUB;
    uint32_t(*sub)[256] = malloc(subs * sizeof(*sub));
    uint8_t(*sym)[256] = malloc(subs * sizeof(*sym)); /* each sub-block's byte values present */
    uint16_t *used = malloc(subs * sizeof(uint16_t));
    float *best = malloc((subs + 1) * sizeof(float));
    size_t *from = malloc((subs + 1) * sizeof(size_t));
    size_t count = 0;
    if (!sub || !sym || !used || !best || !from) goto done;
    for (size_t k = 0; k < subs; k++) {
        size_t end = (k + 1) * SUB < n ? (k + 1) * SUB : n;
        histogram(src + k * SUB, end - k * SUB, sub[k]);
        int m = 0;
        for (int s = 0; s < 256; s++)
            if (sub[k][s]) sym[k][m++] = (uint8_t)s;
        used[k] = (uint16_t)m;
    }
    best[0] = 0;
    for (size_t j = 1; j <= subs; j++) best[j] = 3e38f;
    /* The candidate block's counts and their c * log2(c), by order of first appearance
     * (slot[] of each byte value, NO_SLOT before), so that the rare values' loop runs over
     * contiguous counts and each count's logarithm is taken once. */
    uint32_t cnt[256];
    float xl[256];
    uint16_t slot[256];
    enum { NO_SLOT = 0xFFFF };
    for (size_t i = 0; i < subs; i++) {
        memset(slot, 0xFF, sizeof(slot));
        float sum_xlogx = 0;
        uint32_t total = 0, distinct = 0;
        for (size_t j = i + 1; j <= subs && j - i <= MAX_SUBS; j++) {
            const uint8_t *s = sym[j - 1];
            const uint32_t *c = sub[j - 1];
            for (int k = 0; k < used[j - 1]; k++) {
                uint32_t add = c[s[k]], q = slot[s[k]];
                if (q == NO_SLOT) {
                    q = slot[s[k]] = (uint16_t)distinct++;
                    cnt[q] = add;
                    xl[q] = xlog2x((float)add);
                    sum_xlogx += xl[q];
                } else {
                    float was = xl[q];
                    cnt[q] += add;
                    xl[q] = xlog2x((float)cnt[q]);
                    sum_xlogx += xl[q] - was;
                }
                total += add;
            }
            /* Codes are at most MAX_BITS long: byte values rarer than 2^-MAX_BITS take
             * 2^-MAX_BITS of the code space each, more than their share, and the other
             * codes lengthen to make room. A block that gathers many rare values pays
             * that on all its bytes. */
            uint32_t rare = 0, rare_count = 0;
            for (uint32_t q = 0; q < distinct; q++) {
                uint32_t is_rare = (cnt[q] << MAX_BITS) < total;
                rare += is_rare;
                rare_count += is_rare ? cnt[q] : 0;
            }
            float limit = 0;
            if (rare) {
                float space = 1.0f - (float)rare / (1 << MAX_BITS), share = 1.0f - (float)rare_count / (float)total;
                limit = (float)(total - rare_count) * log2f(share / space) / 8;
            }
            float cost = (xlog2x((float)total) - sum_xlogx) / 8 + limit + BLOCK_COST + DESC_COST * (float)distinct;
            if (best[i] + cost < best[j]) {
                best[j] = best[i] + cost;
                from[j] = i;
            }
        }
    }
    for (size_t j = subs; j > 0; j = from[j]) count++;
    size_t k = count;
    for (size_t j = subs; j > 0; j = from[j]) {
        k--;
        ends[k] = j * SUB < n ? j * SUB : n;
        memset(hist[k], 0, sizeof(hist[k]));
        for (size_t q = from[j]; q < j; q++)
            for (int s = 0; s < used[q]; s++) hist[k][sym[q][s]] += sub[q][sym[q][s]];
    }
done:
    free(sub);
    free(sym);
    free(used);
    free(best);
    free(from);
    return count;
}

/* The whole frame into `out` (capacity from frame_capacity): blocks of `block` bytes, or
 * planned ones for block 0. Returns its size; 0 if a block's table cannot be described
 * (or memory ran out). */
static size_t write_frame(uint8_t *out, const uint8_t *src, size_t n, size_t block) {
    uint8_t *op = out;
    put_le(op, 0xFD2FB528u, 4);
    op += 4;
    /* Single_Segment_flag set (no window descriptor; the window is the content), content size
     * in 1, 2 (+256), 4 or 8 bytes. */
    if (n < 256) {
        *op++ = 0x20;
        *op++ = (uint8_t)n;
    } else if (n < 65536 + 256) {
        *op++ = 0x60;
        put_le(op, n - 256, 2);
        op += 2;
    } else if (n <= 0xFFFFFFFFu) {
        *op++ = 0xA0;
        put_le(op, n, 4);
        op += 4;
    } else {
        *op++ = 0xE0;
        put_le(op, n, 8);
        op += 8;
    }
    if (n == 0) { /* one empty raw block */
        put_le(op, 1, 3);
        return (size_t)(op + 3 - out);
    }
    size_t blocks = block ? (n + block - 1) / block : n / SUB + 1;
    size_t *ends = malloc(blocks * sizeof(size_t));
    uint32_t(*hist)[256] = malloc(blocks * sizeof(*hist));
    uint8_t *scratch = malloc(PAIR_AT + (1 << 16) * sizeof(uint32_t)); /* streams, pair table */
    table_t prev;
    prev.valid = 0;
    if (!ends || !hist || !scratch) {
        op = NULL;
    } else if (block) {
        for (size_t k = 0; k < blocks; k++) {
            ends[k] = (k + 1) * block < n ? (k + 1) * block : n;
            histogram(src + k * block, ends[k] - k * block, hist[k]);
        }
    } else {
        blocks = plan_blocks(src, n, ends, hist);
        if (!blocks) op = NULL;
    }
    for (size_t k = 0, at = 0; op && k < blocks; at = ends[k++])
        op = write_block(op, src + at, ends[k] - at, hist[k], k + 1 == blocks, &prev, scratch, block != 0);
    free(ends);
    free(hist);
    free(scratch);
    return op ? (size_t)(op - out) : 0;
}

static size_t frame_capacity(size_t n, size_t block) {
    /* header 14, per block at most a raw block (3 + bytes) */
    return 14 + n + 3 * (n / (block ? block : SUB) + 1) + 64;
}
