/*
 * ckptz._native: the CPU coder's inner loops in C (an optional speed-up; ckptz.codecs.native
 * falls back to numpy and the zstd/deflate bindings where this module is not built).
 *
 *   split(src, dst, word, rotate, sample)  words -> byte planes, one pass (ckptz.codecs.planes),
 *                                       with each plane's statistics (ckptz.codecs.frames)
 *   plane_stats(plane, sample)          the same statistics of one plane
 *   merge(planes, dst, word, rotate)    byte planes (or constant bytes) -> words, one pass
 *   huffman_zstd(src, block)            one standard zstd frame (RFC 8878) of Huffman-coded
 *                                       literal blocks with no sequences, or None
 *   literals_decode(frame, out)         such a frame (or any zstd frame of raw, RLE and
 *                                       literal-only blocks) into out; False to leave it to libzstd
 *   bitpack_encode(src, fixed, value)   a ckptz.codecs.bitpack payload (8x8 bit transposes)
 *   bitpack_decode(rows, fixed, value, out)
 *
 * Every function checks its arguments, raises ValueError on bad ones, and releases the GIL
 * while it works.
 *
 * The zstd frame: libzstd cannot be told to skip LZ matching, and on float exponent planes
 * its few short matches cost more than they save; ZipNN calls zstd's Huffman coder
 * directly, which the zstandard binding does not expose. So this writes the frame itself:
 * a single-segment header with the content size, then blocks (planned from the plane's
 * statistics, or `block` bytes each), each the cheapest (exact sizes, computed before
 * writing) of
 *
 *   - an RLE block (one byte value),
 *   - a compressed block whose literals are Huffman-coded in four streams with a new
 *     table (its weights FSE-compressed or direct, whichever is smaller) or with the
 *     previous block's table (a treeless literals block) and whose sequence section is
 *     empty,
 *   - a raw block.
 *
 * Codes are limited to 11 bits and assigned canonically as RFC 8878 section 4.2.1.3
 * prescribes, so any zstd decoder (libzstd, nvCOMP's Zstd) reads the frame. A block whose
 * table cannot be described (more than 128 weights that FSE cannot fit in 127 bytes) and
 * that cannot reuse the previous table makes the function return None: the caller codes
 * the plane another way.
 *
 * Reading those frames back, libzstd runs about 1-1.5 GB/s on exponent planes; the
 * decoder here (literals_decode) looks up 11 bits at a time and takes every whole code in
 * them, up to four symbols per lookup, on four streams in lockstep: 1.1-1.6x libzstd's
 * speed (bench/exponents.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* ---------------------------------------------------------------- split and merge */

/* The word loops below vectorise; on x86-64 Linux they are also built for AVX2 and the
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

#define ROTL(v, bits) (((v) << 1) | ((v) >> ((bits)-1)))
#define ROTR(v, bits) (((v) >> 1) | ((v) << ((bits)-1)))

/* Each split also ANDs and ORs the (rotated) words: byte k of the results is the AND and
 * the OR of plane k, which tell a constant plane and the bit positions that never vary. */

WIDE static void split2(const uint8_t *restrict src, uint8_t *restrict dst, size_t n, int rotate, uint64_t *and_out,
                   uint64_t *or_out) {
    uint8_t *restrict p0 = dst, *restrict p1 = dst + n;
    uint16_t a = 0xFFFF, o = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t v;
        memcpy(&v, src + 2 * i, 2);
        if (rotate) v = (uint16_t)ROTL(v, 16);
        a &= v;
        o |= v;
        p0[i] = (uint8_t)v;
        p1[i] = (uint8_t)(v >> 8);
    }
    *and_out = a, *or_out = o;
}

WIDE static void split4(const uint8_t *restrict src, uint8_t *restrict dst, size_t n, int rotate, uint64_t *and_out,
                   uint64_t *or_out) {
    uint8_t *restrict p0 = dst, *restrict p1 = dst + n, *restrict p2 = dst + 2 * n, *restrict p3 = dst + 3 * n;
    uint32_t a = 0xFFFFFFFFu, o = 0;
    for (size_t i = 0; i < n; i++) { /* -O3 unswitches the rotate test out of the loop */
        uint32_t v;
        memcpy(&v, src + 4 * i, 4);
        if (rotate) v = ROTL(v, 32);
        a &= v;
        o |= v;
        p0[i] = (uint8_t)v;
        p1[i] = (uint8_t)(v >> 8);
        p2[i] = (uint8_t)(v >> 16);
        p3[i] = (uint8_t)(v >> 24);
    }
    *and_out = a, *or_out = o;
}

WIDE static void split8(const uint8_t *restrict src, uint8_t *restrict dst, size_t n, int rotate, uint64_t *and_out,
                   uint64_t *or_out) {
    uint64_t a = ~0ULL, o = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t v;
        memcpy(&v, src + 8 * i, 8);
        if (rotate) v = ROTL(v, 64);
        a &= v;
        o |= v;
        for (int k = 0; k < 8; k++) dst[k * n + i] = (uint8_t)(v >> (8 * k));
    }
    *and_out = a, *or_out = o;
}

/* A plane's sampled statistics, as ckptz.codecs.frames computes them with numpy: order-0
 * entropy (bits per byte) and share of zeros of bytes 0, step, 2 step, ... with
 * step = max(1, n / sample). */
