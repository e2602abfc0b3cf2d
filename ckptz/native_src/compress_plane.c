/*
 * The compress data plane: one call codes a whole file into its container's data area on a
 * pool of native threads, and no Python runs per frame.
 *
 * Python plans (ckptz/pipeline/native_compress.py): a table of frames (plane.c's columns;
 * the checksum column is filled in here) and of their pieces in the file, which is read from
 * a descriptor or from regions of host memory that tile it (ckptz.save's image of the state
 * being saved). Each thread takes the next frame, reads its pieces, takes the frame's
 * checksum and hashes the digest's leaves (plane.c's functions, fused in one pass where the
 * pieces come in order), splits the words into planes, codes each plane by
 * ckptz/codecs/frames.py's rules (its thresholds come with the plan; exponent planes of
 * frames so marked are tried in order-1 and row-predicted coding too, order1.c and
 * order2d.c, and their lowest planes' signs row-predicted, sign2d.c) and takes the payloads'
 * checksums into the chunk table. Payloads are placed in frame order, so the data area is
 * the one the Python pipeline writes: a coded frame whose predecessors are not all placed
 * waits in its buffers (a bounded set) while its thread codes another, and the thread that
 * places a frame places the waiting ones after it too and pwrites their payloads (with their
 * padding), or writes them to a pipe in order (before it lets go of the order lock), or
 * writes nothing for a discarded output. With verify, each frame is decoded back from its
 * payloads before they are written and must give its checksum again, and the payloads are
 * read back once written (not from a pipe) and must give theirs. LZ-coded zstd planes go
 * through the zstd vendored beside this file, the very version and calls of the Python
 * binding, so the bytes are the same. Progress is a counter Python polls; a stop flag Python
 * sets ends the threads between frames; the first failure is reported as (kind, frame,
 * detail). A series delta (delta_plane.c) is applied to each frame it touches once the
 * frame's digest leaves are hashed, and the frame's checksum taken of the bytes it codes.
 */
#include "native.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/uio.h>
#include <unistd.h>

#define ZSTD_STATIC_LINKING_ONLY /* the CCtx_params calls python-zstandard makes */
#include "zstd/zstd.h"

/* What stopped a compression besides plane.c's kinds (native_compress.py names each). */
enum {
    PLANE_SHORT = 13, /* the file ends inside a frame: it changed while being read */
    PLANE_CODER = 14, /* zstd refused a plane (detail: its error code) */
};

/* Columns of the chunk table this fills (container.make_tables' chunk rows). */
enum { CC_OFFSET, CC_SIZE, CC_RAW, CC_CHECKSUM, CC_CODEC, CC_PLANE, CC_COLS };

/* ckptz/codecs/frames.py's thresholds, in the order native_compress.py passes them: the
 * plane's choices follow them to the bit, and they are written down once, there. */
enum { RULE_SAMPLE, RULE_NOISE_BITS, RULE_NOISE_ZEROS, RULE_ZSTD_ZEROS, RULE_PACK_SLACK, RULE_LOW_BITS,
       RULE_RUN_SHARE, RULE_CONTEXT_MARGIN, RULE_BLOCK, RULE_CLEAR_SAVING,
       RULE_CLEAR_MISS, RULE_MANTISSA_MARGIN, RULE_COUNT };

/* A frame's FR_ROTATE column here: bit 0, its words are floats; bit 1, its exponents are
 * also tried in order-1 coding (frames.py's context_exponents); bit 2, its planes are coded
 * on the GPU (compress_gpu.c; the others of a GPU run are coded here, as on the CPU); bit 3,
 * its exponents are tried so only where a sparse sample says order-1 contexts save clearly,
 * and its signs row-predicted (frames.py's measured_contexts). */
enum { ROTATE_FLOAT = 1, ROTATE_CONTEXT = 2, ROTATE_GPU = 4, ROTATE_MEASURED = 8 };

/* How plane_code tries the contextual coders on an exponent plane: not at all, always, or
 * where order1_saving() reaches the plan's RULE_CLEAR_SAVING (and plane_code_signs sign2d:
 * not at all, always, or where its width mispredicts at most RULE_CLEAR_MISS). */
enum { CONTEXT_NONE, CONTEXT_ALWAYS, CONTEXT_MEASURED };

/* The compress plane's steps, as its threads' clocks count them (stage_clock_t): reading a
 * frame, its checksum and digest leaves, applying a delta, splitting it into planes,
 * coding them, deciding the GPU's planes (and planning portable ones), decoding back and
 * reading back (verify), the payloads' checksums, writing, waiting for a free set of
 * buffers, waiting for the order lock (and placing), a GPU worker's batch, waiting for a
 * batch, and the rest (taking frames, the loop). */
enum { CS_READ, CS_HASH, CS_DELTA, CS_SPLIT, CS_CODE, CS_PLAN, CS_VERIFY, CS_CHECKSUM, CS_WRITE, CS_WAIT_BUFFERS,
       CS_WAIT_ORDER, CS_GPU, CS_WAIT, CS_OTHER, CS_COUNT };
static const char *const compress_stage_names[CS_COUNT] = {
    "read",  "hash",         "delta",      "split", "code", "plan", "verify", "checksum",
    "write", "wait buffers", "wait order", "gpu",   "wait", "other"};
_Static_assert(CS_COUNT <= STAGE_MAX, "compress stages");

/* nvCOMP ANS codes chunks of at most this many bytes. */
#define GPU_LARGEST_PLANE ((int64_t)16 << 20)

/* Columns of the memory table: the source's bytes as regions of host memory that tile it
 * in file order (file offset, length, address). */
enum { MR_AT, MR_SIZE, MR_ADDRESS, MR_COLS };

