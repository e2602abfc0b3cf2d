/* Series delta kinds 1-3 (docs/FORMAT.md "Delta kinds"): each float word of a tensor coded
 * against the same word of the reference checkpoint, or against its prediction
 * scale * reference (an AdamW moment decays by a power of its beta between snapshots, a
 * weight by its weight decay).
 *
 * The prediction is computed in integers, not by the FPU: it is the IEEE round-to-nearest-even
 * product wherever that is a normal number, and the same bits on every machine whatever its
 * denormal or rounding modes (a library loaded with -ffast-math sets flush-to-zero for the
 * whole process), so a delta written on one machine decodes on any other. */

#include "native.h"

/* scale * r for one word of `bits` bits with `mant` mantissa bits (FORMAT.md "Scaled
 * prediction"); scale is a positive normal float32's bit pattern, checked by the caller.
 * Branch-free, so the loops below vectorise. */
static inline uint32_t predict_word(uint32_t r, int bits, int mant, uint32_t scale) {
    const uint32_t emax = (1u << (bits - 1 - mant)) - 1;
    const uint32_t sign = r & (1u << (bits - 1));
    const uint32_t e = (r >> mant) & emax;
    const uint32_t m = (r & ((1u << mant) - 1)) | (1u << mant);
    const uint64_t q = (uint64_t)m * (uint64_t)((scale & 0x7FFFFFu) | 0x800000u); /* 32 x 32 -> 64 bits */
    const uint32_t wide = (uint32_t)(q >> (mant + 24)); /* the product has one more bit: 0 or 1 */
    /* Doubled when narrow, so that one constant shift drops the bits below the mantissa. */
    const uint64_t qn = wide ? q : q + q;
    /* Round to nearest, ties to even: add half less one, and the bit that decides the tie. */
    uint64_t t = (qn + (((uint64_t)1 << 23) - 1) + ((qn >> 24) & 1)) >> 24;
    const uint32_t carry = (uint32_t)(t >> (mant + 1)); /* rounded up to the next power of two */
    t >>= carry;
    const int32_t exponent = (int32_t)e + (int32_t)((scale >> 23) & 0xFFu) - 127 + (int32_t)(wide + carry);
    uint32_t out = sign | ((uint32_t)exponent << mant) | ((uint32_t)t & ((1u << mant) - 1));
    out = exponent >= (int32_t)emax ? sign | (emax << mant) : out;
    out = exponent <= 0 ? sign : out;
    return e == 0 || e == emax ? r : out; /* zeros, subnormals, infinities and NaNs: as they are */
}

/* A float's bit pattern as an integer that orders like the float (its own inverse). */
#define ORDERED(u, bits) ((u) ^ (((u) >> ((bits) - 1)) * ((1u << ((bits) - 1)) - 1)))

/* One word coded (forward) or restored against its prediction p; all arithmetic modulo 2^bits. */
static inline uint32_t delta_word(uint32_t x, uint32_t p, int bits, int kind, int forward) {
    const uint32_t all = bits == 32 ? 0xFFFFFFFFu : (1u << bits) - 1;
    const uint32_t top = 1u << (bits - 1), low = top - 1;
    if (kind == 3) { /* sign agreement, then the magnitudes' zigzagged difference in bits-1 bits */
        if (forward) {
            const uint32_t d = (x - p) & low;
            return ((x ^ p) & top) | (((d << 1) ^ (0u - (d >> (bits - 2)))) & low);
        }
        const uint32_t z = x & low;
        const uint32_t d = ((z >> 1) ^ (0u - (z & 1))) & low;
        return ((d + p) & low) | ((x ^ p) & top);
    }
    const uint32_t po = ORDERED(p, bits) & all;
    if (forward) {
        const uint32_t d = (ORDERED(x, bits) - po) & all;
        return ((d << 1) ^ (0u - (d >> (bits - 1)))) & all;
    }
    const uint32_t d = ((x >> 1) ^ (0u - (x & 1))) & all;
    const uint32_t o = (d + po) & all;
    return ORDERED(o, bits) & all;
}

/* n words of `word` bytes (2 or 4, little-endian) of data coded or restored in place against
 * ref's, in their own order: kind 1 against ref itself, kinds 2 and 3 against scale * ref. One
 * loop per word size and kind, so each is compiled with its constants. */
