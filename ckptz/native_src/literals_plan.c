/*
 * The plan of zstd frames of Huffman-coded literal blocks whose bytes a GPU writes
 * (ckptz/engines/gpu/literals.py): the same bitstream as literals_encode.c, in blocks of a
 * fixed size. From each block quarter's byte counts (taken on the GPU), everything about
 * the frames is known before a bit is written: each block's kind and table, its headers,
 * where each of its four streams starts, and each frame's size. The GPU then writes every
 * stream of every block at once (one thread each), and the headers from `blob`.
 */
#include "native.h"

/* One row of the plan per block; offsets are absolute in the source and destination
 * buffers. */
enum {
    LP_SRC,      /* its first input byte */
    LP_LEN,      /* its input bytes */
    LP_MODE,     /* LP_RAW, LP_RLE, LP_FRESH, LP_REUSE */
    LP_DST,      /* where its head goes (the frame header first, for a frame's first block) */
    LP_HEAD,     /* where its head lies in blob */
    LP_HEAD_LEN, /* its head's bytes */
    LP_TABLE,    /* its code, a row of tables */
    LP_STREAM,   /* LP_STREAM + k: where stream k starts (k < 4) */
    LP_END = LP_STREAM + 4, /* where the block's last byte goes (Number_of_Sequences = 0) */
    LP_FIELDS = 16
};
enum { LP_RAW = 0, LP_RLE = 1, LP_FRESH = 2, LP_REUSE = 3 };

/* Bytes of a block's head at most: frame header 14, block header 3, literals header 5,
 * table description 129, jump table 6. */
#define LP_HEAD_MAX 160

/* The four streams' sizes in bytes for quarters `q` under table t (each rounded up after
 * its end bit); -1 if a byte present has no code. */
static int64_t stream_sizes(const uint16_t (*q)[256], const table_t *t, int64_t *sizes) {
    int64_t total = 0;
    for (int k = 0; k < 4; k++) {
        int64_t bits = 0;
        for (int s = 0; s < 256; s++)
            if (q[k][s]) {
                if (s > t->max_symbol || !t->len[s]) return -1;
                bits += (int64_t)q[k][s] * t->len[s];
            }
        sizes[k] = (bits + 1 + 7) / 8;
        total += sizes[k];
    }
    return total;
}

static size_t frame_header(uint8_t *op, uint64_t n) {
    put_le(op, 0xFD2FB528u, 4);
    if (n < 256) {
        op[4] = 0x20;
        op[5] = (uint8_t)n;
        return 6;
    }
    if (n < 65536 + 256) {
        op[4] = 0x60;
        put_le(op + 5, n - 256, 2);
        return 7;
    }
    if (n <= 0xFFFFFFFFu) {
        op[4] = 0xA0;
        put_le(op + 5, n, 4);
        return 9;
    }
    op[4] = 0xE0;
    put_le(op + 5, n, 8);
    return 13;
}

/* A chunk whose bytes agree on some bit positions and whose entropy is within PACK_SLACK
 * bits a byte of the positions that vary is bit-packed instead (ckptz.codecs.bitpack, as
 * the CPU coder does: as small, and decoded ~10x faster than Huffman codes of such a
 * plane). Returns the payload's size, with *pack = fixed | value << 8; 0 if not. */
#define PACK_SLACK 0.1
static int64_t bitpack_choice(const uint16_t (*quarters)[256], int64_t nq, int64_t n, int64_t *pack) {
    uint64_t count[256] = {0};
    for (int64_t q = 0; q < nq; q++)
        for (int s = 0; s < 256; s++) count[s] += quarters[q][s];
    unsigned all = 0xFF, any = 0;
    double sum = 0;
    for (int s = 0; s < 256; s++)
        if (count[s]) {
            all &= (unsigned)s;
            any |= (unsigned)s;
            sum += (double)count[s] * log2((double)count[s]);
        }
    unsigned fixed = ~(all ^ any) & 0xFF;
    int varying = 8 - __builtin_popcount(fixed);
    double bits = log2((double)n) - sum / (double)n;
    if (!fixed || n == 0 || (double)varying >= bits + PACK_SLACK) return 0;
    *pack = (int64_t)(fixed | (all & fixed) << 8);
    return 2 + (int64_t)varying * ((n + 7) / 8);
}

/* Plans `chunks` frames: chunk c's `sizes[c]` bytes at src_at[c], its frame to go at
 * dst_at[c] if it is at most cap[c] bytes and smaller than the chunk. `quarters` holds
 * each block's four quarters' byte counts, chunk after chunk (stream k of a block of m bytes
 * codes bytes [k * ceil(m / 4), ...) as literals_encode.c's do). got[c] gets the frame's size,
 * or -1 where the chunk is better stored (its blocks are then left out of the plan);
 * packs[c] says where it is bit-packed instead (bitpack_choice; -1: a frame).
 * Returns the plan's rows; *n_tables and *blob_used get what it used of `tables` and
 * `blob` (room: a table and LP_HEAD_MAX bytes per block). */