typedef struct {
    restore_plan_t leaves; /* the digest's leaves and the frame and piece tables, as plane.c reads them */
    int source, output;    /* descriptors; output -1 to write nothing */
    const int64_t *memory; /* MR_COLS per region: the source in host memory, where source is -1 */
    int64_t memory_count;
    int in_order;          /* output is a pipe: payloads written in order, by write() */
    int verify;            /* decode every frame back from its payloads ... */
    int checked;           /* ... and read them back from here once written (-1: not) */
    int64_t *frames;       /* writable: each frame's checksum goes in */
    int64_t *chunks;       /* CC_COLS per chunk, filled in */
    int level;
    double rules[RULE_COUNT];
    volatile int64_t *progress;
    volatile uint8_t *stop;
    size_t frame_room, out_room, spare_room; /* buffer sizes */
    int64_t next;                            /* the next frame to take */
    pthread_mutex_t order_lock;              /* guards what follows, to `end` */
    pthread_cond_t order_turn;               /* a set of buffers came free, or the run failed */
    struct held *held;                       /* held_count sets of frame buffers */
    struct held **free_held, **waiting;      /* the free sets; coded frames by frame % held_count */
    int held_count, free_count;
    int64_t placed; /* frames given their place so far */
    int64_t end;    /* the data area's end so far */
    int failed;
    pthread_mutex_t error_lock;
    int64_t error[3]; /* kind, frame, detail */
    /* Coding on a GPU (compress_gpu.c), where gpu is set: the planes of frames marked
     * ROTATE_GPU go to the GPU in batches of about gpu_batch bytes, coded as gpu_codec: by
     * nvCOMP ANS, or as the portable bitstream by ckptz's kernels (gpu_kernels: their cubin). */
    int gpu, gpu_device, gpu_workers, gpu_codec;
    int64_t gpu_batch;
    const char *gpu_library; /* nvCOMP's shared library */
    const uint8_t *gpu_kernels;
    int64_t *gpu_stats;      /* batches, chunks and input bytes coded on the GPU */
    char *gpu_why;           /* why the GPU engine failed */
    size_t gpu_why_room;
    int64_t *stages, stage_rows; /* where each thread's clock is reported (STAGE_COLS a row), or NULL */
} compress_plan_t;

typedef struct {
    int codec;
    const uint8_t *bytes;
    size_t len;
} payload_t;

/* One frame's buffers, held from its read until its payloads are written: its planes (or,
 * of single bytes, the frame itself) and its coded payloads. */
typedef struct held {
    uint8_t *planes, *out;
    payload_t payloads[8];
    int64_t frame, need, at;
} held_t;

typedef struct {
    compress_plan_t *plan;
    uint8_t *raw, *spare; /* the frame as read; a second candidate payload */
    held_t **placing;     /* the frames this thread places at once */
    ZSTD_CCtx *level, *literal;
    uint8_t *decoded, *merged, *written; /* with verify */
    uint8_t *groups;                     /* with verify: order-1 planes' groups */
    dtable_t *dt;
    ZSTD_DCtx *dctx;
    struct delta_scratch *delta; /* this thread's room for the plan's series delta */
    stage_clock_t clock;
} coder_t;

static void compress_fail(compress_plan_t *p, int kind, int64_t frame, int64_t detail) {
    keep_first_failure(&p->error_lock, &p->failed, p->error, kind, frame, detail);
    /* Threads waiting for a free set of buffers must see it and leave. */
    pthread_mutex_lock(&p->order_lock);
    pthread_cond_broadcast(&p->order_turn);
    pthread_mutex_unlock(&p->order_lock);
}

/* ---------------------------------------------------------------- zstd as the binding calls it */

static int zstd_set(ZSTD_CCtx_params *params, ZSTD_cParameter which, int value) {
    return !ZSTD_isError(ZSTD_CCtxParams_setParameter(params, which, value));
}

/* A context set up as python-zstandard's ZstdCompressor sets one up: from a level (with
 * content size, no checksum, dictionary ids) or, for `literal`, from ZstdCodec's
 * _LITERAL_PARAMS as its ZstdCompressionParameters passes them, every parameter in order. */
static ZSTD_CCtx *zstd_context(int level, int literal) {
    ZSTD_CCtx *cctx = ZSTD_createCCtx();
    ZSTD_CCtx_params *params = ZSTD_createCCtxParams();
    int ok = cctx && params;
    if (ok && !literal) {
        ok = zstd_set(params, ZSTD_c_compressionLevel, level) && zstd_set(params, ZSTD_c_contentSizeFlag, 1) &&
             zstd_set(params, ZSTD_c_checksumFlag, 0) && zstd_set(params, ZSTD_c_dictIDFlag, 1);
    } else if (ok) {
        static const int order[][2] = {
            {ZSTD_c_nbWorkers, 0},       {ZSTD_c_format, 0},          {ZSTD_c_compressionLevel, 0},
            {ZSTD_c_windowLog, 15},      {ZSTD_c_hashLog, 6},         {ZSTD_c_chainLog, 6},
            {ZSTD_c_searchLog, 1},       {ZSTD_c_minMatch, 7},        {ZSTD_c_targetLength, 0},
            {ZSTD_c_strategy, ZSTD_fast}, {ZSTD_c_contentSizeFlag, 1}, {ZSTD_c_checksumFlag, 0},
            {ZSTD_c_dictIDFlag, 0},      {ZSTD_c_jobSize, 0},         {ZSTD_c_overlapLog, 0},
            {ZSTD_c_forceMaxWindow, 0},  {ZSTD_c_enableLongDistanceMatching, 0},
            {ZSTD_c_ldmHashLog, 0},      {ZSTD_c_ldmMinMatch, 0},     {ZSTD_c_ldmBucketSizeLog, 0},
            {ZSTD_c_ldmHashRateLog, 0},
        };
        for (size_t k = 0; ok && k < sizeof order / sizeof order[0]; k++)
            ok = zstd_set(params, (ZSTD_cParameter)order[k][0], order[k][1]);
    }
    ok = ok && !ZSTD_isError(ZSTD_CCtx_setParametersUsingCCtxParams(cctx, params));
    ZSTD_freeCCtxParams(params);
    if (!ok) {
        ZSTD_freeCCtx(cctx);
        return NULL;
    }
    return cctx;
}

/* One zstd frame of src into dst (room for ZSTD_compressBound(n)), as ZstdCompressor.compress
 * makes it; its size, or 0 with *error set. */
