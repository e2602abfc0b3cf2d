/*
 * zstd literal frames, decoded.
 *
 * literals_decode(frame, out): the frames literals_encode.c writes (and any zstd frame whose
 * blocks are raw, RLE, or hold only literals) decoded straight into `out`. Huffman streams are read by lookups
 * of LOOKUP bits that each yield every whole code in them, up to four symbols, four streams
 * in lockstep: on float exponent planes (2-3 bits per symbol) about three symbols per
 * lookup. A frame with sequences, a dictionary or a checksum is not for this decoder: it
 * returns False and the caller hands the frame to libzstd, which also judges frames this
 * one finds malformed. Every read and write is bounds-checked against the frame and `out`.
 */
#include "native.h"

/* A backward bit stream (RFC 8878 4.1.2.1 / libzstd's BIT_DStream): `pos` bits remain,
 * bit pos-1 is read next (most significant first). */
typedef struct {
    const uint8_t *start;
    int64_t pos;
} rstream_t;

/* Starts a stream of n bytes: the last byte's highest set bit marks the end. */
static int rstream_init(rstream_t *r, const uint8_t *p, size_t n) {
    if (n == 0 || p[n - 1] == 0) return 0;
    r->start = p;
    r->pos = 8 * (int64_t)(n - 1) + highbit(p[n - 1]);
    return 1;
}

/* The next `bits` (1..32) bits, zeros below the stream's start; does not consume. */
static inline uint32_t rstream_peek(const rstream_t *r, int bits) {
    int64_t pos = r->pos;
    if (pos <= 0) return 0;
    uint64_t c = 0;
    int64_t top = (pos + 7) >> 3; /* bytes [0, top) hold the remaining bits */
    if (top >= 8) {
        memcpy(&c, r->start + top - 8, 8);
        c <<= 8 * top - pos;
    } else {
        for (int64_t k = 0; k < top; k++) c |= (uint64_t)r->start[k] << (8 * k);
        c <<= 64 - pos;
    }
    return (uint32_t)(c >> (64 - bits));
}

static inline uint32_t rstream_read(rstream_t *r, int bits) {
    if (!bits) return 0;
    uint32_t v = rstream_peek(r, bits);
    r->pos -= bits;
    return v;
}

/* A forward little-endian bit reader over [p, end). */
typedef struct {
    const uint8_t *p, *end;
    size_t bit;
} fstream_t;

static uint32_t fstream_read(fstream_t *f, int bits) {
    size_t byte = f->bit >> 3, size = (size_t)(f->end - f->p);
    uint64_t c = 0;
    if (byte < size) memcpy(&c, f->p + byte, size - byte < 8 ? size - byte : 8);
    uint32_t v = (uint32_t)(c >> (f->bit & 7)) & ((1u << bits) - 1);
    f->bit += (size_t)bits;
    return v;
}

/* FSE-compressed Huffman weights (RFC 8878 4.2.1.2) from in[0..n); returns their number
 * (at most 255) in w, or -1. */
