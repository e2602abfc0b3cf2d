/*
 * Series deltas in the data planes: the bytes of a file's paired tensors coded against their
 * counterparts in a reference file (ckptz/series/delta.py's XorDelta, which plans them).
 *
 * Python hands over a table of paired ranges of the original file (start, end, counterpart
 * offset in the reference, delta kind, scale, word, mantissa bits: XorDelta's ranges) and the
 * reference: a plain file read by descriptor, or a container whose frames the plane decodes
 * itself from a restore plan Python built (native_restore.plan), one frame kept per thread;
 * a reference container that is itself a series delta has its own delta, undone in turn by
 * the thread's reader, down the chain to its end.
 * The compress plane applies the delta to a frame once its digest leaves are hashed from the
 * original bytes and before its checksum is taken of the bytes it codes; the restore plane
 * undoes it once that checksum holds and before the pieces are put and the leaves hashed, so
 * both record and check exactly what the Python pipeline does.
 */
#include "native.h"

#include <pthread.h>

/* Columns of the delta's range table (one row per paired range, in file order) and of the
 * reference container's pieces by file offset. */
enum { TR_START, TR_END, TR_REF, TR_KIND, TR_SCALE, TR_WORD, TR_MANT, TR_COLS };
enum { RX_AT, RX_FRAME, RX_WITHIN, RX_SIZE, RX_COLS };

/* What stopped a delta (both planes' kinds go up to 14; native_call.py names these). */
enum {
    PLANE_REFERENCE_SHORT = 15,   /* the reference ends before a counterpart does */
    PLANE_REFERENCE_READ = 16,    /* reading the reference failed (detail: errno) */
    PLANE_REFERENCE_DAMAGED = 17, /* a frame of the reference container fails a check */
    PLANE_WORD_CUT = 18,          /* a frame cuts a word of a tensor coded in value */
    PLANE_GROUP_CUT = 19,         /* a grouped kind's part of a tensor is not its frame's whole part */
};

enum { DELTA_XOR, DELTA_ORDERED, DELTA_SCALED, DELTA_SIGN_MAGNITUDE };

typedef struct delta {
    const int64_t *ranges; /* TR_COLS per paired range, sorted and disjoint */
    int64_t range_count;
    int grouped; /* some range is of a kind that groups its words (they need room) */
    int64_t reference_size;
    int reference;             /* a plain reference's descriptor, or -1 for a container */
    restore_plan_t container;  /* the reference container's frames, chunks and pieces */
    const int64_t *lookup;     /* RX_COLS per piece of the reference container, by file offset */
    int64_t lookup_count;
} delta_t;

/* A thread's room for a delta: the counterpart of a frame's part, the grouped kinds' room
 * (where the delta has such a kind), and a reader of the reference container that keeps the
 * frame it decoded last. */
typedef struct delta_scratch {
    delta_t *delta;
    uint8_t *theirs, *room;
    size_t frame_room;
    worker_t reader;
    int reading;    /* reader is set up */
    int64_t cached; /* the reference frame whose bytes are in reader.out, or -1 */
} delta_scratch_t;

/* Checks the range table against the file's and the reference's sizes before any thread
 * starts (a hostile header must not move a read outside its buffers); NULL if it holds.
 * Notes whether some range groups its words. */
static const char *delta_check(delta_t *d, int64_t source_size) {
    int64_t end = 0;
    for (int64_t r = 0; r < d->range_count; r++) {
        const int64_t *t = d->ranges + r * TR_COLS;
        int64_t kind = t[TR_KIND], word = t[TR_WORD], mant = t[TR_MANT], scale = t[TR_SCALE];
        if (t[TR_START] < end || t[TR_END] < t[TR_START] || t[TR_END] > source_size)
            return "paired ranges out of order or outside the file";
        if (t[TR_REF] < 0 || t[TR_REF] > d->reference_size - (t[TR_END] - t[TR_START]))
            return "counterpart outside the reference";
        if (kind < DELTA_XOR || kind > DELTA_SIGN_MAGNITUDE) return "unknown delta kind";
        if (kind != DELTA_XOR && (word != 2 && word != 4)) return "delta kind of no float words";
        /* series_delta groups by at most 8 exponent bits. */
        if (kind != DELTA_XOR && (mant < word * 8 - 9 || mant > word * 8 - 3)) return "mantissa bits out of range";
        if ((kind == DELTA_SCALED || kind == DELTA_SIGN_MAGNITUDE) &&
            (scale < 0 || scale > 0x7FFFFFFF || !((scale >> 23) & 0xFF) || ((scale >> 23) & 0xFF) == 0xFF))
            return "scale is no positive normal float32";
        if (kind == DELTA_SCALED || kind == DELTA_SIGN_MAGNITUDE) d->grouped = 1;
        end = t[TR_END];
    }
    for (int64_t r = 0; r < d->lookup_count; r++) {
        const int64_t *x = d->lookup + r * RX_COLS;
        if (x[RX_FRAME] < 0 || x[RX_FRAME] >= d->container.frame_count) return "reference piece of no frame";
        const int64_t *f = d->container.frames + x[RX_FRAME] * FR_COLS, *before = r ? x - RX_COLS : NULL;
        if (x[RX_AT] < 0 || x[RX_SIZE] < 0 || x[RX_WITHIN] < 0 || x[RX_WITHIN] > f[FR_LENGTH] - x[RX_SIZE] ||
            (before && x[RX_AT] < before[RX_AT] + before[RX_SIZE]))
            return "reference pieces out of order or outside their frames";
    }
    return NULL;
}

