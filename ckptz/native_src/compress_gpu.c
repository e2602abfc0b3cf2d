/*
 * The compress plane with a GPU (compress_plane.c's plan, where plan->gpu is set): the
 * planes of frames marked ROTATE_GPU are coded on the GPU in batches (gpu_engine.c), by
 * nvCOMP ANS or as the portable bitstream; every other step is the CPU plane's, on the same
 * threads.
 *
 * The frames are cut into batches of consecutive frames of about gpu_batch bytes. A batch
 * lives in a slot: pinned memory for its planes and for what the GPU codes. The plane's
 * threads read a batch's frames, take their checksums and leaves, and split them into the
 * slot's planes: a constant plane becomes `const`, one that looks like noise by the GPU
 * coder's sample is stored raw, and the frames of components the GPU leaves to the CPU
 * (metadata) are coded there and then by the CPU coder. A GPU worker thread then codes the
 * rest of the batch in one call and keeps each payload smaller than its plane. For the
 * portable bitstream the threads also count each plane's bytes and plan its literal-only
 * zstd frame (or bit pack) as they read it (literals_plan.c), so its size is known there
 * and the GPU's kernels only write the bits (ckptz/engines/gpu/literals.py's steps, with
 * the counting and planning moved to the threads that read). Batches are
 * placed in the data area in order as soon as their sizes are known; then the threads fill
 * each frame's chunk rows (the payloads' checksums), and the thread that finishes a batch's
 * last frame writes the batch at its place (to a pipe, once the batches before it are
 * written), so the other threads go on reading while writes to the one file take turns.
 * With verify, the GPU decodes back what nvCOMP ANS coded, and the threads merge each frame
 * from its payloads (decoding the others as the CPU plane does) and check its checksum
 * before writing, then read the payloads back once written.
 * Threads finish frames before they read new ones, which frees slots soonest. The choices
 * are the Python GPU engine's (ckptz/engines/gpu/coder.py), so the containers are the same.
 */
#include "native.h"

#include <pthread.h>
#include <stdio.h>

enum { CG_FREE, CG_READING, CG_READ, CG_CODING, CG_CODED, CG_PLACED, CG_WRITING };

#define CG_WHY 240
#define CG_PENDING (-1) /* a chunk's codec until the GPU has coded it */
/* The GPU coder's sample of a plane: every CG_SAMPLE_EVERY-th full block of CG_SAMPLE_BLOCK
 * bytes (ckptz/engines/gpu/transform.py's SAMPLE_BLOCK and SAMPLE_EVERY). */
#define CG_SAMPLE_BLOCK 4096
#define CG_SAMPLE_EVERY 8
/* Input bytes per zstd block of the portable bitstream on the GPU (literals.py's BLOCK). */
#define CG_LITERAL_BLOCK (64 << 10)

typedef struct {
    int64_t batch; /* the batch it holds */
    int state;
    int64_t next, done;     /* frames of the batch taken and done in this state */
    uint8_t *planes, *coded; /* pinned: the batch's planes, and what the GPU coded */
    uint8_t *decoded;        /* pinned, with verify: what the GPU decoded back (planes' places) */
    uint8_t *cpu;           /* candidates of the frames the CPU codes */
    size_t planes_size, coded_size, decoded_size;
    /* The portable bitstream's plans: rows, tables and head bytes, room for each block. */
    int64_t *plan;
    uint32_t (*tables)[256];
    uint8_t *blob;
} cg_slot_t;

typedef struct {
    compress_plan_t *p;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    cg_slot_t slots[2 * GPU_MAX_WORKERS];
    int slot_count;
    int64_t batch_count, next_batch, coded_batches, placed_batches, finished;
    int64_t written_batches; /* batches written (to a pipe, in their order) */
    int64_t *batch_first; /* per batch: its first frame; then the frame count */
    /* Per batch: bytes of each region of its slot, and the chunks the GPU may code. */
    int64_t *batch_planes, *batch_coded, *batch_cpu, *batch_chunks;
    int64_t *plane_at, *coded_at; /* per chunk: its plane's place in `planes`, its payload's in `coded` */
    int64_t *cpu_at;              /* per frame: its candidates' place in `cpu` (-1: the GPU codes it) */
    payload_t *payloads;          /* per chunk: what is written */
    int64_t *need, *at;           /* per frame: bytes of its payloads, and their place */
    int64_t largest_chunks;       /* most chunks the GPU may code in a batch */
    /* The portable bitstream: per chunk, its first block in its batch's plan, the rows its
     * plan has, and its bit pack (-1: none); per batch, its blocks. */
    int portable;
    int64_t *block_at, *rows, *packs, *batch_blocks;
    int64_t largest_blocks, largest_plane;
} cg_plane_t;