static int fse_read_weights(const uint8_t *in, size_t n, uint8_t *w) {
    enum { SYMBOLS = MAX_BITS + 2 };
    fstream_t f = {in, in + n, 0};
    int log = (int)fstream_read(&f, 4) + 5;
    if (log > FSE_MAX_LOG) return -1;
    short norm[SYMBOLS] = {0};
    int remaining = (1 << log) + 1, threshold = 1 << log, nbits = log + 1, prev_zero = 0, s = 0;
    while (remaining > 1) {
        if (prev_zero) {
            for (;;) {
                uint32_t flag = fstream_read(&f, 2);
                s += (int)flag;
                if (s > SYMBOLS) return -1;
                if (flag != 3) break;
            }
        }
        if (s >= SYMBOLS) return -1;
        int max = (2 * threshold - 1) - remaining;
        int low = (int)fstream_read(&f, nbits - 1), count;
        if (low < max) {
            count = low;
        } else {
            count = low | (int)fstream_read(&f, 1) << (nbits - 1);
            if (count >= threshold) count -= max;
        }
        count--;
        remaining -= count < 0 ? -count : count;
        norm[s++] = (short)count;
        prev_zero = count == 0;
        if (remaining < 1) return -1;
        while (remaining < threshold) {
            nbits--;
            threshold >>= 1;
        }
    }
    if (remaining != 1) return -1;
    size_t used = (f.bit + 7) >> 3;
    if (used > n) return -1;
    int symbols = s, size = 1 << log, high = size - 1;
    /* the decoding table (FSE_buildDTable) */
    uint8_t sym[1 << FSE_MAX_LOG], nb[1 << FSE_MAX_LOG];
    uint16_t base[1 << FSE_MAX_LOG];
    int next[SYMBOLS];
    for (s = 0; s < symbols; s++) {
        if (norm[s] == -1) {
            sym[high--] = (uint8_t)s;
            next[s] = 1;
        } else {
            next[s] = norm[s];
        }
    }
    int pos = 0, step = (size >> 1) + (size >> 3) + 3;
    for (s = 0; s < symbols; s++)
        for (int k = 0; k < norm[s]; k++) {
            sym[pos] = (uint8_t)s;
            do pos = (pos + step) & (size - 1);
            while (pos > high);
        }
    if (pos != 0) return -1;
    for (int u = 0; u < size; u++) {
        int state = next[sym[u]]++;
        nb[u] = (uint8_t)(log - highbit((uint32_t)state));
        base[u] = (uint16_t)((state << nb[u]) - size);
    }
    rstream_t r;
    if (!rstream_init(&r, in + used, n - used)) return -1;
    uint32_t st[2];
    st[0] = rstream_read(&r, log);
    st[1] = rstream_read(&r, log);
    if (r.pos < 0) return -1;
    /* alternate the states; once a read overruns the stream, the other state's symbol is
     * the last one (FSE_decompress_usingDTable's tail) */
    int count = 0;
    for (int k = 0;; k ^= 1) {
        if (count > 253) return -1;
        w[count++] = sym[st[k]];
        st[k] = base[st[k]] + rstream_read(&r, nb[st[k]]);
        if (r.pos < 0) {
            w[count++] = sym[st[k ^ 1]];
            return count;
        }
    }
}

/* Fills dt->multi[at, at + 2^bits): the windows whose first `used` bits hold the `count`
 * symbols in `syms`. Each next code that fits in the remaining `bits` gets its own range
 * (codes lie in the table longest first, so those are the table's tail); the rest, where
 * no whole code fits or four symbols are there, end the lookup. Every entry is written once. */
static void fill_multi(dtable_t *dt, uint32_t at, int bits, uint64_t syms, int used, int count) {
    uint64_t stop = syms | (uint64_t)used << 32 | (uint64_t)count << 40;
    int log = dt->log;
    uint32_t j = 1u << log;
    if (count < 4)
        while (j > 0 && dt->len[j - 1] <= bits) {
            int len = dt->len[j - 1];
            j -= 1u << (log - len);
            uint32_t v = bits >= log ? j << (bits - log) : j >> (log - bits);
            fill_multi(dt, at + v, bits - len, syms | (uint64_t)dt->sym[j] << (8 * count), used + len, count + 1);
        }
    uint32_t rest = count == 4 ? 1u << bits : bits >= log ? j << (bits - log) : j >> (log - bits);
    for (uint32_t v = 0; v < rest; v++) dt->multi[at + v] = stop;
}

/* A Huffman tree description (RFC 8878 4.2.1) from in[0..n) into dt; returns its size, or 0.
 * With `lookups` 0 only the code (sym, len, log) is made, not the lookup tables. */