static size_t zstd_frame(ZSTD_CCtx *cctx, uint8_t *dst, size_t cap, const uint8_t *src, size_t n, size_t *error) {
    ZSTD_CCtx_reset(cctx, ZSTD_reset_session_only);
    size_t got = ZSTD_CCtx_setPledgedSrcSize(cctx, n);
    ZSTD_inBuffer in = {src, n, 0};
    ZSTD_outBuffer out = {dst, cap, 0};
    if (!ZSTD_isError(got)) got = ZSTD_compressStream2(cctx, &out, &in, ZSTD_e_end);
    if (ZSTD_isError(got) || got) {
        *error = ZSTD_isError(got) ? (size_t)ZSTD_getErrorCode(got) : 0;
        return 0;
    }
    return out.pos;
}

/* ---------------------------------------------------------------- one plane, frames.py's choice */

/* Room a plane of n bytes may need for any candidate payload. */
static size_t plane_room(size_t n) {
    size_t zstd = ZSTD_compressBound(n), huffman = frame_capacity(n, 0);
    return (zstd > huffman ? zstd : huffman) + 16;
}

enum { TRY_ZSTD, TRY_HUFFMAN };

/* A candidate's payload into dst; its size, or 0 where it could not be made (*error set). */
static size_t plane_try(coder_t *w, int which, uint8_t *dst, const uint8_t *plane, size_t n, size_t *error) {
    size_t cap = plane_room(n);
    if (which == TRY_HUFFMAN) {
        size_t size = write_frame(dst, plane, n, 0);
        if (size) return size;
        /* HuffmanZstd's fallback: a table it cannot describe goes to the literal-mostly zstd. */
        if (!w->literal && !(w->literal = zstd_context(0, 1))) return *error = 0, 0;
        return zstd_frame(w->literal, dst, cap, plane, n, error);
    }
    if (!w->level && !(w->level = zstd_context(w->plan->level, 0))) return *error = 0, 0;
    return zstd_frame(w->level, dst, cap, plane, n, error);
}

/* Codes one non-empty plane as frames.encode_plane does: *out points at
 * `slot` (a payload made there, plane_room(n) bytes) or at the plane itself (stored raw).
 * `context` (CONTEXT_*) says whether an exponent plane tries huff1 and huff2d. Returns 0
 * where zstd failed (*error_out: its error code). */
static int plane_code(coder_t *w, const uint8_t *plane, size_t n, int exponent, int context, double bits,
                      double zeros, uint8_t ones, uint8_t any, uint8_t *slot, payload_t *out, int64_t *error_out) {
    const double *rule = w->plan->rules;
    if (ones == any) {
        slot[0] = ones;
        *out = (payload_t){CODEC_CONST, slot, 1};
        return 1;
    }
    if (bits > rule[RULE_NOISE_BITS] && zeros <= rule[RULE_NOISE_ZEROS]) {
        *out = (payload_t){CODEC_RAW, plane, n};
        return 1;
    }
    int tries[2], count = 0;
    if (exponent) {
        tries[count++] = TRY_HUFFMAN;
        if (zeros >= rule[RULE_ZSTD_ZEROS]) tries[count++] = TRY_ZSTD;
    } else {
        int fixed = ~(ones ^ any) & 0xFF;
        if (fixed && (double)(8 - __builtin_popcount((unsigned)fixed)) < bits + rule[RULE_PACK_SLACK]) {
            int varying[8], k = varying_list(fixed, varying);
            size_t m = (n + 7) / 8;
            slot[0] = (uint8_t)fixed;
            slot[1] = ones & (uint8_t)fixed;
            pack_rows(plane, n, varying, k, slot + 2, m);
            *out = (payload_t){CODEC_BITPACK, slot, 2 + (size_t)k * m};
            return 1;
        }
        tries[count++] = TRY_ZSTD;
        if ((bits < rule[RULE_LOW_BITS] || context != CONTEXT_NONE) && zeros < rule[RULE_RUN_SHARE])
            tries[count++] = TRY_HUFFMAN;
    }
    /* Order-1 exponents as frames.encode_plane tries them: they decode slower, so they must
     * save the margin; against Huffman coding alone, a saving below the entropy of the
     * plane's blocks is one no order-0 code reaches, and the others are not tried. A plane
     * order1.c declines is coded as if huff1 had lost. Row-predicted exponents (order2d.c)
     * stand in for huff1 where they are smaller. */
    uint8_t *ordered = NULL;
    size_t ordered_size = 0;
    int ordered_codec = CODEC_HUFF1;
    double keep = 1 - rule[RULE_CONTEXT_MARGIN];
    int segments = n >= (1u << 17) ? 8 : n >= (1u << 15) ? 4 : 1;
    if (exponent && context == CONTEXT_MEASURED) context = order1_saving(plane, n, segments) >= rule[RULE_CLEAR_SAVING];
    if (exponent && context) { /* exponent planes only, as in frames.encode_plane */
        ordered_size = order1_encode(plane, n, segments, 1, &ordered);
        uint8_t *rowed = NULL;
        size_t rowed_size = order2d_encode(plane, n, segments, 0, &rowed);
        if (rowed_size && (!ordered_size || rowed_size < ordered_size)) {
            free(ordered);
            ordered = rowed, ordered_size = rowed_size, ordered_codec = CODEC_HUFF2D;
        } else {
            free(rowed);
        }
        if (ordered_size && count == 1 &&
            (double)ordered_size < keep * blocked_entropy(plane, n, (size_t)rule[RULE_BLOCK])) {
            memcpy(slot, ordered, ordered_size);
            free(ordered);
            *out = (payload_t){ordered_codec, slot, ordered_size};
            return 1;
        }
    }
    size_t best = 0;
    for (int t = 0; t < count; t++) {
        size_t error = 0;
        /* The best payload so far stays in the slot; a later candidate is made in the
         * spare and copied over where it wins. */
        uint8_t *dst = best ? w->spare : slot;
        size_t size = plane_try(w, tries[t], dst, plane, n, &error);
        if (!size) return free(ordered), *error_out = error, 0;
        if (size < (best ? best : n)) {
            if (dst != slot) memcpy(slot, dst, size);
            best = size;
        }
    }
    if (ordered_size && (double)ordered_size < keep * (double)(best ? best : n)) {
        memcpy(slot, ordered, ordered_size);
        *out = (payload_t){ordered_codec, slot, ordered_size};
    } else {
        *out = best ? (payload_t){CODEC_ZSTD, slot, best} : (payload_t){CODEC_RAW, plane, n};
    }
    free(ordered);
    return 1;
}

