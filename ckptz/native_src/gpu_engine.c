/*
 * The GPU engine of the native data plane (gpu_engine.h): one batch of chunks, pinned host
 * memory in and out, coded or decoded by nvCOMP on one CUDA stream per worker.
 *
 * A batch goes up in two copies (its payloads, and one table of every chunk's pointers and
 * sizes), is decoded with one nvCOMP call per bitstream, and comes back in two (the decoded
 * bytes, and every chunk's decoded size and status); the worker then sleeps on an event. The
 * plane runs two workers, each with its own stream and device memory, so one batch's copies
 * overlap the other's decoding. Coding is the same in the other direction, except that a
 * payload's size is known only once it is coded: the sizes come back first, then only the
 * payloads smaller than their input (the others are stored raw). Workers and pinned buffers are kept in pools for the next
 * file: pinning and device allocation cost more than a small file's restore.
 */
#include "gpu_engine.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPU_MAX_DEVICES 64
#define GPU_POOL 8
#define GPU_BLOCKING_SYNC_EVENT 0x3 /* CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING */
#define GPU_NON_BLOCKING_STREAM 0x1 /* CU_STREAM_NON_BLOCKING */
#define GPU_PORTABLE_PINNED 0x1     /* CU_MEMHOSTALLOC_PORTABLE */
#define GPU_ANY_ANS_TYPE 0xFF       /* NVCOMP_TYPE_BITS: the data type is read from the bitstream */
#define GPU_THREADS 256             /* threads of a block of every kernel (kernels.py's _THREADS) */
#define GPU_MAX_Y 65535             /* CUDA's limit on a grid's second dimension */

/* The driver's and nvCOMP's functions, loaded once. nvCOMP's options structs are passed by
 * value, so each algorithm gets a thin caller below that passes its own struct. */
static struct {
    gpu_result_t (*init)(unsigned);
    gpu_result_t (*device_get)(int *, int);
    gpu_result_t (*retain)(void **, int);
    gpu_result_t (*set_current)(void *);
    gpu_result_t (*stream_create)(void **, unsigned);
    gpu_result_t (*stream_destroy)(void *);
    gpu_result_t (*event_create)(void **, unsigned);
    gpu_result_t (*event_destroy)(void *);
    gpu_result_t (*event_record)(void *, void *);
    gpu_result_t (*event_sync)(void *);
    gpu_result_t (*mem_alloc)(gpu_dptr_t *, size_t);
    gpu_result_t (*mem_free)(gpu_dptr_t);
    gpu_result_t (*host_alloc)(void **, size_t, unsigned);
    gpu_result_t (*host_free)(void *);
    gpu_result_t (*to_device)(gpu_dptr_t, const void *, size_t, void *);
    gpu_result_t (*to_host)(void *, gpu_dptr_t, size_t, void *);
    gpu_result_t (*zero)(gpu_dptr_t, unsigned char, size_t, void *);
    gpu_result_t (*error_string)(gpu_result_t, const char **);
    gpu_result_t (*module_load)(void **, const void *);
    gpu_result_t (*function)(void **, void *, const char *);
    gpu_result_t (*launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                           void **, void **);
    gpu_result_t (*ans_temp)(size_t, size_t, nvcomp_ans_opts_t, size_t *, size_t, void *);
    gpu_result_t (*ans_decode)(const void *const *, const size_t *, const size_t *, size_t *, size_t, void *, size_t,
                               void *const *, nvcomp_ans_opts_t, gpu_result_t *, void *);
    gpu_result_t (*zstd_temp)(size_t, size_t, nvcomp_zstd_opts_t, size_t *, size_t, void *);
    gpu_result_t (*zstd_decode)(const void *const *, const size_t *, const size_t *, size_t *, size_t, void *, size_t,
                                void *const *, nvcomp_zstd_opts_t, gpu_result_t *, void *);
    gpu_result_t (*ans_code_temp)(size_t, size_t, nvcomp_ans_code_opts_t, size_t *, size_t, void *);
    gpu_result_t (*ans_code_bound)(size_t, nvcomp_ans_code_opts_t, size_t *);
    gpu_result_t (*ans_code)(const void *const *, const size_t *, size_t, size_t, void *, size_t, void *const *,
                             size_t *, nvcomp_ans_code_opts_t, gpu_result_t *, void *);
    gpu_result_t (*zstd_code_temp)(size_t, size_t, nvcomp_zstd_code_opts_t, size_t *, size_t, void *);
    gpu_result_t (*zstd_code_bound)(size_t, nvcomp_zstd_code_opts_t, size_t *);
    gpu_result_t (*zstd_code)(const void *const *, const size_t *, size_t, size_t, void *, size_t, void *const *,
                              size_t *, nvcomp_zstd_code_opts_t, gpu_result_t *, void *);
    int loaded;
    void *context[GPU_MAX_DEVICES];
    void *kernels[GPU_MAX_DEVICES][GPU_KERNELS]; /* ckptz's kernels, once loaded on a device */
} gpu_api;

