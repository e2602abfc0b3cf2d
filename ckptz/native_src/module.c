/*
 * ckptz._native: where ckptz's bytes move, in C (required: ckptz does not import without
 * it). The compress and restore planes code or restore a whole file in one call on threads
 * of their own (compress_plan, restore_plan); the functions below serve the planes, the
 * Python pipeline that GPU engines (and series deltas the planes cannot apply) still take,
 * and the format readers.
 *
 *   compress_plan(...), restore_plan(...)  a whole file, on native threads, GIL released
 *
 *   split(src, dst, word, rotate, sample)  words -> byte planes, one pass (ckptz.codecs.planes),
 *                                       with each plane's statistics (ckptz.codecs.frames)
 *   split_planes(src, word, rotate, sample)  the same into a new bytes object per plane
 *   plane_stats(plane, sample)          the same statistics of one plane
 *   merge(planes, dst, word, rotate)    byte planes (or constant bytes) -> words, one pass
 *   huffman_zstd(src, block)            one standard zstd frame (RFC 8878) of Huffman-coded
 *                                       literal blocks with no sequences, or None
 *   literals_decode(frame, out)         such a frame (or any zstd frame of raw, RLE and
 *                                       literal-only blocks) into out; False to leave it to libzstd
 *   literals_plan(quarters, sizes, ...) such frames planned for the GPU to write
 *                                       (ckptz.engines.gpu.literals)
 *   literals_scan(host, at, sizes, ...) such frames cut into the rows the GPU decodes
 *   bitpack_encode(src, fixed, value)   a ckptz.codecs.bitpack payload (8x8 bit transposes)
 *   bitpack_decode(rows, fixed, value, out)
 *   order1_encode(src, segments, contextual_only)
 *                                       a ckptz.codecs.order1 payload (exponents grouped by
 *                                       the preceding byte's bucket), or None
 *   order1_saving(src, segments)        the share order-1 buckets would save (a sparse sample)
 *   order1_decode(payload, out)         one, decoded; False to leave it to the Python codec
 *   order2d_encode(src, segments, width) a ckptz.codecs.order2d payload (exponents predicted
 *                                       from the row above, residuals grouped), or None
 *   order2d_decode(payload, out)        one, decoded; False if it is malformed
 *   sign2d_encode(src, width, most_miss) a ckptz.codecs.sign2d payload (sign bits predicted from
 *                                       the row above, the mantissa bits packed), or None
 *   sign2d_decode(payload, out)         one, decoded; False if it is malformed
 *   huffexp_encode(src, ctx, segments)  a ckptz.codecs.huffexp payload (a lower plane grouped by
 *                                       the bucket of its element's exponent byte), or None
 *   huffexp_decode(payload, ctx, out)   one, decoded; False if it is malformed
 *   blocked_entropy(src, sub)           order-0 entropy of each block of `sub` bytes, summed
 *   series_delta(data, ref, word, kind, mantissa_bits, scale, forward)
 *                                       a series delta of kind 1-3 applied or undone in place
 *   pickle_scan(data, kinds)            a pickle's opcodes counted to STOP, its largest memo
 *                                       index and protocol (or None: unsure)
 *   pread_many(fd, offsets, sizes)      many small reads of a file, the GIL released once
 *   pread_into(fd, buf, at, to, sizes)  many reads of a file into one buffer, the same
 *   first_difference(fd, data, at, from, sizes)  ranges of a file read back and compared with
 *                                       data, the same; -1 or the first differing offset
 *   xxh3_64(data)                       xxh3_64 (seed 0) of data, as python xxhash's intdigest
 *   xxh3_64_ranges(data, offsets, sizes, out)  the same of many ranges of data, into out
 *   xxh3_64_nested(data, offsets, sizes, out, inner_offsets, inner_sizes, inner_out)
 *                                       the same of ranges and of the ranges inside them
 *                                       (a frame and its digest leaves), in one pass
 *   xxh3_64_each(parts)                 the same of each of many buffers, the GIL released once
 *   xxh3_64_streams(jobs)               the same of inputs given in parts over several
 *                                       calls (rows of tables of states), many at once
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
 *
 * Files, one per concern, built as one compilation unit (this file includes the others,
 * as python-zstandard's c-ext does), so setup.py compiles this file alone:
 *
 *   native.h            what more than one file needs: target attributes, constants, types,
 *                       and each file's entry points
 *   planes.c            split and merge, and a plane's statistics
 *   huffman.c           Huffman codes for zstd literals and their descriptions
 *   literals_encode.c   the zstd frame of Huffman-coded literal blocks
 *   literals_plan.c     the same frames in fixed blocks, planned for the GPU to write
 *   literals_decode.c   such frames, decoded
 *   bitpack.c           bit packing by 8x8 bit transposes (SSE2, AVX2)
 *   order1.c            order-1 exponent coding: bytes grouped by context, literal frames
 *   order2d.c           row-predicted exponents: residuals grouped by prediction, as order1.c
 *   sign2d.c            row-predicted sign bits of a float's lowest plane
 *   huffexp.c           a lower plane grouped by its element's exponent, as order1.c
 *   frame.c             a whole frame's planes decoded and merged
 *   hash.c              xxh3_64 without the GIL (vendored xxHash: xxhash.h, xxh_x86dispatch.c)
 *   plane.c             the restore data plane: a whole file restored on native threads
 *   compress_plane.c    the compress data plane: a whole file coded on native threads
 *   zstd/               zstd 1.5.7 as python-zstandard vendors it (its own compilation unit):
 *                       LZ-coded planes come out byte for byte as the binding codes them
 *   gpu_engine.c        nvCOMP coding and decoding batches of chunks on a GPU (CUDA and nvCOMP loaded
 *                       at run time)
 *   plane_gpu.c         the restore plane with the GPU engine decoding its batches
 *   compress_gpu.c      the compress plane with the GPU engine coding its batches
 *   series_delta.c      series delta kinds 1-3: words coded against a reference's, or its
 *                       scaled prediction
 *   delta_plane.c       series deltas in both planes: paired ranges against a plain or compressed
 *                       reference
 *   module.c            the Python functions above (argument checks, the GIL) and the module
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <unistd.h>

#include "native.h"

#include "planes.c"
#include "huffman.c"
#include "literals_encode.c"
#include "literals_plan.c"
#include "literals_decode.c"
#include "bitpack.c"
#include "order1.c"
#include "order2d.c"
#include "sign2d.c"
#include "huffexp.c"
#include "frame.c"
#include "hash.c"
#include "pickle_ops.c"
#include "fileio.c"
#include "gpu_engine.c"
#include "plane.c"
#include "compress_plane.c"
#include "plane_gpu.c"
#include "compress_gpu.c"
#include "series_delta.c"
#include "delta_plane.c"

/* ---------------------------------------------------------------- split and merge */

static int check_word(int word) {
    if (word != 2 && word != 4 && word != 8) {
        PyErr_Format(PyExc_ValueError, "word size %d: expected 2, 4 or 8", word);
        return -1;
    }
    return 0;
}

/* Each plane's sampled statistics, as plane_stats gives them, from one split. */
static PyObject *split_stats(int word, const double *bits, const double *zeros, uint64_t and_word, uint64_t or_word) {
    PyObject *result = PyTuple_New(word);
    for (int k = 0; result && k < word; k++) {
        PyObject *item = Py_BuildValue("(ddii)", bits[k], zeros[k], (int)(and_word >> (8 * k) & 255),
                                       (int)(or_word >> (8 * k) & 255));
        if (!item) Py_CLEAR(result);
        else PyTuple_SET_ITEM(result, k, item);
    }
    return result;
}

/* The split and each plane's sampled statistics, without the GIL: with many coder threads,
 * every stretch of work that holds it is a stretch the others wait for. */