/* Row-predicted signs (sign2d.c) for a float's lowest plane, in place of plane_code's
 * payload where they save the margin a slower decoder must, as frames.encode_plane does;
 * with CONTEXT_MEASURED, only where the width found mispredicts at most RULE_CLEAR_MISS of
 * the sampled signs. */
static void plane_code_signs(coder_t *w, const uint8_t *plane, size_t n, int context, uint8_t *slot,
                             payload_t *out) {
    uint8_t *signs = NULL;
    double most_miss = context == CONTEXT_MEASURED ? w->plan->rules[RULE_CLEAR_MISS] : 1.0;
    size_t size = sign2d_encode(plane, n, 0, most_miss, &signs);
    if (size && (double)size < (1 - w->plan->rules[RULE_CONTEXT_MARGIN]) * (double)out->len) {
        memcpy(slot, signs, size);
        *out = (payload_t){CODEC_SIGN2D, slot, size};
    }
    free(signs);
}

/* A float's plane below its exponents (a bf16's lowest, an fp32's top mantissa byte) given
 * them (huffexp.c; `top`, the frame's top plane) in place of the plane's payload where it
 * saves RULE_MANTISSA_MARGIN, as frames.encode_frame does (with CONTEXT_ALWAYS only). */
static void plane_code_mantissas(coder_t *w, const uint8_t *plane, const uint8_t *top, size_t n, uint8_t *slot,
                                 payload_t *out) {
    int segments = n >= (1u << 17) ? 8 : n >= (1u << 15) ? 4 : 1;
    uint8_t *coded = NULL;
    size_t size = huffexp_encode(plane, top, n, segments, &coded);
    if (size && (double)size < (1 - w->plan->rules[RULE_MANTISSA_MARGIN]) * (double)out->len) {
        memcpy(slot, coded, size);
        *out = (payload_t){CODEC_HUFFEXP, slot, size};
    }
    free(coded);
}

/* ---------------------------------------------------------------- verify */

/* The scratch for the groups of a frame's table-coded planes, sized for the largest frame
 * of the plan (the first such plane may be a stream's short last frame); 0 where memory ran
 * out. */
static int decode_groups(coder_t *w) {
    size_t room = w->plan->frame_room;
    return w->groups || (w->groups = malloc(room ? room : 1)) != NULL;
}

/* Whether a frame's payloads decode back to bytes of its checksum (`length` bytes of
 * `word`-byte words, planes of n bytes): what --verify proves before a payload is written.
 * `decoded` (or NULL) gives planes already decoded from their payloads elsewhere. */
static int decodes_back(coder_t *w, const payload_t *payloads, int word, int rotate, size_t n, int64_t length,
                        uint64_t checksum, const uint8_t *const *decoded) {
    plane_t planes[8] = {{NULL, 0}};
    for (int k = word - 1; k >= 0; k--) { /* the top plane first: huffexp's contexts */
        const payload_t *c = &payloads[k];
        if (decoded && decoded[k]) { /* decoded back elsewhere (on the GPU) */
            planes[k] = (plane_t){decoded[k], 0};
            continue;
        }
        chunk_t chunk = {c->codec, c->bytes, c->len};
        uint8_t *into = w->decoded + (size_t)k * n;
        if (!frame_chunk_usable(&chunk, n, n, into, &planes[k])) return 0;
        if (c->codec == CODEC_ZSTD) {
            if (literals_frame(c->bytes, c->len, NULL, n, w->dt, 0)) {
                if (!literals_frame(c->bytes, c->len, into, n, w->dt, 1)) return 0;
            } else {
                if (ZSTD_getFrameContentSize(c->bytes, c->len) != n) return 0;
                if (!w->dctx && !(w->dctx = ZSTD_createDCtx())) return 0;
                if (ZSTD_decompressDCtx(w->dctx, into, n, c->bytes, c->len) != n) return 0;
            }
        } else if (c->codec == CODEC_BITPACK) {
            int bits[8], count = varying_list(c->bytes[0], bits);
            unpack_rows(c->bytes + 2, (n + 7) / 8, bits, count, c->bytes[1], into, n);
        } else if (c->codec == CODEC_HUFF1) {
            if (!decode_groups(w)) return 0;
            if (!order1_usable(c->bytes, c->len, n, w->dt) ||
                !order1_decode(c->bytes, c->len, into, n, w->groups, w->dt))
                return 0;
        } else if (c->codec == CODEC_HUFF2D) {
            if (!decode_groups(w)) return 0;
            if (!order2d_usable(c->bytes, c->len, n, w->dt) ||
                !order2d_decode(c->bytes, c->len, into, n, w->groups, w->dt))
                return 0;
        } else if (c->codec == CODEC_SIGN2D) {
            if (!decode_groups(w)) return 0;
            if (!sign2d_decode(c->bytes, c->len, into, n, w->groups, w->dt)) return 0;
        } else if (c->codec == CODEC_HUFFEXP) {
            if (k + 1 >= word || !decode_groups(w)) return 0;
            const uint8_t *ctx = huffexp_context(&planes[word - 1], w->decoded + (size_t)(word - 1) * n, n);
            if (!order1_usable(c->bytes, c->len, n, w->dt) ||
                !huffexp_decode(c->bytes, c->len, into, n, ctx, w->groups, w->dt))
                return 0;
        }
    }
    const uint8_t *bytes = planes[0].bytes;
    if (word > 1 || !bytes) {
        if (word > 1) merge_words(planes, w->merged, n, word, rotate);
        else memset(w->merged, planes[0].value, n);
        bytes = w->merged;
    }
    return CKPTZ_XXH3_64(bytes, (size_t)length) == checksum;
}

/* Whether the payloads written at `at` (chunk rows `row`, `word` of them) read back with
 * the checksums taken before they were written; 0 with *error set where reading failed. */
static int reads_back(coder_t *w, const int64_t *row, int word, int64_t at, int64_t n, int *error) {
    int64_t got = pread_fully(w->plan->checked, (char *)w->written, n, at, error);
    if (*error || got != n) return 0;
    for (int k = 0; k < word; k++, row += CC_COLS)
        if (CKPTZ_XXH3_64(w->written + (row[CC_OFFSET] - at), (size_t)row[CC_SIZE]) != (uint64_t)row[CC_CHECKSUM])
            return 0;
    return 1;
}