static void sample_stats(const uint8_t *plane, size_t n, size_t sample, double *bits, double *zeros) {
    size_t step = n / sample > 1 ? n / sample : 1, count = 0;
    uint32_t hist[256] = {0};
    for (size_t i = 0; i < n; i += step, count++) hist[plane[i]]++;
    double sum = 0;
    for (int s = 0; s < 256; s++)
        if (hist[s]) sum += hist[s] * log2((double)hist[s]);
    *bits = count ? log2((double)count) - sum / (double)count : 0;
    *zeros = count ? (double)hist[0] / (double)count : 0;
}

/* (bits, zero share, AND of the bytes, OR of the bytes) */
static PyObject *stats_tuple(const uint8_t *plane, size_t n, size_t sample, int and_byte, int or_byte) {
    double bits, zeros;
    sample_stats(plane, n, sample, &bits, &zeros);
    return Py_BuildValue("(ddii)", bits, zeros, and_byte, or_byte);
}

/* A plane of merge(): its bytes, or NULL and a constant byte. */
typedef struct {
    const uint8_t *bytes;
    uint8_t value;
} plane_t;

/* Planes given as constants are read from a small buffer of that byte instead, so the
 * loops below need no branch: `stride` is 1 for real planes, 0 for constants. */
WIDE static void merge2(const plane_t *planes, uint8_t *restrict dst, size_t n, int rotate) {
    const uint8_t *p0 = planes[0].bytes ? planes[0].bytes : &planes[0].value;
    const uint8_t *p1 = planes[1].bytes ? planes[1].bytes : &planes[1].value;
    size_t s0 = planes[0].bytes != NULL, s1 = planes[1].bytes != NULL;
    if (s0 && s1) {
        for (size_t i = 0; i < n; i++) {
            uint16_t v = (uint16_t)(p0[i] | (p1[i] << 8));
            if (rotate) v = (uint16_t)ROTR(v, 16);
            memcpy(dst + 2 * i, &v, 2);
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint16_t v = (uint16_t)(p0[i * s0] | (p1[i * s1] << 8));
        if (rotate) v = (uint16_t)ROTR(v, 16);
        memcpy(dst + 2 * i, &v, 2);
    }
}

#ifdef __SSE2__
/* 16 bytes of a plane, or its constant byte 16 times (the test is the same every call of
 * a merge, so the branch predicts). */
static inline __m128i plane16(const plane_t *pl, size_t i) {
    return pl->bytes ? _mm_loadu_si128((const __m128i *)(pl->bytes + i)) : _mm_set1_epi8((char)pl->value);
}
#endif

WIDE static void merge4(const plane_t *planes, uint8_t *restrict dst, size_t n, int rotate) {
    size_t i = 0;
#ifdef __SSE2__
    /* 16 words at a time: interleave bytes (planes 0+1, 2+3), then the byte pairs */
    for (; i + 16 <= n; i += 16) {
        __m128i a = plane16(&planes[0], i), b = plane16(&planes[1], i);
        __m128i c = plane16(&planes[2], i), d = plane16(&planes[3], i);
        __m128i ab0 = _mm_unpacklo_epi8(a, b), ab1 = _mm_unpackhi_epi8(a, b);
        __m128i cd0 = _mm_unpacklo_epi8(c, d), cd1 = _mm_unpackhi_epi8(c, d);
        __m128i w[4] = {_mm_unpacklo_epi16(ab0, cd0), _mm_unpackhi_epi16(ab0, cd0), _mm_unpacklo_epi16(ab1, cd1),
                        _mm_unpackhi_epi16(ab1, cd1)};
        for (int k = 0; k < 4; k++) {
            if (rotate) w[k] = _mm_or_si128(_mm_srli_epi32(w[k], 1), _mm_slli_epi32(w[k], 31));
            _mm_storeu_si128((__m128i *)(dst + 4 * i + 16 * (size_t)k), w[k]);
        }
    }
#endif
    for (; i < n; i++) {
        uint32_t v = 0;
        for (int k = 0; k < 4; k++) v |= (uint32_t)(planes[k].bytes ? planes[k].bytes[i] : planes[k].value) << (8 * k);
        if (rotate) v = ROTR(v, 32);
        memcpy(dst + 4 * i, &v, 4);
    }
}

WIDE static void merge8(const plane_t *planes, uint8_t *restrict dst, size_t n, int rotate) {
    for (size_t i = 0; i < n; i++) {
        uint64_t v = 0;
        for (int k = 0; k < 8; k++)
            v |= (uint64_t)(planes[k].bytes ? planes[k].bytes[i] : planes[k].value) << (8 * k);
        if (rotate) v = ROTR(v, 64);
        memcpy(dst + 8 * i, &v, 8);
    }
}

static int check_word(int word) {
    if (word != 2 && word != 4 && word != 8) {
        PyErr_Format(PyExc_ValueError, "word size %d: expected 2, 4 or 8", word);
        return -1;
    }
    return 0;
}

static PyObject *native_split(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    int word, rotate;
    Py_ssize_t sample = 0;
    if (!PyArg_ParseTuple(args, "y*w*ip|n", &src, &dst, &word, &rotate, &sample)) return NULL;
    PyObject *result = NULL;
    if (check_word(word) < 0) goto done;
    if (src.len != dst.len || src.len % word) {
        PyErr_Format(PyExc_ValueError, "split of %zd bytes into %zd: sizes must match and hold whole %d-byte words",
                     src.len, dst.len, word);
        goto done;
    }
    size_t n = (size_t)src.len / (size_t)word;
    uint64_t and_word = 0, or_word = 0;
    Py_BEGIN_ALLOW_THREADS;
    if (word == 2)
        split2(src.buf, dst.buf, n, rotate, &and_word, &or_word);
    else if (word == 4)
        split4(src.buf, dst.buf, n, rotate, &and_word, &or_word);
    else
        split8(src.buf, dst.buf, n, rotate, &and_word, &or_word);
    Py_END_ALLOW_THREADS;
    if (sample <= 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    result = PyTuple_New(word);
    for (int k = 0; result && k < word; k++) {
        PyObject *item = stats_tuple((const uint8_t *)dst.buf + (size_t)k * n, n, (size_t)sample,
                                     (int)(and_word >> (8 * k) & 255), (int)(or_word >> (8 * k) & 255));
        if (!item) Py_CLEAR(result);
        else PyTuple_SET_ITEM(result, k, item);
    }
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

static PyObject *native_plane_stats(PyObject *self, PyObject *args) {
    Py_buffer plane;
    Py_ssize_t sample;
    if (!PyArg_ParseTuple(args, "y*n", &plane, &sample)) return NULL;
    PyObject *result = NULL;
    if (sample <= 0) {
        PyErr_Format(PyExc_ValueError, "sample of %zd bytes", sample);
        goto done;
    }
    const uint8_t *p = plane.buf;
    size_t n = (size_t)plane.len;
    uint8_t a = 0xFF, o = 0;
    double bits, zeros;
    Py_BEGIN_ALLOW_THREADS;
    for (size_t i = 0; i < n; i++) {
        a &= p[i];
        o |= p[i];
    }
    sample_stats(p, n, (size_t)sample, &bits, &zeros);
    Py_END_ALLOW_THREADS;
    result = Py_BuildValue("(ddii)", bits, zeros, a, o);
done:
    PyBuffer_Release(&plane);
    return result;
}

/* n words of `word` (2, 4 or 8) bytes from their planes. */
static void merge_words(const plane_t *planes, uint8_t *dst, size_t n, int word, int rotate) {
    if (word == 2)
        merge2(planes, dst, n, rotate);
    else if (word == 4)
        merge4(planes, dst, n, rotate);
    else
        merge8(planes, dst, n, rotate);
}

static PyObject *native_merge(PyObject *self, PyObject *args) {
    PyObject *seq;
    Py_buffer dst;
    int word, rotate;
    if (!PyArg_ParseTuple(args, "Ow*ip", &seq, &dst, &word, &rotate)) return NULL;
    Py_buffer views[8];
    plane_t planes[8];
    int held = 0;
    PyObject *result = NULL, *fast = NULL;
    if (check_word(word) < 0) goto done;
    fast = PySequence_Fast(seq, "planes must be a sequence");
    if (!fast) goto done;
    if (PySequence_Fast_GET_SIZE(fast) != word) {
        PyErr_Format(PyExc_ValueError, "%zd planes for %d-byte words", PySequence_Fast_GET_SIZE(fast), word);
        goto done;
    }
    if (dst.len % word) {
        PyErr_Format(PyExc_ValueError, "output of %zd bytes is not whole %d-byte words", dst.len, word);
        goto done;
    }
    size_t n = (size_t)dst.len / (size_t)word;
    for (int k = 0; k < word; k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, k);
        if (PyLong_Check(item)) {
            long value = PyLong_AsLong(item);
            if (value < 0 || value > 255) {
                if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "constant plane byte %ld", value);
                goto done;
            }
            planes[k].bytes = NULL;
            planes[k].value = (uint8_t)value;
            continue;
        }
        if (PyObject_GetBuffer(item, &views[held], PyBUF_SIMPLE) < 0) goto done;
        held++;
        if ((size_t)views[held - 1].len != n) {
            PyErr_Format(PyExc_ValueError, "plane %d holds %zd bytes, expected %zu", k, views[held - 1].len, n);
            goto done;
        }
        planes[k].bytes = views[held - 1].buf;
        planes[k].value = 0;
    }
    Py_BEGIN_ALLOW_THREADS;
    merge_words(planes, dst.buf, n, word, rotate);
    Py_END_ALLOW_THREADS;
    result = Py_NewRef(Py_None);
done:
    for (int k = 0; k < held; k++) PyBuffer_Release(&views[k]);
    Py_XDECREF(fast);
    PyBuffer_Release(&dst);
    return result;
}

/* ---------------------------------------------------------------- Huffman (zstd literals) */

#define MAX_BITS 11        /* RFC 8878: Huffman codes are at most 11 bits */
#define MAX_DIRECT 128     /* direct weights: the highest byte value present is at most 128 */
#define BLOCK_MAX (1 << 17) /* zstd's Block_Maximum_Size */
#define MIN_HUFFMAN 1024   /* smaller blocks are stored raw (4 streams need a few symbols) */

typedef struct {
    uint8_t len[256]; /* code length per byte value, 0 = absent */
    uint16_t code[256];
    int max_symbol;   /* highest byte value present */
    int valid;
} table_t;

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

#define FSE_MAX_LOG 6 /* the accuracy log of weight tables */

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

static int highbit(uint32_t v) { return 31 - __builtin_clz(v); }

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

/* The four streams of a block of n >= MIN_HUFFMAN bytes (RFC 8878 4.2.2: streams 1-3 hold
 * ceil(n / 4) symbols each, stream 4 the rest), each into its own `region`-byte part of
 * `scratch`; sizes[] gets their sizes. BMI2's shifts by a register help the bit writer. */
SHIFTS static void write_streams(const uint8_t *src, size_t n, const uint32_t *ce, uint8_t *scratch, size_t region,
                                 size_t *sizes) {
    size_t seg = (n + 3) / 4;
    for (int k = 0; k < 4; k++) {
        stream_t st = {0, 0, scratch + (size_t)k * region};
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

/* Writes one block of n input bytes with byte counts `hist`; returns the end, or NULL if
 * its table cannot be described. `prev` is the table a treeless block may reuse. */
static uint8_t *write_block(uint8_t *op, const uint8_t *src, size_t n, const uint32_t *hist, int last,
                            table_t *prev, uint8_t *scratch) {
    int distinct = 0;
    for (int s = 0; s < 256; s++) distinct += hist[s] != 0;
    if (distinct == 1) { /* RLE block: Block_Size is the regenerated size */
        put_le(op, (uint64_t)last | (1u << 1) | ((uint64_t)n << 3), 3);
        op[3] = src[0];
        return op + 4;
    }
    size_t best = n; /* a raw block's payload */
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
        if (reused >= 0 && COMPRESSED(reused) < best) {
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
    size_t sizes[4];
    write_streams(src, n, ce, scratch, REGION, sizes);
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
    uint32_t acc[256];
    uint8_t present[256];
    for (size_t i = 0; i < subs; i++) {
        memset(acc, 0, sizeof(acc));
        float sum_xlogx = 0;
        uint32_t total = 0, distinct = 0;
        for (size_t j = i + 1; j <= subs && j - i <= MAX_SUBS; j++) {
            const uint8_t *s = sym[j - 1];
            const uint32_t *c = sub[j - 1];
            for (int k = 0; k < used[j - 1]; k++) {
                uint32_t was = acc[s[k]], now = was + c[s[k]];
                acc[s[k]] = now;
                sum_xlogx += xlog2x((float)now) - (was ? xlog2x((float)was) : 0);
                if (!was) present[distinct++] = s[k];
                total += c[s[k]];
            }
            /* Codes are at most MAX_BITS long: byte values rarer than 2^-MAX_BITS take
             * 2^-MAX_BITS of the code space each, more than their share, and the other
             * codes lengthen to make room. A block that gathers many rare values pays
             * that on all its bytes. */
            uint32_t rare = 0, rare_count = 0;
            for (uint32_t k = 0; k < distinct; k++)
                if ((acc[present[k]] << MAX_BITS) < total) rare++, rare_count += acc[present[k]];
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
    uint8_t *scratch = malloc(4 * REGION);
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
        op = write_block(op, src + at, ends[k] - at, hist[k], k + 1 == blocks, &prev, scratch);
    free(ends);
    free(hist);
    free(scratch);
    return op ? (size_t)(op - out) : 0;
}

static size_t frame_capacity(size_t n, size_t block) {
    /* header 14, per block at most a raw block (3 + bytes) */
    return 14 + n + 3 * (n / (block ? block : SUB) + 1) + 64;
}

static PyObject *native_huffman_zstd(PyObject *self, PyObject *args) {
    Py_buffer src;
    Py_ssize_t block = 0;
    if (!PyArg_ParseTuple(args, "y*|n", &src, &block)) return NULL;
    PyObject *result = NULL;
    if (block && (block < MIN_HUFFMAN || block > BLOCK_MAX)) {
        PyErr_Format(PyExc_ValueError, "block of %zd bytes: expected 0 (adaptive) or %d to %d", block, MIN_HUFFMAN,
                     BLOCK_MAX);
        goto done;
    }
    size_t n = (size_t)src.len, cap = frame_capacity(n, (size_t)block);
    uint8_t *buf = malloc(cap);
    if (!buf) {
        PyErr_NoMemory();
        goto done;
    }
    size_t size;
    Py_BEGIN_ALLOW_THREADS;
    size = write_frame(buf, src.buf, n, (size_t)block);
    Py_END_ALLOW_THREADS;
    result = size ? PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)size) : Py_NewRef(Py_None);
    free(buf);
done:
    PyBuffer_Release(&src);
    return result;
}

/* ---------------------------------------------------------------- zstd literal frames: decode
 *
 * literals_decode(frame, out): the frames above (and any zstd frame whose blocks are raw, RLE,
 * or hold only literals) decoded straight into `out`. Huffman streams are read by lookups
 * of LOOKUP bits that each yield every whole code in them, up to four symbols, four streams
 * in lockstep: on float exponent planes (2-3 bits per symbol) about three symbols per
 * lookup. A frame with sequences, a dictionary or a checksum is not for this decoder: it
 * returns False and the caller hands the frame to libzstd, which also judges frames this
 * one finds malformed. Every read and write is bounds-checked against the frame and `out`. */

/* A lookup's window: every code fits in it (so each lookup yields a symbol), and five of
 * them fit in the 57+ bits a refill guarantees. */
#define LOOKUP 11
_Static_assert(LOOKUP >= MAX_BITS && 5 * LOOKUP <= 57, "lookup window");

typedef struct {
    uint8_t sym[1 << MAX_BITS]; /* by the next `log` bits: the symbol ... */
    uint8_t len[1 << MAX_BITS]; /* ... and its code length */
    uint64_t multi[1 << LOOKUP]; /* by the next LOOKUP bits: symbols | bits << 32 | count << 40 */
    uint16_t single[1 << LOOKUP]; /* by the next LOOKUP bits: symbol | length << 8 */
    int one; /* no two codes fit in a window (7-bit mantissas): `single` is the table */
    int log;
    int valid;
} dtable_t;

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

/* A Huffman tree description (RFC 8878 4.2.1) from in[0..n) into dt; returns its size, or 0. */
static size_t read_tree(const uint8_t *in, size_t n, dtable_t *dt) {
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

/* One compressed block's content in[0..n): literals, then an empty sequence section.
 * Writes the literals to out[0..cap) when `out` is set; returns their number, or -1 if the
 * block is malformed or has sequences. */
static int64_t literals_block(const uint8_t *in, size_t n, uint8_t *out, size_t cap, dtable_t *dt) {
    if (n < 1) return -1;
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
        if (n < header) return -1;
        uint64_t h = get_le(in, (int)header) >> 4;
        regen = (size_t)(h & ((1u << bits) - 1));
        csize = (size_t)(h >> bits);
    }
    if (n < header || n - header < csize || n - header - csize != 1 || in[header + csize] != 0) return -1;
    if (regen > cap) return -1;
    if (!out) return (int64_t)regen;
    const uint8_t *body = in + header;
    if (type == 0) {
        memcpy(out, body, regen);
    } else if (type == 1) {
        memset(out, body[0], regen);
    } else {
        size_t tree = 0;
        if (type == 2) {
            tree = read_tree(body, csize, dt);
            if (!tree) return -1;
        } else if (!dt->valid) {
            return -1;
        }
        if (!decode_streams(body + tree, csize - tree, format == 0 ? 1 : 4, dt, out, regen)) return -1;
    }
    return (int64_t)regen;
}

/* Decodes frame in[0..n) into out[0..size) (see above); 1 on success, 0 if the frame is not
 * one of these or is malformed. A first pass checks every block header without decoding;
 * with `decode` 0 only that pass runs (out is not touched). */
static int literals_frame(const uint8_t *in, size_t n, uint8_t *out, size_t size, dtable_t *dt, int decode) {
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
    at += (size_t)fcs_bytes;
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

/* literals_decode(frame, out) -> True if `frame` was decoded into `out` (its exact size),
 * False if libzstd should decode it. */
static PyObject *native_literals_decode(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    if (!PyArg_ParseTuple(args, "y*w*", &src, &dst)) return NULL;
    PyObject *result = NULL;
    dtable_t *dt = malloc(sizeof(dtable_t));
    if (!dt) {
        PyErr_NoMemory();
    } else {
        int ok;
        Py_BEGIN_ALLOW_THREADS;
        ok = literals_frame(src.buf, (size_t)src.len, dst.buf, (size_t)dst.len, dt, 1);
        Py_END_ALLOW_THREADS;
        result = PyBool_FromLong(ok);
    }
    free(dt);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

/* ---------------------------------------------------------------- bit packing */

/* An 8x8 bit matrix (byte r = row r) transposed: three delta swaps (Hacker's Delight). */
static inline uint64_t transpose8(uint64_t x) {
    uint64_t t;
    t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AAULL;
    x ^= t ^ (t << 7);
    t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCCULL;
    x ^= t ^ (t << 14);
    t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0ULL;
    x ^= t ^ (t << 28);
    return x;
}

static int varying_list(int fixed, int *bits) {
    int k = 0;
    for (int b = 0; b < 8; b++)
        if (!(fixed >> b & 1)) bits[k++] = b;
    return k;
}

#if AVX2_PATHS
/* The rows' bytes [0, j) for the first 8 * j bytes of in[0..n), 32 bytes at a time (the
 * SSE2 loop below on twice the width); returns j. */
AVX2 static size_t pack_rows_avx2(const uint8_t *in, size_t n, const int *bits, int k, uint8_t *out, size_t m) {
    size_t j = 0;
    for (; 8 * j + 32 <= n; j += 4) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(in + 8 * j));
        for (int i = 0; i < k; i++) {
            uint32_t row = (uint32_t)_mm256_movemask_epi8(_mm256_sll_epi64(x, _mm_cvtsi32_si128(7 - bits[i])));
            memcpy(out + (size_t)i * m + j, &row, 4);
        }
    }
    return j;
}
#endif

/* bitpack_encode(src, fixed, value) -> ckptz.codecs.bitpack's payload: the two header
 * bytes, then the rows of the varying bits. */
static PyObject *native_bitpack_encode(PyObject *self, PyObject *args) {
    Py_buffer src;
    int fixed, value;
    if (!PyArg_ParseTuple(args, "y*ii", &src, &fixed, &value)) return NULL;
    PyObject *result = NULL;
    if (fixed < 0 || fixed > 255 || value < 0 || value > 255 || (value & ~fixed)) {
        PyErr_Format(PyExc_ValueError, "fixed-bit mask %d with values %d", fixed, value);
        goto done;
    }
    int bits[8], k = varying_list(fixed, bits);
    size_t n = (size_t)src.len, m = (n + 7) / 8;
    result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(2 + k * m));
    if (!result) goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
    const uint8_t *in = src.buf;
    out[0] = (uint8_t)fixed;
    out[1] = (uint8_t)value;
    out += 2;
    Py_BEGIN_ALLOW_THREADS;
    size_t j = 0;
#if AVX2_PATHS
    if (have_avx2) j = pack_rows_avx2(in, n, bits, k, out, m);
#endif
#ifdef __SSE2__
    /* 16 bytes at a time: bit b of each byte shifted to its top, then gathered by movemask */
    __m128i shift[8];
    for (int i = 0; i < k; i++) shift[i] = _mm_cvtsi32_si128(7 - bits[i]);
    for (; 8 * j + 16 <= n; j += 2) {
        __m128i x = _mm_loadu_si128((const __m128i *)(in + 8 * j));
        for (int i = 0; i < k; i++) {
            uint16_t row = (uint16_t)_mm_movemask_epi8(_mm_sll_epi64(x, shift[i]));
            memcpy(out + (size_t)i * m + j, &row, 2);
        }
    }
#endif
    for (; j < m; j++) {
        uint64_t word = 0;
        memcpy(&word, in + 8 * j, 8 * j + 8 <= n ? 8 : n - 8 * j);
        word = transpose8(word); /* byte b: bit b of the 8 bytes */
        for (int i = 0; i < k; i++) out[(size_t)i * m + j] = (uint8_t)(word >> (8 * bits[i]));
    }
    Py_END_ALLOW_THREADS;
done:
    PyBuffer_Release(&src);
    return result;
}

/* spread[x]: byte q holds bit q of x (as bit 0), set up at import */
static uint64_t spread[256];

static void init_spread(void) {
    for (int x = 0; x < 256; x++) {
        uint64_t w = 0;
        for (int q = 0; q < 8; q++) w |= (uint64_t)((x >> q) & 1) << (8 * q);
        spread[x] = w;
    }
}

#ifdef __SSE2__
/* transpose8 of both 64-bit halves */
static inline __m128i transpose8x2(__m128i x) {
    static const int shifts[3] = {7, 14, 28};
    static const uint64_t masks[3] = {0x00AA00AA00AA00AAULL, 0x0000CCCC0000CCCCULL, 0x00000000F0F0F0F0ULL};
    for (int s = 0; s < 3; s++) {
        __m128i t = _mm_and_si128(_mm_xor_si128(x, _mm_srli_epi64(x, shifts[s])), _mm_set1_epi64x((long long)masks[s]));
        x = _mm_xor_si128(x, _mm_xor_si128(t, _mm_slli_epi64(t, shifts[s])));
    }
    return x;
}

/* 128 bytes from 16 bytes of each bit's row (or its fixed bit as 0x00/0xFF): an 8x16 byte
 * transpose by unpacks (word j's byte b = row b's byte j), then transpose8 per word. */
static inline void unpack128(__m128i r[8], uint8_t *out) {
    __m128i p[8], q[8];
    for (int b = 0; b < 8; b += 2) {
        p[b] = _mm_unpacklo_epi8(r[b], r[b + 1]); /* rows b, b+1 of bytes 0..7 */
        p[b + 1] = _mm_unpackhi_epi8(r[b], r[b + 1]); /* ... of bytes 8..15 */
    }
    for (int h = 0; h < 2; h++) { /* h = 0: rows 0-3, h = 1: rows 4-7 */
        q[4 * h + 0] = _mm_unpacklo_epi16(p[4 * h], p[4 * h + 2]);     /* bytes 0..3 */
        q[4 * h + 1] = _mm_unpackhi_epi16(p[4 * h], p[4 * h + 2]);     /* bytes 4..7 */
        q[4 * h + 2] = _mm_unpacklo_epi16(p[4 * h + 1], p[4 * h + 3]); /* bytes 8..11 */
        q[4 * h + 3] = _mm_unpackhi_epi16(p[4 * h + 1], p[4 * h + 3]); /* bytes 12..15 */
    }
    for (int t = 0; t < 4; t++) {
        __m128i lo = _mm_unpacklo_epi32(q[t], q[4 + t]), hi = _mm_unpackhi_epi32(q[t], q[4 + t]);
        _mm_storeu_si128((__m128i *)(out + 32 * t), transpose8x2(lo));
        _mm_storeu_si128((__m128i *)(out + 32 * t + 16), transpose8x2(hi));
    }
}
#endif

#if AVX2_PATHS
/* transpose8 of each 64-bit quarter */
AVX2 static inline __m256i transpose8x4(__m256i x) {
    static const int shifts[3] = {7, 14, 28};
    static const uint64_t masks[3] = {0x00AA00AA00AA00AAULL, 0x0000CCCC0000CCCCULL, 0x00000000F0F0F0F0ULL};
    for (int s = 0; s < 3; s++) {
        __m256i t = _mm256_and_si256(_mm256_xor_si256(x, _mm256_srli_epi64(x, shifts[s])),
                                     _mm256_set1_epi64x((long long)masks[s]));
        x = _mm256_xor_si256(x, _mm256_xor_si256(t, _mm256_slli_epi64(t, shifts[s])));
    }
    return x;
}

/* unpack128 on both 128-bit lanes at once: 32 bytes of each row give 256 bytes (the low
 * lanes the first 128, the high lanes the next); returns how many row bytes it took. */
AVX2 static size_t unpack_rows_avx2(const uint8_t *const row[8], uint8_t value, uint8_t *out, size_t m, size_t n) {
    size_t j = 0;
    for (; j + 32 <= m && 8 * j + 256 <= n; j += 32) {
        __m256i r[8], p[8], q[8];
        for (int b = 0; b < 8; b++)
            r[b] = row[b] ? _mm256_loadu_si256((const __m256i *)(row[b] + j)) : _mm256_set1_epi8((char)-(value >> b & 1));
        for (int b = 0; b < 8; b += 2) {
            p[b] = _mm256_unpacklo_epi8(r[b], r[b + 1]);
            p[b + 1] = _mm256_unpackhi_epi8(r[b], r[b + 1]);
        }
        for (int h = 0; h < 2; h++) {
            q[4 * h + 0] = _mm256_unpacklo_epi16(p[4 * h], p[4 * h + 2]);
            q[4 * h + 1] = _mm256_unpackhi_epi16(p[4 * h], p[4 * h + 2]);
            q[4 * h + 2] = _mm256_unpacklo_epi16(p[4 * h + 1], p[4 * h + 3]);
            q[4 * h + 3] = _mm256_unpackhi_epi16(p[4 * h + 1], p[4 * h + 3]);
        }
        uint8_t *o = out + 8 * j;
        for (int t = 0; t < 4; t++) {
            __m256i lo = transpose8x4(_mm256_unpacklo_epi32(q[t], q[4 + t]));
            __m256i hi = transpose8x4(_mm256_unpackhi_epi32(q[t], q[4 + t]));
            _mm256_storeu_si256((__m256i *)(o + 32 * t), _mm256_permute2x128_si256(lo, hi, 0x20));
            _mm256_storeu_si256((__m256i *)(o + 128 + 32 * t), _mm256_permute2x128_si256(lo, hi, 0x31));
        }
    }
    return j;
}
#endif

/* Bytes from k packed rows of m bytes (row i: bit bits[i] of every byte). With AVX2 or
 * SSE2, 256 or 128 bytes at a time by unpacks and bit transposes; the rest by one table
 * lookup and shift per row and 8 bytes. */
static void unpack_rows(const uint8_t *in, size_t m, const int *bits, int k, uint8_t value, uint8_t *out,
                        size_t n) {
    size_t j = 0;
#ifdef __SSE2__
    const uint8_t *row[8] = {NULL};
    __m128i r[8];
    for (int i = 0; i < k; i++) row[bits[i]] = in + (size_t)i * m;
#if AVX2_PATHS
    if (have_avx2) j = unpack_rows_avx2(row, value, out, m, n);
#endif
    for (; j + 16 <= m && 8 * j + 128 <= n; j += 16) {
        for (int b = 0; b < 8; b++)
            r[b] = row[b] ? _mm_loadu_si128((const __m128i *)(row[b] + j)) : _mm_set1_epi8((char)-(value >> b & 1));
        unpack128(r, out + 8 * j);
    }
#endif
    uint64_t fill = 0x0101010101010101ULL * value;
    for (; j < m; j++) {
        uint64_t word = fill;
        for (int i = 0; i < k; i++) word |= spread[in[(size_t)i * m + j]] << bits[i];
        if (8 * j + 8 <= n)
            memcpy(out + 8 * j, &word, 8); /* a constant size: one store, not a call */
        else
            memcpy(out + 8 * j, &word, n - 8 * j);
    }
}

/* ---------------------------------------------------------------- whole frames */

/* The bitstreams decode_frame() handles itself (ckptz.codecs ids). */
enum { CODEC_RAW = 0, CODEC_CONST = 1, CODEC_ZSTD = 2, CODEC_BITPACK = 6 };

/* decode_frame(chunks, out, room, word, rotate) -> True if every plane of a frame
 * (`chunks`: (codec id, size, payload) per plane, lowest first) was decoded here and the
 * words merged into `out`, with `room` (at least out's size) as the planes' scratch;
 * False if any plane needs the Python codecs: another bitstream, a zstd frame libzstd
 * must decode, or anything malformed, which they then report. The decoding runs without
 * the GIL from the first plane to the merge. */
static PyObject *native_decode_frame(PyObject *self, PyObject *args) {
    PyObject *seq;
    Py_buffer dst, room, views[8];
    int word, rotate, held = 0, ok = 0;
    if (!PyArg_ParseTuple(args, "Ow*w*ip", &seq, &dst, &room, &word, &rotate)) return NULL;
    PyObject *result = NULL, *fast = NULL;
    int codec[8];
    plane_t planes[8];
    dtable_t *dt = NULL;
    if (check_word(word) < 0) goto done;
    fast = PySequence_Fast(seq, "chunks must be a sequence");
    if (!fast) goto done;
    size_t n = (size_t)dst.len / (size_t)word;
    int usable = PySequence_Fast_GET_SIZE(fast) == word && dst.len % word == 0 && (size_t)room.len >= n * word;
    for (int k = 0; usable && k < word; k++) {
        Py_ssize_t size;
        PyObject *item = PySequence_Fast_GET_ITEM(fast, k);
        if (!PyTuple_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "each chunk must be a (codec id, size, payload) tuple");
            goto done;
        }
        if (!PyArg_ParseTuple(item, "iny*", &codec[k], &size, &views[held])) goto done;
        const uint8_t *bytes = views[held].buf;
        size_t len = (size_t)views[held++].len;
        planes[k].bytes = (uint8_t *)room.buf + (size_t)k * n; /* decoded there */
        planes[k].value = 0;
        int bits[8];
        if ((size_t)size != n) {
            usable = 0;
        } else if (codec[k] == CODEC_RAW) {
            usable = len == n;
            planes[k].bytes = bytes;
        } else if (codec[k] == CODEC_CONST) {
            usable = len == 1;
            planes[k].bytes = NULL;
            planes[k].value = len ? bytes[0] : 0;
        } else if (codec[k] == CODEC_BITPACK) {
            usable = len >= 2 && !(bytes[1] & ~bytes[0]) &&
                     len - 2 == (size_t)varying_list(bytes[0], bits) * ((n + 7) / 8);
        } else {
            usable = codec[k] == CODEC_ZSTD;
        }
        if (usable && codec[k] == CODEC_ZSTD && !dt && !(dt = malloc(sizeof(dtable_t)))) {
            PyErr_NoMemory();
            goto done;
        }
    }
    if (usable) {
        Py_BEGIN_ALLOW_THREADS;
        /* a frame libzstd must decode is found by its block headers before any work */
        for (int k = 0; usable && k < word; k++)
            if (codec[k] == CODEC_ZSTD) usable = literals_frame(views[k].buf, (size_t)views[k].len, NULL, n, dt, 0);
        for (int k = 0; usable && k < word; k++) {
            uint8_t *plane = (uint8_t *)room.buf + (size_t)k * n;
            const uint8_t *in = views[k].buf;
            if (codec[k] == CODEC_ZSTD) {
                usable = literals_frame(in, (size_t)views[k].len, plane, n, dt, 1);
            } else if (codec[k] == CODEC_BITPACK) {
                int bits[8], count = varying_list(in[0], bits);
                unpack_rows(in + 2, (n + 7) / 8, bits, count, in[1], plane, n);
            }
        }
        if (usable) merge_words(planes, dst.buf, n, word, rotate);
        Py_END_ALLOW_THREADS;
        ok = usable;
    }
    result = PyBool_FromLong(ok);
done:
    for (int k = 0; k < held; k++) PyBuffer_Release(&views[k]);
    free(dt);
    Py_XDECREF(fast);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&room);
    return result;
}

/* bitpack_decode(rows, fixed, value, out): the bytes of a bitpack payload's rows. */
static PyObject *native_bitpack_decode(PyObject *self, PyObject *args) {
    Py_buffer rows, dst;
    int fixed, value;
    if (!PyArg_ParseTuple(args, "y*iiw*", &rows, &fixed, &value, &dst)) return NULL;
    PyObject *result = NULL;
    int bits[8], k = varying_list(fixed & 255, bits);
    size_t n = (size_t)dst.len, m = (n + 7) / 8;
    if (fixed < 0 || fixed > 255 || value < 0 || value > 255 || (value & ~fixed)) {
        PyErr_Format(PyExc_ValueError, "fixed-bit mask %d with values %d", fixed, value);
        goto done;
    }
    if ((size_t)rows.len != (size_t)k * m) {
        PyErr_Format(PyExc_ValueError, "%zd bytes of rows for %d varying bits of %zu bytes", rows.len, k, n);
        goto done;
    }
    const uint8_t *in = rows.buf;
    uint8_t *out = dst.buf;
    Py_BEGIN_ALLOW_THREADS;
    unpack_rows(in, m, bits, k, (uint8_t)value, out, n);
    Py_END_ALLOW_THREADS;
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&rows);
    PyBuffer_Release(&dst);
    return result;
}

