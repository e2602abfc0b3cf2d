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