/* ---------------------------------------------------------------- one frame */

/* Moves past the first `put` bytes of iov, which a short write took. */
static void skip_written(struct iovec **iov, int *count, size_t put) {
    while (*count > 0 && put >= (*iov)->iov_len) {
        put -= (*iov)->iov_len;
        (*iov)++;
        (*count)--;
    }
    if (*count > 0) {
        (*iov)->iov_base = (uint8_t *)(*iov)->iov_base + put;
        (*iov)->iov_len -= put;
    }
}

static int pwritev_fully(int fd, struct iovec *iov, int count, int64_t at) {
    int64_t total = 0;
    for (int k = 0; k < count; k++) total += (int64_t)iov[k].iov_len;
    int64_t first = at;
    while (count > 0) {
        ssize_t put = pwritev(fd, iov, count, (off_t)at);
        if (put < 0 && errno == EINTR) continue;
        if (put < 0) return errno;
        if (put == 0) return EIO;
        at += put;
        skip_written(&iov, &count, (size_t)put);
    }
#ifdef POSIX_FADV_DONTNEED
    if (total >= PLANE_WRITEBACK_MIN) posix_fadvise(fd, (off_t)first, (off_t)total, POSIX_FADV_DONTNEED);
#endif
    return 0;
}

/* Writes iov in order where the descriptor stands (a pipe): 0, or the errno. */
static int writev_fully(int fd, struct iovec *iov, int count) {
    while (count > 0) {
        ssize_t put = writev(fd, iov, count);
        if (put < 0 && errno == EINTR) continue;
        if (put < 0) return errno;
        if (put == 0) return EIO;
        skip_written(&iov, &count, (size_t)put);
    }
    return 0;
}

/* Copies n bytes of the source from file offset `at` out of its memory regions (which
 * compress_check proved tile the file). */
static void memory_read(const compress_plan_t *p, uint8_t *dst, int64_t n, int64_t at) {
    for (int64_t r = row_at_or_before(p->memory, p->memory_count, MR_COLS, at); n > 0; r++) {
        const int64_t *region = p->memory + r * MR_COLS;
        int64_t within = at - region[MR_AT], take = region[MR_SIZE] - within;
        if (take > n) take = n;
        memcpy(dst, (const uint8_t *)(uintptr_t)region[MR_ADDRESS] + within, (size_t)take);
        dst += take;
        at += take;
        n -= take;
    }
}

static const uint8_t zero_padding[PLANE_ALIGN];

/* Reads frame i's pieces into raw, takes its checksum (into the frame table) and hashes the
 * digest's leaves; a frame a series delta touches (with `delta`, the thread's room for it)
 * has its leaves hashed from the bytes read, then the delta applied, and its checksum taken
 * of the bytes it is coded as, as the Python pipeline records it. 1 if it went through, else
 * 0 with the failure recorded. */
static int read_frame(compress_plan_t *p, int64_t i, uint8_t *raw, struct delta_scratch *delta, stage_clock_t *clock) {
    int64_t *f = p->frames + i * FR_COLS;
    const int64_t *pc = p->leaves.pieces + f[FR_PIECE] * PC_COLS;
    for (int64_t j = 0; j < f[FR_PIECES]; j++) {
        const int64_t *piece = pc + j * PC_COLS;
        if (p->memory_count) {
            memory_read(p, raw + piece[PC_WITHIN], piece[PC_SIZE], piece[PC_AT]);
            continue;
        }
        int error = 0;
        int64_t got = pread_fully(p->source, (char *)raw + piece[PC_WITHIN], piece[PC_SIZE], piece[PC_AT], &error);
        if (error) return compress_fail(p, PLANE_READ, i, error), 0;
        if (got != piece[PC_SIZE]) return compress_fail(p, PLANE_SHORT, i, 0), 0;
    }
    stage_mark(clock, CS_READ);
    int fused = 0, changed = p->leaves.delta && delta_touches(p->leaves.delta, pc, f[FR_PIECES]);
    if (!changed) f[FR_CHECKSUM] = (int64_t)plane_frame_hash(&p->leaves, f, raw, &fused);
    for (int64_t j = 0; j < f[FR_PIECES]; j++) {
        const int64_t *piece = pc + j * PC_COLS;
        if (!plane_leaves(&p->leaves, raw + piece[PC_WITHIN], piece[PC_AT], piece[PC_SIZE], fused))
            return compress_fail(p, PLANE_NOMEM, i, 0), 0;
    }
    stage_mark(clock, CS_HASH);
    if (changed) {
        int64_t detail = 0;
        int kind = delta_apply(delta, pc, f[FR_PIECES], f[FR_LENGTH], raw, 1, &detail);
        stage_mark(clock, CS_DELTA);
        if (kind != PLANE_OK) return compress_fail(p, kind, i, detail), 0;
        f[FR_CHECKSUM] = (int64_t)CKPTZ_XXH3_64(raw, (size_t)f[FR_LENGTH]);
        stage_mark(clock, CS_HASH);
    }
    return 1;
}

/* A frame's planes and what the coder's choice reads of each. */
typedef struct {
    const uint8_t *planes[8];
    uint8_t ones[8], any[8]; /* the AND and the OR of each plane's bytes */
    double bits[8], zeros[8]; /* sampled order-0 entropy and share of zeros (with `sampled`) */
    size_t n;                 /* bytes per plane */
} split_t;

/* Splits frame f's words in raw into planes at into + k * stride (a frame of single bytes is
 * its own plane: raw itself), with each plane's AND and OR and, where `sampled`, the
 * statistics of ckptz/codecs/frames.py's sample. */
