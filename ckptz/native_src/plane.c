/*
 * The restore data plane: one call restores a whole file from its container on a pool of
 * native threads, with every check docs/FORMAT.md promises, and no Python per frame.
 *
 * Python plans (ckptz/pipeline/native_restore.py): a table of frames, of their chunks and
 * of their pieces in the file. Each thread takes the next frame, preads its payloads with
 * their padding, checks the padding and every payload's checksum, decodes the planes
 * (frame.c's bitstreams; a zstd frame with LZ sequences through the system's libzstd,
 * loaded at first use), merges the words, checks the frame's checksum, and then for each
 * piece writes it at its file offset (or into memory holding the whole file, or compares it
 * with a file's bytes there, or keeps nothing) and hashes the digest's leaves that it completes. Progress is a counter Python
 * polls; a stop flag Python sets ends the threads between frames. The first failure stops
 * every thread and is reported as (kind, frame, detail) for Python to word. A series delta's
 * frames are undone (delta_plane.c) once their checksum holds, before their pieces are put.
 */
#include "native.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

/* What stopped a restore (ckptz/pipeline/native_restore.py names each). */
enum {
    PLANE_OK = 0,
    PLANE_TRUNCATED = 1,   /* the container ends inside a chunk (detail: chunk) */
    PLANE_PADDING = 2,     /* nonzero padding after a chunk (detail: chunk) */
    PLANE_PAYLOAD = 3,     /* a payload fails its checksum (detail: chunk) */
    PLANE_DECODE = 4,      /* a frame does not decode here */
    PLANE_FRAME = 5,       /* decoded bytes fail the frame's checksum */
    PLANE_READ = 6,        /* reading the container failed (detail: errno) */
    PLANE_WRITE = 7,       /* writing the output failed (detail: errno) */
    PLANE_DIFFERS = 8,     /* the checked file differs (detail: its offset) */
    PLANE_STOPPED = 9,     /* the stop flag was set */
    PLANE_NOMEM = 10,      /* a buffer could not be allocated */
    PLANE_CHECK_READ = 11, /* reading the checked file failed (detail: errno) */
    PLANE_GPU = 12,        /* the GPU engine failed (its message in the plan's gpu_why) */
};

/* Columns of the plan's tables (int64 rows). */
enum { FR_CHUNK, FR_WORD, FR_ROTATE, FR_LENGTH, FR_CHECKSUM, FR_PIECE, FR_PIECES, FR_COLS };
enum { CH_OFFSET, CH_SIZE, CH_CODEC, CH_RAW, CH_CHECKSUM, CH_COLS };
enum { PC_AT, PC_WITHIN, PC_SIZE, PC_COLS };

#define PLANE_ALIGN 16 /* container.py's ALIGN: payloads are padded to it with zeros */

/* The restore plane's steps, as its threads' clocks count them (stage_clock_t): reading
 * payloads, checking their padding and checksums, decoding planes, merging words, the
 * frame's checksum and the leaves it holds, undoing a delta, putting pieces into memory,
 * writing them, comparing them with a file, the leaves they straddle, a GPU worker's batch,
 * waiting for a batch, and the rest (taking frames, the loop). */
enum { RS_READ, RS_CHECK, RS_DECODE, RS_MERGE, RS_HASH, RS_DELTA, RS_PUT, RS_WRITE, RS_COMPARE, RS_LEAVES,
       RS_GPU, RS_WAIT, RS_OTHER, RS_COUNT };
static const char *const restore_stage_names[RS_COUNT] = {
    "read", "check", "decode", "merge", "hash", "delta", "put", "write", "compare", "leaves", "gpu", "wait", "other"};
_Static_assert(RS_COUNT <= STAGE_MAX, "restore stages");

/* ---------------------------------------------------------------- libzstd, at run time */

/* The few functions of libzstd's stable ABI that a zstd frame with sequences needs; loaded
 * once, so that the extension builds without zstd's headers and imports without the library. */
typedef struct {
    void *(*create)(void);
    size_t (*free_ctx)(void *);
    size_t (*decompress)(void *, void *, size_t, const void *, size_t);
    unsigned (*is_error)(size_t);
    unsigned long long (*content_size)(const void *, size_t);
    int loaded;
} zstd_api_t;

static zstd_api_t zstd_api;
static pthread_once_t zstd_once = PTHREAD_ONCE_INIT;

static void zstd_load(void) {
    void *lib = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    zstd_api.create = (void *(*)(void))dlsym(lib, "ZSTD_createDCtx");
    zstd_api.free_ctx = (size_t(*)(void *))dlsym(lib, "ZSTD_freeDCtx");
    zstd_api.decompress = (size_t(*)(void *, void *, size_t, const void *, size_t))dlsym(lib, "ZSTD_decompressDCtx");
    zstd_api.is_error = (unsigned (*)(size_t))dlsym(lib, "ZSTD_isError");
    zstd_api.content_size = (unsigned long long (*)(const void *, size_t))dlsym(lib, "ZSTD_getFrameContentSize");
    zstd_api.loaded = zstd_api.create && zstd_api.free_ctx && zstd_api.decompress && zstd_api.is_error &&
                      zstd_api.content_size;
}