static int64_t plan_literals(const uint16_t (*quarters)[256], const int64_t *sizes, const int64_t *src_at,
                             const int64_t *dst_at, const int64_t *cap, int64_t chunks, int64_t block,
                             int64_t *got, int64_t *packs, int64_t *plan, uint32_t (*tables)[256],
                             int64_t *n_tables, uint8_t *blob, int64_t *blob_used) {
    int64_t rows = 0, ntab = 0, used = 0, q = 0;
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t n = sizes[c], nb = (n + block - 1) / block;
        const int64_t first_row = rows, first_tab = ntab, first_used = used;
        packs[c] = -1;
        int64_t packed = bitpack_choice(quarters + q, 4 * nb, n, &packs[c]);
        if (packed) {
            got[c] = packed <= cap[c] ? packed : -1;
            if (got[c] < 0) packs[c] = -1;
            q += 4 * nb;
            continue;
        }
        table_t prev;
        prev.valid = 0;
        int64_t at = 0; /* bytes of the frame so far */
        for (int64_t b = 0; b < nb; b++, q += 4) {
            const int64_t m = (b + 1) * block < n ? block : n - b * block;
            const int last = b + 1 == nb;
            uint32_t hist[256];
            int distinct = 0, only = 0;
            for (int s = 0; s < 256; s++) {
                hist[s] = (uint32_t)quarters[q][s] + quarters[q + 1][s] + quarters[q + 2][s] + quarters[q + 3][s];
                if (hist[s]) distinct++, only = s;
            }
            int64_t *row = plan + rows * LP_FIELDS;
            uint8_t *head = blob + used;
            size_t h = b == 0 ? frame_header(head, (uint64_t)n) : 0;
            memset(row, 0, LP_FIELDS * sizeof(int64_t));
            row[LP_SRC] = src_at[c] + b * block;
            row[LP_LEN] = m;
            row[LP_DST] = dst_at[c] + at;
            row[LP_HEAD] = used;
            int64_t bytes;
            if (distinct == 1) { /* RLE block: Block_Size is the regenerated size */
                put_le(head + h, (uint64_t)last | (1u << 1) | ((uint64_t)m << 3), 3);
                head[h + 3] = (uint8_t)only;
                row[LP_MODE] = LP_RLE;
                h += 4;
                bytes = 0;
            } else {
                int mode = LP_RAW;
                /* coded only where it saves MIN_GAIN (literals_encode.c, as its fixed blocks) */
                int64_t best = m - MIN_GAIN(m), sz[4], fresh_sz[4] = {0}, reuse_sz[4] = {0};
                table_t fresh;
                uint8_t desc[160];
                size_t desc_size = 0, lit_header = m <= 16383 ? 4 : 5;
                if (m >= MIN_HUFFMAN) {
                    build_table(hist, &fresh);
                    desc_size = describe_table(desc, &fresh);
                    int64_t s = stream_sizes((const uint16_t(*)[256])quarters[q], &fresh, fresh_sz);
                    if (desc_size && s >= 0 && (int64_t)(lit_header + desc_size + 6 + 1) + s < best) {
                        best = (int64_t)(lit_header + desc_size + 6 + 1) + s;
                        mode = LP_FRESH;
                    }
                    s = prev.valid ? stream_sizes((const uint16_t(*)[256])quarters[q], &prev, reuse_sz) : -1;
                    /* a new table must save FRESH_COST bytes (its decoding) over the last one */
                    if (s >= 0 && (int64_t)(lit_header + 6 + 1) + s < best + (mode == LP_FRESH ? FRESH_COST : 0)) {
                        best = (int64_t)(lit_header + 6 + 1) + s;
                        mode = LP_REUSE;
                    }
                }
                if (mode == LP_RAW) {
                    put_le(head + h, (uint64_t)last | ((uint64_t)m << 3), 3);
                    h += 3;
                    bytes = m; /* copied from the source after the head */
                } else {
                    const table_t *t = mode == LP_FRESH ? &fresh : &prev;
                    memcpy(sz, mode == LP_FRESH ? fresh_sz : reuse_sz, sizeof(sz));
                    size_t compressed = (mode == LP_FRESH ? desc_size : 0) + 6 + (size_t)(sz[0] + sz[1] + sz[2] + sz[3]);
                    uint64_t type = mode == LP_FRESH ? 2 : 3, lit;
                    if (lit_header == 4)
                        lit = type | (2u << 2) | ((uint64_t)m << 4) | ((uint64_t)compressed << 18);
                    else
                        lit = type | (3u << 2) | ((uint64_t)m << 4) | ((uint64_t)compressed << 22);
                    put_le(head + h, (uint64_t)last | (2u << 1) | ((uint64_t)(lit_header + compressed + 1) << 3), 3);
                    h += 3;
                    put_le(head + h, lit, (int)lit_header);
                    h += lit_header;
                    if (mode == LP_FRESH) {
                        memcpy(head + h, desc, desc_size);
                        h += desc_size;
                    }
                    for (int k = 0; k < 3; k++) put_le(head + h + 2 * k, (uint64_t)sz[k], 2);
                    h += 6;
                    uint32_t *ce = tables[ntab];
                    for (int s = 0; s < 256; s++)
                        ce[s] = s <= t->max_symbol ? (uint32_t)t->code[s] | ((uint32_t)t->len[s] << 16) : 0;
                    row[LP_TABLE] = ntab++;
                    row[LP_MODE] = mode;
                    int64_t s_at = row[LP_DST] + (int64_t)h;
                    for (int k = 0; k < 4; k++) {
                        row[LP_STREAM + k] = s_at;
                        s_at += sz[k];
                    }
                    row[LP_END] = s_at;
                    bytes = sz[0] + sz[1] + sz[2] + sz[3] + 1;
                    if (mode == LP_FRESH) prev = fresh;
                }
            }
            row[LP_HEAD_LEN] = (int64_t)h;
            used += (int64_t)h;
            at += (int64_t)h + bytes;
            rows++;
        }
        if (n == 0 || at >= n || at > cap[c]) { /* stored instead: its rows are dropped */
            got[c] = -1;
            rows = first_row;
            ntab = first_tab;
            used = first_used;
        } else {
            got[c] = at;
        }
    }
    *n_tables = ntab;
    *blob_used = used;
    return rows;
}