static void split_sampled(const uint8_t *src, uint8_t *const *planes, size_t n, int word, int rotate,
                          Py_ssize_t sample, double *bits, double *zeros, uint64_t *and_word, uint64_t *or_word) {
    Py_BEGIN_ALLOW_THREADS;
    split_words(src, planes, n, word, rotate, and_word, or_word);
    for (int k = 0; sample > 0 && k < word; k++) sample_stats(planes[k], n, (size_t)sample, &bits[k], &zeros[k]);
    Py_END_ALLOW_THREADS;
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
    double bits[8], zeros[8];
    uint8_t *planes[8];
    for (int k = 0; k < word; k++) planes[k] = (uint8_t *)dst.buf + (size_t)k * n;
    split_sampled(src.buf, planes, n, word, rotate, sample, bits, zeros, &and_word, &or_word);
    result = sample > 0 ? split_stats(word, bits, zeros, and_word, or_word) : Py_NewRef(Py_None);
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

/* split into a new bytes object per plane: a plane stored raw is then its own payload, with
 * no copy out of a reused scratch buffer (a pass over the plane's memory, and one more wait
 * for the GIL, per raw plane). */
static PyObject *native_split_planes(PyObject *self, PyObject *args) {
    Py_buffer src;
    int word, rotate;
    Py_ssize_t sample = 0;
    if (!PyArg_ParseTuple(args, "y*ip|n", &src, &word, &rotate, &sample)) return NULL;
    PyObject *result = NULL, *planes = NULL, *stats = NULL;
    if (check_word(word) < 0) goto done;
    if (src.len % word) {
        PyErr_Format(PyExc_ValueError, "split of %zd bytes: not whole %d-byte words", src.len, word);
        goto done;
    }
    size_t n = (size_t)src.len / (size_t)word;
    uint8_t *into[8];
    if (!(planes = PyTuple_New(word))) goto done;
    for (int k = 0; k < word; k++) {
        PyObject *plane = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
        if (!plane) goto done;
        PyTuple_SET_ITEM(planes, k, plane);
        into[k] = (uint8_t *)PyBytes_AS_STRING(plane);
    }
    uint64_t and_word = 0, or_word = 0;
    double bits[8], zeros[8];
    split_sampled(src.buf, into, n, word, rotate, sample, bits, zeros, &and_word, &or_word);
    if (!(stats = sample > 0 ? split_stats(word, bits, zeros, and_word, or_word) : Py_NewRef(Py_None))) goto done;
    result = PyTuple_Pack(2, planes, stats);
done:
    Py_XDECREF(planes);
    Py_XDECREF(stats);
    PyBuffer_Release(&src);
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
    uint8_t a, o;
    double bits, zeros;
    Py_BEGIN_ALLOW_THREADS;
    plane_stats(plane.buf, (size_t)plane.len, (size_t)sample, &a, &o, &bits, &zeros);
    Py_END_ALLOW_THREADS;
    result = Py_BuildValue("(ddii)", bits, zeros, a, o);
done:
    PyBuffer_Release(&plane);
    return result;
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

/* ---------------------------------------------------------------- zstd literal frames */

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

/* literals_plan(quarters, sizes, src_at, dst_at, cap, block, got, packs, plan, tables, blob)
 *   -> (rows, tables used, blob bytes used): see literals_plan.c. */
static PyObject *native_literals_plan(PyObject *self, PyObject *args) {
    Py_buffer in[5], out[5];
    Py_ssize_t block;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*nw*w*w*w*w*", &in[0], &in[1], &in[2], &in[3], &in[4], &block, &out[0],
                          &out[4], &out[1], &out[2], &out[3]))
        return NULL;
    PyObject *result = NULL;
    int64_t chunks = (int64_t)(in[1].len / 8), blocks = 0;
    for (int64_t c = 0; c < chunks; c++) blocks += (((const int64_t *)in[1].buf)[c] + block - 1) / (block > 0 ? block : 1);
    if (block < MIN_HUFFMAN || block > BLOCK_MAX) {
        PyErr_Format(PyExc_ValueError, "block of %zd bytes: expected %d to %d", block, MIN_HUFFMAN, BLOCK_MAX);
    } else if (in[2].len != in[1].len || in[3].len != in[1].len || in[4].len != in[1].len ||
               out[0].len != in[1].len || out[4].len != in[1].len || in[0].len != blocks * 4 * 256 * 2 ||
               out[1].len < blocks * LP_FIELDS * 8 ||
               out[2].len < blocks * 256 * 4 || out[3].len < blocks * LP_HEAD_MAX) {
        PyErr_SetString(PyExc_ValueError, "literals_plan: buffer sizes do not match the chunks");
    } else {
        int64_t rows, ntab, used;
        Py_BEGIN_ALLOW_THREADS;
        rows = plan_literals((const uint16_t(*)[256])in[0].buf, in[1].buf, in[2].buf, in[3].buf, in[4].buf, chunks,
                             (int64_t)block, out[0].buf, out[4].buf, out[1].buf, (uint32_t(*)[256])out[2].buf,
                             &ntab, out[3].buf, &used);
        Py_END_ALLOW_THREADS;
        result = Py_BuildValue("LLL", (long long)rows, (long long)ntab, (long long)used);
    }
    for (int k = 0; k < 5; k++) PyBuffer_Release(&in[k]);
    for (int k = 0; k < 5; k++) PyBuffer_Release(&out[k]);
    return result;
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

/* literals_scan(host, at, sizes, raw, dst, ok, rows, codes) -> (rows, codes): the frames
 * host[at[f] .. at[f] + sizes[f]) of raw[f] bytes, decoded at dst[f], as the GPU decodes
 * them (literals_decode.c's literals_scan); ok[f] 0 where a frame is not such a frame. With
 * rows and codes None: the room the scan needs (the most it holds at once, a refused
 * frame's rows included until it is refused); with too little room it returns (-1, -1). */
static PyObject *native_literals_scan(PyObject *self, PyObject *args) {
    Py_buffer host, in[4], ok, rows = {0}, codes = {0};
    PyObject *rows_obj, *codes_obj;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*w*OO", &host, &in[0], &in[1], &in[2], &in[3], &ok, &rows_obj, &codes_obj))
        return NULL;
    PyObject *result = NULL;
    int count = rows_obj == Py_None;
    if (!count && (PyObject_GetBuffer(rows_obj, &rows, PyBUF_WRITABLE) < 0 ||
                   PyObject_GetBuffer(codes_obj, &codes, PyBUF_WRITABLE) < 0))
        goto done;
    int64_t frames = (int64_t)(in[0].len / 8);
    if (in[1].len != in[0].len || in[2].len != in[0].len || in[3].len != in[0].len || ok.len != frames) {
        PyErr_SetString(PyExc_ValueError, "literals_scan: one offset, size, raw size, destination and flag a frame");
        goto done;
    }
    const int64_t *at = in[0].buf, *size = in[1].buf, *raw = in[2].buf, *dst = in[3].buf;
    for (int64_t f = 0; f < frames; f++)
        if (at[f] < 0 || size[f] < 0 || raw[f] < 0 || at[f] > (int64_t)host.len - size[f]) {
            PyErr_Format(PyExc_ValueError, "literals_scan: frame %lld lies outside the buffer", (long long)f);
            goto done;
        }
    scan_t o = {count ? NULL : rows.buf, 0, count ? 0 : rows.len / (8 * SCAN_FIELDS),
                count ? NULL : codes.buf, 0, count ? 0 : codes.len / (2 * SCAN_LOOKUP), 0, 0, 0};
    dtable_t *dt = malloc(sizeof(dtable_t));
    if (!dt) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    for (int64_t f = 0; f < frames && !o.over; f++)
        ((uint8_t *)ok.buf)[f] = (uint8_t)scan_frame(&o, host.buf, (size_t)at[f], (size_t)size[f], (size_t)raw[f],
                                                     dst[f], dt);
    Py_END_ALLOW_THREADS;
    free(dt);
    result = o.over    ? Py_BuildValue("LL", -1LL, -1LL)
             : count ? Py_BuildValue("LL", (long long)o.peak_rows, (long long)o.peak_codes)
                     : Py_BuildValue("LL", (long long)o.nrows, (long long)o.ncodes);
done:
    PyBuffer_Release(&host);
    for (int k = 0; k < 4; k++) PyBuffer_Release(&in[k]);
    PyBuffer_Release(&ok);
    if (rows.obj) PyBuffer_Release(&rows);
    if (codes.obj) PyBuffer_Release(&codes);
    return result;
}

/* ---------------------------------------------------------------- order-1 exponents */

/* order1_encode(src, segments, contextual_only=False) -> a ckptz.codecs.order1 payload, or
 * None if a group's table cannot be described (or, contextual_only, if one bucket is chosen). */
static PyObject *native_order1_encode(PyObject *self, PyObject *args) {
    Py_buffer src;
    int segments, contextual_only = 0;
    if (!PyArg_ParseTuple(args, "y*i|p", &src, &segments, &contextual_only)) return NULL;
    PyObject *result = NULL;
    if (segments < 1 || segments > O1_MAX_SEGMENTS || (size_t)src.len > 0xFFFFFFFFu) {
        PyErr_Format(PyExc_ValueError, "%d segments of %zd bytes: expected 1 to %d, under 4 GiB", segments, src.len,
                     O1_MAX_SEGMENTS);
        goto done;
    }
    uint8_t *buf;
    size_t size;
    Py_BEGIN_ALLOW_THREADS;
    size = order1_encode(src.buf, (size_t)src.len, segments, contextual_only, &buf);
    Py_END_ALLOW_THREADS;
    result = size ? PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)size) : Py_NewRef(Py_None);
    free(buf);
done:
    PyBuffer_Release(&src);
    return result;
}

/* order1_saving(src, segments) -> the share of an order-0 code that order-1 buckets are
 * estimated to save on src, from a sparse sample of its pairs. */
static PyObject *native_order1_saving(PyObject *self, PyObject *args) {
    Py_buffer src;
    int segments;
    if (!PyArg_ParseTuple(args, "y*i", &src, &segments)) return NULL;
    PyObject *result = NULL;
    if (segments < 1 || segments > O1_MAX_SEGMENTS || (size_t)src.len > 0xFFFFFFFFu) {
        PyErr_Format(PyExc_ValueError, "%d segments of %zd bytes: expected 1 to %d, under 4 GiB", segments, src.len,
                     O1_MAX_SEGMENTS);
        goto done;
    }
    float saving;
    Py_BEGIN_ALLOW_THREADS;
    saving = order1_saving(src.buf, (size_t)src.len, segments);
    Py_END_ALLOW_THREADS;
    result = saving < 0 ? PyErr_NoMemory() : PyFloat_FromDouble((double)saving);
done:
    PyBuffer_Release(&src);
    return result;
}

/* blocked_entropy(src, sub) -> the sum of the order-0 entropies of src's blocks of `sub`
 * bytes, in bytes. */
static PyObject *native_blocked_entropy(PyObject *self, PyObject *args) {
    Py_buffer src;
    Py_ssize_t sub;
    if (!PyArg_ParseTuple(args, "y*n", &src, &sub)) return NULL;
    PyObject *result = NULL;
    if (sub < 1) {
        PyErr_Format(PyExc_ValueError, "blocks of %zd bytes", sub);
    } else {
        double bytes;
        Py_BEGIN_ALLOW_THREADS;
        bytes = blocked_entropy(src.buf, (size_t)src.len, (size_t)sub);
        Py_END_ALLOW_THREADS;
        result = PyFloat_FromDouble(bytes);
    }
    PyBuffer_Release(&src);
    return result;
}