typedef struct {
    cg_plane_t *g;
    coder_t *w;           /* a CPU thread's */
    uint16_t *counts;     /* a CPU thread's: the byte counts of a plane's blocks' quarters */
    gpu_engine_t *engine; /* a GPU worker's */
    stage_clock_t clock;  /* a GPU worker's (a CPU thread's is its coder's) */
} cg_thread_t;

static int64_t cg_aligned(int64_t n) { return n + (-n & (PLANE_ALIGN - 1)); }

/* Whether a plane looks like noise by the GPU coder's sample (coder.py's _noise_rows): near
 * 8 bits of order-0 entropy and few zeros. A plane with no full sampled block is not. */
static int cg_noise(const uint8_t *plane, size_t n, const double *rule) {
    uint32_t hist[256];
    memset(hist, 0, sizeof hist);
    size_t full = n / CG_SAMPLE_BLOCK;
    for (size_t b = 0; b < full; b += CG_SAMPLE_EVERY) {
        const uint8_t *block = plane + b * CG_SAMPLE_BLOCK;
        for (size_t j = 0; j < CG_SAMPLE_BLOCK; j++) hist[block[j]]++;
    }
    double total = 0, weighted = 0;
    for (int v = 0; v < 256; v++)
        if (hist[v]) total += hist[v], weighted += hist[v] * log2((double)hist[v]);
    if (total == 0) return 0;
    double bits = log2(total) - weighted / total;
    return bits > rule[RULE_NOISE_BITS] && hist[0] <= rule[RULE_NOISE_ZEROS] * total;
}

/* Cuts the frames into batches and lays out each batch's slot; 0 where memory runs out or
 * nvCOMP cannot bound a payload (why set). */
static int cg_plan_batches(cg_plane_t *g, char *why, size_t room) {
    compress_plan_t *p = g->p;
    int64_t n = p->leaves.frame_count, chunks = p->leaves.chunk_count;
    size_t rows = (size_t)(n + 1) * sizeof(int64_t);
    g->batch_first = malloc(rows);
    g->batch_planes = calloc((size_t)n + 1, sizeof(int64_t));
    g->batch_coded = calloc((size_t)n + 1, sizeof(int64_t));
    g->batch_cpu = calloc((size_t)n + 1, sizeof(int64_t));
    g->batch_chunks = calloc((size_t)n + 1, sizeof(int64_t));
    g->cpu_at = malloc(rows);
    g->need = calloc((size_t)n + 1, sizeof(int64_t));
    g->at = calloc((size_t)n + 1, sizeof(int64_t));
    g->plane_at = malloc(((size_t)chunks + 1) * sizeof(int64_t));
    g->coded_at = malloc(((size_t)chunks + 1) * sizeof(int64_t));
    g->payloads = calloc((size_t)chunks + 1, sizeof(payload_t));
    g->block_at = calloc((size_t)chunks + 1, sizeof(int64_t));
    g->rows = calloc((size_t)chunks + 1, sizeof(int64_t));
    g->packs = calloc((size_t)chunks + 1, sizeof(int64_t));
    g->batch_blocks = calloc((size_t)n + 1, sizeof(int64_t));
    if (!g->batch_first || !g->batch_planes || !g->batch_coded || !g->batch_cpu || !g->batch_chunks || !g->cpu_at ||
        !g->need || !g->at || !g->plane_at || !g->coded_at || !g->payloads || !g->block_at || !g->rows || !g->packs ||
        !g->batch_blocks)
        return snprintf(why, room, "no memory for the batches' tables"), 0;
    int64_t b = -1, bound_size = -1, bound = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t *f = p->frames + i * FR_COLS;
        int64_t word = f[FR_WORD], plane = f[FR_LENGTH] / word, stride = cg_aligned(plane);
        int gpu = (f[FR_ROTATE] & ROTATE_GPU) != 0;
        int64_t planes = word * stride, coded = 0, cpu = gpu ? 0 : word * (int64_t)plane_room((size_t)plane);
        int64_t blocks = g->portable ? (plane + CG_LITERAL_BLOCK - 1) / CG_LITERAL_BLOCK : 0;
        if (gpu && plane) {
            /* A literal frame larger than its plane is never kept (literals.py's max_frame_size). */
            if (g->portable) bound = cg_aligned(plane + 32);
            else if (plane != bound_size && !(bound = gpu_code_bound(0, plane)))
                return snprintf(why, room, "nvCOMP cannot bound a coded plane of %lld bytes", (long long)plane), 0;
            bound_size = plane;
            coded = word * bound;
            if (plane > g->largest_plane) g->largest_plane = plane;
        }
        if (b < 0 || (i > g->batch_first[b] && (g->batch_planes[b] + planes > p->gpu_batch ||
                                                 g->batch_coded[b] + coded > p->gpu_batch + p->gpu_batch / 2)))
            g->batch_first[++b] = i;
        g->cpu_at[i] = gpu ? -1 : g->batch_cpu[b];
        for (int64_t k = 0; k < word; k++) {
            int64_t c = f[FR_CHUNK] + k;
            g->plane_at[c] = g->batch_planes[b] + k * stride;
            g->coded_at[c] = gpu && plane ? g->batch_coded[b] + k * bound : -1;
            if (gpu && plane) {
                g->block_at[c] = g->batch_blocks[b];
                g->batch_blocks[b] += blocks;
            }
        }
        if (g->batch_blocks[b] > g->largest_blocks) g->largest_blocks = g->batch_blocks[b];
        g->batch_planes[b] += planes;
        g->batch_coded[b] += coded;
        g->batch_cpu[b] += cpu;
        if (gpu && plane) g->batch_chunks[b] += word;
        if (g->batch_chunks[b] > g->largest_chunks) g->largest_chunks = g->batch_chunks[b];
    }
    g->batch_count = b + 1;
    g->batch_first[b + 1] = n;
    return 1;
}