/* The kernels the planes launch, by index (names as in ckptz/engines/gpu/cuda_src/). */
static const char *const gpu_kernel_names[GPU_KERNELS] = {"literals_encode", "bitpack_encode"};

static pthread_mutex_t gpu_lock = PTHREAD_MUTEX_INITIALIZER;

struct gpu_engine {
    int device;
    void *stream, *done;
    gpu_dptr_t in, out, table, temp;
    size_t in_room, out_room, table_room, temp_room;
    uint8_t *host_table; /* pinned: the chunk table going up, then sizes and statuses coming back */
    size_t host_room;
};

static gpu_engine_t *idle_engines[GPU_POOL];
static struct {
    uint8_t *ptr;
    size_t size;
} idle_pinned[GPU_POOL];

static void gpu_say(char *why, size_t room, const char *what, gpu_result_t result) {
    const char *text = NULL;
    if (gpu_api.error_string && gpu_api.error_string(result, &text)) text = NULL;
    if (text)
        snprintf(why, room, "%s failed (%s)", what, text);
    else
        snprintf(why, room, "%s failed (status %d)", what, result);
}

#define GPU_SYM(lib, owner, field, name)                                                                             \
    do {                                                                                                           \
        *(void **)&gpu_api.field = dlsym(lib, name);                                                               \
        if (!gpu_api.field) return snprintf(why, room, "%s lacks %s", owner, name), -1;                           \
    } while (0)

static int gpu_load(const char *nvcomp_path, char *why, size_t room) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) return snprintf(why, room, "no CUDA driver on this machine (libcuda.so.1 not found)"), -1;
    void *nvcomp = dlopen(nvcomp_path && *nvcomp_path ? nvcomp_path : "libnvcomp.so.6", RTLD_NOW | RTLD_LOCAL);
    if (!nvcomp) return snprintf(why, room, "nvCOMP is not installed (pip install nvidia-libnvcomp-cu12)"), -1;
    GPU_SYM(cuda, "libcuda", init, "cuInit");
    GPU_SYM(cuda, "libcuda", device_get, "cuDeviceGet");
    GPU_SYM(cuda, "libcuda", retain, "cuDevicePrimaryCtxRetain");
    GPU_SYM(cuda, "libcuda", set_current, "cuCtxSetCurrent");
    GPU_SYM(cuda, "libcuda", stream_create, "cuStreamCreate");
    GPU_SYM(cuda, "libcuda", stream_destroy, "cuStreamDestroy_v2");
    GPU_SYM(cuda, "libcuda", event_create, "cuEventCreate");
    GPU_SYM(cuda, "libcuda", event_destroy, "cuEventDestroy_v2");
    GPU_SYM(cuda, "libcuda", event_record, "cuEventRecord");
    GPU_SYM(cuda, "libcuda", event_sync, "cuEventSynchronize");
    GPU_SYM(cuda, "libcuda", mem_alloc, "cuMemAlloc_v2");
    GPU_SYM(cuda, "libcuda", mem_free, "cuMemFree_v2");
    GPU_SYM(cuda, "libcuda", host_alloc, "cuMemHostAlloc");
    GPU_SYM(cuda, "libcuda", host_free, "cuMemFreeHost");
    GPU_SYM(cuda, "libcuda", to_device, "cuMemcpyHtoDAsync_v2");
    GPU_SYM(cuda, "libcuda", to_host, "cuMemcpyDtoHAsync_v2");
    GPU_SYM(cuda, "libcuda", zero, "cuMemsetD8Async");
    GPU_SYM(cuda, "libcuda", error_string, "cuGetErrorString");
    GPU_SYM(cuda, "libcuda", module_load, "cuModuleLoadData");
    GPU_SYM(cuda, "libcuda", function, "cuModuleGetFunction");
    GPU_SYM(cuda, "libcuda", launch, "cuLaunchKernel");
    GPU_SYM(nvcomp, "nvCOMP", ans_temp, "nvcompBatchedANSDecompressGetTempSize");
    GPU_SYM(nvcomp, "nvCOMP", ans_decode, "nvcompBatchedANSDecompressAsync");
    GPU_SYM(nvcomp, "nvCOMP", zstd_temp, "nvcompBatchedZstdDecompressGetTempSize");
    GPU_SYM(nvcomp, "nvCOMP", zstd_decode, "nvcompBatchedZstdDecompressAsync");
    GPU_SYM(nvcomp, "nvCOMP", ans_code_temp, "nvcompBatchedANSCompressGetTempSize");
    GPU_SYM(nvcomp, "nvCOMP", ans_code_bound, "nvcompBatchedANSCompressGetMaxOutputChunkSize");
    GPU_SYM(nvcomp, "nvCOMP", ans_code, "nvcompBatchedANSCompressAsync");
    GPU_SYM(nvcomp, "nvCOMP", zstd_code_temp, "nvcompBatchedZstdCompressGetTempSize");
    GPU_SYM(nvcomp, "nvCOMP", zstd_code_bound, "nvcompBatchedZstdCompressGetMaxOutputChunkSize");
    GPU_SYM(nvcomp, "nvCOMP", zstd_code, "nvcompBatchedZstdCompressAsync");
    gpu_result_t r = gpu_api.init(0);
    if (r) return gpu_say(why, room, "cuInit", r), -1;
    return 0;
}