/* The three table coders' decoders take (payload, out) alike: a bool, False where the
 * payload is malformed, decoded without the GIL with a decoding table and a scratch of out's
 * size. */
typedef int (*table_decoder_t)(const uint8_t *, size_t, uint8_t *, size_t, uint8_t *, dtable_t *);

static PyObject *decode_with_table(PyObject *args, table_decoder_t decode) {
    Py_buffer src, dst;
    if (!PyArg_ParseTuple(args, "y*w*", &src, &dst)) return NULL;
    PyObject *result = NULL;
    dtable_t *dt = malloc(sizeof(dtable_t));
    uint8_t *scratch = malloc(dst.len ? (size_t)dst.len : 1);
    if (!dt || !scratch) {
        PyErr_NoMemory();
    } else {
        int ok;
        Py_BEGIN_ALLOW_THREADS;
        ok = decode(src.buf, (size_t)src.len, dst.buf, (size_t)dst.len, scratch, dt);
        Py_END_ALLOW_THREADS;
        result = PyBool_FromLong(ok);
    }
    free(dt);
    free(scratch);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

/* order1_decode(payload, out) -> True if the payload was decoded into `out` (its exact
 * size), False if it is malformed or a group needs libzstd (the Python decoder then
 * decodes it or says what is wrong). */
static PyObject *native_order1_decode(PyObject *self, PyObject *args) {
    return decode_with_table(args, order1_decode);
}

/* order2d_encode(src, segments, width=0) -> a ckptz.codecs.order2d payload, or None where no
 * row width pays (width 0: the encoder searches one) or a group's table cannot be described. */
static PyObject *native_order2d_encode(PyObject *self, PyObject *args) {
    Py_buffer src;
    int segments;
    Py_ssize_t width = 0;
    if (!PyArg_ParseTuple(args, "y*i|n", &src, &segments, &width)) return NULL;
    PyObject *result = NULL;
    if (segments < 1 || segments > O1_MAX_SEGMENTS || (size_t)src.len > 0xFFFFFFFFu || width < 0 ||
        (size_t)width > 0xFFFFFFFFu) {
        PyErr_Format(PyExc_ValueError, "%d segments of %zd bytes, width %zd: expected 1 to %d, under 4 GiB", segments,
                     src.len, width, O1_MAX_SEGMENTS);
        goto done;
    }
    uint8_t *buf;
    size_t size;
    Py_BEGIN_ALLOW_THREADS;
    size = order2d_encode(src.buf, (size_t)src.len, segments, (size_t)width, &buf);
    Py_END_ALLOW_THREADS;
    result = size ? PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)size) : Py_NewRef(Py_None);
    free(buf);
done:
    PyBuffer_Release(&src);
    return result;
}

/* order2d_decode(payload, out) -> True if the payload was decoded into `out` (its exact
 * size), False if it is malformed. */
static PyObject *native_order2d_decode(PyObject *self, PyObject *args) {
    return decode_with_table(args, order2d_decode);
}

/* sign2d_encode(src, width=0, most_miss=1.0) -> a ckptz.codecs.sign2d payload, or None where
 * no row width predicts the sign bits (width 0: the encoder searches one; also where the one
 * found mispredicts more than most_miss of the sampled signs) or the residual's table cannot
 * be described. */
static PyObject *native_sign2d_encode(PyObject *self, PyObject *args) {
    Py_buffer src;
    Py_ssize_t width = 0;
    double most_miss = 1.0;
    if (!PyArg_ParseTuple(args, "y*|nd", &src, &width, &most_miss)) return NULL;
    PyObject *result = NULL;
    if ((size_t)src.len > 0xFFFFFFFFu || width < 0 || (size_t)width > 0xFFFFFFFFu) {
        PyErr_Format(PyExc_ValueError, "%zd bytes, width %zd: expected under 4 GiB", src.len, width);
        goto done;
    }
    uint8_t *buf;
    size_t size;
    Py_BEGIN_ALLOW_THREADS;
    size = sign2d_encode(src.buf, (size_t)src.len, (size_t)width, most_miss, &buf);
    Py_END_ALLOW_THREADS;
    result = size ? PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)size) : Py_NewRef(Py_None);
    free(buf);
done:
    PyBuffer_Release(&src);
    return result;
}

/* sign2d_decode(payload, out) -> True if the payload was decoded into `out` (its exact
 * size), False if it is malformed. */
static PyObject *native_sign2d_decode(PyObject *self, PyObject *args) {
    return decode_with_table(args, sign2d_decode);
}

/* ---------------------------------------------------------------- bit packing */

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
    pack_rows(in, n, bits, k, out, m);
    Py_END_ALLOW_THREADS;
done:
    PyBuffer_Release(&src);
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

/* ---------------------------------------------------------------- mantissas given exponents */

/* The (src, ctx, segments) arguments of huffexp_encode: two buffers of one
 * size under 4 GiB and 1 to O1_MAX_SEGMENTS segments; 0 with ValueError set otherwise. */
static int huffexp_args(const Py_buffer *src, const Py_buffer *ctx, int segments) {
    if (segments < 1 || segments > O1_MAX_SEGMENTS || (size_t)src->len > 0xFFFFFFFFu || ctx->len != src->len) {
        PyErr_Format(PyExc_ValueError, "%d segments of %zd bytes with %zd context bytes: expected 1 to %d, under 4 GiB",
                     segments, src->len, ctx->len, O1_MAX_SEGMENTS);
        return 0;
    }
    return 1;
}

/* huffexp_encode(src, ctx, segments) -> a ckptz.codecs.huffexp payload of src given the
 * context bytes ctx, or None where no bucket split pays or a group's table cannot be
 * described. */
static PyObject *native_huffexp_encode(PyObject *self, PyObject *args) {
    Py_buffer src, ctx;
    int segments;
    if (!PyArg_ParseTuple(args, "y*y*i", &src, &ctx, &segments)) return NULL;
    PyObject *result = NULL;
    if (huffexp_args(&src, &ctx, segments)) {
        uint8_t *buf;
        size_t size;
        Py_BEGIN_ALLOW_THREADS;
        size = huffexp_encode(src.buf, ctx.buf, (size_t)src.len, segments, &buf);
        Py_END_ALLOW_THREADS;
        result = size ? PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)size) : Py_NewRef(Py_None);
        free(buf);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&ctx);
    return result;
}

/* huffexp_decode(payload, ctx, out) -> True if the payload was decoded into `out` (its exact
 * size) given the context bytes ctx (out's size), False if it is malformed. */
static PyObject *native_huffexp_decode(PyObject *self, PyObject *args) {
    Py_buffer src, ctx, dst;
    if (!PyArg_ParseTuple(args, "y*y*w*", &src, &ctx, &dst)) return NULL;
    PyObject *result = NULL;
    dtable_t *dt = NULL;
    uint8_t *scratch = NULL;
    if (ctx.len != dst.len) {
        PyErr_Format(PyExc_ValueError, "%zd context bytes for %zd bytes", ctx.len, dst.len);
        goto done;
    }
    dt = malloc(sizeof(dtable_t));
    scratch = malloc(dst.len ? (size_t)dst.len : 1);
    if (!dt || !scratch) {
        PyErr_NoMemory();
        goto done;
    }
    int ok;
    Py_BEGIN_ALLOW_THREADS;
    ok = order1_usable(src.buf, (size_t)src.len, (size_t)dst.len, dt) &&
         huffexp_decode(src.buf, (size_t)src.len, dst.buf, (size_t)dst.len, ctx.buf, scratch, dt);
    Py_END_ALLOW_THREADS;
    result = PyBool_FromLong(ok);
done:
    free(dt);
    free(scratch);
    PyBuffer_Release(&src);
    PyBuffer_Release(&ctx);
    PyBuffer_Release(&dst);
    return result;
}