static void split_frame(const compress_plan_t *p, const int64_t *f, const uint8_t *raw, uint8_t *into, size_t stride,
                        int sampled, split_t *s) {
    int word = (int)f[FR_WORD];
    size_t n = s->n = (size_t)f[FR_LENGTH] / (size_t)word, sample = (size_t)p->rules[RULE_SAMPLE];
    if (word == 1) {
        s->planes[0] = raw;
        s->bits[0] = s->zeros[0] = 0;
        if (n) plane_stats(raw, n, sample, &s->ones[0], &s->any[0], &s->bits[0], &s->zeros[0]);
        return;
    }
    uint8_t *to[8] = {NULL};
    uint64_t and_word = 0, or_word = 0;
    for (int k = 0; k < word; k++) s->planes[k] = to[k] = into + (size_t)k * stride;
    split_words(raw, to, n, word, (int)(f[FR_ROTATE] & ROTATE_FLOAT), &and_word, &or_word);
    for (int k = 0; k < word; k++) {
        s->bits[k] = s->zeros[k] = 0;
        if (sampled) sample_stats(s->planes[k], n, sample, &s->bits[k], &s->zeros[k]);
        s->ones[k] = (uint8_t)(and_word >> (8 * k));
        s->any[k] = (uint8_t)(or_word >> (8 * k));
    }
}

/* Codes frame i's planes by frames.py's rules into payloads (candidates made at out +
 * k * plane_room(n)): 1, or 0 with the failure recorded. */
static int code_planes(coder_t *w, int64_t i, const split_t *s, uint8_t *out, payload_t *payloads) {
    const int64_t *f = w->plan->frames + i * FR_COLS;
    int word = (int)f[FR_WORD], is_float = (int)(f[FR_ROTATE] & ROTATE_FLOAT);
    int context = f[FR_ROTATE] & ROTATE_CONTEXT ? CONTEXT_ALWAYS
                  : f[FR_ROTATE] & ROTATE_MEASURED ? CONTEXT_MEASURED
                                                    : CONTEXT_NONE;
    size_t n = s->n, room = plane_room(n);
    for (int k = 0; k < word; k++) {
        int64_t error = 0;
        if (!n) {
            payloads[k] = (payload_t){CODEC_RAW, s->planes[k], 0};
        } else if (!plane_code(w, s->planes[k], n, is_float && k == word - 1, context, s->bits[k], s->zeros[k],
                               s->ones[k], s->any[k], out + (size_t)k * room, &payloads[k], &error)) {
            return compress_fail(w->plan, PLANE_CODER, i, error), 0;
        } else if (is_float && k == 0 && context != CONTEXT_NONE) {
            plane_code_signs(w, s->planes[k], n, context, out + (size_t)k * room, &payloads[k]);
        }
    }
    if (is_float && word >= 2 && n && context == CONTEXT_ALWAYS)
        plane_code_mantissas(w, s->planes[word - 2], s->planes[word - 1], n, out + (size_t)(word - 2) * room,
                             &payloads[word - 2]);
    return 1;
}

/* Fills frame f's rows of the chunk table but their offsets: sizes, checksums, bitstreams. */
static void chunk_rows(compress_plan_t *p, const int64_t *f, const payload_t *payloads, size_t n) {
    int64_t *row = p->chunks + f[FR_CHUNK] * CC_COLS;
    for (int k = 0; k < (int)f[FR_WORD]; k++, row += CC_COLS) {
        row[CC_SIZE] = (int64_t)payloads[k].len;
        row[CC_RAW] = (int64_t)n;
        row[CC_CHECKSUM] = (int64_t)CKPTZ_XXH3_64(payloads[k].bytes, payloads[k].len);
        row[CC_CODEC] = payloads[k].codec;
        row[CC_PLANE] = k;
    }
}

/* Bytes a frame's payloads take in the data area, each padded to the alignment. */
static int64_t payload_bytes(const payload_t *payloads, int word) {
    int64_t need = 0;
    for (int k = 0; k < word; k++) need += (int64_t)payloads[k].len + (-(int64_t)payloads[k].len & (PLANE_ALIGN - 1));
    return need;
}

/* Codes frame i into `held`: 1 if it went through, else 0 with the failure recorded. */
static int code_frame(coder_t *w, held_t *held, int64_t i) {
    compress_plan_t *p = w->plan;
    const int64_t *f = p->frames + i * FR_COLS;
    int word = (int)f[FR_WORD];
    /* Single bytes are their own plane: read where the planes go. */
    uint8_t *raw = word == 1 ? held->planes : w->raw;
    if (!read_frame(p, i, raw, w->delta, &w->clock)) return 0;
    split_t s;
    size_t n = (size_t)f[FR_LENGTH] / (size_t)word;
    split_frame(p, f, raw, held->planes, n, 1, &s);
    stage_mark(&w->clock, CS_SPLIT);
    int coded = code_planes(w, i, &s, held->out, held->payloads);
    stage_mark(&w->clock, CS_CODE);
    if (!coded) return 0;
    held->need = payload_bytes(held->payloads, word);
    if (p->verify) {
        int back = decodes_back(w, held->payloads, word, (int)(f[FR_ROTATE] & ROTATE_FLOAT), n, f[FR_LENGTH],
                                (uint64_t)f[FR_CHECKSUM], NULL);
        stage_mark(&w->clock, CS_VERIFY);
        if (!back) return compress_fail(p, PLANE_FRAME, i, 0), 0;
    }
    chunk_rows(p, f, held->payloads, n);
    stage_mark(&w->clock, CS_CHECKSUM);
    held->frame = i;
    return 1;
}

/* Writes a placed frame's payloads (and reads them back, with verify): PLANE_OK if it went
 * through, else the failure's kind (*detail: its errno), for the caller to record once it
 * holds no lock. */
static int write_frame_payloads(coder_t *w, const held_t *held, int64_t *detail) {
    compress_plan_t *p = w->plan;
    const int64_t *f = p->frames + held->frame * FR_COLS;
    int word = (int)f[FR_WORD];
    struct iovec iov[16];
    int count = 0;
    int64_t *row = p->chunks + f[FR_CHUNK] * CC_COLS;
    for (int64_t k = 0, pos = held->at; k < word; k++, row += CC_COLS) {
        size_t len = held->payloads[k].len, pad = -len & (PLANE_ALIGN - 1);
        row[CC_OFFSET] = pos;
        pos += (int64_t)(len + pad);
        if (len) iov[count++] = (struct iovec){(void *)held->payloads[k].bytes, len};
        if (pad) iov[count++] = (struct iovec){(void *)zero_padding, pad};
    }
    if (p->output >= 0 && count) {
        int error = p->in_order ? writev_fully(p->output, iov, count) : pwritev_fully(p->output, iov, count, held->at);
        stage_mark(&w->clock, CS_WRITE);
        if (error) return *detail = error, PLANE_WRITE;
    }
    if (p->checked >= 0 && held->need) {
        int error = 0;
        int back = reads_back(w, p->chunks + f[FR_CHUNK] * CC_COLS, word, held->at, held->need, &error);
        stage_mark(&w->clock, CS_VERIFY);
        if (!back) return *detail = error, error ? PLANE_CHECK_READ : PLANE_PAYLOAD;
    }
    __atomic_add_fetch(p->progress, f[FR_LENGTH], __ATOMIC_RELAXED);
    return PLANE_OK;
}