static int64_t cg_frames(const cg_plane_t *g, int64_t b) { return g->batch_first[b + 1] - g->batch_first[b]; }

static void cg_wait(cg_plane_t *g) { plane_timed_wait(&g->changed, &g->lock); }

/* The slot in `state` holding the earliest batch with a frame left to take (or any, with
 * untaken 0), or NULL. */
static cg_slot_t *cg_slot_in(cg_plane_t *g, int state, int untaken) {
    cg_slot_t *best = NULL;
    for (int s = 0; s < g->slot_count; s++) {
        cg_slot_t *slot = &g->slots[s];
        if (slot->state != state || (untaken && slot->next >= cg_frames(g, slot->batch))) continue;
        if (!best || slot->batch < best->batch) best = slot;
    }
    return best;
}

/* Plans chunk c's portable payload from its plane (n bytes) as literals.py's encode does: the
 * byte counts of each block's quarters, then literals_plan.c's choice. A chunk the GPU is to
 * write gets its bitstream and size now (CG_PENDING marks it for the GPU), with its plan's
 * rows numbered into the slot's tables and head bytes; any other is stored raw. */
static void cg_plan_literals(cg_thread_t *t, cg_slot_t *slot, int64_t c, const uint8_t *plane, size_t n,
                             payload_t *payload) {
    cg_plane_t *g = t->g;
    int64_t size = (int64_t)n, blocks = (size + CG_LITERAL_BLOCK - 1) / CG_LITERAL_BLOCK;
    uint16_t(*counts)[256] = (uint16_t(*)[256])t->counts;
    memset(counts, 0, (size_t)blocks * 4 * 256 * sizeof(uint16_t));
    for (int64_t b = 0; b < blocks; b++) {
        int64_t m = size - b * CG_LITERAL_BLOCK < CG_LITERAL_BLOCK ? size - b * CG_LITERAL_BLOCK : CG_LITERAL_BLOCK;
        int64_t seg = (m + 3) / 4;
        const uint8_t *block = plane + b * CG_LITERAL_BLOCK;
        for (int k = 0; k < 4; k++) {
            int64_t lo = k * seg < m ? k * seg : m, hi = k < 3 ? ((k + 1) * seg < m ? (k + 1) * seg : m) : m;
            uint16_t *q = counts[b * 4 + k];
            for (int64_t j = lo; j < hi; j++) q[block[j]]++;
        }
    }
    int64_t first = g->block_at[c], src = g->plane_at[c], dst = g->coded_at[c], cap = cg_aligned(size + 32);
    int64_t got = -1, pack = -1, tables = 0, used = 0;
    int64_t *rows = slot->plan + first * GPU_PLAN_FIELDS;
    g->rows[c] = plan_literals((const uint16_t(*)[256])counts, &size, &src, &dst, &cap, 1, CG_LITERAL_BLOCK, &got,
                               &pack, rows, slot->tables + first, &tables, slot->blob + first * LP_HEAD_MAX, &used);
    for (int64_t r = 0; r < g->rows[c]; r++) {
        rows[r * GPU_PLAN_FIELDS + LP_TABLE] += first;
        rows[r * GPU_PLAN_FIELDS + LP_HEAD] += first * LP_HEAD_MAX;
    }
    g->packs[c] = pack;
    if (got >= 0 && got < size)
        *payload = (payload_t){CG_PENDING, slot->coded + dst, (size_t)got};
    else
        *payload = (payload_t){CODEC_RAW, plane, n};
}