static size_t read_tree(const uint8_t *in, size_t n, dtable_t *dt, int lookups) {
    uint8_t w[256];
    int count;
    size_t used;
    if (n < 1) return 0;
    if (in[0] >= 128) {
        count = in[0] - 127;
        used = 1 + ((size_t)count + 1) / 2;
        if (used > n) return 0;
        for (int i = 0; i < count; i++) w[i] = i & 1 ? in[1 + i / 2] & 15 : in[1 + i / 2] >> 4;
    } else {
        used = 1 + (size_t)in[0];
        if (in[0] == 0 || used > n) return 0;
        count = fse_read_weights(in + 1, in[0], w);
        if (count < 0) return 0;
    }
    uint32_t total = 0;
    for (int i = 0; i < count; i++) {
        if (w[i] > MAX_BITS) return 0;
        if (w[i]) total += 1u << (w[i] - 1);
    }
    if (!total || count > 255) return 0;
    int log = highbit(total) + 1;
    uint32_t rest = (1u << log) - total;
    if (log > MAX_BITS || (rest & (rest - 1))) return 0;
    w[count++] = (uint8_t)(highbit(rest) + 1); /* the last weight is implied */
    /* symbols by weight, lowest weight (longest code) first, in ascending order within
     * one weight (HUF_readDTableX1) */
    uint32_t start[MAX_BITS + 2] = {0};
    for (int i = 0; i < count; i++) start[w[i]] += 1u << w[i] >> 1;
    for (int k = 1, at = 0; k <= log; k++) {
        uint32_t size = start[k];
        start[k] = (uint32_t)at;
        at += (int)size;
    }
    for (int i = 0; i < count; i++) {
        if (!w[i]) continue;
        uint32_t size = 1u << w[i] >> 1;
        memset(dt->sym + start[w[i]], i, size);
        memset(dt->len + start[w[i]], log + 1 - w[i], size);
        start[w[i]] += size;
    }
    dt->log = log;
    dt->valid = 1;
    if (!lookups) return used;
    /* With codes of 6+ bits a window never holds two: the 2-byte table is faster there (a
     * quarter of the cache) and quicker to build. */
    dt->one = 2 * dt->len[(1u << log) - 1] > LOOKUP;
    if (dt->one)
        for (uint32_t p = 0; p < (1u << LOOKUP); p++) {
            uint32_t idx = p >> (LOOKUP - log);
            dt->single[p] = (uint16_t)(dt->sym[idx] | dt->len[idx] << 8);
        }
    else
        fill_multi(dt, 0, LOOKUP, 0, 0, 0);
    dt->valid = 1;
    return used;
}

/* The rest of a stream into [op, end): multi-symbol lookups while their codes lie within
 * the stream's bits and the output, then single codes. The stream's first bytes are read
 * from a copy behind 8 zero bytes, so every window is one load. 1 if the stream ends
 * exactly at `end`. */
static int stream_tail(rstream_t *r, const dtable_t *dt, uint8_t *op, uint8_t *end, size_t len) {
    uint8_t low[16] = {0};
    memcpy(low + 8, r->start, len < 8 ? len : 8);
    int64_t pos = r->pos;
    while (op < end) {
        if (pos < 0) return 0;
        int64_t top = (pos + 7) >> 3;
        uint64_t c;
        memcpy(&c, top >= 8 ? r->start + top - 8 : low + top, 8);
        c <<= 8 * top - pos;
        if (!dt->one && end - op >= 4) {
            uint64_t e = dt->multi[c >> (64 - LOOKUP)];
            int64_t bits = (int64_t)(e >> 32 & 0xFF);
            if (bits <= pos) {
                uint32_t y = (uint32_t)e;
                memcpy(op, &y, 4);
                op += e >> 40;
                pos -= bits;
                continue;
            }
        }
        uint32_t idx = (uint32_t)(c >> (64 - dt->log));
        *op++ = dt->sym[idx];
        pos -= dt->len[idx];
    }
    return pos == 0;
}

/* One lookup on a stream (container c, shift s, output o): a multi-symbol entry, or a
 * single one. `one` is a constant wherever this is expanded. */
#define STEP(one, c, s, o)                                                     \
    do {                                                                       \
        uint32_t w_ = (uint32_t)(((c) << (s)) >> (64 - LOOKUP));               \
        if (one) {                                                             \
            uint16_t e_ = single[w_];                                          \
            *(o)++ = (uint8_t)e_;                                              \
            (s) += e_ >> 8;                                                    \
        } else {                                                               \
            uint64_t e_ = multi[w_];                                           \
            uint32_t y_ = (uint32_t)e_;                                        \
            memcpy((o), &y_, 4);                                               \
            (o) += e_ >> 40;                                                   \
            (s) += (unsigned)(e_ >> 32) & 0xFF;                                \
        }                                                                      \
    } while (0)

/* One stream by lookups while it has 66+ bits and 20+ symbols left; returns where its
 * output got to. */
static inline __attribute__((always_inline)) uint8_t *stream_fast(rstream_t *r, const dtable_t *dt,
                                                                  uint8_t *restrict o, uint8_t *end, const int one) {
    const uint64_t *restrict multi = dt->multi;
    const uint16_t *restrict single = dt->single;
    int64_t pos = r->pos;
    while (pos >= 66 && end - o >= 20) {
        int64_t top = (pos + 7) >> 3;
        uint64_t c;
        memcpy(&c, r->start + top - 8, 8);
        unsigned sh = (unsigned)(8 * top - pos);
        for (int q = 0; q < 5; q++) STEP(one, c, sh, o);
        pos = 8 * top - sh;
    }
    r->pos = pos;
    return o;
}