/* ---------------------------------------------------------------- whole frames */

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
    chunk_t chunks[8];
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
        if (!PyArg_ParseTuple(item, "iny*", &chunks[k].codec, &size, &views[held])) goto done;
        chunks[k].bytes = views[held].buf;
        chunks[k].len = (size_t)views[held++].len;
        usable = frame_chunk_usable(&chunks[k], (size_t)size, n, (uint8_t *)room.buf + (size_t)k * n, &planes[k]);
        if (usable && frame_chunk_tabled(chunks[k].codec) && !dt && !(dt = malloc(sizeof(dtable_t)))) {
            PyErr_NoMemory();
            goto done;
        }
    }
    if (usable) {
        Py_BEGIN_ALLOW_THREADS;
        ok = frame_decode(chunks, planes, word, n, room.buf, dst.buf, rotate, dt);
        Py_END_ALLOW_THREADS;
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

/* ---------------------------------------------------------------- module */

/* copy(data) -> bytes: a copy made without the GIL (a stored plane is a frame's biggest
   payload; copying it while holding the GIL stalled every other coder thread). */
/* Many small preads in one call that releases the GIL once: the few hundred bytes a
 * stream plan samples from each of a large optimizer's thousands of tensors. Each read
 * stops early only at the end of the file (the bytes object is then shorter). */

/* Whether foffs, boffs and sizes are int64 tables of one length whose ranges (file offset,
 * place in a buffer of `limit` bytes, bytes) lie inside that buffer; if not, a ValueError
 * naming `what` is set. */
static int file_ranges_ok(const char *what, const Py_buffer *foffs, const Py_buffer *boffs, const Py_buffer *sizes,
                          Py_ssize_t limit) {
    if (foffs->len % sizeof(int64_t) || boffs->len != foffs->len || sizes->len != foffs->len) {
        PyErr_Format(PyExc_ValueError, "%s: the offsets and sizes must be int64 of one length", what);
        return 0;
    }
    const int64_t *fo = foffs->buf, *bo = boffs->buf, *len = sizes->buf;
    for (size_t i = 0; i < (size_t)foffs->len / sizeof(int64_t); i++)
        if (fo[i] < 0 || bo[i] < 0 || len[i] < 0 || bo[i] > limit || len[i] > limit - bo[i]) {
            PyErr_Format(PyExc_ValueError, "%s: range %zu (%lld, %lld, %lld) is outside the buffer", what, i,
                         (long long)fo[i], (long long)bo[i], (long long)len[i]);
            return 0;
        }
    return 1;
}

/* pread_into(fd, buffer, file_offsets, buffer_offsets, sizes) -> int: reads of a file into
 * places of one writable buffer (int64 tables of one length), the GIL released once; the
 * bytes read, fewer than asked where the file ends first (the reads stop there). Reads
 * that follow on in both the file and the buffer are made as one. */
static PyObject *native_pread_into(PyObject *self, PyObject *args) {
    int fd;
    Py_buffer buf, foffs, boffs, sizes;
    if (!PyArg_ParseTuple(args, "iw*y*y*y*", &fd, &buf, &foffs, &boffs, &sizes)) return NULL;
    PyObject *result = NULL;
    size_t count = (size_t)foffs.len / sizeof(int64_t);
    const int64_t *fo = foffs.buf, *bo = boffs.buf, *len = sizes.buf;
    if (!file_ranges_ok("pread_into", &foffs, &boffs, &sizes, buf.len)) goto done;
    int error = 0;
    Py_ssize_t total = 0;
    Py_BEGIN_ALLOW_THREADS;
    size_t i = 0;
    while (i < count && !error) {
        int64_t at = fo[i], to = bo[i], want = len[i];
        size_t j = i + 1;
        for (; j < count && fo[j] == at + want && bo[j] == to + want; j++) want += len[j];
        int64_t got = pread_fully(fd, (char *)buf.buf + to, want, at, &error);
        total += (Py_ssize_t)got;
        if (got < want) break;
        i = j;
    }
    Py_END_ALLOW_THREADS;
    if (error) {
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    result = PyLong_FromSsize_t(total);
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&foffs);
    PyBuffer_Release(&boffs);
    PyBuffer_Release(&sizes);
    return result;
}

/* first_difference(fd, data, file_offsets, data_offsets, sizes) -> int: reads each range of
 * a file back and compares it with the bytes of data at its place (int64 tables of one
 * length), the GIL released once; -1 where every range equals, else the file offset of the
 * first difference found (a read cut short by the file's end differs where it stops). */
#define COMPARE_BLOCK (256 << 10)
static PyObject *native_first_difference(PyObject *self, PyObject *args) {
    int fd;
    Py_buffer data, foffs, doffs, sizes;
    if (!PyArg_ParseTuple(args, "iy*y*y*y*", &fd, &data, &foffs, &doffs, &sizes)) return NULL;
    PyObject *result = NULL;
    size_t count = (size_t)foffs.len / sizeof(int64_t);
    const int64_t *fo = foffs.buf, *dof = doffs.buf, *len = sizes.buf;
    if (!file_ranges_ok("first_difference", &foffs, &doffs, &sizes, data.len)) goto done;
    int error = 0;
    int64_t found = -1;
    Py_BEGIN_ALLOW_THREADS;
    char *back = malloc(COMPARE_BLOCK);
    if (!back) error = ENOMEM;
    for (size_t i = 0; i < count && found < 0 && !error; i++)
        for (int64_t at = 0; at < len[i];) {
            int64_t want = len[i] - at < COMPARE_BLOCK ? len[i] - at : COMPARE_BLOCK;
            int64_t got = pread_fully(fd, back, want, fo[i] + at, &error);
            if (error) break;
            const char *ours = (const char *)data.buf + dof[i] + at;
            if (got < want || memcmp(back, ours, (size_t)got) != 0) {
                int64_t k = 0;
                while (k < got && back[k] == ours[k]) k++;
                found = fo[i] + at + k;
                break;
            }
            at += got;
        }
    free(back);
    Py_END_ALLOW_THREADS;
    if (error) {
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    result = PyLong_FromLongLong((long long)found);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&foffs);
    PyBuffer_Release(&doffs);
    PyBuffer_Release(&sizes);
    return result;
}

static PyObject *native_pread_many(PyObject *self, PyObject *args) {
    int fd;
    Py_buffer offsets, sizes;
    if (!PyArg_ParseTuple(args, "iy*y*", &fd, &offsets, &sizes)) return NULL;
    PyObject *result = NULL;
    size_t count = (size_t)offsets.len / sizeof(int64_t);
    const int64_t *off = offsets.buf, *len = sizes.buf;
    char **dst = NULL;
    Py_ssize_t *got = NULL;
    if (offsets.len % sizeof(int64_t) || sizes.len != offsets.len) {
        PyErr_SetString(PyExc_ValueError, "pread_many: offsets and sizes must be int64 of one length");
        goto done;
    }
    for (size_t i = 0; i < count; i++)
        if (off[i] < 0 || len[i] < 0 || len[i] > PY_SSIZE_T_MAX) {
            PyErr_Format(PyExc_ValueError, "pread_many: read %zu (%lld, %lld) is negative", i, (long long)off[i],
                         (long long)len[i]);
            goto done;
        }
    dst = PyMem_Calloc(count ? count : 1, sizeof(char *));
    got = PyMem_Calloc(count ? count : 1, sizeof(Py_ssize_t));
    if (!dst || !got || !(result = PyList_New((Py_ssize_t)count))) {
        if (!PyErr_Occurred()) PyErr_NoMemory();
        goto done;
    }
    for (size_t i = 0; i < count; i++) {
        PyObject *b = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len[i]);
        if (!b) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, (Py_ssize_t)i, b);
        dst[i] = PyBytes_AS_STRING(b);
    }
    int error = 0;
    Py_BEGIN_ALLOW_THREADS;
    for (size_t i = 0; i < count && !error; i++) got[i] = (Py_ssize_t)pread_fully(fd, dst[i], len[i], off[i], &error);
    Py_END_ALLOW_THREADS;
    if (error) {
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
        Py_CLEAR(result);
        goto done;
    }
    for (size_t i = 0; i < count; i++)
        if (got[i] < len[i]) {
            PyObject *whole = PyList_GET_ITEM(result, (Py_ssize_t)i), *part = PyBytes_FromStringAndSize(dst[i], got[i]);
            if (!part) {
                Py_CLEAR(result);
                goto done;
            }
            PyList_SET_ITEM(result, (Py_ssize_t)i, part);
            Py_DECREF(whole);
        }
done:
    PyMem_Free(dst);
    PyMem_Free(got);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&sizes);
    return result;
}

static PyObject *native_copy(PyObject *self, PyObject *args) {
    Py_buffer src;
    if (!PyArg_ParseTuple(args, "y*", &src)) return NULL;
    PyObject *result = PyBytes_FromStringAndSize(NULL, src.len);
    if (result) {
        char *out = PyBytes_AS_STRING(result);
        Py_BEGIN_ALLOW_THREADS;
        memcpy(out, src.buf, (size_t)src.len);
        Py_END_ALLOW_THREADS;
    }
    PyBuffer_Release(&src);
    return result;
}

/* ---------------------------------------------------------------- checksums */

/* Below this, releasing and taking back the GIL costs more than the hash. */
#define HASH_WITHOUT_GIL (16 << 10)

static PyObject *native_pickle_scan(PyObject *self, PyObject *args) {
    Py_buffer data, kinds;
    if (!PyArg_ParseTuple(args, "y*y*", &data, &kinds)) return NULL;
    PyObject *result = NULL;
    if (kinds.len != 256) {
        PyErr_SetString(PyExc_ValueError, "pickle_scan: kinds must be 256 bytes");
    } else {
        pickle_scan_t scan;
        int ok;
        if (data.len > (1 << 20)) { /* small pickles: cheaper than giving the GIL up */
            Py_BEGIN_ALLOW_THREADS;
            ok = pickle_scan(data.buf, (size_t)data.len, kinds.buf, &scan);
            Py_END_ALLOW_THREADS;
        } else {
            ok = pickle_scan(data.buf, (size_t)data.len, kinds.buf, &scan);
        }
        result = ok ? Py_BuildValue("(KKi)", (unsigned long long)scan.count, (unsigned long long)scan.max_put,
                                    scan.max_proto)
                    : Py_NewRef(Py_None);
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&kinds);
    return result;
}

static PyObject *native_xxh3_64(PyObject *self, PyObject *args) {
    Py_buffer src;
    if (!PyArg_ParseTuple(args, "y*", &src)) return NULL;
    uint64_t h;
    if (src.len >= HASH_WITHOUT_GIL) {
        Py_BEGIN_ALLOW_THREADS;
        h = CKPTZ_XXH3_64(src.buf, (size_t)src.len);
        Py_END_ALLOW_THREADS;
    } else {
        h = CKPTZ_XXH3_64(src.buf, (size_t)src.len);
    }
    PyBuffer_Release(&src);
    return PyLong_FromUnsignedLongLong(h);
}

/* Whether offsets, sizes and out are int64/uint64 tables of one length whose ranges lie
 * inside `len` bytes (and, with `sorted`, come in order without overlaps); if not, a
 * ValueError naming `what` and the table's `label` is set. */