/* Reads frame i into its slot and decides every plane but those the GPU is to code. */
static int cg_read_frame(cg_thread_t *t, cg_slot_t *slot, int64_t i) {
    cg_plane_t *g = t->g;
    coder_t *w = t->w;
    compress_plan_t *p = g->p;
    const int64_t *f = p->frames + i * FR_COLS;
    int word = (int)f[FR_WORD];
    size_t n = (size_t)f[FR_LENGTH] / (size_t)word;
    uint8_t *base = slot->planes + g->plane_at[f[FR_CHUNK]];
    uint8_t *raw = word == 1 ? base : w->raw;
    if (!read_frame(p, i, raw, NULL, &w->clock)) return 0;
    int gpu = (f[FR_ROTATE] & ROTATE_GPU) != 0;
    split_t s;
    split_frame(p, f, raw, base, (size_t)cg_aligned((int64_t)n), !gpu, &s);
    stage_mark(&w->clock, CS_SPLIT);
    payload_t *payloads = g->payloads + f[FR_CHUNK];
    if (!gpu) {
        int coded = code_planes(w, i, &s, slot->cpu + g->cpu_at[i], payloads);
        stage_mark(&w->clock, CS_CODE);
        return coded;
    }
    for (int k = 0; k < word; k++) {
        if (n && s.ones[k] == s.any[k]) /* its first byte is the constant */
            payloads[k] = (payload_t){CODEC_CONST, s.planes[k], 1};
        else if (!n || cg_noise(s.planes[k], n, p->rules))
            payloads[k] = (payload_t){CODEC_RAW, s.planes[k], n};
        else if (g->portable)
            cg_plan_literals(t, slot, f[FR_CHUNK] + k, s.planes[k], n, &payloads[k]);
        else
            payloads[k] = (payload_t){CG_PENDING, s.planes[k], n};
    }
    stage_mark(&w->clock, CS_PLAN);
    return 1;
}

/* Each frame's payload bytes, once the batch's payloads are all known. */
static void cg_settle(cg_plane_t *g, const cg_slot_t *slot) {
    const compress_plan_t *p = g->p;
    for (int64_t i = g->batch_first[slot->batch]; i < g->batch_first[slot->batch + 1]; i++) {
        const int64_t *f = p->frames + i * FR_COLS;
        g->need[i] = payload_bytes(g->payloads + f[FR_CHUNK], (int)f[FR_WORD]);
    }
}

/* Places every coded batch whose predecessors are placed (under the lock). */
static void cg_place(cg_plane_t *g) {
    compress_plan_t *p = g->p;
    for (;;) {
        cg_slot_t *slot = NULL;
        for (int s = 0; s < g->slot_count && !slot; s++)
            if (g->slots[s].state == CG_CODED && g->slots[s].batch == g->placed_batches) slot = &g->slots[s];
        if (!slot) return;
        for (int64_t i = g->batch_first[slot->batch]; i < g->batch_first[slot->batch + 1]; i++) {
            g->at[i] = p->end;
            p->end += g->need[i];
        }
        slot->state = CG_PLACED;
        g->placed_batches++;
    }
}

/* Marks a slot's batch coded, its payloads' sizes settled, and places what can be placed
 * (under the lock). */
static void cg_coded(cg_plane_t *g, cg_slot_t *slot) {
    slot->state = CG_CODED;
    g->coded_batches++;
    cg_place(g);
}

/* Fills frame i's chunk rows and writes its payloads at their place (with verify, once
 * they decode back to the frame's checksum). */
static int cg_finish_frame(coder_t *w, cg_plane_t *g, cg_slot_t *slot, int64_t i) {
    compress_plan_t *p = g->p;
    const int64_t *f = p->frames + i * FR_COLS;
    int word = (int)f[FR_WORD];
    held_t held;
    memcpy(held.payloads, g->payloads + f[FR_CHUNK], (size_t)word * sizeof(payload_t));
    held.frame = i;
    held.at = g->at[i];
    held.need = g->need[i];
    size_t n = (size_t)f[FR_LENGTH] / (size_t)word;
    if (p->verify) {
        const uint8_t *decoded[8] = {NULL};
        for (int k = 0; k < word && !g->portable; k++)
            if (held.payloads[k].codec == p->gpu_codec) decoded[k] = slot->decoded + g->plane_at[f[FR_CHUNK] + k];
        int back = decodes_back(w, held.payloads, word, (int)(f[FR_ROTATE] & ROTATE_FLOAT), n, f[FR_LENGTH],
                                (uint64_t)f[FR_CHECKSUM], decoded);
        stage_mark(&w->clock, CS_VERIFY);
        if (!back) return compress_fail(p, PLANE_FRAME, i, 0), 0;
    }
    chunk_rows(p, f, held.payloads, n);
    stage_mark(&w->clock, CS_CHECKSUM);
    return 1; /* written with its batch (cg_write_batch) */
}

/* Writes a finished batch's payloads, frame after frame: 1, or 0 with the failure recorded.
 * The caller holds no lock; to a pipe, every batch before it is written. */
static int cg_write_batch(coder_t *w, cg_plane_t *g, const cg_slot_t *slot) {
    compress_plan_t *p = g->p;
    for (int64_t i = g->batch_first[slot->batch]; i < g->batch_first[slot->batch + 1]; i++) {
        const int64_t *f = p->frames + i * FR_COLS;
        held_t held;
        memcpy(held.payloads, g->payloads + f[FR_CHUNK], (size_t)f[FR_WORD] * sizeof(payload_t));
        held.frame = i;
        held.at = g->at[i];
        held.need = g->need[i];
        int64_t detail = 0;
        int kind = write_frame_payloads(w, &held, &detail);
        if (kind != PLANE_OK) return compress_fail(p, kind, i, detail), 0;
    }
    return 1;
}

