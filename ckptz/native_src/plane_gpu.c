/*
 * The restore plane with a GPU (plane.c's plan, where plan->gpu is set): chunks of the
 * bitstreams nvCOMP decodes go to the GPU engine (gpu_engine.c) in batches; every other step
 * is the CPU plane's, on the same threads.
 *
 * The frames are cut into batches of consecutive frames, of about gpu_batch bytes of payload
 * (and as much decoded). A batch lives in a slot: pinned memory for its payloads and for what
 * the GPU decodes. The plane's threads read a batch's frames into its slot (checking padding
 * and checksums, as on the CPU), a GPU worker thread then decodes the slot's GPU chunks in
 * one call, and the plane's threads finish each frame from the slot (planes decoded there or
 * by the CPU, merged, checked, put, hashed). There are more slots than GPU workers, so
 * reading, decoding and finishing of different batches run at once; threads finish frames
 * before they read new ones, which frees slots soonest.
 */
#include "native.h"

#include <pthread.h>
#include <stdio.h>
#include <time.h>

enum { SLOT_FREE, SLOT_READING, SLOT_READ, SLOT_DECODING, SLOT_DECODED };

#define GPU_WHY 240

typedef struct {
    int64_t batch; /* the batch it holds */
    int state;
    int64_t next, done; /* frames of the batch taken and done in this state */
    uint8_t *in, *out;  /* pinned: payloads the GPU decodes, and what it decoded */
    uint8_t *rest;      /* the payloads the CPU threads decode */
    size_t in_size, out_size, rest_size;
} gpu_slot_t;

typedef struct {
    restore_plan_t *p;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    gpu_slot_t slots[2 * GPU_MAX_WORKERS];
    int slot_count;
    int64_t batch_count, next_batch, decoded, finished;
    int64_t *batch_first;      /* per batch: its first frame; then the frame count */
    /* Per frame and chunk (8 a frame): its payload's place in its slot's `in` (a chunk the
     * GPU decodes, whose plane is at out_at in `out`) or `rest` (out_at -1). */
    int64_t *in_at, *out_at;
    int64_t *batch_in, *batch_out, *batch_rest; /* per batch: bytes of each region */
    int64_t largest_batch;         /* most GPU chunks in a batch */
} gpu_plane_t;

typedef struct {
    gpu_plane_t *g;
    worker_t *w;          /* a CPU thread's */
    gpu_engine_t *engine; /* a GPU worker's */
    stage_clock_t clock;  /* a GPU worker's (a CPU thread's is its worker's) */
} gpu_thread_t;

/* Whether a chunk of a frame of `word`-byte words goes to the GPU: every ans chunk, and the
 * zstd chunks of words' planes (a frame of bytes, such as metadata, is an LZ-coded frame
 * that the CPU threads decode faster). */
static int gpu_codec(const restore_plan_t *p, int64_t codec, int64_t word) {
    return codec == p->gpu_ans || (p->gpu_zstd >= 0 && codec == p->gpu_zstd && word > 1);
}

/* Cuts the frames into batches; 0 where memory runs out. */
static int gpu_plan_batches(gpu_plane_t *g) {
    restore_plan_t *p = g->p;
    int64_t n = p->frame_count;
    size_t rows = (size_t)(n + 1) * sizeof(int64_t);
    g->batch_first = malloc(rows);
    g->batch_in = malloc(rows);
    g->batch_out = malloc(rows);
    g->batch_rest = malloc(rows);
    g->in_at = malloc(rows * 8);
    g->out_at = malloc(rows * 8);
    if (!g->batch_first || !g->batch_in || !g->batch_out || !g->batch_rest || !g->in_at || !g->out_at) return 0;
    int64_t b = -1, in = 0, out = 0, rest = 0, chunks = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t *f = p->frames + i * FR_COLS;
        const int64_t *c = p->chunks + f[FR_CHUNK] * CH_COLS;
        int64_t fin = 0, fout = 0, frest = 0;
        for (int k = 0; k < (int)f[FR_WORD]; k++) {
            const int64_t *ck = c + k * CH_COLS;
            int64_t padded = ck[CH_SIZE] + (-ck[CH_SIZE] & (PLANE_ALIGN - 1));
            if (gpu_codec(p, ck[CH_CODEC], f[FR_WORD]))
                fin += padded, fout += ck[CH_RAW] + (-ck[CH_RAW] & (PLANE_ALIGN - 1));
            else
                frest += padded;
        }
        if (b < 0 || in + fin + rest + frest > p->gpu_batch || out + fout > p->gpu_batch) {
            if (b >= 0 && i > g->batch_first[b]) {
                g->batch_in[b] = in, g->batch_out[b] = out, g->batch_rest[b] = rest;
                if (chunks > g->largest_batch) g->largest_batch = chunks;
                in = out = rest = chunks = 0;
            }
            if (b < 0 || i > g->batch_first[b]) g->batch_first[++b] = i;
        }
        for (int k = 0; k < (int)f[FR_WORD]; k++) {
            const int64_t *ck = c + k * CH_COLS;
            int64_t padded = ck[CH_SIZE] + (-ck[CH_SIZE] & (PLANE_ALIGN - 1));
            if (gpu_codec(p, ck[CH_CODEC], f[FR_WORD])) {
                g->in_at[i * 8 + k] = in;
                g->out_at[i * 8 + k] = out;
                in += padded;
                out += ck[CH_RAW] + (-ck[CH_RAW] & (PLANE_ALIGN - 1));
                chunks++;
            } else {
                g->in_at[i * 8 + k] = rest;
                g->out_at[i * 8 + k] = -1;
                rest += padded;
            }
        }
    }
    if (b >= 0) {
        g->batch_in[b] = in, g->batch_out[b] = out, g->batch_rest[b] = rest;
        if (chunks > g->largest_batch) g->largest_batch = chunks;
    }
    g->batch_count = b + 1;
    g->batch_first[b + 1] = n;
    return 1;
}