static int hash_ranges_ok(const char *what, const char *label, const Py_buffer *offsets, const Py_buffer *sizes,
                          const Py_buffer *out, Py_ssize_t len, int sorted) {
    if (offsets->len % sizeof(int64_t) || sizes->len != offsets->len || out->len != offsets->len) {
        PyErr_Format(PyExc_ValueError, "%s: offsets, sizes and out must be int64/uint64 of one length", what);
        return 0;
    }
    const int64_t *at = offsets->buf, *size = sizes->buf;
    for (size_t i = 0; i < (size_t)offsets->len / sizeof(int64_t); i++) {
        if (at[i] < 0 || size[i] < 0 || at[i] > len || size[i] > len - at[i]) {
            PyErr_Format(PyExc_ValueError, "%s: %srange %zu (%lld, %lld) outside %zd bytes", what, label, i,
                         (long long)at[i], (long long)size[i], len);
            return 0;
        }
        if (sorted && i && at[i] < at[i - 1] + size[i - 1]) {
            PyErr_Format(PyExc_ValueError, "%s: %srange %zu overlaps or precedes the one before", what, label, i);
            return 0;
        }
    }
    return 1;
}

static PyObject *native_xxh3_64_ranges(PyObject *self, PyObject *args) {
    Py_buffer src, offsets, sizes, out;
    if (!PyArg_ParseTuple(args, "y*y*y*w*", &src, &offsets, &sizes, &out)) return NULL;
    PyObject *result = NULL;
    size_t count = (size_t)offsets.len / sizeof(int64_t);
    if (!hash_ranges_ok("xxh3_64_ranges", "", &offsets, &sizes, &out, src.len, 0)) goto done;
    Py_BEGIN_ALLOW_THREADS;
    hash_ranges(src.buf, offsets.buf, sizes.buf, out.buf, count);
    Py_END_ALLOW_THREADS;
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *native_xxh3_64_nested(PyObject *self, PyObject *args) {
    Py_buffer src, oat, osize, oout, iat, isize, iout;
    if (!PyArg_ParseTuple(args, "y*y*y*w*y*y*w*", &src, &oat, &osize, &oout, &iat, &isize, &iout)) return NULL;
    PyObject *result = NULL;
    size_t outers = (size_t)oat.len / sizeof(int64_t), inners = (size_t)iat.len / sizeof(int64_t);
    if (!hash_ranges_ok("xxh3_64_nested", "outer ", &oat, &osize, &oout, src.len, 1) ||
        !hash_ranges_ok("xxh3_64_nested", "inner ", &iat, &isize, &iout, src.len, 1))
        goto done;
    Py_BEGIN_ALLOW_THREADS;
    hash_nested(src.buf, oat.buf, osize.buf, oout.buf, outers, iat.buf, isize.buf, iout.buf, inners);
    Py_END_ALLOW_THREADS;
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&oat);
    PyBuffer_Release(&osize);
    PyBuffer_Release(&oout);
    PyBuffer_Release(&iat);
    PyBuffer_Release(&isize);
    PyBuffer_Release(&iout);
    return result;
}

/* One row of a table of xxh3_64 streaming states: XXH3_state_t must be 64-byte aligned, and
 * a row's state starts at its first aligned byte (the same one while the table stays put). */
#define XXH3_STATE_ROW ((sizeof(XXH3_state_t) + 63) / 64 * 64 + 64)

static XXH3_state_t *state_row(Py_buffer *table, Py_ssize_t row) {
    if (row < 0 || (size_t)table->len / XXH3_STATE_ROW <= (size_t)row) {
        PyErr_SetString(PyExc_IndexError, "xxh3_64_streams: row outside the state table");
        return NULL;
    }
    uintptr_t at = (uintptr_t)table->buf + (size_t)row * XXH3_STATE_ROW;
    return (XXH3_state_t *)((at + 63) & ~(uintptr_t)63);
}

/* Streams parts of several inputs into their state rows and returns each one's xxh3_64 so
 * far: jobs is a sequence of (table, row, reset, parts). Digest leaves hashed part by part
 * as the frames holding their parts arrive, all that a run of frames lets through in one
 * call that releases the GIL once (taking it back costs more than hashing a leaf). */
static PyObject *native_xxh3_64_streams(PyObject *self, PyObject *args) {
    PyObject *jobs_arg;
    if (!PyArg_ParseTuple(args, "O", &jobs_arg)) return NULL;
    PyObject *jobs = PySequence_Fast(jobs_arg, "xxh3_64_streams: jobs must be a sequence");
    if (!jobs) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(jobs), tables = 0, held = 0, total = 0, n_parts = 0;
    PyObject *result = NULL, **fast = PyMem_Calloc((size_t)(count ? count : 1), sizeof(PyObject *));
    Py_buffer *table = PyMem_Calloc((size_t)(count ? count : 1), sizeof(Py_buffer));
    XXH3_state_t **state = PyMem_Calloc((size_t)(count ? count : 1), sizeof(XXH3_state_t *));
    int *reset = PyMem_Calloc((size_t)(count ? count : 1), sizeof(int));
    uint64_t *out = PyMem_Calloc((size_t)(count ? count : 1), sizeof(uint64_t));
    Py_buffer *views = NULL;
    if (!fast || !table || !state || !reset || !out) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < count; j++, tables++) {
        PyObject *job = PySequence_Fast_GET_ITEM(jobs, j), *parts;
        Py_ssize_t row;
        if (!PyArg_ParseTuple(job, "w*npO;xxh3_64_streams: a job is (table, row, reset, parts)", &table[j], &row,
                              &reset[j], &parts))
            goto done;
        if (!(state[j] = state_row(&table[j], row))) {
            PyBuffer_Release(&table[j]);
            goto done;
        }
        if (!(fast[j] = PySequence_Fast(parts, "xxh3_64_streams: parts must be a sequence of buffers"))) {
            PyBuffer_Release(&table[j]);
            goto done;
        }
        n_parts += PySequence_Fast_GET_SIZE(fast[j]);
    }
    views = PyMem_Calloc((size_t)(n_parts ? n_parts : 1), sizeof(Py_buffer));
    if (!views) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < count; j++)
        for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(fast[j]); k++, held++) {
            if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast[j], k), &views[held], PyBUF_SIMPLE) < 0) goto done;
            total += views[held].len;
        }
    PyThreadState *released = total >= HASH_WITHOUT_GIL ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t j = 0, v = 0; j < count; j++) {
        if (reset[j]) XXH3_64bits_reset(state[j]);
        for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(fast[j]); k++, v++)
            CKPTZ_XXH3_64_UPDATE(state[j], views[v].buf, (size_t)views[v].len);
        out[j] = XXH3_64bits_digest(state[j]);
    }
    if (released) PyEval_RestoreThread(released);
    result = PyList_New(count);
    for (Py_ssize_t j = 0; result && j < count; j++) {
        PyObject *h = PyLong_FromUnsignedLongLong(out[j]);
        if (!h) Py_CLEAR(result);
        else PyList_SET_ITEM(result, j, h);
    }
done:
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    for (Py_ssize_t j = 0; j < tables; j++) {
        PyBuffer_Release(&table[j]);
        Py_XDECREF(fast[j]);
    }
    PyMem_Free(views);
    PyMem_Free(fast);
    PyMem_Free(table);
    PyMem_Free(state);
    PyMem_Free(reset);
    PyMem_Free(out);
    Py_DECREF(jobs);
    return result;
}

/* xxh3_64 of each buffer of a sequence (a run's payloads), in one call that releases the GIL
 * once: a writer took a payload's checksum a call at a time, and with every pipeline thread
 * waiting on the GIL each call's return cost more than its hashing. */
static PyObject *native_xxh3_64_each(PyObject *self, PyObject *args) {
    PyObject *parts_arg;
    if (!PyArg_ParseTuple(args, "O", &parts_arg)) return NULL;
    PyObject *parts = PySequence_Fast(parts_arg, "xxh3_64_each: parts must be a sequence of buffers");
    if (!parts) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(parts), held = 0, total = 0;
    PyObject *result = NULL;
    Py_buffer *views = PyMem_Calloc((size_t)(count ? count : 1), sizeof(Py_buffer));
    uint64_t *out = PyMem_Calloc((size_t)(count ? count : 1), sizeof(uint64_t));
    if (!views || !out) {
        PyErr_NoMemory();
        goto done;
    }
    for (; held < count; held++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(parts, held), &views[held], PyBUF_SIMPLE) < 0) goto done;
        total += views[held].len;
    }
    PyThreadState *released = total >= HASH_WITHOUT_GIL ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < count; i++) out[i] = CKPTZ_XXH3_64(views[i].buf, (size_t)views[i].len);
    if (released) PyEval_RestoreThread(released);
    result = PyList_New(count);
    for (Py_ssize_t i = 0; result && i < count; i++) {
        PyObject *h = PyLong_FromUnsignedLongLong(out[i]);
        if (!h) Py_CLEAR(result);
        else PyList_SET_ITEM(result, i, h);
    }
done:
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(out);
    Py_DECREF(parts);
    return result;
}

/* Tests turn the AVX2 loops off and on again, to check the SSE2 ones on a CPU that has AVX2. */
static PyObject *native_gpu_memory(PyObject *self, PyObject *args) {
    int reset = 0;
    if (!PyArg_ParseTuple(args, "|p", &reset)) return NULL;
    int64_t held = __atomic_load_n(&gpu_held_bytes, __ATOMIC_RELAXED);
    int64_t peak = reset ? __atomic_exchange_n(&gpu_peak_bytes, held, __ATOMIC_RELAXED)
                         : __atomic_load_n(&gpu_peak_bytes, __ATOMIC_RELAXED);
    return Py_BuildValue("LL", (long long)held, (long long)peak);
}

static PyObject *native_use_avx2(PyObject *self, PyObject *arg) {
    (void)self;
    int want = PyObject_IsTrue(arg);
    if (want < 0) return NULL;
#if AVX2_PATHS
    int before = have_avx2;
    have_avx2 = want && __builtin_cpu_supports("avx2");
    return PyBool_FromLong(before);
#else
    return PyBool_FromLong(0);
#endif
}