static void *cg_work(void *arg) {
    cg_thread_t *t = arg;
    cg_plane_t *g = t->g;
    compress_plan_t *p = g->p;
    stage_clock_t *clock = &t->w->clock;
    stage_begin(clock);
    pthread_mutex_lock(&g->lock);
    stage_mark(clock, CS_WAIT);
    for (;;) {
        if (__atomic_load_n(&p->failed, __ATOMIC_ACQUIRE)) break;
        if (*p->stop) {
            compress_fail(p, PLANE_STOPPED, -1, 0);
            break;
        }
        cg_slot_t *slot = cg_slot_in(g, CG_PLACED, 1);
        int reading = slot == NULL;
        if (!slot) slot = cg_slot_in(g, CG_READING, 1);
        if (!slot && g->next_batch < g->batch_count) {
            slot = cg_slot_in(g, CG_FREE, 0);
            if (slot) {
                slot->batch = g->next_batch++;
                slot->state = CG_READING;
                slot->next = slot->done = 0;
            }
        }
        if (!slot) {
            if (g->finished == g->batch_count) break;
            stage_mark(clock, CS_OTHER);
            cg_wait(g);
            stage_mark(clock, CS_WAIT);
            continue;
        }
        int64_t i = g->batch_first[slot->batch] + slot->next++;
        pthread_mutex_unlock(&g->lock);
        stage_mark(clock, CS_OTHER);
        int ok = reading ? cg_read_frame(t, slot, i) : cg_finish_frame(t->w, g, slot, i);
        pthread_mutex_lock(&g->lock);
        stage_mark(clock, CS_WAIT);
        if (!ok) break;
        if (++slot->done == cg_frames(g, slot->batch)) {
            slot->next = slot->done = 0;
            if (!reading) {
                slot->state = CG_WRITING;
                /* A pipe takes the batches in their order. */
                stage_mark(clock, CS_OTHER);
                while (p->in_order && g->written_batches != slot->batch &&
                       !__atomic_load_n(&p->failed, __ATOMIC_ACQUIRE))
                    cg_wait(g);
                stage_mark(clock, CS_WAIT_ORDER);
                if (__atomic_load_n(&p->failed, __ATOMIC_ACQUIRE)) break;
                pthread_mutex_unlock(&g->lock);
                ok = cg_write_batch(t->w, g, slot);
                stage_mark(clock, CS_OTHER);
                pthread_mutex_lock(&g->lock);
                stage_mark(clock, CS_WAIT);
                if (!ok) break;
                g->written_batches++;
            }
            if (!reading) {
                slot->state = CG_FREE;
                g->finished++;
            } else if (g->batch_chunks[slot->batch]) {
                slot->state = CG_READ;
            } else { /* nothing for the GPU in it */
                cg_settle(g, slot);
                cg_coded(g, slot);
            }
            pthread_cond_broadcast(&g->changed);
        }
    }
    pthread_cond_broadcast(&g->changed);
    pthread_mutex_unlock(&g->lock);
    stage_end(clock, CS_OTHER);
    return NULL;
}

static void cg_gpu_fail(compress_plan_t *p, int64_t frame, const char *why) {
    pthread_mutex_lock(&p->error_lock);
    if (!p->failed) snprintf(p->gpu_why, p->gpu_why_room, "%s", why);
    pthread_mutex_unlock(&p->error_lock);
    compress_fail(p, PLANE_GPU, frame, 0);
}

/* Writes the planned portable payloads of a slot's batch on the GPU (their sizes known);
 * 1, or 0 with why set. */