static int64_t batch_frames(const gpu_plane_t *g, int64_t b) { return g->batch_first[b + 1] - g->batch_first[b]; }

/* Waits for `changed` (under `lock`), a while at most: a stop flag set from Python is seen
 * even while nothing else changes. The GPU compress plane waits the same way. */
static void plane_timed_wait(pthread_cond_t *changed, pthread_mutex_t *lock) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 20 * 1000 * 1000;
    if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
    pthread_cond_timedwait(changed, lock, &until);
}

static void gpu_wait(gpu_plane_t *g) { plane_timed_wait(&g->changed, &g->lock); }

/* The slot in `state` holding the earliest batch with a frame left to take (or any, with
 * untaken 0), or NULL. */
static gpu_slot_t *gpu_slot_in(gpu_plane_t *g, int state, int untaken) {
    gpu_slot_t *best = NULL;
    for (int s = 0; s < g->slot_count; s++) {
        gpu_slot_t *slot = &g->slots[s];
        if (slot->state != state || (untaken && slot->next >= batch_frames(g, slot->batch))) continue;
        if (!best || slot->batch < best->batch) best = slot;
    }
    return best;
}

static void *gpu_plane_work(void *arg) {
    gpu_thread_t *t = arg;
    gpu_plane_t *g = t->g;
    restore_plan_t *p = g->p;
    uint8_t *payload[8];
    const uint8_t *decoded[8];
    stage_clock_t *clock = &t->w->clock;
    stage_begin(clock);
    pthread_mutex_lock(&g->lock);
    stage_mark(clock, RS_WAIT);
    for (;;) {
        if (__atomic_load_n(&p->failed, __ATOMIC_ACQUIRE)) break;
        if (*p->stop) {
            plane_fail(p, PLANE_STOPPED, -1, 0);
            break;
        }
        gpu_slot_t *slot = gpu_slot_in(g, SLOT_DECODED, 1);
        int reading = slot == NULL;
        if (!slot) slot = gpu_slot_in(g, SLOT_READING, 1);
        if (!slot && g->next_batch < g->batch_count) {
            slot = gpu_slot_in(g, SLOT_FREE, 0);
            if (slot) {
                slot->batch = g->next_batch++;
                slot->state = SLOT_READING;
                slot->next = slot->done = 0;
            }
        }
        if (!slot) {
            if (g->finished == g->batch_count) break;
            stage_mark(clock, RS_OTHER);
            gpu_wait(g);
            stage_mark(clock, RS_WAIT);
            continue;
        }
        int64_t i = g->batch_first[slot->batch] + slot->next++;
        pthread_mutex_unlock(&g->lock);
        stage_mark(clock, RS_OTHER);
        int word = (int)p->frames[i * FR_COLS + FR_WORD];
        for (int k = 0; k < word; k++) {
            int64_t at = g->in_at[i * 8 + k], to = g->out_at[i * 8 + k];
            payload[k] = (to < 0 ? slot->rest : slot->in) + at;
            decoded[k] = to < 0 ? NULL : slot->out + to;
        }
        int ok = reading ? plane_read(p, i, payload, clock)
                         : plane_finish(t->w, i, (const uint8_t *const *)payload, decoded);
        pthread_mutex_lock(&g->lock);
        stage_mark(clock, RS_WAIT);
        if (!ok) break;
        if (++slot->done == batch_frames(g, slot->batch)) {
            slot->next = slot->done = 0;
            if (!reading) {
                slot->state = SLOT_FREE;
                g->finished++;
            } else if (g->batch_out[slot->batch]) {
                slot->state = SLOT_READ;
            } else { /* nothing for the GPU in it */
                slot->state = SLOT_DECODED;
                g->decoded++;
            }
            pthread_cond_broadcast(&g->changed);
        }
    }
    pthread_cond_broadcast(&g->changed);
    pthread_mutex_unlock(&g->lock);
    stage_end(clock, RS_OTHER);
    return NULL;
}