/* ---------------------------------------------------------------- module */

static PyMethodDef methods[] = {
    {"split", native_split, METH_VARARGS,
     "split(src, dst, word, rotate, sample=0): the byte planes of src's words into dst (plane k at\n"
     "k * n); with sample > 0, each plane's plane_stats as a tuple."},
    {"plane_stats", native_plane_stats, METH_VARARGS,
     "plane_stats(plane, sample): (entropy bits per byte and zero share of a strided sample of about\n"
     "`sample` bytes, AND of all bytes, OR of all bytes)."},
    {"merge", native_merge, METH_VARARGS,
     "merge(planes, dst, word, rotate): words from byte planes (buffers, or ints for constant planes)."},
    {"huffman_zstd", native_huffman_zstd, METH_VARARGS,
     "huffman_zstd(src, block=0): a zstd frame of Huffman-coded literal blocks (adaptive sizes, or `block` bytes each), or None."},
    {"bitpack_encode", native_bitpack_encode, METH_VARARGS,
     "bitpack_encode(src, fixed, value): a ckptz.codecs.bitpack payload of src."},
    {"literals_decode", native_literals_decode, METH_VARARGS,
     "literals_decode(frame, out): decode a zstd frame of literal-only blocks into out; False if not one."},
    {"bitpack_decode", native_bitpack_decode, METH_VARARGS,
     "bitpack_decode(rows, fixed, value, out): bytes from packed rows of varying bits."},
    {"decode_frame", native_decode_frame, METH_VARARGS,
     "decode_frame(chunks, out, room, word, rotate): decode and merge a frame's planes into out; False\n"
     "if a plane needs the Python codecs."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "ckptz._native", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    init_spread();
#if AVX2_PATHS
    /* CKPTZ_NO_AVX2=1 keeps the SSE2 loops (tests run both) */
    const char *off = getenv("CKPTZ_NO_AVX2");
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2") && !(off && *off && strcmp(off, "0"));
#else
    const int have_avx2 = 0;
#endif
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "avx2", have_avx2) < 0) Py_CLEAR(m);
    return m;
}