static int cg_write_literals(cg_thread_t *t, cg_slot_t *slot, int64_t *table, int64_t *plan, int64_t *pack_rows,
                             char *why, size_t room) {
    cg_plane_t *g = t->g;
    compress_plan_t *p = g->p;
    int64_t rows = g->largest_chunks ? g->largest_chunks : 1;
    int64_t *in_at = table, *in_size = table + rows, *out_at = table + 2 * rows, *out_size = table + 3 * rows;
    int64_t n = 0, bytes = 0, planned = 0, packs = 0, largest_pack = 0;
    for (int64_t i = g->batch_first[slot->batch]; i < g->batch_first[slot->batch + 1]; i++) {
        const int64_t *f = p->frames + i * FR_COLS;
        for (int64_t c = f[FR_CHUNK]; c < f[FR_CHUNK] + f[FR_WORD]; c++) {
            payload_t *payload = &g->payloads[c];
            if (payload->codec != CG_PENDING) continue;
            int64_t plane = f[FR_LENGTH] / f[FR_WORD];
            in_at[n] = g->plane_at[c];
            in_size[n] = plane;
            out_at[n] = g->coded_at[c];
            out_size[n] = (int64_t)payload->len;
            if (g->packs[c] >= 0) {
                int64_t *row = pack_rows + packs++ * 4;
                row[0] = g->plane_at[c], row[1] = plane, row[2] = g->coded_at[c], row[3] = g->packs[c];
                if (plane > largest_pack) largest_pack = plane;
                payload->codec = CODEC_BITPACK;
            } else {
                memcpy(plan + planned * GPU_PLAN_FIELDS, slot->plan + g->block_at[c] * GPU_PLAN_FIELDS,
                       (size_t)g->rows[c] * GPU_PLAN_FIELDS * sizeof(int64_t));
                planned += g->rows[c];
                payload->codec = CODEC_ZSTD;
            }
            bytes += plane;
            n++;
        }
    }
    gpu_code_batch_t batch = {slot->planes, slot->coded, (size_t)g->batch_planes[slot->batch],
                              (size_t)g->batch_coded[slot->batch], n, in_at, in_size, out_at, NULL, out_size,
                              -1, CODEC_ZSTD};
    size_t blocks = (size_t)g->batch_blocks[slot->batch];
    gpu_literals_t literals = {plan, planned, (const uint32_t *)slot->tables, blocks * 256 * sizeof(uint32_t),
                               slot->blob, blocks * LP_HEAD_MAX, pack_rows, packs, largest_pack};
    if (gpu_write_literals(t->engine, &batch, &literals, why, room)) return 0;
    __atomic_add_fetch(&p->gpu_stats[0], 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&p->gpu_stats[1], n, __ATOMIC_RELAXED);
    __atomic_add_fetch(&p->gpu_stats[2], bytes, __ATOMIC_RELAXED);
    return 1;
}

/* Codes the pending planes of a slot's batch on the GPU (with verify, and decodes back
 * what it keeps); 1, or 0 with why set, or *failed the frame whose payload did not decode
 * back. */
static int cg_code(cg_thread_t *t, cg_slot_t *slot, int64_t *table, int64_t *failed, char *why, size_t room) {
    cg_plane_t *g = t->g;
    compress_plan_t *p = g->p;
    int64_t rows = g->largest_chunks ? g->largest_chunks : 1;
    int64_t *in_at = table, *in_size = table + rows, *out_at = table + 2 * rows, *codec = table + 3 * rows,
            *out_size = table + 4 * rows, *chunk = table + 5 * rows;
    int64_t n = 0, bytes = 0;
    for (int64_t i = g->batch_first[slot->batch]; i < g->batch_first[slot->batch + 1]; i++) {
        const int64_t *f = p->frames + i * FR_COLS;
        for (int64_t c = f[FR_CHUNK]; c < f[FR_CHUNK] + f[FR_WORD]; c++)
            if (g->payloads[c].codec == CG_PENDING) {
                in_at[n] = g->plane_at[c];
                in_size[n] = (int64_t)g->payloads[c].len;
                out_at[n] = g->coded_at[c];
                codec[n] = p->gpu_codec;
                out_size[n] = -1;
                chunk[n] = c;
                bytes += in_size[n];
                n++;
            }
    }
    gpu_code_batch_t batch = {slot->planes,  slot->coded, (size_t)g->batch_planes[slot->batch],
                              (size_t)g->batch_coded[slot->batch], n, in_at, in_size, out_at, codec, out_size,
                              p->gpu_codec,  -1};
    if (gpu_code(t->engine, &batch, why, room)) return 0;
    /* With verify, what is kept is decoded back by nvCOMP into the planes' places. */
    int64_t *back_in_at = table + 6 * rows, *back_in_size = table + 7 * rows, *back_out_at = table + 8 * rows,
            *back_out_size = table + 9 * rows, *back_codec = table + 10 * rows, kept = 0;
    for (int64_t k = 0; k < n; k++) {
        payload_t *payload = &g->payloads[chunk[k]];
        if (out_size[k] >= 0 && out_size[k] < in_size[k]) {
            *payload = (payload_t){p->gpu_codec, slot->coded + out_at[k], (size_t)out_size[k]};
            back_in_at[kept] = out_at[k], back_in_size[kept] = out_size[k];
            back_out_at[kept] = g->plane_at[chunk[k]], back_out_size[kept] = in_size[k];
            back_codec[kept++] = p->gpu_codec;
        } else {
            payload->codec = CODEC_RAW;
        }
    }
    if (p->verify && kept) {
        int64_t bad = -1;
        gpu_batch_t back = {slot->coded, slot->decoded, (size_t)g->batch_coded[slot->batch],
                            (size_t)g->batch_planes[slot->batch], kept, back_in_at, back_in_size, back_out_at,
                            back_out_size, back_codec, p->gpu_codec, -1};
        int result = gpu_decode(t->engine, &back, &bad, why, room);
        if (result < 0) return 0;
        if (result > 0) { /* the frame of the chunk that did not decode to its size */
            for (int64_t i = g->batch_first[slot->batch]; i < g->batch_first[slot->batch + 1]; i++) {
                const int64_t *f = p->frames + i * FR_COLS;
                if (g->plane_at[f[FR_CHUNK]] <= back_out_at[bad]) *failed = i;
            }
            return 0;
        }
    }
    __atomic_add_fetch(&p->gpu_stats[0], 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&p->gpu_stats[1], n, __ATOMIC_RELAXED);
    __atomic_add_fetch(&p->gpu_stats[2], bytes, __ATOMIC_RELAXED);
    return 1;
}

