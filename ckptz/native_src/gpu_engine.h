/*
 * The GPU engine of the native data plane: nvCOMP codes or decodes a batch of chunks from
 * pinned host memory into pinned host memory (gpu_engine.c). The CUDA driver and nvCOMP are loaded at
 * run time, so the extension builds without their headers and imports without a GPU; the
 * few types and prototypes it calls are declared here, matching the driver's stable ABI and
 * nvCOMP 6.0's (include/nvcomp/ans.h, zstd.h of the nvidia-libnvcomp-cu12 wheel).
 */
#ifndef CKPTZ_GPU_ENGINE_H
#define CKPTZ_GPU_ENGINE_H

#include <stddef.h>
#include <stdint.h>

typedef int gpu_result_t;                /* CUresult, nvcompStatus_t: 0 is success */
typedef unsigned long long gpu_dptr_t;   /* CUdeviceptr */
typedef struct gpu_engine gpu_engine_t;  /* one worker: a stream, an event, device memory */

/* nvCOMP's decompression options: passed by value, 64 bytes each. */
typedef struct {
    int backend;
    int data_type;
    uint8_t max_sub_chunk_count, states_per_lane, skip_validate;
    char reserved[53];
} nvcomp_ans_opts_t;
typedef struct {
    int backend;
    char reserved[60];
} nvcomp_zstd_opts_t;
/* Its compression options: ANS on bytes (data_type 1, NVCOMP_TYPE_UCHAR), Zstd's defaults. */
typedef struct {
    int type, data_type;
    uint8_t max_sub_chunk_count, states_per_lane, histogram_reduction_log2;
    char reserved[53];
} nvcomp_ans_code_opts_t;
typedef struct {
    char reserved[64];
} nvcomp_zstd_code_opts_t;
_Static_assert(sizeof(nvcomp_ans_opts_t) == 64 && sizeof(nvcomp_zstd_opts_t) == 64 &&
                   sizeof(nvcomp_ans_code_opts_t) == 64 && sizeof(nvcomp_zstd_code_opts_t) == 64,
               "nvCOMP 6.0 options");

/* A batch of chunks to decode: chunk c's payload is in_size[c] bytes at in + in_at[c], and
 * decodes to exactly out_size[c] bytes at out + out_at[c] (offsets 16-byte aligned; `in` and
 * `out` pinned, from gpu_host_alloc). `codec` is each chunk's bitstream id: ans_id for nvCOMP
 * ANS, zstd_id for nvCOMP Zstd. */
typedef struct {
    const uint8_t *in;
    uint8_t *out;
    size_t in_bytes, out_bytes;
    int64_t count;
    const int64_t *in_at, *in_size, *out_at, *out_size, *codec;
    int ans_id, zstd_id;
} gpu_batch_t;

/* A batch of chunks to code: chunk c is in_size[c] bytes at in + in_at[c] (pinned, 16-byte
 * aligned) and is coded by nvCOMP as `codec[c]` (ans_id or zstd_id) into out + out_at[c]
 * (pinned), which has room for gpu_code_bound(codec[c], in_size[c]) bytes. in_bytes covers
 * every chunk's input; out_size[c] gets each payload's size, which is only copied back where
 * it is smaller than its input (a larger one is stored raw anyway). */
typedef struct {
    const uint8_t *in;
    uint8_t *out;
    size_t in_bytes, out_bytes;
    int64_t count;
    const int64_t *in_at, *in_size, *out_at, *codec;
    int64_t *out_size;
    int ans_id, zstd_id;
} gpu_code_batch_t;

/* What ckptz's kernels write of the portable bitstream for a gpu_code_batch_t whose
 * payload sizes are known (out_size): literal-only zstd frames from a plan (literals_plan.c's
 * rows, GPU_PLAN_FIELDS each, offsets in the batch's `in` and `out`; its tables and head
 * bytes), and bit packs (4 int64 a chunk: input offset, size, output offset, pack). */
#define GPU_PLAN_FIELDS 16
enum { GPU_LITERALS_ENCODE, GPU_BITPACK_ENCODE, GPU_KERNELS };
typedef struct {
    const int64_t *plan;
    int64_t rows;
    const uint32_t *tables;
    size_t tables_bytes;
    const uint8_t *blob;
    size_t blob_bytes;
    const int64_t *pack_rows;
    int64_t packs, largest_pack; /* bit-packed chunks, and the largest's input bytes */
} gpu_literals_t;

/* Loads libcuda and nvCOMP (from nvcomp_path) once per process and retains device's primary
 * context; 0, or else a message in why. */
static int gpu_open(const char *nvcomp_path, int device, char *why, size_t room);
/* Makes the device's context current in the calling thread. */
static int gpu_enter(int device, char *why, size_t room);
/* A worker of the device (from a pool kept for the next call), or NULL with why set. */
static gpu_engine_t *gpu_engine_take(int device, char *why, size_t room);
/* Gives a worker back to the pool. */
static void gpu_engine_give(gpu_engine_t *g);
/* Decodes a batch; 0 on success, else -1 with why set (the CUDA or nvCOMP call that failed),
 * or 1 with *bad the first chunk nvCOMP did not decode to its size. */
static int gpu_decode(gpu_engine_t *g, const gpu_batch_t *b, int64_t *bad, char *why, size_t room);
/* Codes a batch; 0 on success, else -1 with why set (the CUDA or nvCOMP call that failed,
 * or a chunk nvCOMP could not code). */
static int gpu_code(gpu_engine_t *g, const gpu_code_batch_t *b, char *why, size_t room);
/* Loads ckptz's kernels from `image` (a cubin for the device) once per device; 0, or -1
 * with why set. The device's context must be current. */
static int gpu_kernels(int device, const uint8_t *image, char *why, size_t room);
/* Writes a batch's portable payloads with ckptz's kernels (gpu_literals_t) and copies each
 * chunk's out_size[c] bytes back; 0, or -1 with why set. */
static int gpu_write_literals(gpu_engine_t *g, const gpu_code_batch_t *b, const gpu_literals_t *lit, char *why,
                              size_t room);
/* Room one chunk of `size` bytes may need when coded as `zstd` (else ANS), 16-byte aligned;
 * 0 where nvCOMP cannot say. Chunks are coded in power-of-two size classes, and this is the
 * bound of the chunk's class. */
static int64_t gpu_code_bound(int zstd, int64_t size);
/* Pinned host memory of at least size bytes (from a pool kept for the next call), or NULL. */
static uint8_t *gpu_host_alloc(size_t size, size_t *got);
/* Gives pinned memory back to the pool. */
static void gpu_host_free(uint8_t *ptr, size_t size);

#endif /* CKPTZ_GPU_ENGINE_H */