/* ---------------------------------------------------------------- the restore data plane */

/* A plan table: a C-contiguous int64 buffer of `cols` columns; its rows, or -1 (error set). */
static Py_ssize_t plan_rows(const Py_buffer *b, Py_ssize_t cols, const char *what) {
    if (b->itemsize != 8 || b->len % (8 * cols)) {
        PyErr_Format(PyExc_ValueError, "%s: an int64 table of %zd columns expected", what, cols);
        return -1;
    }
    return b->len / (8 * cols);
}

/* A plane's `stages` argument, where given: an int64 table of STAGE_COLS columns, a row per
 * thread (plane threads first, then GPU workers), zeroed here for the plane to fill; its
 * rows (0 where not given), or -1 (error set). */
static int64_t stage_table(Py_buffer *b, int64_t **rows) {
    *rows = NULL;
    if (!b->obj) return 0;
    Py_ssize_t count = plan_rows(b, STAGE_COLS, "stages");
    if (count < 0) return -1;
    memset(b->buf, 0, (size_t)b->len);
    *rows = b->buf;
    return count;
}

/* References followed at once: series/reference.py's MAX_CHAIN. */
#define DELTA_MAX_CHAIN 64

/* A series delta argument of either plane, parsed (delta_plane.c's delta_t), with the tables
 * it holds until delta_release, and its reference container's own delta, where it is one. */
typedef struct delta_args {
    delta_t delta;
    Py_buffer ranges, frames, chunks, pieces, lookup;
    int parsed, locked;
    struct delta_args *inner;
} delta_args_t;

/* delta = (ranges, reference_size, reference_fd, container_fd, frames, chunks, pieces, lookup,
 * inner): a plain reference read by reference_fd (container_fd -1, the tables empty, inner
 * None), or a container (reference_fd -1) restored by native_restore.plan's tables, its pieces
 * by file offset in lookup, and inner its own delta (a delta argument, or None). 1, or 0 with
 * the error set. */
static int delta_parse(PyObject *arg, delta_args_t *held, int64_t source_size, int depth) {
    long long size;
    delta_t *d = &held->delta;
    restore_plan_t *c = &d->container;
    PyObject *inner = Py_None;
    if (!PyArg_ParseTuple(arg, "y*Liiy*y*y*y*O", &held->ranges, &size, &d->reference, &c->container, &held->frames,
                          &held->chunks, &held->pieces, &held->lookup, &inner))
        return 0;
    held->parsed = 1;
    d->reference_size = c->source_size = size;
    c->output = c->checked = -1;
    d->range_count = plan_rows(&held->ranges, TR_COLS, "delta ranges");
    c->frame_count = d->range_count < 0 ? -1 : plan_rows(&held->frames, FR_COLS, "reference frames");
    c->chunk_count = c->frame_count < 0 ? -1 : plan_rows(&held->chunks, CH_COLS, "reference chunks");
    c->piece_count = c->chunk_count < 0 ? -1 : plan_rows(&held->pieces, PC_COLS, "reference pieces");
    d->lookup_count = c->piece_count < 0 ? -1 : plan_rows(&held->lookup, RX_COLS, "reference lookup");
    if (d->lookup_count < 0) return 0;
    d->ranges = held->ranges.buf;
    c->frames = held->frames.buf;
    c->chunks = held->chunks.buf;
    c->pieces = held->pieces.buf;
    d->lookup = held->lookup.buf;
    const char *wrong = NULL;
    if (size < 0 || (d->reference < 0) == (c->container < 0)) wrong = "one reference, a file or a container";
    if (!wrong && inner != Py_None && c->container < 0) wrong = "a plain reference has no delta of its own";
    if (!wrong && depth >= DELTA_MAX_CHAIN) wrong = "reference chain too long";
    if (!wrong && c->container >= 0) wrong = plane_check(c);
    if (!wrong) wrong = delta_check(d, source_size);
    if (wrong) {
        PyErr_Format(PyExc_ValueError, "series delta rejected: %s", wrong);
        return 0;
    }
    pthread_mutex_init(&c->error_lock, NULL);
    held->locked = 1;
    if (inner == Py_None) return 1;
    if (!(held->inner = calloc(1, sizeof *held->inner))) return PyErr_NoMemory(), 0;
    if (!delta_parse(inner, held->inner, size, depth + 1)) return 0;
    c->delta = &held->inner->delta;
    return 1;
}

static void delta_release(delta_args_t *held) {
    if (held->inner) {
        delta_release(held->inner);
        free(held->inner);
    }
    if (held->locked) pthread_mutex_destroy(&held->delta.container.error_lock);
    if (!held->parsed) return;
    PyBuffer_Release(&held->ranges);
    PyBuffer_Release(&held->frames);
    PyBuffer_Release(&held->chunks);
    PyBuffer_Release(&held->pieces);
    PyBuffer_Release(&held->lookup);
}

/* restore_plan(container, output, checked, memory, frames, chunks, pieces, source_size, leaf,
 * leaf_hashes, threads, progress, stop, error, gpu=None, delta=None, window=(0, 0), stages=None) -> int:
 * plane.c's restore of one file; gpu = (nvcomp_library, device, batch_bytes, workers, ans_id, zstd_id,
 * stats, why) decodes those bitstreams' chunks there (plane_gpu.c); delta (delta_parse) undoes a
 * series delta; window = (start, end) restores only those bytes of the file, into memory; stages
 * (stage_table) gets each thread's clock. */
static PyObject *native_restore_plan(PyObject *self, PyObject *args) {
    Py_buffer memory, frames, chunks, pieces, hashes, progress, stop, error, stats = {0}, why = {0}, stages = {0};
    restore_plan_t plan;
    delta_args_t delta_held = {0};
    int threads;
    PyObject *gpu = Py_None, *delta_arg = Py_None;
    long long window_start = 0, window_end = 0;
    memset(&plan, 0, sizeof plan);
    if (!PyArg_ParseTuple(args, "iiiw*y*y*y*LLw*iw*w*w*|OO(LL)w*", &plan.container, &plan.output, &plan.checked,
                          &memory, &frames, &chunks, &pieces, &plan.source_size, &plan.leaf, &hashes, &threads,
                          &progress, &stop, &error, &gpu, &delta_arg, &window_start, &window_end, &stages))
        return NULL;
    PyObject *result = NULL;
    const char *wrong = NULL;
    if (gpu != Py_None) {
        long long batch;
        if (!PyArg_ParseTuple(gpu, "siLiiiw*w*", &plan.gpu_library, &plan.gpu_device, &batch, &plan.gpu_workers,
                              &plan.gpu_ans, &plan.gpu_zstd, &stats, &why))
            goto done;
        if (stats.len < 24 || why.len < 2 || batch < 1 || plan.gpu_workers < 1) {
            PyErr_SetString(PyExc_ValueError, "restore_plan: malformed GPU settings");
            goto done;
        }
        plan.gpu = 1;
        plan.gpu_batch = batch;
        plan.gpu_stats = stats.buf;
        plan.gpu_why = why.buf;
        plan.gpu_why_room = (size_t)why.len;
    }
    plan.frame_count = plan_rows(&frames, FR_COLS, "frames");
    plan.chunk_count = plan.frame_count < 0 ? -1 : plan_rows(&chunks, CH_COLS, "chunks");
    plan.piece_count = plan.chunk_count < 0 ? -1 : plan_rows(&pieces, PC_COLS, "pieces");
    if (plan.piece_count < 0 || (plan.stage_rows = stage_table(&stages, &plan.stages)) < 0) goto done;
    if (hashes.len % 8 || progress.len < 8 || stop.len < 1 || error.len < 24 || threads < 1 || plan.container < 0) {
        PyErr_SetString(PyExc_ValueError, "restore_plan: malformed leaf, progress, stop or error buffer");
        goto done;
    }
    if (window_end && (window_start < 0 || window_end <= window_start || window_end > plan.source_size ||
                       memory.len != window_end - window_start || plan.output >= 0 || plan.checked >= 0 ||
                       plan.leaf)) {
        PyErr_SetString(PyExc_ValueError, "restore_plan: a window is restored into memory of its size, unhashed");
        goto done;
    }
    if (!window_end && memory.len && memory.len != plan.source_size) {
        PyErr_SetString(PyExc_ValueError, "restore_plan: memory must hold the whole file (or nothing)");
        goto done;
    }
    plan.window_start = window_start;
    plan.window_end = window_end;
    plan.memory = memory.len ? memory.buf : NULL;
    plan.frames = frames.buf;
    plan.chunks = chunks.buf;
    plan.pieces = pieces.buf;
    plan.leaf_hashes = hashes.buf;
    plan.leaf_count = plan.leaf ? hashes.len / 8 : 0;
    plan.progress = progress.buf;
    plan.stop = stop.buf;
    if ((wrong = plane_check(&plan)) != NULL) {
        PyErr_Format(PyExc_ValueError, "restore plan rejected: %s", wrong);
        goto done;
    }
    if (delta_arg != Py_None) {
        if (plan.gpu) {
            PyErr_SetString(PyExc_ValueError, "restore_plan: series deltas are undone on the CPU");
            goto done;
        }
        if (!delta_parse(delta_arg, &delta_held, plan.source_size, 0)) goto done;
        plan.delta = &delta_held.delta;
    }
    pthread_mutex_init(&plan.leaf_lock, NULL);
    pthread_mutex_init(&plan.error_lock, NULL);
    int kind;
    Py_BEGIN_ALLOW_THREADS;
    kind = plane_run(&plan, threads);
    Py_END_ALLOW_THREADS;
    pthread_mutex_destroy(&plan.leaf_lock);
    pthread_mutex_destroy(&plan.error_lock);
    memcpy(error.buf, plan.error, sizeof plan.error);
    ((int64_t *)error.buf)[0] = kind;
    result = PyLong_FromLong(kind);
done:
    delta_release(&delta_held);
    PyBuffer_Release(&memory);
    PyBuffer_Release(&frames);
    PyBuffer_Release(&chunks);
    PyBuffer_Release(&pieces);
    PyBuffer_Release(&hashes);
    PyBuffer_Release(&progress);
    PyBuffer_Release(&stop);
    PyBuffer_Release(&error);
    if (stats.obj) PyBuffer_Release(&stats);
    if (why.obj) PyBuffer_Release(&why);
    if (stages.obj) PyBuffer_Release(&stages);
    return result;
}