/* Four streams in lockstep rounds while every one has 66+ bits left (so 5 lookups of <= 11
 * bits read only its own bytes) and room for 5 lookups' 4-byte stores, then each alone.
 * Locals, not arrays, so the byte stores cannot alias the decoder's state. */
static inline __attribute__((always_inline)) void streams4(rstream_t *r, uint8_t **op, uint8_t *const *end,
                                                           const dtable_t *dt, const int one) {
    const uint64_t *restrict multi = dt->multi;
    const uint16_t *restrict single = dt->single;
    uint8_t *restrict o0 = op[0], *restrict o1 = op[1], *restrict o2 = op[2], *restrict o3 = op[3];
    int64_t p0 = r[0].pos, p1 = r[1].pos, p2 = r[2].pos, p3 = r[3].pos;
    while ((p0 >= 66) & (p1 >= 66) & (p2 >= 66) & (p3 >= 66) & (end[0] - o0 >= 20) & (end[1] - o1 >= 20) &
           (end[2] - o2 >= 20) & (end[3] - o3 >= 20)) {
        int64_t t0 = (p0 + 7) >> 3, t1 = (p1 + 7) >> 3, t2 = (p2 + 7) >> 3, t3 = (p3 + 7) >> 3;
        uint64_t c0, c1, c2, c3;
        memcpy(&c0, r[0].start + t0 - 8, 8);
        memcpy(&c1, r[1].start + t1 - 8, 8);
        memcpy(&c2, r[2].start + t2 - 8, 8);
        memcpy(&c3, r[3].start + t3 - 8, 8);
        unsigned s0 = (unsigned)(8 * t0 - p0), s1 = (unsigned)(8 * t1 - p1), s2 = (unsigned)(8 * t2 - p2),
                 s3 = (unsigned)(8 * t3 - p3);
        for (int q = 0; q < 5; q++) {
            STEP(one, c0, s0, o0);
            STEP(one, c1, s1, o1);
            STEP(one, c2, s2, o2);
            STEP(one, c3, s3, o3);
        }
        p0 = 8 * t0 - s0, p1 = 8 * t1 - s1, p2 = 8 * t2 - s2, p3 = 8 * t3 - s3;
    }
    r[0].pos = p0, r[1].pos = p1, r[2].pos = p2, r[3].pos = p3;
    op[0] = o0, op[1] = o1, op[2] = o2, op[3] = o3;
    /* streams of shorter codes reach their ends in fewer rounds: the others go on alone */
    for (int k = 0; k < 4; k++) op[k] = stream_fast(&r[k], dt, op[k], end[k], one);
}

#undef STEP

/* The Huffman-coded literals of n bytes in[0..size) (`streams` 1 or 4) into out[0..n). */
SHIFTS static int decode_streams(const uint8_t *in, size_t size, int streams, const dtable_t *dt, uint8_t *out,
                                size_t n) {
    rstream_t r[4];
    uint8_t *op[4], *end[4];
    size_t len[4];
    if (streams == 1) return rstream_init(&r[0], in, size) && stream_tail(&r[0], dt, out, out + n, size);
    if (size < 6) return 0;
    size_t seg = (n + 3) / 4, at = 6;
    len[0] = in[0] | (size_t)in[1] << 8;
    len[1] = in[2] | (size_t)in[3] << 8;
    len[2] = in[4] | (size_t)in[5] << 8;
    if (len[0] + len[1] + len[2] > size - 6 || 3 * seg > n) return 0;
    len[3] = size - 6 - len[0] - len[1] - len[2];
    for (int k = 0; k < 4; k++) {
        if (!rstream_init(&r[k], in + at, len[k])) return 0;
        at += len[k];
        op[k] = out + (size_t)k * seg;
        end[k] = k < 3 ? op[k] + seg : out + n;
    }
    if (dt->one)
        streams4(r, op, end, dt, 1);
    else
        streams4(r, op, end, dt, 0);
    for (int k = 0; k < 4; k++)
        if (!stream_tail(&r[k], dt, op[k], end[k], len[k])) return 0;
    return 1;
}