static void *gpu_plane_decode(void *arg) {
    gpu_thread_t *t = arg;
    stage_clock_t *clock = &t->clock;
    stage_begin(clock);
    gpu_plane_t *g = t->g;
    restore_plan_t *p = g->p;
    char why[GPU_WHY];
    int64_t rows = g->largest_batch ? g->largest_batch : 1;
    int64_t *table = malloc((size_t)rows * 6 * sizeof(int64_t));
    if (!table || gpu_enter(p->gpu_device, why, sizeof why)) {
        if (!table) snprintf(why, sizeof why, "no memory for a batch's table");
        pthread_mutex_lock(&p->error_lock);
        if (!p->failed) snprintf(p->gpu_why, p->gpu_why_room, "%s", why);
        pthread_mutex_unlock(&p->error_lock);
        plane_fail(p, PLANE_GPU, -1, 0);
        free(table);
        return NULL;
    }
    int64_t *in_at = table, *in_size = table + rows, *out_at = table + 2 * rows, *out_size = table + 3 * rows,
            *codec = table + 4 * rows, *frame = table + 5 * rows;
    pthread_mutex_lock(&g->lock);
    stage_mark(clock, RS_WAIT);
    for (;;) {
        if (__atomic_load_n(&p->failed, __ATOMIC_ACQUIRE)) break;
        gpu_slot_t *slot = gpu_slot_in(g, SLOT_READ, 0);
        if (!slot) {
            if (g->decoded == g->batch_count) break;
            stage_mark(clock, RS_OTHER);
            gpu_wait(g);
            stage_mark(clock, RS_WAIT);
            continue;
        }
        slot->state = SLOT_DECODING;
        pthread_mutex_unlock(&g->lock);
        int64_t n = 0, bytes = 0, bad = -1;
        for (int64_t i = g->batch_first[slot->batch]; i < g->batch_first[slot->batch + 1]; i++) {
            const int64_t *f = p->frames + i * FR_COLS;
            const int64_t *c = p->chunks + f[FR_CHUNK] * CH_COLS;
            for (int k = 0; k < (int)f[FR_WORD]; k++)
                if (g->out_at[i * 8 + k] >= 0) {
                    in_at[n] = g->in_at[i * 8 + k];
                    in_size[n] = c[k * CH_COLS + CH_SIZE];
                    out_at[n] = g->out_at[i * 8 + k];
                    out_size[n] = c[k * CH_COLS + CH_RAW];
                    codec[n] = c[k * CH_COLS + CH_CODEC];
                    frame[n] = i;
                    bytes += in_size[n];
                    n++;
                }
        }
        gpu_batch_t batch = {slot->in, slot->out, (size_t)g->batch_in[slot->batch], (size_t)g->batch_out[slot->batch],
                             n, in_at, in_size, out_at, out_size, codec, p->gpu_ans, p->gpu_zstd};
        stage_mark(clock, RS_OTHER);
        int result = gpu_decode(t->engine, &batch, &bad, why, sizeof why); /* copies there and back, and nvCOMP */
        stage_mark(clock, RS_GPU);
        pthread_mutex_lock(&g->lock);
        stage_mark(clock, RS_WAIT);
        if (result < 0) {
            pthread_mutex_lock(&p->error_lock);
            if (!p->failed) snprintf(p->gpu_why, p->gpu_why_room, "%s", why);
            pthread_mutex_unlock(&p->error_lock);
            plane_fail(p, PLANE_GPU, g->batch_first[slot->batch], 0);
        } else if (result > 0) {
            plane_fail(p, PLANE_DECODE, frame[bad], 0);
        } else {
            slot->state = SLOT_DECODED;
            g->decoded++;
            p->gpu_stats[0]++;
            p->gpu_stats[1] += n;
            p->gpu_stats[2] += bytes;
        }
        pthread_cond_broadcast(&g->changed);
    }
    pthread_cond_broadcast(&g->changed);
    pthread_mutex_unlock(&g->lock);
    free(table);
    stage_end(clock, RS_OTHER);
    return NULL;
}

