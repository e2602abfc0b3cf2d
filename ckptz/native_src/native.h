/*
 * ckptz._native's shared header: what more than one of its files needs (the build's target
 * attributes, constants, types, and each file's entry points). module.c includes it and
 * then every other file into one compilation unit, so all functions stay static and the
 * compiler can inline across files (setup.py builds module.c alone); each file includes it
 * too, so it also reads on its own. Only module.c uses the Python API (it includes
 * Python.h first, as Python requires); the other files are plain C.
 */
#ifndef CKPTZ_NATIVE_H
#define CKPTZ_NATIVE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* The word loops vectorise; on x86-64 Linux they are also built for AVX2 and the
 * loader picks the clone the CPU runs (SSE2 is the baseline). */
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define WIDE __attribute__((target_clones("avx2", "default")))
/* Bit readers want BMI2's shifts by a register (one instruction, no CL): a BMI2 clone
 * beside the baseline one. (Not "arch=haswell": GCC picks an arch= clone by CPU model,
 * so it would run on Haswell only, never on AMD or later Intel cores.) */
#define SHIFTS __attribute__((target_clones("bmi2", "default")))
/* Hand-written AVX2 loops (bit unpacking), chosen at run time. */
#include <immintrin.h>
#define AVX2_PATHS 1
#define AVX2 __attribute__((target("avx2")))
static int have_avx2; /* set at import */
#else
#define WIDE
#define SHIFTS
#define AVX2_PATHS 0
#endif

/* ---------------------------------------------------------------- stage clocks */

/* Where a plane's thread spends its time: at each step's end it charges the nanoseconds since
 * its last mark to that step (each plane numbers its own steps), in a clock of its own, so
 * the hot path shares no cache line and takes no lock. A mark is one vDSO clock_gettime, a
 * few per frame of megabytes: always on. */
#define STAGE_MAX 14

typedef struct {
    int64_t born, last; /* when the thread started, and its last mark (CLOCK_MONOTONIC ns) */
    int64_t cpu_born, cpu; /* its CPU time then (CLOCK_THREAD_CPUTIME_ID), and its CPU time in all */
    int64_t ns[STAGE_MAX], count[STAGE_MAX];
    char apart[64]; /* keeps the next thread's clock off this one's cache line */
} stage_clock_t;

/* A row of the table a plane reports its clocks in (module.c's `stages` argument): the
 * thread's role (STAGE_ROLE_*; 0: no thread), when it started, how long it ran, how much of
 * that on a CPU (the rest it waited: for a lock, the disk, or a core another process held),
 * then each step's nanoseconds and each step's count. */
enum { STAGE_ROLE, STAGE_BORN, STAGE_LIFE, STAGE_CPU, STAGE_NS, STAGE_COLS = STAGE_NS + 2 * STAGE_MAX };
enum { STAGE_ROLE_NONE, STAGE_ROLE_CPU, STAGE_ROLE_GPU };
/* Most GPU workers a GPU plane runs beside its threads: their stage rows follow the threads'. */
#define GPU_MAX_WORKERS 4