static delta_scratch_t *delta_scratch_new(delta_t *d, size_t frame_room) {
    delta_scratch_t *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->delta = d;
    s->frame_room = frame_room;
    s->cached = -1;
    s->theirs = plane_buffer(frame_room);
    s->room = d->grouped ? plane_buffer(frame_room) : NULL;
    if (s->theirs && d->reference < 0) s->reading = worker_init(&s->reader, &d->container);
    if (!s->theirs || (d->grouped && !s->room) || (d->reference < 0 && !s->reading)) {
        delta_scratch_free(s);
        return NULL;
    }
    return s;
}

static void delta_scratch_free(delta_scratch_t *s) {
    if (!s) return;
    plane_buffer_free(s->theirs, s->frame_room);
    if (s->room) plane_buffer_free(s->room, s->frame_room);
    if (s->delta->reference < 0 && s->reader.plan) worker_free(&s->reader);
    free(s);
}

/* Decodes frame i of the reference container into the reader's out, checked by every check
 * a restore makes of it: PLANE_OK, or PLANE_REFERENCE_DAMAGED (Python words which check). */
static int reference_frame(delta_scratch_t *s, int64_t i) {
    if (s->cached == i) return PLANE_OK;
    restore_plan_t *c = &s->delta->container;
    const int64_t *f = c->frames + i * FR_COLS;
    uint8_t *payload[8];
    int64_t cursor = 0;
    for (int k = 0; k < (int)f[FR_WORD]; k++) {
        int64_t size = c->chunks[(f[FR_CHUNK] + k) * CH_COLS + CH_SIZE];
        payload[k] = s->reader.payloads + cursor;
        cursor += size + (-size & (PLANE_ALIGN - 1));
    }
    s->cached = -1;
    if (!plane_read(c, i, payload, NULL) || !plane_decode(&s->reader, i, (const uint8_t *const *)payload, NULL) ||
        CKPTZ_XXH3_64(s->reader.out, (size_t)f[FR_LENGTH]) != (uint64_t)f[FR_CHECKSUM])
        return PLANE_REFERENCE_DAMAGED;
    /* A reference that is a delta itself: its frame, checked as coded, undone against its own
     * reference (any failure down the chain is a damaged reference here; Python words it). */
    const int64_t *pc = c->pieces + f[FR_PIECE] * PC_COLS;
    int64_t detail = 0;
    if (c->delta && delta_touches(c->delta, pc, f[FR_PIECES]) &&
        delta_apply(s->reader.delta, pc, f[FR_PIECES], f[FR_LENGTH], s->reader.out, 0, &detail) != PLANE_OK)
        return PLANE_REFERENCE_DAMAGED;
    s->cached = i;
    return PLANE_OK;
}

/* n bytes of the reference's original from offset `at`: *bytes points at them, in the
 * reader's decoded frame where one piece of a reference container holds them all (most
 * counterparts: no copy, and the thread's `theirs` buffer stays untouched), else in
 * `theirs`. Valid until the next read. PLANE_OK, or the failure (*detail: an errno). */
