/*
 * xxh3_64 (seed 0), the checksum of every frame, payload and digest leaf (docs/FORMAT.md),
 * computed without the GIL.
 *
 * The python xxhash binding holds the GIL for its one-shot functions, so with many pipeline
 * threads every checksum ran one at a time. xxHash itself is vendored (xxhash.h and, on
 * x86-64, xxh_x86dispatch.c, which picks the SSE2, AVX2 or AVX-512 loop at run time;
 * BSD 2-clause, Yann Collet, v0.8.3): the same function, bit for bit. On the pieces ckptz
 * hashes (0.5-4 MiB) AVX-512 ran 1.4-1.5x AVX2's speed on the CI machine's CPU (though
 * 0.7x on buffers far larger than its caches).
 */
#if defined(__x86_64__) || defined(_M_X64)
#include "xxh_x86dispatch.c"
#define CKPTZ_XXH3_64(p, n) XXH3_64bits_dispatch((p), (n))
#define CKPTZ_XXH3_64_UPDATE(s, p, n) XXH3_64bits_update_dispatch((s), (p), (n))
#else
#define XXH_INLINE_ALL
#include "xxhash.h"
#define CKPTZ_XXH3_64(p, n) XXH3_64bits((p), (n))
#define CKPTZ_XXH3_64_UPDATE(s, p, n) XXH3_64bits_update((s), (p), (n))
#endif

/* xxh3_64 of each range [offsets[i], offsets[i] + sizes[i]) of data into out[i]. */
static void hash_ranges(const uint8_t *data, const int64_t *offsets, const int64_t *sizes, uint64_t *out,
                        size_t count) {
    for (size_t i = 0; i < count; i++) out[i] = CKPTZ_XXH3_64(data + offsets[i], (size_t)sizes[i]);
}

/* xxh3_64 of each outer range into outer_out and of each inner range into inner_out, in one
 * pass over memory where an inner range lies inside an outer one: the inner range is hashed
 * whole, then streamed into its outer range's state while its bytes are still in this
 * core's cache (a frame's checksum and the digest leaves inside it read the frame once from
 * memory rather than twice). Both lists sorted by offset, each without overlaps (the caller
 * checks); an inner range inside no outer one is hashed on its own. */
static void hash_nested(const uint8_t *data, const int64_t *outer_at, const int64_t *outer_size, uint64_t *outer_out,
                        size_t outers, const int64_t *inner_at, const int64_t *inner_size, uint64_t *inner_out,
                        size_t inners) {
    XXH3_state_t state;
    size_t j = 0;
    for (size_t i = 0; i < outers; i++) {
        int64_t pos = outer_at[i], end = outer_at[i] + outer_size[i];
        XXH3_64bits_reset(&state);
        for (; j < inners && inner_at[j] < pos; j++) inner_out[j] = CKPTZ_XXH3_64(data + inner_at[j], (size_t)inner_size[j]);
        for (; j < inners && inner_at[j] + inner_size[j] <= end; j++) {
            if (inner_at[j] > pos) CKPTZ_XXH3_64_UPDATE(&state, data + pos, (size_t)(inner_at[j] - pos));
            inner_out[j] = CKPTZ_XXH3_64(data + inner_at[j], (size_t)inner_size[j]);
            CKPTZ_XXH3_64_UPDATE(&state, data + inner_at[j], (size_t)inner_size[j]);
            pos = inner_at[j] + inner_size[j];
        }
        if (end > pos) CKPTZ_XXH3_64_UPDATE(&state, data + pos, (size_t)(end - pos));
        outer_out[i] = XXH3_64bits_digest(&state);
    }
    for (; j < inners; j++) inner_out[j] = CKPTZ_XXH3_64(data + inner_at[j], (size_t)inner_size[j]);
}