static void plane_gpu_fail(restore_plan_t *p, const char *why) {
    pthread_mutex_lock(&p->error_lock);
    if (!p->failed) snprintf(p->gpu_why, p->gpu_why_room, "%s", why);
    pthread_mutex_unlock(&p->error_lock);
    plane_fail(p, PLANE_GPU, -1, 0);
}

static void plane_gpu_run(restore_plan_t *p, worker_t *workers, int threads) {
    char why[GPU_WHY];
    gpu_plane_t g;
    memset(&g, 0, sizeof g);
    g.p = p;
    int engines = p->gpu_workers < 1 ? 1 : p->gpu_workers > GPU_MAX_WORKERS ? GPU_MAX_WORKERS : p->gpu_workers;
    gpu_thread_t *args = calloc((size_t)(threads + engines), sizeof(gpu_thread_t));
    pthread_t *ids = calloc((size_t)(threads + engines), sizeof(pthread_t));
    int cpu_started = 0;
    pthread_mutex_init(&g.lock, NULL);
    pthread_cond_init(&g.changed, NULL);
    if (!args || !ids || !gpu_plan_batches(&g)) {
        plane_fail(p, PLANE_NOMEM, -1, 0);
        goto done;
    }
    if (gpu_open(p->gpu_library, p->gpu_device, why, sizeof why) ||
        gpu_enter(p->gpu_device, why, sizeof why)) {
        plane_gpu_fail(p, why);
        goto done;
    }
    size_t in_room = 16, out_room = 16, rest_room = 16;
    for (int64_t b = 0; b < g.batch_count; b++) {
        if ((size_t)g.batch_in[b] > in_room) in_room = (size_t)g.batch_in[b];
        if ((size_t)g.batch_out[b] > out_room) out_room = (size_t)g.batch_out[b];
        if ((size_t)g.batch_rest[b] > rest_room) rest_room = (size_t)g.batch_rest[b];
    }
    g.slot_count = (int)(g.batch_count < engines + 2 ? (g.batch_count ? g.batch_count : 1) : engines + 2);
    for (int s = 0; s < g.slot_count; s++) {
        gpu_slot_t *slot = &g.slots[s];
        slot->state = SLOT_FREE;
        slot->in = gpu_host_alloc(in_room, &slot->in_size);
        slot->out = gpu_host_alloc(out_room, &slot->out_size);
        slot->rest = malloc(rest_room);
        if (!slot->in || !slot->out || !slot->rest) {
            plane_gpu_fail(p, "pinning host memory for the GPU's batches failed");
            goto done;
        }
    }
    for (int e = 0; e < engines; e++) {
        args[threads + e].g = &g;
        if (!(args[threads + e].engine = gpu_engine_take(p->gpu_device, why, sizeof why))) {
            plane_gpu_fail(p, why);
            goto done;
        }
    }
    int gpu_started = 0;
    for (int e = 0; e < engines; e++, gpu_started++)
        if (pthread_create(&ids[threads + e], NULL, gpu_plane_decode, &args[threads + e])) break;
    if (!gpu_started) plane_gpu_fail(p, "no thread for the GPU worker");
    for (int t = 0; t < threads; t++) {
        args[t].g = &g;
        args[t].w = &workers[t];
    }
    for (int t = 1; t < threads; t++, cpu_started++)
        if (pthread_create(&ids[t], NULL, gpu_plane_work, &args[t])) break;
    gpu_plane_work(&args[0]);
    for (int t = 1; t <= cpu_started; t++) pthread_join(ids[t], NULL);
    pthread_mutex_lock(&g.lock);
    pthread_cond_broadcast(&g.changed);
    pthread_mutex_unlock(&g.lock);
    for (int e = 0; e < gpu_started; e++) pthread_join(ids[threads + e], NULL);
    for (int t = 0; t <= cpu_started; t++) stage_report(&workers[t].clock, STAGE_ROLE_CPU, p->stages, p->stage_rows, t);
    for (int e = 0; e < gpu_started; e++)
        stage_report(&args[threads + e].clock, STAGE_ROLE_GPU, p->stages, p->stage_rows, threads + e);
done:
    if (args)
        for (int e = 0; e < engines; e++) gpu_engine_give(args[threads + e].engine);
    for (int s = 0; s < 2 * GPU_MAX_WORKERS; s++) {
        gpu_host_free(g.slots[s].in, g.slots[s].in_size);
        gpu_host_free(g.slots[s].out, g.slots[s].out_size);
        free(g.slots[s].rest);
    }
    pthread_cond_destroy(&g.changed);
    pthread_mutex_destroy(&g.lock);
    free(g.batch_first);
    free(g.batch_in);
    free(g.batch_out);
    free(g.in_at);
    free(g.out_at);
    free(args);
    free(ids);
}