static void *cg_gpu(void *arg) {
    cg_thread_t *t = arg;
    stage_clock_t *clock = &t->clock;
    stage_begin(clock);
    cg_plane_t *g = t->g;
    compress_plan_t *p = g->p;
    char why[CG_WHY];
    int64_t rows = g->largest_chunks ? g->largest_chunks : 1;
    int64_t *table = malloc((size_t)rows * 11 * sizeof(int64_t));
    int64_t *plan = g->portable ? malloc(((size_t)g->largest_blocks + 1) * GPU_PLAN_FIELDS * sizeof(int64_t)) : NULL;
    int64_t *pack_rows = g->portable ? malloc((size_t)rows * 4 * sizeof(int64_t)) : NULL;
    int no_memory = !table || (g->portable && (!plan || !pack_rows));
    if (no_memory || gpu_enter(p->gpu_device, why, sizeof why)) {
        if (no_memory) snprintf(why, sizeof why, "no memory for a batch's table");
        cg_gpu_fail(p, -1, why);
        free(table);
        free(plan);
        free(pack_rows);
        return NULL;
    }
    pthread_mutex_lock(&g->lock);
    stage_mark(clock, CS_WAIT);
    for (;;) {
        if (__atomic_load_n(&p->failed, __ATOMIC_ACQUIRE)) break;
        cg_slot_t *slot = cg_slot_in(g, CG_READ, 0);
        if (!slot) {
            if (g->coded_batches == g->batch_count) break;
            stage_mark(clock, CS_OTHER);
            cg_wait(g);
            stage_mark(clock, CS_WAIT);
            continue;
        }
        slot->state = CG_CODING;
        pthread_mutex_unlock(&g->lock);
        stage_mark(clock, CS_OTHER);
        int64_t failed = -1;
        /* The batch's copies there and back and its coding (and, with verify, decoding back). */
        int ok = g->portable ? cg_write_literals(t, slot, table, plan, pack_rows, why, sizeof why)
                             : cg_code(t, slot, table, &failed, why, sizeof why);
        stage_mark(clock, CS_GPU);
        if (ok) cg_settle(g, slot);
        pthread_mutex_lock(&g->lock);
        stage_mark(clock, CS_WAIT);
        if (!ok) {
            pthread_mutex_unlock(&g->lock);
            if (failed >= 0)
                compress_fail(p, PLANE_FRAME, failed, 0);
            else
                cg_gpu_fail(p, g->batch_first[slot->batch], why);
            pthread_mutex_lock(&g->lock);
        } else {
            cg_coded(g, slot);
        }
        pthread_cond_broadcast(&g->changed);
    }
    pthread_cond_broadcast(&g->changed);
    pthread_mutex_unlock(&g->lock);
    free(table);
    free(plan);
    free(pack_rows);
    stage_end(clock, CS_OTHER);
    return NULL;
}