/* compress_plan(source, memory, output, in_order, verify, checked, start, frames, chunks, pieces, source_size, leaf,
 * leaf_hashes, level, rules, threads, progress, stop, error, gpu=None, delta=None, stages=None) -> int:
 * compress_plane.c's coding of one file, read from the descriptor `source` or (source -1) the host memory regions
 * of `memory`, whose buffers the caller keeps alive; gpu = (nvcomp_library, device, batch_bytes, workers, codec,
 * kernels, stats, why) codes the frames marked for it there as `codec` (ans, or zstd with ckptz's kernels: their
 * cubin) (compress_gpu.c); delta (delta_parse) codes paired ranges as a series delta; stages (stage_table) gets
 * each thread's clock. */
static PyObject *native_compress_plan(PyObject *self, PyObject *args) {
    Py_buffer memory, frames, chunks, pieces, hashes, rules, progress, stop, error, stats = {0}, why = {0},
                                                                                  kernels = {0}, stages = {0};
    compress_plan_t plan;
    delta_args_t delta_held = {0};
    int threads;
    PyObject *gpu = Py_None, *delta_arg = Py_None;
    memset(&plan, 0, sizeof plan);
    restore_plan_t *l = &plan.leaves;
    if (!PyArg_ParseTuple(args, "iy*ippiLw*w*y*LLw*iy*iw*w*w*|OOw*", &plan.source, &memory, &plan.output,
                          &plan.in_order, &plan.verify, &plan.checked, &plan.end, &frames, &chunks, &pieces,
                          &l->source_size, &l->leaf, &hashes, &plan.level, &rules, &threads, &progress, &stop, &error,
                          &gpu, &delta_arg, &stages))
        return NULL;
    PyObject *result = NULL;
    const char *wrong = NULL;
    if (gpu != Py_None) {
        long long batch;
        if (!PyArg_ParseTuple(gpu, "siLiiy*w*w*", &plan.gpu_library, &plan.gpu_device, &batch, &plan.gpu_workers,
                              &plan.gpu_codec, &kernels, &stats, &why))
            goto done;
        plan.gpu_kernels = kernels.len ? kernels.buf : NULL;
        if (stats.len < 24 || why.len < 2 || batch < 1 || plan.gpu_workers < 1) {
            PyErr_SetString(PyExc_ValueError, "compress_plan: malformed GPU settings");
            goto done;
        }
        plan.gpu = 1;
        plan.gpu_batch = batch;
        plan.gpu_stats = stats.buf;
        plan.gpu_why = why.buf;
        plan.gpu_why_room = (size_t)why.len;
    }
    l->frame_count = plan_rows(&frames, FR_COLS, "frames");
    l->chunk_count = l->frame_count < 0 ? -1 : plan_rows(&chunks, CC_COLS, "chunks");
    l->piece_count = l->chunk_count < 0 ? -1 : plan_rows(&pieces, PC_COLS, "pieces");
    plan.memory_count = l->piece_count < 0 ? -1 : plan_rows(&memory, MR_COLS, "memory");
    if (plan.memory_count < 0 || (plan.stage_rows = stage_table(&stages, &plan.stages)) < 0) goto done;
    plan.memory = memory.buf;
    if (hashes.len % 8 || progress.len < 8 || stop.len < 1 || error.len < 24 || threads < 1 || plan.end < 0 ||
        rules.len != sizeof plan.rules) {
        PyErr_SetString(PyExc_ValueError, "compress_plan: malformed leaf, progress, stop or error buffer");
        goto done;
    }
    plan.frames = frames.buf;
    plan.chunks = chunks.buf;
    memcpy(plan.rules, rules.buf, sizeof plan.rules);
    l->frames = frames.buf;
    l->pieces = pieces.buf;
    l->leaf_hashes = hashes.buf;
    l->leaf_count = l->leaf ? hashes.len / 8 : 0;
    plan.progress = progress.buf;
    plan.stop = stop.buf;
    if (delta_arg != Py_None) {
        if (!delta_parse(delta_arg, &delta_held, l->source_size, 0)) goto done;
        l->delta = &delta_held.delta;
    }
    if ((wrong = compress_check(&plan)) != NULL) {
        PyErr_Format(PyExc_ValueError, "compress plan rejected: %s", wrong);
        goto done;
    }
    pthread_mutex_init(&l->leaf_lock, NULL);
    pthread_mutex_init(&plan.error_lock, NULL);
    pthread_mutex_init(&plan.order_lock, NULL);
    pthread_cond_init(&plan.order_turn, NULL);
    int kind;
    Py_BEGIN_ALLOW_THREADS;
    kind = compress_run(&plan, threads);
    Py_END_ALLOW_THREADS;
    pthread_mutex_destroy(&l->leaf_lock);
    pthread_mutex_destroy(&plan.error_lock);
    pthread_mutex_destroy(&plan.order_lock);
    pthread_cond_destroy(&plan.order_turn);
    memcpy(error.buf, plan.error, sizeof plan.error);
    ((int64_t *)error.buf)[0] = kind;
    result = PyLong_FromLong(kind);
done:
    delta_release(&delta_held);
    PyBuffer_Release(&memory);
    PyBuffer_Release(&frames);
    PyBuffer_Release(&chunks);
    PyBuffer_Release(&pieces);
    PyBuffer_Release(&hashes);
    PyBuffer_Release(&rules);
    PyBuffer_Release(&progress);
    PyBuffer_Release(&stop);
    PyBuffer_Release(&error);
    if (stats.obj) PyBuffer_Release(&stats);
    if (why.obj) PyBuffer_Release(&why);
    if (kernels.obj) PyBuffer_Release(&kernels);
    if (stages.obj) PyBuffer_Release(&stages);
    return result;
}

/* series_delta(data, ref, word, kind, mantissa_bits, scale, forward): data's words coded
 * (forward) or restored in place against ref's as series delta kind 1, 2 or 3. */
static PyObject *native_series_delta(PyObject *self, PyObject *args) {
    Py_buffer data, ref;
    int word, kind, mant, forward;
    unsigned long scale;
    if (!PyArg_ParseTuple(args, "w*y*iiikp", &data, &ref, &word, &kind, &mant, &scale, &forward)) return NULL;
    const unsigned long scale_exponent = (scale >> 23) & 0xFFu;
    PyObject *result = NULL;
    if (word != 2 && word != 4) {
        PyErr_Format(PyExc_ValueError, "series deltas of %d-byte words", word);
    } else if (kind < 1 || kind > 3) {
        PyErr_Format(PyExc_ValueError, "series delta kind %d", kind);
    } else if (mant < 1 || mant > word * 8 - 3) {
        PyErr_Format(PyExc_ValueError, "%d mantissa bits in a %d-byte word", mant, word);
    } else if (kind != 1 && (scale > 0x7FFFFFFFul || scale_exponent == 0 || scale_exponent == 0xFF)) {
        PyErr_Format(PyExc_ValueError, "scale 0x%lx is not a positive normal float32", scale);
    } else if (data.len != ref.len || data.len % word) {
        PyErr_Format(PyExc_ValueError, "%zd bytes against %zd of %d-byte words", data.len, ref.len, word);
    } else {
        uint8_t *room = kind == 1 ? NULL : malloc(data.len ? (size_t)data.len : 1);
        if (kind != 1 && !room) {
            PyErr_NoMemory();
        } else {
            Py_BEGIN_ALLOW_THREADS;
            series_delta(data.buf, ref.buf, (size_t)data.len / (size_t)word, word, kind, mant, (uint32_t)scale,
                         forward, room);
            Py_END_ALLOW_THREADS;
            result = Py_NewRef(Py_None);
        }
        free(room);
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&ref);
    return result;
}