static size_t get_le(const uint8_t *p, int bytes) {
    size_t v = 0;
    for (int k = 0; k < bytes; k++) v |= (size_t)p[k] << (8 * k);
    return v;
}

/* A compressed block's literals section header (RFC 8878 3.1.1.3.1) from in[0..n): its
 * type and size format, the literals' number, the section's size after the header and the
 * header's; 0 if the block is malformed, has sequences or more than `cap` literals. */
typedef struct {
    int type, format;
    size_t regen, csize, header;
} lheader_t;

static int literals_header(const uint8_t *in, size_t n, size_t cap, lheader_t *h) {
    if (n < 1) return 0;
    int type = in[0] & 3, format = in[0] >> 2 & 3;
    size_t regen, csize = 0, header;
    if (type < 2) {
        if (!(format & 1)) header = 1, regen = in[0] >> 3;
        else if (format == 1) header = 2, regen = n >= 2 ? get_le(in, 2) >> 4 : 0;
        else header = 3, regen = n >= 3 ? get_le(in, 3) >> 4 : 0;
        csize = type == 0 ? regen : 1;
    } else {
        int bits = format < 2 ? 10 : format == 2 ? 14 : 18;
        header = format < 2 ? 3 : (size_t)format + 2;
        if (n < header) return 0;
        uint64_t v = get_le(in, (int)header) >> 4;
        regen = (size_t)(v & ((1u << bits) - 1));
        csize = (size_t)(v >> bits);
    }
    if (n < header || n - header < csize || n - header - csize != 1 || in[header + csize] != 0) return 0;
    if (regen > cap) return 0;
    *h = (lheader_t){type, format, regen, csize, header};
    return 1;
}

/* One compressed block's content in[0..n): literals, then an empty sequence section.
 * Writes the literals to out[0..cap) when `out` is set; returns their number, or -1 if the
 * block is malformed or has sequences. */
static int64_t literals_block(const uint8_t *in, size_t n, uint8_t *out, size_t cap, dtable_t *dt) {
    lheader_t lh;
    if (!literals_header(in, n, cap, &lh)) return -1;
    int type = lh.type, format = lh.format;
    size_t regen = lh.regen, csize = lh.csize, header = lh.header;
    if (!out) return (int64_t)regen;
    const uint8_t *body = in + header;
    if (type == 0) {
        memcpy(out, body, regen);
    } else if (type == 1) {
        memset(out, body[0], regen);
    } else {
        size_t tree = 0;
        if (type == 2) {
            tree = read_tree(body, csize, dt, 1);
            if (!tree) return -1;
        } else if (!dt->valid) {
            return -1;
        }
        if (!decode_streams(body + tree, csize - tree, format == 0 ? 1 : 4, dt, out, regen)) return -1;
    }
    return (int64_t)regen;
}

/* Where the first block of frame in[0..n) of `size` bytes starts, or 0 if the frame is not
 * one of these: no checksum, dictionary or reserved bit, and a content size (if given) of
 * `size`. */
static size_t frame_start(const uint8_t *in, size_t n, size_t size) {
    if (n < 6 || get_le(in, 4) != 0xFD2FB528u) return 0;
    int fhd = in[4], fcs = fhd >> 6, single = fhd >> 5 & 1;
    if (fhd & 0x0F) return 0; /* reserved bit, checksum, or dictionary id */
    size_t at = 5 + !single;
    int fcs_bytes = fcs == 0 ? single : fcs == 1 ? 2 : fcs == 2 ? 4 : 8;
    if (n < at + (size_t)fcs_bytes) return 0;
    if (fcs_bytes) {
        size_t declared = get_le(in + at, fcs_bytes) + (fcs == 1 ? 256 : 0);
        if (declared != size) return 0;
    }
    return at + (size_t)fcs_bytes;
}

/* Decodes frame in[0..n) into out[0..size) (see above); 1 on success, 0 if the frame is not
 * one of these or is malformed. A first pass checks every block header without decoding;
 * with `decode` 0 only that pass runs (out is not touched). */