/* A free set of frame buffers (waits for one), or NULL once the run failed. */
static held_t *take_held(compress_plan_t *p) {
    held_t *held = NULL;
    pthread_mutex_lock(&p->order_lock);
    while (!p->free_count && !__atomic_load_n(&p->failed, __ATOMIC_ACQUIRE))
        pthread_cond_wait(&p->order_turn, &p->order_lock);
    if (p->free_count && !__atomic_load_n(&p->failed, __ATOMIC_ACQUIRE)) held = p->free_held[--p->free_count];
    pthread_mutex_unlock(&p->order_lock);
    return held;
}

static void give_held(compress_plan_t *p, held_t **held, int count) {
    pthread_mutex_lock(&p->order_lock);
    for (int k = 0; k < count; k++) p->free_held[p->free_count++] = held[k];
    pthread_cond_broadcast(&p->order_turn);
    pthread_mutex_unlock(&p->order_lock);
}

/* Each thread takes a free set of buffers, then the next frame, and codes it. Payloads are
 * placed in frame order: a coded frame whose predecessors are not all placed waits in its
 * set, and the thread goes on with another; the thread that places a frame places every
 * waiting successor with it and writes them. The sets bound the frames held at once. */
static void *compress_work(void *arg) {
    coder_t *w = arg;
    compress_plan_t *p = w->plan;
    stage_begin(&w->clock);
    for (;;) {
        if (__atomic_load_n(&p->failed, __ATOMIC_ACQUIRE)) break;
        if (*p->stop) {
            compress_fail(p, PLANE_STOPPED, -1, 0);
            break;
        }
        stage_mark(&w->clock, CS_OTHER);
        held_t *held = take_held(p);
        stage_mark(&w->clock, CS_WAIT_BUFFERS);
        if (!held) break;
        int64_t i = __atomic_fetch_add(&p->next, 1, __ATOMIC_RELAXED);
        if (i >= p->leaves.frame_count || !code_frame(w, held, i)) {
            give_held(p, &held, 1);
            break;
        }
        int count = 0;
        pthread_mutex_lock(&p->order_lock);
        p->waiting[i % p->held_count] = held;
        while (p->placed < p->leaves.frame_count) {
            held_t *next = p->waiting[p->placed % p->held_count];
            if (!next || next->frame != p->placed) break;
            p->waiting[p->placed % p->held_count] = NULL;
            next->at = p->end;
            p->end += next->need;
            p->placed++;
            w->placing[count++] = next;
        }
        /* A pipe takes the payloads in their order: they are written before the next
         * frames can be placed. */
        int kind = PLANE_OK, k = 0;
        int64_t detail = 0;
        stage_mark(&w->clock, CS_WAIT_ORDER);
        if (p->in_order)
            for (; kind == PLANE_OK && k < count; k++) kind = write_frame_payloads(w, w->placing[k], &detail);
        pthread_mutex_unlock(&p->order_lock);
        if (!p->in_order)
            for (; kind == PLANE_OK && k < count; k++) kind = write_frame_payloads(w, w->placing[k], &detail);
        stage_mark(&w->clock, CS_OTHER);
        if (kind != PLANE_OK) compress_fail(p, kind, w->placing[k - 1]->frame, detail);
        if (count) give_held(p, w->placing, count);
        stage_mark(&w->clock, CS_WAIT_ORDER);
        if (kind != PLANE_OK) break;
    }
    stage_end(&w->clock, CS_OTHER);
    return NULL;
}

static int coder_init(coder_t *w, compress_plan_t *p) {
    memset(w, 0, sizeof *w);
    w->plan = p;
    w->raw = plane_buffer(p->frame_room);
    w->spare = plane_buffer(p->spare_room);
    w->placing = malloc((size_t)p->held_count * sizeof(held_t *));
    if (p->verify) {
        w->decoded = malloc(p->frame_room ? p->frame_room : 1);
        w->merged = malloc(p->frame_room ? p->frame_room : 1);
        w->dt = malloc(sizeof(dtable_t));
        if (!w->decoded || !w->merged || !w->dt) return 0;
    }
    if (p->checked >= 0 && !(w->written = malloc(p->out_room + 8 * PLANE_ALIGN))) return 0;
    if (p->leaves.delta && !(w->delta = delta_scratch_new(p->leaves.delta, p->frame_room))) return 0;
    return w->raw && w->spare && w->placing;
}

static void coder_free(coder_t *w) {
    plane_buffer_free(w->raw, w->plan->frame_room);
    plane_buffer_free(w->spare, w->plan->spare_room);
    free(w->placing);
    free(w->decoded);
    free(w->merged);
    free(w->written);
    free(w->groups);
    free(w->dt);
    ZSTD_freeDCtx(w->dctx);
    ZSTD_freeCCtx(w->level);
    ZSTD_freeCCtx(w->literal);
    delta_scratch_free(w->delta);
}

/* Checks the plan against its own tables and the file's size before any thread starts;
 * NULL if it holds, else what is wrong. Sets the per-thread buffer sizes. */