static PyMethodDef methods[] = {
    {"gpu_memory", native_gpu_memory, METH_VARARGS,
     "gpu_memory(reset=False) -> (held, peak): device bytes the native GPU engines hold now and the most they\n"
     "held at once (reset: count the peak again from what is held now)."},
    {"use_avx2", native_use_avx2, METH_O,
     "use_avx2(on) -> bool: run the AVX2 loops where the CPU has them (on) or the SSE2 ones; returns\n"
     "whether the AVX2 loops ran before."},
    {"xxh3_64", native_xxh3_64, METH_VARARGS, "xxh3_64(data) -> int: xxh3_64 (seed 0), without the GIL for large data."},
    {"xxh3_64_ranges", native_xxh3_64_ranges, METH_VARARGS,
     "xxh3_64_ranges(data, offsets, sizes, out): xxh3_64 of each range of data (int64 offsets and sizes)\n"
     "into out (uint64), without the GIL."},
    {"xxh3_64_nested", native_xxh3_64_nested, METH_VARARGS,
     "xxh3_64_nested(data, offsets, sizes, out, inner_offsets, inner_sizes, inner_out): xxh3_64 of each\n"
     "range and of each inner range (int64 tables, each sorted without overlaps) into out and inner_out\n"
     "(uint64), an inner range inside a range hashed while its bytes are in cache; without the GIL."},
    {"xxh3_64_each", native_xxh3_64_each, METH_VARARGS,
     "xxh3_64_each(parts) -> list[int]: xxh3_64 (seed 0) of each buffer, the GIL released once."},
    {"xxh3_64_streams", native_xxh3_64_streams, METH_VARARGS,
     "xxh3_64_streams(jobs) -> list[int]: for each (table, row, reset, parts), stream parts into\n"
     "that row of a table of xxh3_state_bytes-byte states (reset first if asked); each one's\n"
     "xxh3_64 of all streamed into it so far. The GIL is released once for all."},
    {"pread_into", native_pread_into, METH_VARARGS,
     "pread_into(fd, buffer, file_offsets, buffer_offsets, sizes) -> int: reads into places of one\n"
     "buffer (int64 tables), the GIL released once; the bytes read (fewer where the file ends)."},
    {"first_difference", native_first_difference, METH_VARARGS,
     "first_difference(fd, data, file_offsets, data_offsets, sizes) -> int: ranges of a file read back\n"
     "and compared with data (int64 tables), the GIL released once; -1, or the first differing offset."},
    {"pread_many", native_pread_many, METH_VARARGS,
     "pread_many(fd, offsets, sizes) -> list[bytes]: each read (int64 offsets and sizes), the GIL\n"
     "released once for all; a read is shorter only at the end of the file."},
    {"pickle_scan", native_pickle_scan, METH_VARARGS,
     "pickle_scan(data, kinds) -> (opcodes, largest binary memo index, largest protocol or -1), or None "
     "where pickletools.genops must judge the pickle."},
    {"copy", native_copy, METH_VARARGS, "copy(data) -> bytes, copied without holding the GIL."},
    {"split", native_split, METH_VARARGS,
     "split(src, dst, word, rotate, sample=0): the byte planes of src's words into dst (plane k at\n"
     "k * n); with sample > 0, each plane's plane_stats as a tuple."},
    {"split_planes", native_split_planes, METH_VARARGS,
     "split_planes(src, word, rotate, sample=0) -> (planes, stats): split into a new bytes object per\n"
     "plane; stats as split's (None without a sample)."},
    {"plane_stats", native_plane_stats, METH_VARARGS,
     "plane_stats(plane, sample): (entropy bits per byte and zero share of a strided sample of about\n"
     "`sample` bytes, AND of all bytes, OR of all bytes)."},
    {"merge", native_merge, METH_VARARGS,
     "merge(planes, dst, word, rotate): words from byte planes (buffers, or ints for constant planes)."},
    {"literals_plan", native_literals_plan, METH_VARARGS,
     "literals_plan(quarters, sizes, src_at, dst_at, cap, block, got, packs, plan, tables, blob): zstd literal frames (or bit packs) planned for a GPU."},
    {"huffman_zstd", native_huffman_zstd, METH_VARARGS,
     "huffman_zstd(src, block=0): a zstd frame of Huffman-coded literal blocks (adaptive sizes, or `block` bytes each), or None."},
    {"bitpack_encode", native_bitpack_encode, METH_VARARGS,
     "bitpack_encode(src, fixed, value): a ckptz.codecs.bitpack payload of src."},
    {"literals_decode", native_literals_decode, METH_VARARGS,
     "literals_decode(frame, out): decode a zstd frame of literal-only blocks into out; False if not one."},
    {"literals_scan", native_literals_scan, METH_VARARGS,
     "literals_scan(host, at, sizes, raw, dst, ok, rows, codes): literal frames cut into the GPU decoder's rows."},
    {"bitpack_decode", native_bitpack_decode, METH_VARARGS,
     "bitpack_decode(rows, fixed, value, out): bytes from packed rows of varying bits."},
    {"blocked_entropy", native_blocked_entropy, METH_VARARGS,
     "blocked_entropy(src, sub): the order-0 entropies of src's blocks of `sub` bytes, summed, in bytes."},
    {"series_delta", native_series_delta, METH_VARARGS,
     "series_delta(data, ref, word, kind, mantissa_bits, scale, forward): data's 2- or 4-byte words coded\n"
     "(forward) or restored in place against ref's as series delta kind 1, 2 or 3 (scale: the bit\n"
     "pattern of a positive normal float32, for kinds 2 and 3, which store the words grouped by their\n"
     "reference word's exponent)."},
    {"order1_encode", native_order1_encode, METH_VARARGS,
     "order1_encode(src, segments, contextual_only=False): a ckptz.codecs.order1 payload of src, or None."},
    {"order1_saving", native_order1_saving, METH_VARARGS,
     "order1_saving(src, segments): the share of an order-0 code that order-1 buckets are estimated to save."},
    {"order1_decode", native_order1_decode, METH_VARARGS,
     "order1_decode(payload, out): decode an order1 payload into out; False if malformed or a group needs libzstd."},
    {"order2d_encode", native_order2d_encode, METH_VARARGS,
     "order2d_encode(src, segments, width=0): a ckptz.codecs.order2d payload of src, or None."},
    {"order2d_decode", native_order2d_decode, METH_VARARGS,
     "order2d_decode(payload, out): decode an order2d payload into out; False if malformed."},
    {"sign2d_encode", native_sign2d_encode, METH_VARARGS,
     "sign2d_encode(src, width=0, most_miss=1.0): a ckptz.codecs.sign2d payload of src, or None."},
    {"sign2d_decode", native_sign2d_decode, METH_VARARGS,
     "sign2d_decode(payload, out): decode a sign2d payload into out; False if malformed."},
    {"huffexp_encode", native_huffexp_encode, METH_VARARGS,
     "huffexp_encode(src, ctx, segments): a ckptz.codecs.huffexp payload of src given ctx, or None."},
    {"huffexp_decode", native_huffexp_decode, METH_VARARGS,
     "huffexp_decode(payload, ctx, out): decode a huffexp payload given ctx into out; False if malformed."},
    {"compress_plan", native_compress_plan, METH_VARARGS,
     "compress_plan(source, memory, output, in_order, verify, checked, start, frames, chunks, pieces, source_size, leaf,\n"
     "leaf_hashes, level, rules, threads, progress, stop, error, gpu=None, delta=None, stages=None) -> int: code a\n"
     "whole file (from a descriptor, or host memory regions) into its container's data area, at offsets or in order\n"
     "(0, or the failure's kind); gpu: (nvcomp_library, device, batch_bytes, workers, codec, kernels, stats, why)\n"
     "codes the frames marked for it there; delta: (ranges, reference_size, reference_fd, container_fd, frames,\n"
     "chunks, pieces, lookup, inner) codes paired ranges against a reference file or container (inner: that\n"
     "container's own delta, or None); stages: an int64 table of stage_columns columns, a row per thread (then per\n"
     "GPU worker), filled with each thread's role, start, run time and time and count in each of compress_stages."},
    {"restore_plan", native_restore_plan, METH_VARARGS,
     "restore_plan(container_fd, output_fd, checked_fd, memory, frames, chunks, pieces, source_size, leaf,\n"
     "leaf_hashes, threads, progress, stop, error, gpu=None, delta=None, window=(0, 0), stages=None) -> int: restore\n"
     "a whole file (or, window = (start, end), those bytes of it into memory) on native threads\n"
     "without the GIL (int64 plan tables; output or checked fd -1, memory empty: none); 0, or the failure's\n"
     "kind (error: kind, frame, detail). gpu: (nvcomp_library, device, batch_bytes, workers, ans_id, zstd_id,\n"
     "stats, why): chunks of those bitstreams (zstd_id -1: none) decoded on that GPU; stats (int64: batches,\n"
     "chunks, payload bytes) counts them, why (bytes) says why the GPU failed. delta: as compress_plan's, undone.\n"
     "stages: as compress_plan's, by restore_stages."},
    {"decode_frame", native_decode_frame, METH_VARARGS,
     "decode_frame(chunks, out, room, word, rotate): decode and merge a frame's planes into out; False\n"
     "if a plane needs the Python codecs."},
    {NULL, NULL, 0, NULL},
};

/* A plane's step names as a tuple attribute of the module; -1 with the error set. */
static int stage_names(PyObject *m, const char *attribute, const char *const *names, int count) {
    PyObject *tuple = PyTuple_New(count);
    for (int k = 0; tuple && k < count; k++) {
        PyObject *name = PyUnicode_FromString(names[k]);
        if (!name) {
            Py_CLEAR(tuple);
            break;
        }
        PyTuple_SET_ITEM(tuple, k, name);
    }
    if (!tuple) return -1;
    int added = PyModule_AddObjectRef(m, attribute, tuple);
    Py_DECREF(tuple);
    return added;
}

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "ckptz._native", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    init_spread();
#if AVX2_PATHS
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2");
#else
    const int have_avx2 = 0;
#endif
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "avx2", have_avx2) < 0) Py_CLEAR(m);
    if (m && PyModule_AddIntConstant(m, "xxh3_state_bytes", (long)XXH3_STATE_ROW) < 0) Py_CLEAR(m);
    if (m && PyModule_AddIntConstant(m, "stage_columns", STAGE_COLS) < 0) Py_CLEAR(m);
    if (m && PyModule_AddIntConstant(m, "gpu_max_workers", GPU_MAX_WORKERS) < 0) Py_CLEAR(m);
    if (m && (stage_names(m, "compress_stages", compress_stage_names, CS_COUNT) < 0 ||
              stage_names(m, "restore_stages", restore_stage_names, RS_COUNT) < 0))
        Py_CLEAR(m);
    return m;
}