static int gpu_open(const char *nvcomp_path, int device, char *why, size_t room) {
    int result = 0;
    if (device < 0 || device >= GPU_MAX_DEVICES) return snprintf(why, room, "no device cuda:%d", device), -1;
    pthread_mutex_lock(&gpu_lock);
    if (!gpu_api.loaded) {
        result = gpu_load(nvcomp_path, why, room);
        gpu_api.loaded = result == 0;
    }
    if (!result && !gpu_api.context[device]) {
        int dev = 0;
        gpu_result_t r = gpu_api.device_get(&dev, device);
        if (!r) r = gpu_api.retain(&gpu_api.context[device], dev);
        if (r) result = -1, gpu_say(why, room, "opening the device", r);
    }
    pthread_mutex_unlock(&gpu_lock);
    return result;
}

static int gpu_enter(int device, char *why, size_t room) {
    gpu_result_t r = gpu_api.set_current(gpu_api.context[device]);
    if (r) return gpu_say(why, room, "cuCtxSetCurrent", r), -1;
    return 0;
}

/* Device memory the native engines hold now, and the most they held at once (bytes), so
 * that a run's peak can be held to its memory budget. */
static int64_t gpu_held_bytes, gpu_peak_bytes;

static void gpu_count(int64_t change) {
    int64_t now = __atomic_add_fetch(&gpu_held_bytes, change, __ATOMIC_RELAXED);
    int64_t peak = __atomic_load_n(&gpu_peak_bytes, __ATOMIC_RELAXED);
    while (now > peak &&
           !__atomic_compare_exchange_n(&gpu_peak_bytes, &peak, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

static void gpu_engine_free(gpu_engine_t *g) {
    gpu_count(-(int64_t)(g->in_room + g->out_room + g->table_room + g->temp_room));
    if (g->in) gpu_api.mem_free(g->in);
    if (g->out) gpu_api.mem_free(g->out);
    if (g->table) gpu_api.mem_free(g->table);
    if (g->temp) gpu_api.mem_free(g->temp);
    if (g->host_table) gpu_api.host_free(g->host_table);
    if (g->done) gpu_api.event_destroy(g->done);
    if (g->stream) gpu_api.stream_destroy(g->stream);
    free(g);
}

static gpu_engine_t *gpu_engine_take(int device, char *why, size_t room) {
    pthread_mutex_lock(&gpu_lock);
    for (int k = 0; k < GPU_POOL; k++)
        if (idle_engines[k] && idle_engines[k]->device == device) {
            gpu_engine_t *g = idle_engines[k];
            idle_engines[k] = NULL;
            pthread_mutex_unlock(&gpu_lock);
            return g;
        }
    pthread_mutex_unlock(&gpu_lock);
    gpu_engine_t *g = calloc(1, sizeof *g);
    if (!g) return snprintf(why, room, "no memory for a GPU worker"), NULL;
    g->device = device;
    gpu_result_t r = gpu_api.stream_create(&g->stream, GPU_NON_BLOCKING_STREAM);
    if (!r) r = gpu_api.event_create(&g->done, GPU_BLOCKING_SYNC_EVENT);
    if (r) {
        gpu_say(why, room, "creating a CUDA stream", r);
        gpu_engine_free(g);
        return NULL;
    }
    return g;
}

static void gpu_engine_give(gpu_engine_t *g) {
    if (!g) return;
    pthread_mutex_lock(&gpu_lock);
    for (int k = 0; k < GPU_POOL; k++)
        if (!idle_engines[k]) {
            idle_engines[k] = g;
            g = NULL;
            break;
        }
    pthread_mutex_unlock(&gpu_lock);
    if (g) gpu_engine_free(g);
}

/* Device memory of at least `need` bytes at *at (grown, never shrunk); a CUDA result. */
static gpu_result_t gpu_room(gpu_dptr_t *at, size_t *room, size_t need) {
    if (need <= *room) return 0;
    if (*at) {
        gpu_api.mem_free(*at);
        gpu_count(-(int64_t)*room);
    }
    *at = 0;
    *room = 0;
    size_t size = (need + (1 << 20) - 1) & ~(size_t)((1 << 20) - 1);
    gpu_result_t r = gpu_api.mem_alloc(at, size);
    if (!r) {
        *room = size;
        gpu_count((int64_t)size);
    }
    return r;
}

static uint8_t *gpu_host_alloc(size_t size, size_t *got) {
    pthread_mutex_lock(&gpu_lock);
    int best = -1;
    for (int k = 0; k < GPU_POOL; k++)
        if (idle_pinned[k].ptr && idle_pinned[k].size >= size &&
            (best < 0 || idle_pinned[k].size < idle_pinned[best].size))
            best = k;
    if (best >= 0) {
        uint8_t *p = idle_pinned[best].ptr;
        *got = idle_pinned[best].size;
        idle_pinned[best].ptr = NULL;
        pthread_mutex_unlock(&gpu_lock);
        return p;
    }
    pthread_mutex_unlock(&gpu_lock);
    void *p = NULL;
    size_t rounded = (size + (1 << 20) - 1) & ~(size_t)((1 << 20) - 1);
    if (gpu_api.host_alloc(&p, rounded ? rounded : 1 << 20, GPU_PORTABLE_PINNED)) return NULL;
    *got = rounded ? rounded : 1 << 20;
    return p;
}

static void gpu_host_free(uint8_t *ptr, size_t size) {
    if (!ptr) return;
    pthread_mutex_lock(&gpu_lock);
    int slot = -1;
    for (int k = 0; k < GPU_POOL && slot < 0; k++)
        if (!idle_pinned[k].ptr) slot = k;
    if (slot < 0) { /* the pool is full: keep the larger buffer */
        slot = 0;
        for (int k = 1; k < GPU_POOL; k++)
            if (idle_pinned[k].size < idle_pinned[slot].size) slot = k;
        if (idle_pinned[slot].size >= size) {
            pthread_mutex_unlock(&gpu_lock);
            gpu_api.host_free(ptr);
            return;
        }
        gpu_api.host_free(idle_pinned[slot].ptr);
    }
    idle_pinned[slot].ptr = ptr;
    idle_pinned[slot].size = size;
    pthread_mutex_unlock(&gpu_lock);
}

/* A worker's memory for a batch: `host` bytes of pinned chunk table (the table going up,
 * then what comes back), and device memory for a `table` of that many bytes and for `in`
 * and `out` bytes; each grown, never shrunk. 0, or -1 with why set. */
static int gpu_batch_room(gpu_engine_t *g, size_t host, size_t table, size_t in, size_t out, char *why, size_t room) {
    gpu_result_t r;
    if (g->host_room < host) {
        if (g->host_table) gpu_api.host_free(g->host_table);
        g->host_table = NULL;
        g->host_room = 0;
        if ((r = gpu_api.host_alloc((void **)&g->host_table, host * 2, GPU_PORTABLE_PINNED)))
            return gpu_say(why, room, "pinning the chunk table", r), -1;
        g->host_room = host * 2;
    }
    if ((r = gpu_room(&g->in, &g->in_room, in ? in : 16)) || (r = gpu_room(&g->out, &g->out_room, out ? out : 16)) ||
        (r = gpu_room(&g->table, &g->table_room, table ? table : 16)))
        return gpu_say(why, room, "allocating GPU memory", r), -1;
    return 0;
}

static int gpu_decode(gpu_engine_t *g, const gpu_batch_t *b, int64_t *bad, char *why, size_t room) {
    int64_t n = b->count;
    if (n <= 0) return 0;
    /* Up: per chunk (in bitstream order) its payload's address and size, its room, its
     * output's address; down: its decoded size and status. */
    size_t up = (size_t)n * 32, down = (size_t)n * 12;
    gpu_result_t r;
    if (gpu_batch_room(g, up + down, up + down, b->in_bytes, b->out_bytes, why, room)) return -1;
    int64_t *order = malloc((size_t)n * sizeof(int64_t));
    if (!order) return snprintf(why, room, "no memory for a batch's table"), -1;
    uint64_t *in_ptr = (uint64_t *)g->host_table, *in_size = in_ptr + n, *out_room = in_size + n, *out_ptr = out_room + n;
    int ids[2] = {b->ans_id, b->zstd_id};
    int64_t first[3] = {0, 0, 0}, largest[2] = {0, 0}, total[2] = {0, 0}, k = 0;
    for (int a = 0; a < 2; a++) {
        first[a] = k;
        for (int64_t c = 0; c < n; c++)
            if (b->codec[c] == ids[a]) {
                order[k] = c;
                in_ptr[k] = g->in + (uint64_t)b->in_at[c];
                in_size[k] = (uint64_t)b->in_size[c];
                out_room[k] = (uint64_t)b->out_size[c];
                out_ptr[k] = g->out + (uint64_t)b->out_at[c];
                if (b->out_size[c] > largest[a]) largest[a] = b->out_size[c];
                total[a] += b->out_size[c];
                k++;
            }
    }
    first[2] = k;
    if (k != n) {
        free(order);
        return snprintf(why, room, "a chunk of a bitstream the GPU engine does not decode"), -1;
    }
    nvcomp_ans_opts_t ans;
    nvcomp_zstd_opts_t zstd;
    memset(&ans, 0, sizeof ans);
    memset(&zstd, 0, sizeof zstd);
    ans.data_type = GPU_ANY_ANS_TYPE;
    size_t temp[2] = {0, 0};
    for (int a = 0; a < 2; a++) {
        size_t count = (size_t)(first[a + 1] - first[a]);
        if (!count) continue;
        r = a == 0 ? gpu_api.ans_temp(count, (size_t)largest[0], ans, &temp[0], (size_t)total[0], g->stream)
                   : gpu_api.zstd_temp(count, (size_t)largest[1], zstd, &temp[1], (size_t)total[1], g->stream);
        if (r) {
            free(order);
            return snprintf(why, room, "sizing nvCOMP's scratch memory failed (nvCOMP status %d)", r), -1;
        }
    }
    size_t scratch = temp[0] > temp[1] ? temp[0] : temp[1];
    if ((r = gpu_room(&g->temp, &g->temp_room, scratch ? scratch : 16))) {
        free(order);
        return gpu_say(why, room, "allocating GPU memory", r), -1;
    }
    const uint64_t dev_in_ptr = g->table, dev_in_size = dev_in_ptr + n * 8, dev_room = dev_in_size + n * 8,
                   dev_out_ptr = dev_room + n * 8, dev_sizes = dev_out_ptr + n * 8, dev_status = dev_sizes + n * 8;
    if ((r = gpu_api.to_device(g->in, b->in, b->in_bytes, g->stream)) ||
        (r = gpu_api.to_device(g->table, g->host_table, up, g->stream))) {
        free(order);
        return gpu_say(why, room, "copying a batch to the GPU", r), -1;
    }
    for (int a = 0; a < 2; a++) {
        int64_t at = first[a];
        size_t count = (size_t)(first[a + 1] - at);
        if (!count) continue;
        const void *const *ptrs = (const void *const *)(uintptr_t)(dev_in_ptr + at * 8);
        const size_t *sizes = (const size_t *)(uintptr_t)(dev_in_size + at * 8);
        const size_t *rooms = (const size_t *)(uintptr_t)(dev_room + at * 8);
        size_t *got = (size_t *)(uintptr_t)(dev_sizes + at * 8);
        void *const *outs = (void *const *)(uintptr_t)(dev_out_ptr + at * 8);
        gpu_result_t *status = (gpu_result_t *)(uintptr_t)(dev_status + at * 4);
        void *scratch_ptr = (void *)(uintptr_t)g->temp;
        r = a == 0 ? gpu_api.ans_decode(ptrs, sizes, rooms, got, count, scratch_ptr, temp[0], outs, ans, status, g->stream)
                   : gpu_api.zstd_decode(ptrs, sizes, rooms, got, count, scratch_ptr, temp[1], outs, zstd, status,
                                         g->stream);
        if (r) {
            free(order);
            return snprintf(why, room, "nvCOMP %s decompression failed (nvCOMP status %d)", a == 0 ? "ANS" : "Zstd", r),
                   -1;
        }
    }
    uint8_t *back = g->host_table + up;
    if ((r = gpu_api.to_host(b->out, g->out, b->out_bytes, g->stream)) ||
        (r = gpu_api.to_host(back, dev_sizes, down, g->stream)) || (r = gpu_api.event_record(g->done, g->stream)) ||
        (r = gpu_api.event_sync(g->done))) {
        free(order);
        return gpu_say(why, room, "decoding a batch on the GPU", r), -1;
    }
    const uint64_t *decoded = (const uint64_t *)back;
    const gpu_result_t *status = (const gpu_result_t *)(back + (size_t)n * 8);
    int result = 0;
    for (int64_t j = 0; j < n && !result; j++)
        if (status[j] != 0 || decoded[j] != out_room[j]) {
            *bad = order[j];
            result = 1;
        }
    free(order);
    return result;
}

/* ---------------------------------------------------------------- coding */

/* The options ckptz codes with (nvcomp_codecs.py's): ANS on bytes, Zstd's defaults. */
static nvcomp_ans_code_opts_t gpu_ans_code_opts(void) {
    nvcomp_ans_code_opts_t o;
    memset(&o, 0, sizeof o);
    o.data_type = 1; /* NVCOMP_TYPE_UCHAR */
    return o;
}

static nvcomp_zstd_code_opts_t gpu_zstd_code_opts(void) {
    nvcomp_zstd_code_opts_t o;
    memset(&o, 0, sizeof o);
    return o;
}

/* The power-of-two size class a chunk is coded in (nvcomp_codecs.py's _pow2_at_least). */
static int64_t gpu_size_class(int64_t size) {
    int64_t c = 1 << 16;
    while (c < size) c <<= 1;
    return c;
}

static int64_t gpu_code_bound(int zstd, int64_t size) {
    size_t bound = 0;
    size_t cls = (size_t)gpu_size_class(size);
    gpu_result_t r = zstd ? gpu_api.zstd_code_bound(cls, gpu_zstd_code_opts(), &bound)
                          : gpu_api.ans_code_bound(cls, gpu_ans_code_opts(), &bound);
    if (r) return 0;
    return (int64_t)((bound + 15) & ~(size_t)15);
}

/* Chunk order for a batch: by bitstream, then size class (one nvCOMP call each). */
typedef struct {
    int64_t chunk, cls;
    int zstd;
} gpu_code_row_t;

static int gpu_code_row_order(const void *a, const void *b) {
    const gpu_code_row_t *x = a, *y = b;
    if (x->zstd != y->zstd) return x->zstd - y->zstd;
    if (x->cls != y->cls) return x->cls < y->cls ? -1 : 1;
    return x->chunk < y->chunk ? -1 : x->chunk > y->chunk;
}

/* Queues the copy of the chunks' input to where it lies in the host buffer, in runs of
 * adjacent chunks (planes between them that are not coded here stay behind). */
static gpu_result_t gpu_upload(gpu_engine_t *g, const gpu_code_batch_t *b) {
    int64_t run_at = -1, run_end = -1;
    for (int64_t c = 0; c <= b->count; c++) {
        int64_t at = c < b->count ? b->in_at[c] : -1, end = c < b->count ? at + b->in_size[c] : -1;
        if (c < b->count && run_at >= 0 && at >= run_end && at <= ((run_end + 15) & ~(int64_t)15)) {
            run_end = end;
            continue;
        }
        gpu_result_t r = 0;
        if (run_at >= 0)
            r = gpu_api.to_device(g->in + (uint64_t)run_at, b->in + run_at, (size_t)(run_end - run_at), g->stream);
        if (r) return r;
        run_at = at, run_end = end;
    }
    return 0;
}

static int gpu_code(gpu_engine_t *g, const gpu_code_batch_t *b, char *why, size_t room) {
    int64_t n = b->count;
    if (n <= 0) return 0;
    size_t up = (size_t)n * 24, down = (size_t)n * 12;
    gpu_result_t r;
    if (gpu_batch_room(g, up + down, up + down, b->in_bytes, b->out_bytes, why, room)) return -1;
    gpu_code_row_t *rows = malloc((size_t)n * sizeof *rows);
    if (!rows) return snprintf(why, room, "no memory for a batch's table"), -1;
    for (int64_t c = 0; c < n; c++) {
        if (b->codec[c] != b->ans_id && b->codec[c] != b->zstd_id) {
            free(rows);
            return snprintf(why, room, "a chunk of a bitstream the GPU engine does not code"), -1;
        }
        rows[c] = (gpu_code_row_t){c, gpu_size_class(b->in_size[c]), b->codec[c] == b->zstd_id};
    }
    qsort(rows, (size_t)n, sizeof *rows, gpu_code_row_order);
    if ((r = gpu_upload(g, b))) {
        free(rows);
        return gpu_say(why, room, "copying a batch to the GPU", r), -1;
    }
    uint64_t *in_ptr = (uint64_t *)g->host_table, *in_size = in_ptr + n, *out_ptr = in_size + n;
    for (int64_t k = 0; k < n; k++) {
        int64_t c = rows[k].chunk;
        in_ptr[k] = g->in + (uint64_t)b->in_at[c];
        in_size[k] = (uint64_t)b->in_size[c];
        out_ptr[k] = g->out + (uint64_t)b->out_at[c];
    }
    const uint64_t dev_in_ptr = g->table, dev_in_size = dev_in_ptr + n * 8, dev_out_ptr = dev_in_size + n * 8,
                   dev_sizes = dev_out_ptr + n * 8, dev_status = dev_sizes + n * 8;
    if ((r = gpu_api.to_device(g->table, g->host_table, up, g->stream))) {
        free(rows);
        return gpu_say(why, room, "copying a batch to the GPU", r), -1;
    }
    /* nvCOMP leaves some bytes of a payload unwritten (padding); zeroed first, they are the
     * same in every run, whatever the memory held before. */
    if ((r = gpu_api.zero(g->out, 0, b->out_bytes, g->stream))) {
        free(rows);
        return gpu_say(why, room, "clearing a batch's output on the GPU", r), -1;
    }
    nvcomp_ans_code_opts_t ans = gpu_ans_code_opts();
    nvcomp_zstd_code_opts_t zstd = gpu_zstd_code_opts();
    /* One call per bitstream and size class, all on the stream, sharing the scratch memory. */
    for (int64_t first = 0; first < n;) {
        int64_t last = first, total = 0;
        while (last < n && rows[last].zstd == rows[first].zstd && rows[last].cls == rows[first].cls)
            total += b->in_size[rows[last++].chunk];
        size_t count = (size_t)(last - first), cls = (size_t)rows[first].cls, temp = 0;
        r = rows[first].zstd ? gpu_api.zstd_code_temp(count, cls, zstd, &temp, (size_t)total, g->stream)
                             : gpu_api.ans_code_temp(count, cls, ans, &temp, (size_t)total, g->stream);
        if (!r && (r = gpu_room(&g->temp, &g->temp_room, temp ? temp : 16))) {
            free(rows);
            return gpu_say(why, room, "allocating GPU memory", r), -1;
        }
        if (!r) {
            const void *const *ptrs = (const void *const *)(uintptr_t)(dev_in_ptr + first * 8);
            const size_t *sizes = (const size_t *)(uintptr_t)(dev_in_size + first * 8);
            void *const *outs = (void *const *)(uintptr_t)(dev_out_ptr + first * 8);
            size_t *got = (size_t *)(uintptr_t)(dev_sizes + first * 8);
            gpu_result_t *status = (gpu_result_t *)(uintptr_t)(dev_status + first * 4);
            void *scratch = (void *)(uintptr_t)g->temp;
            r = rows[first].zstd ? gpu_api.zstd_code(ptrs, sizes, cls, count, scratch, temp, outs, got, zstd, status,
                                                     g->stream)
                                 : gpu_api.ans_code(ptrs, sizes, cls, count, scratch, temp, outs, got, ans, status,
                                                    g->stream);
        }
        if (r) {
            snprintf(why, room, "nvCOMP %s compression failed (nvCOMP status %d)", rows[first].zstd ? "Zstd" : "ANS", r);
            free(rows);
            return -1;
        }
        first = last;
    }
    uint8_t *back = g->host_table + up;
    if ((r = gpu_api.to_host(back, dev_sizes, down, g->stream)) || (r = gpu_api.event_record(g->done, g->stream)) ||
        (r = gpu_api.event_sync(g->done))) {
        free(rows);
        return gpu_say(why, room, "coding a batch on the GPU", r), -1;
    }
    const uint64_t *coded = (const uint64_t *)back;
    const gpu_result_t *status = (const gpu_result_t *)(back + (size_t)n * 8);
    int result = 0;
    for (int64_t k = 0; k < n && !result; k++) {
        int64_t c = rows[k].chunk;
        if (status[k] != 0) {
            snprintf(why, room, "nvCOMP could not code a chunk (nvCOMP status %d)", status[k]);
            result = -1;
            break;
        }
        b->out_size[c] = (int64_t)coded[k];
        /* Only a payload smaller than its input is kept; the others are stored raw. */
        if (b->out_size[c] < b->in_size[c] &&
            (r = gpu_api.to_host(b->out + b->out_at[c], g->out + (uint64_t)b->out_at[c], (size_t)coded[k], g->stream))) {
            gpu_say(why, room, "copying a batch from the GPU", r);
            result = -1;
        }
    }
    /* Waited for even after a failure: copies queued before it still write to the batch. */
    if (((r = gpu_api.event_record(g->done, g->stream)) || (r = gpu_api.event_sync(g->done))) && !result) {
        gpu_say(why, room, "coding a batch on the GPU", r);
        result = -1;
    }
    free(rows);
    return result;
}

/* ---------------------------------------------------------------- the portable bitstream */

static int gpu_kernels(int device, const uint8_t *image, char *why, size_t room) {
    int result = 0;
    pthread_mutex_lock(&gpu_lock);
    if (!gpu_api.kernels[device][0]) {
        void *module = NULL;
        gpu_result_t r = gpu_api.module_load(&module, image);
        if (r) {
            gpu_say(why, room, "loading ckptz's CUDA kernels", r);
            result = -1;
        }
        for (int k = 0; k < GPU_KERNELS && !result; k++)
            if ((r = gpu_api.function(&gpu_api.kernels[device][k], module, gpu_kernel_names[k]))) {
                gpu_say(why, room, gpu_kernel_names[k], r);
                result = -1;
            }
        if (result) memset(gpu_api.kernels[device], 0, sizeof gpu_api.kernels[device]);
    }
    pthread_mutex_unlock(&gpu_lock);
    return result;
}

/* Queues kernel k on the worker's stream: a grid of x by y blocks of GPU_THREADS threads. */
static gpu_result_t gpu_launch(gpu_engine_t *g, int k, unsigned x, unsigned y, void **args) {
    return gpu_api.launch(gpu_api.kernels[g->device][k], x, y, 1, GPU_THREADS, 1, 1, 0, g->stream, args, NULL);
}

static int gpu_write_literals(gpu_engine_t *g, const gpu_code_batch_t *b, const gpu_literals_t *lit, char *why,
                              size_t room) {
    if (b->count <= 0) return 0;
    size_t plan_bytes = (size_t)lit->rows * GPU_PLAN_FIELDS * 8, pack_bytes = (size_t)lit->packs * 32;
    size_t tables_at = (plan_bytes + 255) & ~(size_t)255, blob_at = (tables_at + lit->tables_bytes + 255) & ~(size_t)255,
           packs_at = (blob_at + lit->blob_bytes + 255) & ~(size_t)255, total = packs_at + pack_bytes + 16;
    gpu_result_t r;
    if (gpu_batch_room(g, 0, total, b->in_bytes, b->out_bytes, why, room)) return -1;
    if ((r = gpu_upload(g, b)) || (plan_bytes && (r = gpu_api.to_device(g->table, lit->plan, plan_bytes, g->stream))) ||
        (lit->tables_bytes && (r = gpu_api.to_device(g->table + tables_at, lit->tables, lit->tables_bytes, g->stream))) ||
        (lit->blob_bytes && (r = gpu_api.to_device(g->table + blob_at, lit->blob, lit->blob_bytes, g->stream))) ||
        (pack_bytes && (r = gpu_api.to_device(g->table + packs_at, lit->pack_rows, pack_bytes, g->stream))))
        return gpu_say(why, room, "copying a batch to the GPU", r), -1;
    gpu_dptr_t src = g->in, dst = g->out, plan = g->table, tables = g->table + tables_at, blob = g->table + blob_at;
    if (lit->rows) {
        void *args[] = {&src, &dst, &plan, &tables, &blob};
        if ((r = gpu_launch(g, GPU_LITERALS_ENCODE, (unsigned)lit->rows, 1, args)))
            return gpu_say(why, room, "writing literal blocks on the GPU", r), -1;
    }
    for (int64_t first = 0; first < lit->packs; first += GPU_MAX_Y) {
        int64_t count = lit->packs - first < GPU_MAX_Y ? lit->packs - first : GPU_MAX_Y;
        gpu_dptr_t rows = g->table + packs_at + (uint64_t)first * 32;
        unsigned groups = (unsigned)((lit->largest_pack + 7) / 8), x = (groups + GPU_THREADS - 1) / GPU_THREADS;
        void *args[] = {&src, &dst, &rows};
        if ((r = gpu_launch(g, GPU_BITPACK_ENCODE, x < 1 ? 1 : x > 1024 ? 1024 : x, (unsigned)count, args)))
            return gpu_say(why, room, "bit-packing on the GPU", r), -1;
    }
    int result = 0;
    for (int64_t c = 0; c < b->count && !result; c++)
        if ((r = gpu_api.to_host(b->out + b->out_at[c], g->out + (uint64_t)b->out_at[c], (size_t)b->out_size[c],
                                 g->stream))) {
            gpu_say(why, room, "copying a batch from the GPU", r);
            result = -1;
        }
    /* Waited for even after a failure: copies queued before it still write to the batch. */
    if (((r = gpu_api.event_record(g->done, g->stream)) || (r = gpu_api.event_sync(g->done))) && !result) {
        gpu_say(why, room, "writing literal blocks on the GPU", r);
        result = -1;
    }
    return result;
}