static inline int64_t stage_time(clockid_t which) {
    struct timespec t;
    clock_gettime(which, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline int64_t stage_now(void) { return stage_time(CLOCK_MONOTONIC); }

/* Starts the calling thread's clock. */
static inline void stage_begin(stage_clock_t *c) {
    memset(c, 0, sizeof *c);
    c->born = c->last = stage_now();
    c->cpu_born = stage_time(CLOCK_THREAD_CPUTIME_ID);
}

/* Charges the time since the last mark to `stage` (nothing where c is NULL). */
static inline void stage_mark(stage_clock_t *c, int stage) {
    if (!c) return;
    int64_t now = stage_now();
    c->ns[stage] += now - c->last;
    c->count[stage]++;
    c->last = now;
}

/* The calling thread's last mark, and its CPU time since stage_begin. */
static void stage_end(stage_clock_t *c, int stage) {
    stage_mark(c, stage);
    c->cpu = stage_time(CLOCK_THREAD_CPUTIME_ID) - c->cpu_born;
}

/* Writes a thread's clock as row `row` of a table of `rows` (none where it has no such row). */
static void stage_report(const stage_clock_t *c, int role, int64_t *table, int64_t rows, int64_t row) {
    if (!table || row < 0 || row >= rows) return;
    int64_t *r = table + row * STAGE_COLS;
    r[STAGE_ROLE] = role;
    r[STAGE_BORN] = c->born;
    r[STAGE_LIFE] = c->last - c->born;
    r[STAGE_CPU] = c->cpu;
    for (int k = 0; k < STAGE_MAX; k++) {
        r[STAGE_NS + k] = c->ns[k];
        r[STAGE_NS + STAGE_MAX + k] = c->count[k];
    }
}

/* ---------------------------------------------------------------- zstd's Huffman literals */

#define MAX_BITS 11        /* RFC 8878: Huffman codes are at most 11 bits */
#define BLOCK_MAX (1 << 17) /* zstd's Block_Maximum_Size */
#define MIN_HUFFMAN 1024   /* smaller blocks are stored raw (4 streams need a few symbols) */
#define FSE_MAX_LOG 6      /* the accuracy log of Huffman weight tables */

static int highbit(uint32_t v) { return 31 - __builtin_clz(v); }

/* A Huffman code for the encoder (huffman.c builds and describes it, literals_encode.c
 * writes with it). */
typedef struct {
    uint8_t len[256]; /* code length per byte value, 0 = absent */
    uint16_t code[256];
    int max_symbol;   /* highest byte value present */
    int valid;
} table_t;

/* A lookup's window: every code fits in it (so each lookup yields a symbol), and five of
 * them fit in the 57+ bits a refill guarantees. */
#define LOOKUP 11
_Static_assert(LOOKUP >= MAX_BITS && 5 * LOOKUP <= 57, "lookup window");

/* A Huffman code for the decoder (literals_decode.c). */
typedef struct {
    uint8_t sym[1 << MAX_BITS]; /* by the next `log` bits: the symbol ... */
    uint8_t len[1 << MAX_BITS]; /* ... and its code length */
    uint64_t multi[1 << LOOKUP]; /* by the next LOOKUP bits: symbols | bits << 32 | count << 40 */
    uint16_t single[1 << LOOKUP]; /* by the next LOOKUP bits: symbol | length << 8 */
    int one; /* no two codes fit in a window (7-bit mantissas): `single` is the table */
    int log;
    int valid;
} dtable_t;

/* ---------------------------------------------------------------- planes.c: split and merge */

/* A plane of merge(): its bytes, or NULL and a constant byte. */
typedef struct {
    const uint8_t *bytes;
    uint8_t value;
} plane_t;

/* n words of `word` (2, 4 or 8) bytes into their planes (plane k at dst[k], n bytes); the
 * AND and OR of the (rotated) words go to *and_out and *or_out. */
static void split_words(const uint8_t *src, uint8_t *const *dst, size_t n, int word, int rotate,
                        uint64_t *and_out, uint64_t *or_out);
/* n words of `word` (2, 4 or 8) bytes from their planes. */
static void merge_words(const plane_t *planes, uint8_t *dst, size_t n, int word, int rotate);
/* Order-0 entropy (bits per byte) and share of zeros of a strided sample of a plane. */
static void sample_stats(const uint8_t *plane, size_t n, size_t sample, double *bits, double *zeros);
/* sample_stats, and the AND and the OR of every byte. */
static void plane_stats(const uint8_t *plane, size_t n, size_t sample, uint8_t *and_out, uint8_t *or_out,
                        double *bits, double *zeros);

/* ---------------------------------------------------------------- huffman.c */

/* A length-limited canonical code for a histogram of at least two byte values. */
static void build_table(const uint32_t *hist, table_t *t);
/* Bits of a histogram's codes under a table, or -1 if a byte value has no code. */
static int64_t coded_bits(const uint32_t *hist, const table_t *t);
/* The table's description as zstd stores it into `out` (129 bytes); its size, or 0. */
static size_t describe_table(uint8_t *out, const table_t *t);

/* ---------------------------------------------------------------- literals_encode.c */

/* Room write_frame needs for n bytes in blocks of `block` (0: planned). */
static size_t frame_capacity(size_t n, size_t block);
/* A zstd frame of Huffman-coded literal blocks into `out`; its size, or 0. */
static size_t write_frame(uint8_t *out, const uint8_t *src, size_t n, size_t block);

/* ---------------------------------------------------------------- literals_decode.c */

/* A zstd frame of raw, RLE and literal-only blocks into out[0..size); 1 on success, 0 if
 * it is not such a frame or is malformed (with `decode` 0, only checks its blocks). */
static int literals_frame(const uint8_t *in, size_t n, uint8_t *out, size_t size, dtable_t *dt, int decode);

/* ---------------------------------------------------------------- bitpack.c */

/* The bit positions clear in `fixed`, ascending, into bits; returns their number. */
static int varying_list(int fixed, int *bits);
/* The k rows (row i: bit bits[i] of each byte of in[0..n)) of m bytes each into out. */
static void pack_rows(const uint8_t *in, size_t n, const int *bits, int k, uint8_t *out, size_t m);
/* Bytes out[0..n) from k packed rows of m bytes, the fixed bits from `value`. */
static void unpack_rows(const uint8_t *in, size_t m, const int *bits, int k, uint8_t value, uint8_t *out,
                        size_t n);
/* Sets up unpack_rows' table (at import). */
static void init_spread(void);

/* ---------------------------------------------------------------- frame.c */

/* One plane's chunk, as the container stores it. */
typedef struct {
    int codec; /* bitstream id (ckptz/codecs/table.py) */
    const uint8_t *bytes;
    size_t len;
} chunk_t;

/* Whether a chunk of `size` bytes (n expected) can be decoded here; sets where merge reads it. */
static int frame_chunk_usable(const chunk_t *chunk, size_t size, size_t n, uint8_t *room, plane_t *plane);
/* Decodes a frame's usable chunks and merges its words into dst; 1 on success (a constant
 * top plane that a huffexp plane reads is written out into its room, and *planes then
 * points there). */
static int frame_decode(const chunk_t *chunks, plane_t *planes, int word, size_t n, uint8_t *room, uint8_t *dst,
                        int rotate, dtable_t *dt);

/* In a table of `count` rows of `cols` int64 columns sorted by their first column (a file
 * offset), the last row starting at or before `at` (0 where none does). */
static inline int64_t row_at_or_before(const int64_t *rows, int64_t count, int cols, int64_t at) {
    int64_t lo = 0, hi = count - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (rows[mid * cols] <= at) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

#endif /* CKPTZ_NATIVE_H */