static void compress_gpu_run(compress_plan_t *p, coder_t *coders, int threads) {
    char why[CG_WHY];
    cg_plane_t g;
    memset(&g, 0, sizeof g);
    g.p = p;
    g.portable = p->gpu_codec == CODEC_ZSTD;
    int engines = p->gpu_workers < 1 ? 1 : p->gpu_workers > GPU_MAX_WORKERS ? GPU_MAX_WORKERS : p->gpu_workers;
    cg_thread_t *args = calloc((size_t)(threads + engines), sizeof(cg_thread_t));
    pthread_t *ids = calloc((size_t)(threads + engines), sizeof(pthread_t));
    int cpu_started = 0, gpu_started = 0;
    pthread_mutex_init(&g.lock, NULL);
    pthread_cond_init(&g.changed, NULL);
    if (!args || !ids) {
        compress_fail(p, PLANE_NOMEM, -1, 0);
        goto done;
    }
    if (gpu_open(p->gpu_library, p->gpu_device, why, sizeof why) || gpu_enter(p->gpu_device, why, sizeof why) ||
        (g.portable && gpu_kernels(p->gpu_device, p->gpu_kernels, why, sizeof why)) ||
        !cg_plan_batches(&g, why, sizeof why)) {
        cg_gpu_fail(p, -1, why);
        goto done;
    }
    size_t planes_room = 16, coded_room = 16, cpu_room = 16;
    for (int64_t b = 0; b < g.batch_count; b++) {
        if ((size_t)g.batch_planes[b] > planes_room) planes_room = (size_t)g.batch_planes[b];
        if ((size_t)g.batch_coded[b] > coded_room) coded_room = (size_t)g.batch_coded[b];
        if ((size_t)g.batch_cpu[b] > cpu_room) cpu_room = (size_t)g.batch_cpu[b];
    }
    g.slot_count = (int)(g.batch_count < engines + 2 ? (g.batch_count ? g.batch_count : 1) : engines + 2);
    for (int s = 0; s < g.slot_count; s++) {
        cg_slot_t *slot = &g.slots[s];
        slot->state = CG_FREE;
        slot->planes = gpu_host_alloc(planes_room, &slot->planes_size);
        slot->coded = gpu_host_alloc(coded_room, &slot->coded_size);
        slot->cpu = malloc(cpu_room);
        if (p->verify && !g.portable) slot->decoded = gpu_host_alloc(planes_room, &slot->decoded_size);
        size_t blocks = (size_t)g.largest_blocks + 1;
        if (g.portable) {
            slot->plan = malloc(blocks * GPU_PLAN_FIELDS * sizeof(int64_t));
            slot->tables = malloc(blocks * sizeof *slot->tables);
            slot->blob = malloc(blocks * LP_HEAD_MAX);
        }
        if (!slot->planes || !slot->coded || !slot->cpu || (g.portable && (!slot->plan || !slot->tables || !slot->blob)) ||
            (p->verify && !g.portable && !slot->decoded)) {
            cg_gpu_fail(p, -1, "pinning host memory for the GPU's batches failed");
            goto done;
        }
    }
    size_t counts = ((size_t)(g.largest_plane + CG_LITERAL_BLOCK - 1) / CG_LITERAL_BLOCK + 1) * 4 * 256;
    for (int t = 0; t < threads; t++) {
        args[t].g = &g;
        args[t].w = &coders[t];
        if (g.portable && !(args[t].counts = malloc(counts * sizeof(uint16_t)))) {
            compress_fail(p, PLANE_NOMEM, -1, 0);
            goto done;
        }
    }
    for (int e = 0; e < engines; e++) {
        args[threads + e].g = &g;
        if (!(args[threads + e].engine = gpu_engine_take(p->gpu_device, why, sizeof why))) {
            cg_gpu_fail(p, -1, why);
            goto done;
        }
    }
    for (int e = 0; e < engines; e++, gpu_started++)
        if (pthread_create(&ids[threads + e], NULL, cg_gpu, &args[threads + e])) break;
    if (!gpu_started) cg_gpu_fail(p, -1, "no thread for the GPU worker");

    for (int t = 1; t < threads; t++, cpu_started++)
        if (pthread_create(&ids[t], NULL, cg_work, &args[t])) break;
    cg_work(&args[0]);
    for (int t = 1; t <= cpu_started; t++) pthread_join(ids[t], NULL);
    pthread_mutex_lock(&g.lock);
    pthread_cond_broadcast(&g.changed);
    pthread_mutex_unlock(&g.lock);
    for (int e = 0; e < gpu_started; e++) pthread_join(ids[threads + e], NULL);
    for (int t = 0; t <= cpu_started; t++) stage_report(&coders[t].clock, STAGE_ROLE_CPU, p->stages, p->stage_rows, t);
    for (int e = 0; e < gpu_started; e++)
        stage_report(&args[threads + e].clock, STAGE_ROLE_GPU, p->stages, p->stage_rows, threads + e);
done:
    if (args)
        for (int e = 0; e < engines; e++) gpu_engine_give(args[threads + e].engine);
    for (int s = 0; s < 2 * GPU_MAX_WORKERS; s++) {
        gpu_host_free(g.slots[s].planes, g.slots[s].planes_size);
        gpu_host_free(g.slots[s].coded, g.slots[s].coded_size);
        gpu_host_free(g.slots[s].decoded, g.slots[s].decoded_size);
        free(g.slots[s].cpu);
        free(g.slots[s].plan);
        free(g.slots[s].tables);
        free(g.slots[s].blob);
    }
    for (int t = 0; args && t < threads; t++) free(args[t].counts);
    pthread_cond_destroy(&g.changed);
    pthread_mutex_destroy(&g.lock);
    free(g.batch_first);
    free(g.batch_planes);
    free(g.batch_coded);
    free(g.batch_cpu);
    free(g.batch_chunks);
    free(g.cpu_at);
    free(g.need);
    free(g.at);
    free(g.plane_at);
    free(g.coded_at);
    free(g.payloads);
    free(g.block_at);
    free(g.rows);
    free(g.packs);
    free(g.batch_blocks);
    free(args);
    free(ids);
}