static int zstd_available(void) {
    pthread_once(&zstd_once, zstd_load);
    return zstd_api.loaded;
}

/* ---------------------------------------------------------------- zlib, at run time */

/* Older containers' deflate planes, which only this plane inflates (frame.c's decode_frame
 * leaves them to Python), through the system's zlib, loaded like libzstd. */
enum { CODEC_DEFLATE = 5 };

/* zlib's z_stream, whose layout its ABI has kept since 1.0. */
typedef struct {
    const uint8_t *next_in;
    unsigned avail_in;
    unsigned long total_in;
    uint8_t *next_out;
    unsigned avail_out;
    unsigned long total_out;
    const char *msg;
    void *state, *zalloc, *zfree, *opaque;
    int data_type;
    unsigned long adler, reserved;
} zlib_stream_t;

static struct {
    int (*init)(zlib_stream_t *, int, const char *, int);
    int (*inflate)(zlib_stream_t *, int);
    int (*end)(zlib_stream_t *);
    const char *(*version)(void);
    int loaded;
} zlib_api;
static pthread_once_t zlib_once = PTHREAD_ONCE_INIT;

static void zlib_load(void) {
    void *lib = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    zlib_api.init = (int (*)(zlib_stream_t *, int, const char *, int))dlsym(lib, "inflateInit2_");
    zlib_api.inflate = (int (*)(zlib_stream_t *, int))dlsym(lib, "inflate");
    zlib_api.end = (int (*)(zlib_stream_t *))dlsym(lib, "inflateEnd");
    zlib_api.version = (const char *(*)(void))dlsym(lib, "zlibVersion");
    zlib_api.loaded = zlib_api.init && zlib_api.inflate && zlib_api.end && zlib_api.version;
}

/* Inflates a raw deflate stream (codecs/deflate.py's payload) that must give exactly n
 * bytes and end; 0 where it does not, or where zlib is not found (Python decodes it then). */
static int deflate_decode(const uint8_t *in, size_t len, uint8_t *into, size_t n) {
    enum { Z_FINISH = 4, Z_STREAM_END = 1, RAW_WINDOW = -15 };
    pthread_once(&zlib_once, zlib_load);
    if (!zlib_api.loaded || len > 0xFFFFFFFFu || n > 0xFFFFFFFFu) return 0;
    uint8_t spare; /* an empty plane's stream must still end: somewhere to write nothing */
    zlib_stream_t z;
    memset(&z, 0, sizeof z);
    if (zlib_api.init(&z, RAW_WINDOW, zlib_api.version(), (int)sizeof z)) return 0;
    z.next_in = in;
    z.avail_in = (unsigned)len;
    z.next_out = n ? into : &spare;
    z.avail_out = n ? (unsigned)n : 1;
    int status = zlib_api.inflate(&z, Z_FINISH);
    int ok = status == Z_STREAM_END && z.total_out == n;
    zlib_api.end(&z);
    return ok;
}

/* ---------------------------------------------------------------- the plan and its state */

typedef struct {
    int container, output, checked; /* descriptors; output and checked -1 where unused */
    uint8_t *memory;                /* the whole file's bytes go here too, where not NULL */
    const int64_t *frames, *chunks, *pieces;
    int64_t frame_count, chunk_count, piece_count, source_size, leaf;
    uint64_t *leaf_hashes; /* leaf_count(source_size, leaf) of them; none where leaf is 0 */
    int64_t leaf_count;
    struct leaf_stream **leaf_streams; /* the leaves that straddle pieces, while their parts come */
    pthread_mutex_t leaf_lock;         /* guards leaf_streams */
    volatile int64_t *progress;
    volatile uint8_t *stop;
    size_t payload_room, frame_room; /* per-thread buffer sizes: the largest frame's */
    int64_t next;                    /* the next frame to take */
    int failed;
    pthread_mutex_t error_lock;
    int64_t error[3]; /* kind, frame, detail */
    /* Decoding on a GPU (plane_gpu.c), where gpu is set: chunks of the bitstreams nvCOMP
     * decodes go to the GPU in batches of about gpu_batch bytes. */
    int gpu, gpu_device, gpu_workers, gpu_ans, gpu_zstd;
    int64_t gpu_batch;
    const char *gpu_library; /* nvCOMP's shared library */
    int64_t *gpu_stats;      /* batches, chunks and payload bytes decoded on the GPU */
    char *gpu_why;           /* why the GPU engine failed */
    size_t gpu_why_room;
    struct delta *delta; /* a series delta the frames were coded through (delta_plane.c), or NULL */
    /* Where window_end > 0, only bytes [window_start, window_end) of the file are restored,
     * into memory from its start (a restore in file order, a window at a time): each frame
     * is decoded whole, as its checks and its delta need, and its pieces clipped. */
    int64_t window_start, window_end;
    int64_t *stages, stage_rows; /* where each thread's clock is reported (STAGE_COLS a row), or NULL */
} restore_plan_t;