#define DELTA_LOOP(T, MANT, KIND, FORWARD)                                                           \
    for (size_t i = 0; i < n; i++) {                                                                 \
        T x, r; /* little-endian hosts only, as all of ckptz */                                      \
        memcpy(&x, data + i * sizeof(T), sizeof(T));                                                 \
        memcpy(&r, ref + i * sizeof(T), sizeof(T));                                                  \
        const uint32_t p = KIND == 1 ? r : predict_word(r, sizeof(T) * 8, MANT, scale);              \
        const T y = (T)delta_word(x, p, sizeof(T) * 8, KIND, FORWARD);                               \
        memcpy(data + i * sizeof(T), &y, sizeof(T));                                                 \
    }

/* Each word format, kind and direction compiled with its constants. */
#define DELTA_KINDS(T, MANT)                                                                         \
    if (kind == 1 && forward) DELTA_LOOP(T, MANT, 1, 1)                                              \
    else if (kind == 1) DELTA_LOOP(T, MANT, 1, 0)                                                    \
    else if (kind == 2 && forward) DELTA_LOOP(T, MANT, 2, 1)                                         \
    else if (kind == 2) DELTA_LOOP(T, MANT, 2, 0)                                                    \
    else if (forward) DELTA_LOOP(T, MANT, 3, 1)                                                      \
    else DELTA_LOOP(T, MANT, 3, 0)

WIDE static void series_delta_words(uint8_t *data, const uint8_t *ref, size_t n, int word, int kind, int mant,
                              uint32_t scale, int forward) {
    if (word == 4 && mant == 23) {
        DELTA_KINDS(uint32_t, 23)
    } else if (word == 2 && mant == 7) {
        DELTA_KINDS(uint16_t, 7)
    } else if (word == 2 && mant == 10) {
        DELTA_KINDS(uint16_t, 10)
    } else if (word == 4) {
        DELTA_KINDS(uint32_t, mant)
    } else {
        DELTA_KINDS(uint16_t, mant)
    }
}

/* Counts, then scatters (forward) or gathers the coded words by group: the reference word's
 * exponent field. T is the word's type, for constant-size copies. */
#define GROUP_WORDS(T)                                                                               \
    do {                                                                                             \
        const uint32_t emax = (1u << (sizeof(T) * 8 - 1 - mant)) - 1;                               \
        T r;                                                                                         \
        for (size_t i = 0; i < n; i++) {                                                             \
            memcpy(&r, ref + i * sizeof(T), sizeof(T));                                              \
            next[((uint32_t)r >> mant & emax) + 1]++;                                                \
        }                                                                                            \
        for (int g = 1; g <= 256; g++) next[g] += next[g - 1];                                       \
        for (size_t i = 0; i < n; i++) {                                                             \
            memcpy(&r, ref + i * sizeof(T), sizeof(T));                                              \
            const size_t at = next[(uint32_t)r >> mant & emax]++;                                    \
            if (forward)                                                                             \
                memcpy(data + at * sizeof(T), room + i * sizeof(T), sizeof(T));                      \
            else                                                                                     \
                memcpy(data + i * sizeof(T), room + at * sizeof(T), sizeof(T));                      \
        }                                                                                            \
    } while (0)

/* A series delta of kind 1-3 applied (forward) or undone in place. Kinds 2 and 3 store the
 * coded words grouped by their reference word's exponent field, stably (FORMAT.md "Scaled
 * prediction"): words of one magnitude then sit together, so a block-adaptive coder sees
 * each group's narrower statistics. `room` holds n words. */
static void series_delta(uint8_t *data, const uint8_t *ref, size_t n, int word, int kind, int mant,
                         uint32_t scale, int forward, uint8_t *room) {
    if (kind == 1) {
        series_delta_words(data, ref, n, word, kind, mant, scale, forward);
        return;
    }
    size_t next[257] = {0}; /* at most 8 exponent bits: where each group's next word goes */
    if (forward) series_delta_words(data, ref, n, word, kind, mant, scale, 1);
    memcpy(room, data, n * (size_t)word);
    if (word == 4)
        GROUP_WORDS(uint32_t);
    else
        GROUP_WORDS(uint16_t);
    if (!forward) series_delta_words(data, ref, n, word, kind, mant, scale, 0);
}