static int literals_frame(const uint8_t *in, size_t n, uint8_t *out, size_t size, dtable_t *dt, int decode) {
    size_t at = frame_start(in, n, size);
    if (!at) return 0;
    for (int pass = 0; pass <= decode; pass++) {
        size_t p = at, done = 0;
        dt->valid = 0;
        for (;;) {
            if (n - p < 3) return 0;
            size_t h = get_le(in + p, 3), bsize = h >> 3;
            int last = h & 1, type = h >> 1 & 3;
            p += 3;
            if (type == 1) {
                if (n - p < 1 || size - done < bsize) return 0;
                if (pass) memset(out + done, in[p], bsize);
                p += 1;
                done += bsize;
            } else if (type == 3 || n - p < bsize) {
                return 0;
            } else if (type == 0) {
                if (size - done < bsize) return 0;
                if (pass) memcpy(out + done, in + p, bsize);
                p += bsize;
                done += bsize;
            } else {
                int64_t got = literals_block(in + p, bsize, pass ? out + done : NULL, size - done, dt);
                if (got < 0) return 0;
                p += bsize;
                done += (size_t)got;
            }
            if (last) break;
        }
        if (p != n || done != size) return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- the GPU's work list */

/* literals_scan: such frames cut into the rows the GPU decodes them by
 * (ckptz.engines.gpu.literals: one thread a row): a Huffman stream (its bytes, where its
 * symbols go, its code), or at most SCAN_PIECE bytes to copy or fill. The header, block,
 * literals and tree checks are literals_frame's; a frame that fails them is not this
 * decoder's (nvCOMP's Zstd takes it, and judges it). */
#define SCAN_FIELDS 6
#define SCAN_PIECE 4096
/* The most symbols a stream may have: a thread decodes a stream alone, so a batch waits for
 * its longest one. The GPU coder's 64 KiB blocks (16 KiB streams) decoded faster this way
 * than by nvCOMP, the CPU coder's planned blocks of up to 128 KiB slower, so frames with
 * longer streams are left to nvCOMP. */
#define SCAN_MAX_STREAM (16 << 10)
#define SCAN_LOOKUP (1 << MAX_BITS)
enum { SCAN_COPY = 0, SCAN_FILL = 1, SCAN_STREAM = 2 };

typedef struct {
    int64_t *rows;     /* SCAN_FIELDS each: kind, src, src bytes, dst, dst bytes, code or byte */
    int64_t nrows, cap_rows;
    uint16_t *codes;   /* SCAN_LOOKUP entries each: symbol | length << 8, by the next 11 bits */
    int64_t ncodes, cap_codes;
    int over; /* a row or code found no room */
    int64_t peak_rows, peak_codes; /* the most held at once (a refused frame's are taken back) */
} scan_t;

static void scan_peak(scan_t *o) {
    if (o->nrows > o->peak_rows) o->peak_rows = o->nrows;
    if (o->ncodes > o->peak_codes) o->peak_codes = o->ncodes;
}

static int scan_row(scan_t *o, int64_t kind, int64_t src, int64_t n, int64_t dst, int64_t m, int64_t extra) {
    if (o->rows) {
        if (o->nrows >= o->cap_rows) return o->over = 1, 0;
        int64_t *r = o->rows + o->nrows * SCAN_FIELDS;
        r[0] = kind, r[1] = src, r[2] = n, r[3] = dst, r[4] = m, r[5] = extra;
    }
    o->nrows++;
    scan_peak(o);
    return 1;
}

/* m bytes copied from src (SCAN_COPY) or filled with `byte`, in pieces. */
static int scan_pieces(scan_t *o, int kind, int64_t src, int64_t dst, int64_t m, int byte) {
    for (int64_t at = 0; at < m; at += SCAN_PIECE) {
        int64_t k = m - at < SCAN_PIECE ? m - at : SCAN_PIECE;
        if (!scan_row(o, kind, kind == SCAN_COPY ? src + at : 0, kind == SCAN_COPY ? k : 0, dst + at, k, byte))
            return 0;
    }
    return 1;
}

/* A stream of n bytes at src: its last byte holds the end mark. */
static int scan_stream(scan_t *o, const uint8_t *in, int64_t src, int64_t n, int64_t dst, int64_t m, int64_t code) {
    if (n < 1 || in[src + n - 1] == 0 || m > SCAN_MAX_STREAM) return 0;
    return scan_row(o, SCAN_STREAM, src, n, dst, m, code);
}

/* The literals of a compressed block at in[p..p+n) (literals_block's checks) whose output
 * goes at dst, at most `cap` bytes; returns their number or -1. `code`: the block's code
 * (-1 before the frame's first tree). */
static int64_t scan_block(scan_t *o, const uint8_t *in, size_t p, size_t n, int64_t dst, size_t cap, dtable_t *dt,
                          int64_t *code) {
    const uint8_t *b = in + p;
    lheader_t lh;
    if (!literals_header(b, n, cap, &lh)) return -1;
    int format = lh.format, type = lh.type;
    size_t regen = lh.regen, csize = lh.csize, header = lh.header;
    int64_t body = (int64_t)(p + header);
    if (type == 0) return scan_pieces(o, SCAN_COPY, body, dst, (int64_t)regen, 0) ? (int64_t)regen : -1;
    if (type == 1) return scan_pieces(o, SCAN_FILL, 0, dst, (int64_t)regen, in[body]) ? (int64_t)regen : -1;
    size_t tree = 0;
    if (type == 2) {
        if (o->rows) {
            tree = read_tree(in + body, csize, dt, 0);
            if (!tree) return -1;
            if (o->ncodes >= o->cap_codes) return o->over = 1, -1;
            uint16_t *e = o->codes + o->ncodes * SCAN_LOOKUP;
            int shift = MAX_BITS - dt->log;
            for (uint32_t v = 0; v < SCAN_LOOKUP; v++) e[v] = (uint16_t)(dt->sym[v >> shift] | dt->len[v >> shift] << 8);
        }
        *code = o->ncodes++;
        scan_peak(o);
    } else if (*code < 0) {
        return -1;
    }
    if (!o->rows) { /* counting: the rows a block makes */
        o->nrows += format == 0 ? 1 : 4;
        scan_peak(o);
        return (int64_t)regen;
    }
    int64_t data = body + (int64_t)tree, size = (int64_t)(csize - tree);
    if (format == 0) return scan_stream(o, in, data, size, dst, (int64_t)regen, *code) ? (int64_t)regen : -1;
    int64_t seg = ((int64_t)regen + 3) / 4, len[4];
    if (size < 6 || 3 * seg > (int64_t)regen) return -1;
    len[0] = (int64_t)get_le(in + data, 2), len[1] = (int64_t)get_le(in + data + 2, 2);
    len[2] = (int64_t)get_le(in + data + 4, 2);
    if (len[0] + len[1] + len[2] > size - 6) return -1;
    len[3] = size - 6 - len[0] - len[1] - len[2];
    int64_t at = data + 6;
    for (int k = 0; k < 4; k++) {
        int64_t m = k < 3 ? seg : (int64_t)regen - 3 * seg;
        if (!scan_stream(o, in, at, len[k], dst + k * seg, m, *code)) return -1;
        at += len[k];
    }
    return (int64_t)regen;
}

/* Frame in[at..at+n) of `size` bytes decoded at dst: its rows and codes (literals_frame's
 * checks); 0 if it is not such a frame (its rows and codes are taken back). */
static int scan_frame(scan_t *o, const uint8_t *in, size_t at, size_t n, size_t size, int64_t dst, dtable_t *dt) {
    int64_t rows0 = o->nrows, codes0 = o->ncodes, code = -1;
    const uint8_t *f = in + at;
    size_t p = frame_start(f, n, size), done = 0;
    if (!p) goto refuse;
    for (;;) {
        if (n - p < 3) goto refuse;
        size_t h = get_le(f + p, 3), bsize = h >> 3;
        int last = h & 1, type = h >> 1 & 3;
        p += 3;
        if (type == 1) {
            if (n - p < 1 || size - done < bsize) goto refuse;
            if (!scan_pieces(o, SCAN_FILL, 0, dst + (int64_t)done, (int64_t)bsize, f[p])) goto refuse;
            p += 1;
            done += bsize;
        } else if (type == 3 || n - p < bsize) {
            goto refuse;
        } else if (type == 0) {
            if (size - done < bsize) goto refuse;
            if (!scan_pieces(o, SCAN_COPY, (int64_t)(at + p), dst + (int64_t)done, (int64_t)bsize, 0)) goto refuse;
            p += bsize;
            done += bsize;
        } else {
            int64_t got = scan_block(o, in, at + p, bsize, dst + (int64_t)done, size - done, dt, &code);
            if (got < 0) goto refuse;
            p += bsize;
            done += (size_t)got;
        }
        if (last) break;
    }
    if (p == n && done == size) return 1;
refuse:
    o->nrows = rows0, o->ncodes = codes0;
    return 0;
}