static const char *compress_check(compress_plan_t *p) {
    const int64_t limit = (int64_t)1 << 40;
    restore_plan_t *l = &p->leaves;
    if (l->source_size < 0 || l->leaf < 0 || (l->leaf && l->leaf_count != (l->source_size + l->leaf - 1) / l->leaf))
        return "leaf table does not match the file's size";
    if (p->level < -(1 << 17) || p->level > 22) return "zstd level out of range";
    if (p->in_order && p->checked >= 0) return "a pipe cannot be read back";
    if (p->gpu && p->gpu_batch < 1) return "GPU batch size out of range";
    if (p->gpu && l->delta) return "series deltas are coded on the CPU";
    if (p->gpu && p->gpu_codec == CODEC_ZSTD && !p->gpu_kernels) return "the portable bitstream needs the kernels";
    if (!(p->rules[RULE_BLOCK] >= 1 && p->rules[RULE_BLOCK] <= (double)(1 << 30))) return "block size out of range";
    for (int64_t r = 0, at = 0; r < p->memory_count; r++) {
        const int64_t *region = p->memory + r * MR_COLS;
        if (region[MR_AT] != at || region[MR_SIZE] <= 0 || !region[MR_ADDRESS]) return "memory regions do not tile the file";
        at += region[MR_SIZE];
        if (r + 1 == p->memory_count && at != l->source_size) return "memory regions do not tile the file";
    }
    if (p->memory_count ? p->source >= 0 : p->source < 0) return "neither a descriptor nor memory to read";
    if (!(p->rules[RULE_SAMPLE] >= 1 && p->rules[RULE_SAMPLE] <= (double)(1 << 30))) return "sample size out of range";
    int64_t chunk = 0;
    p->spare_room = p->out_room = 1;
    for (int64_t i = 0; i < l->frame_count; i++) {
        const int64_t *f = p->frames + i * FR_COLS;
        int64_t word = f[FR_WORD], length = f[FR_LENGTH];
        if ((word != 1 && word != 2 && word != 4 && word != 8) || f[FR_ROTATE] < 0 ||
            (f[FR_ROTATE] & ~(int64_t)(ROTATE_FLOAT | ROTATE_CONTEXT | ROTATE_MEASURED | (p->gpu ? ROTATE_GPU : 0))))
            return "frame of an unknown word size";
        if ((f[FR_ROTATE] & ROTATE_GPU) && p->gpu_codec != CODEC_ZSTD && length / word > GPU_LARGEST_PLANE)
            return "plane too large for nvCOMP ANS";
        if (f[FR_CHUNK] != chunk || chunk > l->chunk_count - word) return "frame's chunks out of order";
        chunk += word;
        if (length < 0 || length > limit || length % word) return "frame length out of range";
        if (f[FR_PIECE] < 0 || f[FR_PIECES] < 0 || f[FR_PIECE] > l->piece_count - f[FR_PIECES])
            return "frame's pieces outside the piece table";
        int64_t covered = 0;
        for (int64_t j = 0; j < f[FR_PIECES]; j++) {
            const int64_t *pc = l->pieces + (f[FR_PIECE] + j) * PC_COLS;
            if (pc[PC_AT] < 0 || pc[PC_SIZE] < 0 || pc[PC_WITHIN] < 0 || pc[PC_SIZE] > length ||
                pc[PC_WITHIN] > length - pc[PC_SIZE] || pc[PC_AT] > l->source_size - pc[PC_SIZE])
                return "piece outside its frame or the file";
            covered += pc[PC_SIZE];
        }
        if (covered != length) return "pieces do not tile their frame";
        size_t room = plane_room((size_t)(length / word));
        if ((size_t)length > p->frame_room) p->frame_room = (size_t)length;
        if (room * (size_t)word > p->out_room) p->out_room = room * (size_t)word;
        if (room > p->spare_room) p->spare_room = room;
    }
    if (chunk != l->chunk_count) return "chunk table does not match the frames";
    return NULL;
}

/* Runs a GPU's plan on the coders' threads and the GPU's workers (compress_gpu.c). */
static void compress_gpu_run(compress_plan_t *p, coder_t *coders, int threads);

/* Runs the plan on `threads` threads (this one among them); the failure kind, or PLANE_OK. */
static int compress_run(compress_plan_t *p, int threads) {
    int result = PLANE_NOMEM;
    restore_plan_t *l = &p->leaves;
    coder_t *coders = calloc((size_t)threads, sizeof(coder_t));
    pthread_t *ids = calloc((size_t)threads, sizeof(pthread_t));
    int started = 0, ready = 0;
    if (!leaf_streams_init(l) || !coders || !ids) goto done;
    /* Half as many sets again as threads: a slow frame holds back the placing of those
     * after it, and the others code on meanwhile. */
    p->held_count = p->gpu ? 0 : threads + threads / 2 + 1;
    p->held = calloc((size_t)p->held_count + 1, sizeof(held_t));
    p->free_held = malloc(((size_t)p->held_count + 1) * sizeof(held_t *));
    p->waiting = calloc((size_t)p->held_count + 1, sizeof(held_t *));
    if (!p->held || !p->free_held || !p->waiting) goto done;
    for (; p->free_count < p->held_count; p->free_count++) {
        held_t *h = &p->held[p->free_count];
        h->frame = -1;
        h->planes = plane_buffer(p->frame_room);
        h->out = plane_buffer(p->out_room);
        if (!h->planes || !h->out) goto done;
        p->free_held[p->free_count] = h;
    }
    for (; ready < threads; ready++)
        if (!coder_init(&coders[ready], p)) {
            ready++;
            goto done;
        }
    if (p->gpu) {
        compress_gpu_run(p, coders, threads);
    } else {
        for (int t = 1; t < threads; t++, started++)
            if (pthread_create(&ids[t], NULL, compress_work, &coders[t])) break;
        compress_work(&coders[0]);
        for (int t = 1; t <= started; t++) pthread_join(ids[t], NULL);
        for (int t = 0; t <= started; t++)
            stage_report(&coders[t].clock, STAGE_ROLE_CPU, p->stages, p->stage_rows, t);
    }
    result = p->failed ? (int)p->error[0] : PLANE_OK;
done:
    for (int t = 0; t < ready; t++) coder_free(&coders[t]);
    for (int k = 0; p->held && k < p->held_count; k++) {
        plane_buffer_free(p->held[k].planes, p->frame_room);
        plane_buffer_free(p->held[k].out, p->out_room);
    }
    free(p->held);
    free(p->free_held);
    free(p->waiting);
    leaf_streams_free(l);
    free(coders);
    free(ids);
    return result;
}
