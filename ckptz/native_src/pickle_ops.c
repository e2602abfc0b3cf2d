/*
 * pickle_ops.c: a pass over a pickle's opcodes (ckptz.formats.pickle_walk's resource check,
 * the quick way).
 *
 * The caller passes what each opcode's argument is (a table of 256 kinds, made from
 * Python's own pickletools descriptors), so this file knows no opcode by name. The pass
 * counts opcodes up to STOP and notes the largest binary memo index and protocol; it
 * answers "unsure" wherever pickletools.genops would judge something this pass does not
 * (an unknown opcode, an argument read up to a newline other than a module or class name,
 * a negative or overlong length, a missing STOP), and the caller then walks the pickle
 * with genops, which raises what it always raised.
 */
#include "native.h"

/* The argument kinds of pickle_scan's table (the low 4 bits of an entry). */
enum {
    ARG_UNKNOWN = 0, /* no such opcode */
    ARG_NONE = 1,
    ARG_FIXED1 = 2,
    ARG_FIXED2 = 3,
    ARG_FIXED4 = 4,
    ARG_FIXED8 = 5,
    ARG_LINE = 6,      /* bytes up to a newline (a module or class name): plain ASCII, no escapes */
    ARG_LINE_PAIR = 7, /* two such lines */
    ARG_TEXT = 8,      /* a line that genops parses (numbers, quoted strings): unsure */
    ARG_LEN1 = 9,      /* a 1-byte length, then that many bytes */
    ARG_LEN4 = 10,     /* a signed 4-byte length (negative: genops raises) */
    ARG_LEN4U = 11,
    ARG_LEN8U = 12,
};
/* Flags of an entry: the opcode stores into the memo at its argument, sets the protocol,
 * or ends the pickle. */
#define OP_MEMO_PUT 0x10
#define OP_PROTO 0x20
#define OP_STOP 0x40
/* The argument is UTF-8 text, which genops decodes with "surrogatepass". */
#define OP_UTF8 0x80

typedef struct {
    uint64_t count;   /* opcodes up to and including STOP */
    uint64_t max_put; /* largest binary memo index stored */
    int max_proto;    /* largest protocol a PROTO opcode named, -1 if none */
} pickle_scan_t;

static uint64_t le_bytes(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Whether s[0..n) decodes as UTF-8 with Python's "surrogatepass" (RFC 3629, plus the
 * encoded surrogates U+D800-DFFF). */
static int utf8_surrogatepass(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int more;
        uint8_t lo = 0x80, hi = 0xBF; /* the second byte's range */
        if (c >= 0xC2 && c <= 0xDF) more = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            more = 2;
            if (c == 0xE0) lo = 0xA0; /* no overlong forms; ED's surrogates pass */
        } else if (c >= 0xF0 && c <= 0xF4) {
            more = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else return 0;
        if (n - i <= (size_t)more) return 0;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (int k = 2; k <= more; k++)
            if ((s[i + k] & 0xC0) != 0x80) return 0;
        i += (size_t)more + 1;
    }
    return 1;
}

/* 1 if the whole pickle was walked to its STOP (out filled in), 0 if unsure. */
static int pickle_scan(const uint8_t *data, size_t n, const uint8_t *kinds, pickle_scan_t *out) {
    size_t at = 0;
    out->count = 0;
    out->max_put = 0;
    out->max_proto = -1;
    while (at < n) {
        uint8_t entry = kinds[data[at++]];
        size_t want = 0, len;
        const uint8_t *nl;
        out->count++;
        switch (entry & 0x0f) {
        case ARG_NONE: break;
        case ARG_FIXED1: want = 1; break;
        case ARG_FIXED2: want = 2; break;
        case ARG_FIXED4: want = 4; break;
        case ARG_FIXED8: want = 8; break;
        case ARG_LINE:
        case ARG_LINE_PAIR:
            for (int lines = (entry & 0x0f) == ARG_LINE ? 1 : 2; lines; lines--) {
                nl = memchr(data + at, '\n', n - at);
                if (!nl) return 0;
                /* genops undoes escapes and wants ASCII: leave those lines to it */
                for (; data + at < nl; at++)
                    if (data[at] >= 0x80 || data[at] == '\\') return 0;
                at++;
            }
            break;
        case ARG_LEN1:
        case ARG_LEN4:
        case ARG_LEN4U:
        case ARG_LEN8U: {
            int k = (entry & 0x0f) == ARG_LEN1 ? 1 : (entry & 0x0f) == ARG_LEN8U ? 8 : 4;
            if (n - at < (size_t)k) return 0;
            len = (size_t)le_bytes(data + at, k);
            if ((entry & 0x0f) == ARG_LEN4 && (len & 0x80000000u)) return 0;
            at += (size_t)k;
            if (len > n - at) return 0;
            if ((entry & OP_UTF8) && !utf8_surrogatepass(data + at, len)) return 0;
            at += len;
            break;
        }
        default: return 0; /* unknown opcode, or an argument genops parses */
        }
        if (want) {
            if (n - at < want) return 0;
            uint64_t arg = le_bytes(data + at, (int)want);
            at += want;
            if ((entry & OP_MEMO_PUT) && arg > out->max_put) out->max_put = arg;
            if ((entry & OP_PROTO) && (int)arg > out->max_proto) out->max_proto = (int)arg;
        }
        if (entry & OP_STOP) return 1;
    }
    return 0; /* no STOP */
}