typedef struct {
    restore_plan_t *plan;
    uint8_t *payloads, *room, *out, *check, *groups;
    dtable_t *dt;
    void *zstd;
    struct delta_scratch *delta; /* this thread's room for the plan's delta */
    stage_clock_t clock;
} worker_t;

/* delta_plane.c, which reads a reference container through this file's workers. */
static struct delta_scratch *delta_scratch_new(struct delta *d, size_t frame_room);
static void delta_scratch_free(struct delta_scratch *s);
static int delta_touches(const struct delta *d, const int64_t *pc, int64_t count);
static int delta_apply(struct delta_scratch *s, const int64_t *pc, int64_t count, int64_t length, uint8_t *data,
                       int forward, int64_t *detail);

/* Keep a native call's first failure for Python to word: later ones follow from it. */
static void keep_first_failure(pthread_mutex_t *lock, int *failed, int64_t *error, int kind, int64_t frame,
                               int64_t detail) {
    pthread_mutex_lock(lock);
    if (!*failed) {
        error[0] = kind;
        error[1] = frame;
        error[2] = detail;
        __atomic_store_n(failed, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(lock);
}

static void plane_fail(restore_plan_t *p, int kind, int64_t frame, int64_t detail) {
    keep_first_failure(&p->error_lock, &p->failed, p->error, kind, frame, detail);
}

/* Writes at least this large ask the kernel to start their writeback at once (safeio.py's
 * WRITEBACK_MIN): else the whole file is written back inside the fsync before its rename. */
#define PLANE_WRITEBACK_MIN (256 << 10)

/* Buffers from this size up are mapped on their own, in huge pages where the kernel offers
 * them (MADV_HUGEPAGE): a plane's frame buffers are new to each call, and in 4 KiB pages
 * every thread faults each of them in a page at a time, on every call. */
#define PLANE_HUGE ((size_t)2 << 20)

static size_t plane_buffer_room(size_t size) { return (size + PLANE_HUGE - 1) / PLANE_HUGE * PLANE_HUGE; }

/* A buffer of `size` bytes for a plane's frames (free it with plane_buffer_free and the same
 * size), or NULL. */
static void *plane_buffer(size_t size) {
    if (size < PLANE_HUGE) return malloc(size ? size : 1);
    size_t room = plane_buffer_room(size), mapped = room + PLANE_HUGE;
    uint8_t *map = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return NULL;
    /* Huge pages need 2 MiB-aligned addresses: keep the aligned room, give back the rest. */
    uint8_t *at = (uint8_t *)(((uintptr_t)map + PLANE_HUGE - 1) & ~(uintptr_t)(PLANE_HUGE - 1));
    if (at > map) munmap(map, (size_t)(at - map));
    if (map + mapped > at + room) munmap(at + room, (size_t)(map + mapped - (at + room)));
#ifdef MADV_HUGEPAGE
    madvise(at, room, MADV_HUGEPAGE);
#endif
    return at;
}

static void plane_buffer_free(void *buffer, size_t size) {
    if (size < PLANE_HUGE) free(buffer);
    else if (buffer) munmap(buffer, plane_buffer_room(size));
}

static int plane_pwrite(int fd, const uint8_t *src, int64_t n, int64_t at) {
    int64_t put = 0;
    while (put < n) {
        ssize_t k = pwrite(fd, src + put, (size_t)(n - put), (off_t)(at + put));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return errno;
        if (k == 0) return EIO;
        put += k;
    }
#ifdef POSIX_FADV_DONTNEED
    if (n >= PLANE_WRITEBACK_MIN) posix_fadvise(fd, (off_t)at, (off_t)n, POSIX_FADV_DONTNEED);
#endif
    return 0;
}

/* Decodes one plane of n bytes into `into` (or points *plane at its bytes); 0 if it does not
 * decode here. `ctx` is the frame's top plane, decoded already, for a huffexp plane (NULL
 * where the plane is the top one, which then must not be huffexp). */
static int plane_decode_one(worker_t *w, const uint8_t *in, size_t len, int codec, size_t n, uint8_t *into,
                            plane_t *plane, const uint8_t *ctx) {
    chunk_t chunk = {codec, in, len};
    if (codec == CODEC_ZSTD) {
        plane->bytes = into;
        plane->value = 0;
        if (literals_frame(in, len, NULL, n, w->dt, 0)) return literals_frame(in, len, into, n, w->dt, 1);
        if (!zstd_available()) return 0;
        if (!w->zstd && !(w->zstd = zstd_api.create())) return 0;
        unsigned long long declared = zstd_api.content_size(in, len);
        if (declared == 0ULL - 2 || (declared != 0ULL - 1 && declared != n)) return 0;
        size_t got = zstd_api.decompress(w->zstd, into, n, in, len);
        return !zstd_api.is_error(got) && got == n;
    }
    if (codec == CODEC_DEFLATE) {
        plane->bytes = into;
        plane->value = 0;
        return deflate_decode(in, len, into, n);
    }
    if (codec != CODEC_RAW && codec != CODEC_CONST && codec != CODEC_BITPACK && codec != CODEC_HUFF1 &&
        codec != CODEC_HUFF2D && codec != CODEC_SIGN2D && codec != CODEC_HUFFEXP)
        return 0;
    if (!frame_chunk_usable(&chunk, n, n, into, plane)) return 0;
    if (codec == CODEC_HUFF1 || codec == CODEC_HUFF2D || codec == CODEC_SIGN2D || codec == CODEC_HUFFEXP) {
        /* Scratch for its groups, the first time such a plane comes (a room of a frame). */
        if (!w->groups && !(w->groups = malloc(w->plan->frame_room ? w->plan->frame_room : 1))) return 0;
        if (codec == CODEC_SIGN2D) return sign2d_decode(in, len, into, n, w->groups, w->dt);
        if (codec == CODEC_HUFFEXP)
            return ctx && order1_usable(in, len, n, w->dt) && huffexp_decode(in, len, into, n, ctx, w->groups, w->dt);
        if (codec == CODEC_HUFF2D)
            return order2d_usable(in, len, n, w->dt) && order2d_decode(in, len, into, n, w->groups, w->dt);
        return order1_usable(in, len, n, w->dt) && order1_decode(in, len, into, n, w->groups, w->dt);
    }
    if (codec == CODEC_BITPACK) {
        int bits[8], count = varying_list(in[0], bits);
        unpack_rows(in + 2, (n + 7) / 8, bits, count, in[1], into, n);
    }
    return 1;
}

/* A part of a straddling leaf that came before the bytes ahead of it: a copy, in a list by
 * offset in the leaf. */
typedef struct leaf_part {
    struct leaf_part *next;
    int64_t lo, hi;
    uint8_t bytes[];
} leaf_part_t;

/* A leaf that straddles pieces, while its parts come from the frames that hold them. Its
 * bytes are streamed into its hash in file order, and only a part that comes before the
 * bytes ahead of it waits as a copy: frames come roughly in file order, so most parts are
 * hashed where they lie, and the leaves a first frame of headers opens (one per tensor)
 * hold a header's bytes each, not a leaf's. */
typedef struct leaf_stream {
    XXH3_state_t state;
    pthread_mutex_t lock;   /* guards the state, streamed and waiting */
    int64_t streamed, size; /* bytes hashed so far from the leaf's start; the leaf's bytes */
    leaf_part_t *waiting;
    int users, hashed; /* under leaf_lock: threads giving parts now; whether it is out of the table */
} leaf_stream_t;

static void leaf_stream_free(leaf_stream_t *s) {
    while (s->waiting) {
        leaf_part_t *part = s->waiting;
        s->waiting = part->next;
        free(part);
    }
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* The straddling leaves' table, before a run. */
static int leaf_streams_init(restore_plan_t *p) {
    p->leaf_streams = p->leaf_count ? calloc((size_t)p->leaf_count, sizeof(leaf_stream_t *)) : NULL;
    return !p->leaf_count || p->leaf_streams;
}

/* Frees what is left of the straddling leaves after a run (leaves a failure left open). */
static void leaf_streams_free(restore_plan_t *p) {
    if (p->leaf_streams)
        for (int64_t k = 0; k < p->leaf_count; k++)
            if (p->leaf_streams[k]) leaf_stream_free(p->leaf_streams[k]);
    free(p->leaf_streams);
    p->leaf_streams = NULL;
}

/* Gives bytes [lo, hi) of a straddling leaf (offsets in the leaf) with its lock held: hashes
 * them if they come next, and the waiting parts they let through, else keeps a copy. A part
 * that overlaps bytes already given (only a hostile plan's pieces overlap) is dropped, and
 * the digest's check finds the leaf's hash wrong. 0 where no memory was left for a copy. */
static int leaf_stream_give(leaf_stream_t *s, const uint8_t *bytes, int64_t lo, int64_t hi) {
    if (lo == s->streamed) {
        CKPTZ_XXH3_64_UPDATE(&s->state, bytes, (size_t)(hi - lo));
        s->streamed = hi;
        while (s->waiting && s->waiting->lo == s->streamed) {
            leaf_part_t *part = s->waiting;
            CKPTZ_XXH3_64_UPDATE(&s->state, part->bytes, (size_t)(part->hi - part->lo));
            s->streamed = part->hi;
            s->waiting = part->next;
            free(part);
        }
        return 1;
    }
    if (lo < s->streamed) return 1;
    leaf_part_t **at = &s->waiting;
    while (*at && (*at)->hi <= lo) at = &(*at)->next;
    if (*at && (*at)->lo < hi) return 1;
    leaf_part_t *part = malloc(sizeof *part + (size_t)(hi - lo));
    if (!part) return 0;
    part->lo = lo;
    part->hi = hi;
    part->next = *at;
    memcpy(part->bytes, bytes, (size_t)(hi - lo));
    *at = part;
    return 1;
}

/* Hashes the digest's leaves that piece [at, at + n) of the file (its bytes at `bytes`)
 * holds whole, and gives its part of those it straddles; a straddling leaf is hashed by the
 * threads that give its parts, in file order (leaf_stream_t). */
static int plane_leaves(restore_plan_t *p, const uint8_t *bytes, int64_t at, int64_t n, int whole_hashed) {
    if (!p->leaf || n <= 0) return 1;
    int64_t L = p->leaf, end = at + n;
    for (int64_t k = at / L; k <= (end - 1) / L && k < p->leaf_count; k++) {
        int64_t lo = k * L, hi = lo + L < p->source_size ? lo + L : p->source_size;
        int64_t a = at > lo ? at : lo, b = end < hi ? end : hi;
        if (a == lo && b == hi) {
            if (!whole_hashed) p->leaf_hashes[k] = CKPTZ_XXH3_64(bytes + (a - at), (size_t)(hi - lo));
            continue;
        }
        pthread_mutex_lock(&p->leaf_lock);
        leaf_stream_t *s = p->leaf_streams[k];
        void *room = NULL;
        if (!s && !posix_memalign(&room, 64, sizeof *s)) { /* XXH3_state_t wants 64-byte alignment */
            s = room;
            memset(s, 0, sizeof *s);
            XXH3_64bits_reset(&s->state);
            pthread_mutex_init(&s->lock, NULL);
            s->size = hi - lo;
            p->leaf_streams[k] = s;
        }
        if (s) s->users++;
        pthread_mutex_unlock(&p->leaf_lock);
        if (!s) return 0;
        pthread_mutex_lock(&s->lock);
        int64_t before = s->streamed;
        int ok = leaf_stream_give(s, bytes + (a - at), a - lo, b - lo);
        /* The part that completes the leaf hashes it; no later part changes the state. */
        int complete = before < s->size && s->streamed == s->size;
        if (complete) p->leaf_hashes[k] = XXH3_64bits_digest(&s->state);
        pthread_mutex_unlock(&s->lock);
        pthread_mutex_lock(&p->leaf_lock);
        if (complete) {
            p->leaf_streams[k] = NULL;
            s->hashed = 1;
        }
        int last = --s->users == 0 && s->hashed;
        pthread_mutex_unlock(&p->leaf_lock);
        if (last) leaf_stream_free(s);
        if (!ok) return 0;
    }
    return 1;
}

/* The xxh3_64 of a decoded frame (`length` bytes at `out`), and of the digest's leaves lying
 * whole inside its pieces into the plan's leaf hashes, in one pass over memory: each leaf is
 * hashed and then streamed into the frame's state while its bytes are in this core's cache
 * (hash.c's hash_nested). Sets *fused to 0, hashing only the frame, where its pieces do not
 * come in frame order (then plane_leaves hashes the leaves). */
static uint64_t plane_frame_hash(restore_plan_t *p, const int64_t *f, const uint8_t *out, int *fused) {
    XXH3_state_t state;
    int64_t length = f[FR_LENGTH], pos = 0, L = p->leaf;
    const int64_t *pc = p->pieces + f[FR_PIECE] * PC_COLS;
    *fused = L > 0;
    for (int64_t j = 0; *fused && j < f[FR_PIECES]; j++)
        if (j && pc[j * PC_COLS + PC_WITHIN] < pc[(j - 1) * PC_COLS + PC_WITHIN] + pc[(j - 1) * PC_COLS + PC_SIZE])
            *fused = 0;
    if (!*fused) return CKPTZ_XXH3_64(out, (size_t)length);
    XXH3_64bits_reset(&state);
    for (int64_t j = 0; j < f[FR_PIECES]; j++, pc += PC_COLS) {
        int64_t at = pc[PC_AT], within = pc[PC_WITHIN], end = at + pc[PC_SIZE];
        for (int64_t k = (at + L - 1) / L; k < p->leaf_count; k++) {
            int64_t lo = k * L, hi = lo + L < p->source_size ? lo + L : p->source_size;
            if (hi > end) break;
            int64_t s = within + (lo - at);
            if (s > pos) CKPTZ_XXH3_64_UPDATE(&state, out + pos, (size_t)(s - pos));
            p->leaf_hashes[k] = CKPTZ_XXH3_64(out + s, (size_t)(hi - lo));
            CKPTZ_XXH3_64_UPDATE(&state, out + s, (size_t)(hi - lo));
            pos = s + (hi - lo);
        }
    }
    if (length > pos) CKPTZ_XXH3_64_UPDATE(&state, out + pos, (size_t)(length - pos));
    return XXH3_64bits_digest(&state);
}

/* The offset of the first byte where the checked file differs from piece [at, at + n)
 * (its bytes at `bytes`), or -1; a read that stops early differs where it stops. */
static int64_t plane_compare(worker_t *w, const uint8_t *bytes, int64_t at, int64_t n, int *error) {
    int64_t got = pread_fully(w->plan->checked, (char *)w->check, n, at, error);
    if (*error) return -1;
    for (int64_t i = 0; i < got; i++)
        if (w->check[i] != bytes[i]) return at + i;
    return got < n ? at + got : -1;
}

/* Reads each payload k of frame i to dst[k] (with its padding) and checks the padding and
 * the payload's checksum (timed on `clock`, or NULL). 1 if they hold, else 0 with the
 * failure recorded. */
static int plane_read(restore_plan_t *p, int64_t i, uint8_t *const *dst, stage_clock_t *clock) {
    const int64_t *f = p->frames + i * FR_COLS;
    const int64_t *c = p->chunks + f[FR_CHUNK] * CH_COLS;
    for (int k = 0; k < (int)f[FR_WORD]; k++) {
        const int64_t *ck = c + k * CH_COLS;
        int64_t size = ck[CH_SIZE], padded = size + (-size & (PLANE_ALIGN - 1));
        int error = 0;
        uint8_t *at = dst[k];
        int64_t got = pread_fully(p->container, (char *)at, padded, ck[CH_OFFSET], &error);
        stage_mark(clock, RS_READ);
        if (error) return plane_fail(p, PLANE_READ, i, error), 0;
        if (got != padded) return plane_fail(p, PLANE_TRUNCATED, i, f[FR_CHUNK] + k), 0;
        for (int64_t j = size; j < padded; j++)
            if (at[j]) return plane_fail(p, PLANE_PADDING, i, f[FR_CHUNK] + k), 0;
        int sound = CKPTZ_XXH3_64(at, (size_t)size) == (uint64_t)ck[CH_CHECKSUM];
        stage_mark(clock, RS_CHECK);
        if (!sound) return plane_fail(p, PLANE_PAYLOAD, i, f[FR_CHUNK] + k), 0;
    }
    return 1;
}

/* Decodes frame i's planes from its checked payloads (or takes plane k from decoded[k],
 * where the GPU decoded it) and merges its words into the worker's out: 1 if it decodes
 * here, else 0 with the failure recorded. */
static int plane_decode(worker_t *w, int64_t i, const uint8_t *const *payload, const uint8_t *const *decoded) {
    restore_plan_t *p = w->plan;
    const int64_t *f = p->frames + i * FR_COLS;
    int word = (int)f[FR_WORD], rotate = (int)f[FR_ROTATE];
    const int64_t *c = p->chunks + f[FR_CHUNK] * CH_COLS;
    size_t n = (size_t)c[CH_RAW];
    int ok = (int64_t)n * word == f[FR_LENGTH];
    plane_t planes[8];
    /* The top plane first: a huffexp plane's contexts are its bytes. */
    for (int k = word - 1; ok && k >= 0; k--) {
        const int64_t *ck = c + k * CH_COLS;
        uint8_t *into = word == 1 ? w->out : w->room + (size_t)k * n;
        ok = ck[CH_RAW] == (int64_t)n;
        if (ok && decoded && decoded[k]) {
            planes[k].bytes = decoded[k];
            planes[k].value = 0;
        } else if (ok) {
            const uint8_t *ctx = NULL;
            if (k + 1 < word && ck[CH_CODEC] == CODEC_HUFFEXP)
                ctx = huffexp_context(&planes[word - 1], w->room + (size_t)(word - 1) * n, n);
            ok = plane_decode_one(w, payload[k], (size_t)ck[CH_SIZE], (int)ck[CH_CODEC], n, into, &planes[k], ctx);
        }
    }
    stage_mark(&w->clock, RS_DECODE);
    if (!ok) return plane_fail(p, PLANE_DECODE, i, 0), 0;
    if (word == 1) {
        if (!planes[0].bytes) memset(w->out, planes[0].value, n);
        else if (planes[0].bytes != w->out) memcpy(w->out, planes[0].bytes, n);
    } else {
        merge_words(planes, w->out, n, word, rotate);
    }
    stage_mark(&w->clock, RS_MERGE);
    return 1;
}

/* Checks a decoded frame's checksum, and with it hashes the digest's leaves it holds whole
 * (*fused; plane_frame_hash). A frame a series delta touches was checksummed as coded: it
 * is checked, then the delta undone, and its leaves hashed from the original bytes later.
 * 1 if it holds, else 0 with the failure recorded. */
static int plane_check_frame(worker_t *w, int64_t i, int *fused) {
    restore_plan_t *p = w->plan;
    const int64_t *f = p->frames + i * FR_COLS;
    const int64_t *pc = p->pieces + f[FR_PIECE] * PC_COLS;
    if (!p->delta || !delta_touches(p->delta, pc, f[FR_PIECES])) {
        int sound = plane_frame_hash(p, f, w->out, fused) == (uint64_t)f[FR_CHECKSUM];
        stage_mark(&w->clock, RS_HASH);
        return sound ? 1 : (plane_fail(p, PLANE_FRAME, i, 0), 0);
    }
    *fused = 0;
    int sound = CKPTZ_XXH3_64(w->out, (size_t)f[FR_LENGTH]) == (uint64_t)f[FR_CHECKSUM];
    stage_mark(&w->clock, RS_HASH);
    if (!sound) return plane_fail(p, PLANE_FRAME, i, 0), 0;
    int64_t detail = 0;
    int kind = delta_apply(w->delta, pc, f[FR_PIECES], f[FR_LENGTH], w->out, 0, &detail);
    stage_mark(&w->clock, RS_DELTA);
    if (kind != PLANE_OK) return plane_fail(p, kind, i, detail), 0;
    return 1;
}

/* Finishes frame i from its checked payloads: decodes it (plane_decode), checks its
 * checksum, and puts and hashes its pieces. 1 if it went through, else 0 with the failure
 * recorded. */
static int plane_finish(worker_t *w, int64_t i, const uint8_t *const *payload, const uint8_t *const *decoded) {
    restore_plan_t *p = w->plan;
    const int64_t *f = p->frames + i * FR_COLS;
    int fused;
    if (!plane_decode(w, i, payload, decoded) || !plane_check_frame(w, i, &fused)) return 0;
    const int64_t *pc = p->pieces + f[FR_PIECE] * PC_COLS;
    for (int64_t j = 0; j < f[FR_PIECES]; j++, pc += PC_COLS) {
        const uint8_t *bytes = w->out + pc[PC_WITHIN];
        int64_t at = pc[PC_AT], size = pc[PC_SIZE];
        if (p->window_end) { /* the piece's part in the window, at its offset there */
            int64_t lo = at > p->window_start ? at : p->window_start;
            int64_t hi = at + size < p->window_end ? at + size : p->window_end;
            if (lo >= hi) continue;
            bytes += lo - at;
            size = hi - lo;
            at = lo - p->window_start;
        }
        if (p->memory) {
            memcpy(p->memory + at, bytes, (size_t)size);
            stage_mark(&w->clock, RS_PUT);
        }
        if (p->output >= 0) {
            int error = plane_pwrite(p->output, bytes, size, at);
            stage_mark(&w->clock, RS_WRITE);
            if (error) return plane_fail(p, PLANE_WRITE, i, error), 0;
        }
        if (p->checked >= 0) {
            int error = 0;
            int64_t differs = plane_compare(w, bytes, at, size, &error);
            stage_mark(&w->clock, RS_COMPARE);
            if (error) return plane_fail(p, PLANE_CHECK_READ, i, error), 0;
            if (differs >= 0) return plane_fail(p, PLANE_DIFFERS, i, differs), 0;
        }
        if (p->leaf) {
            int ok = plane_leaves(p, bytes, at, size, fused);
            stage_mark(&w->clock, RS_LEAVES);
            if (!ok) return plane_fail(p, PLANE_NOMEM, i, 0), 0;
        }
    }
    __atomic_add_fetch(p->progress, f[FR_LENGTH], __ATOMIC_RELAXED);
    return 1;
}

/* Restores frame i: 1 if it went through, else 0 with the failure recorded. */
static int plane_frame(worker_t *w, int64_t i) {
    restore_plan_t *p = w->plan;
    const int64_t *f = p->frames + i * FR_COLS;
    uint8_t *payload[8];
    int64_t cursor = 0;
    for (int k = 0; k < (int)f[FR_WORD]; k++) {
        int64_t size = p->chunks[(f[FR_CHUNK] + k) * CH_COLS + CH_SIZE];
        payload[k] = w->payloads + cursor;
        cursor += size + (-size & (PLANE_ALIGN - 1));
    }
    return plane_read(p, i, payload, &w->clock) && plane_finish(w, i, (const uint8_t *const *)payload, NULL);
}

static void *plane_work(void *arg) {
    worker_t *w = arg;
    restore_plan_t *p = w->plan;
    stage_begin(&w->clock);
    for (;;) {
        if (__atomic_load_n(&p->failed, __ATOMIC_ACQUIRE)) break;
        if (*p->stop) {
            plane_fail(p, PLANE_STOPPED, -1, 0);
            break;
        }
        int64_t i = __atomic_fetch_add(&p->next, 1, __ATOMIC_RELAXED);
        stage_mark(&w->clock, RS_OTHER);
        if (i >= p->frame_count || !plane_frame(w, i)) break;
    }
    stage_end(&w->clock, RS_OTHER);
    return NULL;
}

static int worker_init(worker_t *w, restore_plan_t *p) {
    memset(w, 0, sizeof *w);
    w->plan = p;
    stage_begin(&w->clock); /* a delta's reader of its reference marks on it too */
    /* On a GPU the payloads are read into the batches' pinned memory instead. */
    w->payloads = plane_buffer(p->gpu ? 0 : p->payload_room);
    w->room = plane_buffer(p->frame_room);
    w->out = plane_buffer(p->frame_room);
    w->check = p->checked >= 0 ? malloc(p->frame_room ? p->frame_room : 1) : NULL;
    w->dt = malloc(sizeof(dtable_t));
    if (p->delta && !(w->delta = delta_scratch_new(p->delta, p->frame_room))) return 0;
    return w->payloads && w->room && w->out && w->dt && (p->checked < 0 || w->check);
}

static void worker_free(worker_t *w) {
    plane_buffer_free(w->payloads, w->plan->gpu ? 0 : w->plan->payload_room);
    plane_buffer_free(w->room, w->plan->frame_room);
    plane_buffer_free(w->out, w->plan->frame_room);
    free(w->groups);
    free(w->check);
    free(w->dt);
    if (w->zstd) zstd_api.free_ctx(w->zstd);
    delta_scratch_free(w->delta);
}

/* Checks the plan against its own tables and the file's size before any thread starts: a
 * hostile index must not move a read, write or hash outside the buffers. Returns NULL if
 * it holds, else what is wrong; sets the per-thread buffer sizes. */
static const char *plane_check(restore_plan_t *p) {
    const int64_t limit = (int64_t)1 << 40; /* no frame or payload is near this */
    if (p->source_size < 0 || p->leaf < 0 || (p->leaf && p->leaf_count != (p->source_size + p->leaf - 1) / p->leaf))
        return "leaf table does not match the file's size";
    for (int64_t r = 0; r < p->chunk_count; r++) {
        const int64_t *c = p->chunks + r * CH_COLS;
        if (c[CH_OFFSET] < 0 || c[CH_SIZE] < 0 || c[CH_SIZE] > limit || c[CH_RAW] < 0 || c[CH_RAW] > limit ||
            c[CH_OFFSET] > limit * 1024)
            return "chunk outside the container";
    }
    for (int64_t i = 0; i < p->frame_count; i++) {
        const int64_t *f = p->frames + i * FR_COLS;
        int64_t word = f[FR_WORD], length = f[FR_LENGTH];
        if ((word != 1 && word != 2 && word != 4 && word != 8) || (f[FR_ROTATE] != 0 && f[FR_ROTATE] != 1))
            return "frame of an unknown word size";
        if (f[FR_CHUNK] < 0 || f[FR_CHUNK] > p->chunk_count - word) return "frame's chunks outside the chunk table";
        if (length < 0 || length > limit) return "frame length out of range";
        if (f[FR_PIECE] < 0 || f[FR_PIECES] < 0 || f[FR_PIECE] > p->piece_count - f[FR_PIECES])
            return "frame's pieces outside the piece table";
        int64_t payload = 0;
        for (int64_t k = 0; k < word; k++) {
            int64_t size = p->chunks[(f[FR_CHUNK] + k) * CH_COLS + CH_SIZE];
            payload += size + (-size & (PLANE_ALIGN - 1));
        }
        for (int64_t j = 0; j < f[FR_PIECES]; j++) {
            const int64_t *pc = p->pieces + (f[FR_PIECE] + j) * PC_COLS;
            if (pc[PC_AT] < 0 || pc[PC_SIZE] < 0 || pc[PC_WITHIN] < 0 || pc[PC_SIZE] > length ||
                pc[PC_WITHIN] > length - pc[PC_SIZE] || pc[PC_AT] > p->source_size - pc[PC_SIZE])
                return "piece outside its frame or the file";
        }
        if ((size_t)payload > p->payload_room) p->payload_room = (size_t)payload;
        if ((size_t)length > p->frame_room) p->frame_room = (size_t)length;
    }
    return NULL;
}

/* plane_gpu.c: runs the plan on the workers' threads with a GPU decoding its batches. */
static void plane_gpu_run(restore_plan_t *p, worker_t *workers, int threads);

/* Runs the plan on `threads` threads (this one among them); the failure kind, or PLANE_OK. */
static int plane_run(restore_plan_t *p, int threads) {
    int result = PLANE_NOMEM;
    worker_t *workers = calloc((size_t)threads, sizeof(worker_t));
    pthread_t *ids = calloc((size_t)threads, sizeof(pthread_t));
    int started = 0, ready = 0;
    if (!leaf_streams_init(p) || !workers || !ids) goto done;
    for (; ready < threads; ready++)
        if (!worker_init(&workers[ready], p)) {
            ready++;
            goto done;
        }
    if (p->gpu) {
        plane_gpu_run(p, workers, threads);
    } else {
        for (int t = 1; t < threads; t++, started++)
            if (pthread_create(&ids[t], NULL, plane_work, &workers[t])) break;
        plane_work(&workers[0]);
        for (int t = 1; t <= started; t++) pthread_join(ids[t], NULL);
        for (int t = 0; t <= started; t++)
            stage_report(&workers[t].clock, STAGE_ROLE_CPU, p->stages, p->stage_rows, t);
    }
    result = p->failed ? (int)p->error[0] : PLANE_OK;
done:
    for (int t = 0; t < ready; t++) worker_free(&workers[t]);
    leaf_streams_free(p);
    free(workers);
    free(ids);
    return result;
}