static int reference_read(delta_scratch_t *s, const uint8_t **bytes, int64_t at, int64_t n, int64_t *detail) {
    const delta_t *d = s->delta;
    uint8_t *dst = s->theirs;
    *bytes = dst;
    if (d->reference >= 0) {
        int error = 0;
        int64_t got = pread_fully(d->reference, (char *)dst, n, at, &error);
        if (error) return *detail = error, PLANE_REFERENCE_READ;
        return got == n ? PLANE_OK : PLANE_REFERENCE_SHORT;
    }
    for (int64_t r = row_at_or_before(d->lookup, d->lookup_count, RX_COLS, at); n > 0; r++) {
        if (r >= d->lookup_count) return PLANE_REFERENCE_SHORT;
        const int64_t *x = d->lookup + r * RX_COLS;
        int64_t within = at - x[RX_AT], take = x[RX_SIZE] - within;
        if (within < 0) return PLANE_REFERENCE_SHORT; /* pieces that do not tile the file */
        if (take <= 0) continue;
        if (take > n) take = n;
        int kind = reference_frame(s, x[RX_FRAME]);
        if (kind != PLANE_OK) return kind;
        const uint8_t *from = s->reader.out + x[RX_WITHIN] + within;
        if (take == n && dst == s->theirs) { /* all in this piece */
            *bytes = from;
            return PLANE_OK;
        }
        memcpy(dst, from, (size_t)take);
        dst += take;
        at += take;
        n -= take;
    }
    return PLANE_OK;
}

/* The first paired range that may overlap bytes from `at` on (ranges are sorted, disjoint). */
static int64_t delta_first(const delta_t *d, int64_t at) {
    return row_at_or_before(d->ranges, d->range_count, TR_COLS, at);
}

/* Whether any paired range overlaps a frame's pieces (`count` rows at pc): the others are
 * coded as they are, and take the planes' fused checksum and leaves. */
static int delta_touches(const delta_t *d, const int64_t *pc, int64_t count) {
    for (int64_t j = 0; j < count; j++, pc += PC_COLS) {
        int64_t at = pc[PC_AT], end = at + pc[PC_SIZE];
        for (int64_t r = delta_first(d, at); r < d->range_count; r++) {
            const int64_t *t = d->ranges + r * TR_COLS;
            if (t[TR_START] >= end) break;
            if (t[TR_END] > at && t[TR_END] > t[TR_START]) return 1;
        }
    }
    return 0;
}

/* Applies (forward) or undoes the delta in place on a frame's bytes (`length` of them at
 * data; its pieces, `count` rows at pc), each piece's part of each paired range at a time,
 * checked in XorDelta._apply's order: PLANE_OK, or the failure (*detail: an errno). */
static int delta_apply(delta_scratch_t *s, const int64_t *pc, int64_t count, int64_t length, uint8_t *data,
                       int forward, int64_t *detail) {
    const delta_t *d = s->delta;
    for (int64_t j = 0; j < count; j++, pc += PC_COLS) {
        int64_t at = pc[PC_AT], within = pc[PC_WITHIN], end = at + pc[PC_SIZE];
        for (int64_t r = delta_first(d, at); r < d->range_count; r++) {
            const int64_t *t = d->ranges + r * TR_COLS;
            if (t[TR_START] >= end) break;
            int64_t lo = at > t[TR_START] ? at : t[TR_START], hi = end < t[TR_END] ? end : t[TR_END];
            if (lo >= hi) continue;
            const uint8_t *theirs;
            int kind = reference_read(s, &theirs, t[TR_REF] + lo - t[TR_START], hi - lo, detail);
            if (kind != PLANE_OK) return kind;
            uint8_t *part = data + within + lo - at;
            int64_t word = t[TR_WORD], n = hi - lo;
            if (t[TR_KIND] == DELTA_XOR) {
                for (int64_t k = 0; k < n; k++) part[k] ^= theirs[k];
                continue;
            }
            if ((lo - t[TR_START]) % word || n % word) return PLANE_WORD_CUT; /* a damaged index */
            int grouped = t[TR_KIND] == DELTA_SCALED || t[TR_KIND] == DELTA_SIGN_MAGNITUDE;
            /* Grouped words are placed within the frame's whole part of the tensor. */
            if (grouped && !((lo == t[TR_START] || within + lo - at == 0) &&
                             (hi == t[TR_END] || within + hi - at == length)))
                return PLANE_GROUP_CUT;
            series_delta(part, theirs, (size_t)(n / word), (int)word, (int)t[TR_KIND], (int)t[TR_MANT],
                         grouped ? (uint32_t)t[TR_SCALE] : 0x3F800000u, forward, s->room);
        }
    }
    return PLANE_OK;
}
