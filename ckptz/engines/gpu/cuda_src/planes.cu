/* Split, merge and gather for the GPU coder (ckptz/engines/gpu/kernels.py), which
   prefixes the constants it shares with them (BLOCK, THREADS, NSTATS, ...). */
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#define PER (BLOCK / THREADS)

template <int W> struct Word;
template <> struct Word<1> { typedef u8 T; };
template <> struct Word<2> { typedef u16 T; };
template <> struct Word<4> { typedef u32 T; };
template <> struct Word<8> { typedef u64 T; };

/* Split frame blockIdx.y's words [blockIdx.x * BLOCK, +BLOCK) into their byte planes
   (row f * W + p of `planes`, `stride` bytes apart), folding each row's min and max byte
   into stats[row][0..1] and, for every SAMPLE_EVERY-th full block, its byte histogram
   into stats[row][2..257]. */
template <int W, bool ROT>
__device__ void split(const typename Word<W>::T* src, u8* planes, int* stats, i64 m, i64 stride) {
  typedef typename Word<W>::T T;
  __shared__ int hist[W][256];
  __shared__ int lo[W], hi[W];
  const i64 b = blockIdx.x, f = blockIdx.y;
  const int t = threadIdx.x;
  const bool sample = (b % SAMPLE_EVERY == 0) && ((b + 1) * BLOCK <= m);
  if (t < W) { lo[t] = 255; hi[t] = 0; }
  if (sample) for (int k = t; k < W * 256; k += THREADS) (&hist[0][0])[k] = 0;
  __syncthreads();
  int mn[W], mx[W];
#pragma unroll
  for (int p = 0; p < W; ++p) { mn[p] = 255; mx[p] = 0; }
  const T* s = src + f * m;
#pragma unroll 4
  for (int k = 0; k < PER; ++k) {
    const i64 i = b * BLOCK + (i64)k * THREADS + t;
    if (i < m) {
      u64 x = s[i];
      if (ROT) x = ((x << 1) | (x >> (8 * W - 1))) & (W == 8 ? ~0ull : (1ull << (8 * (W % 8))) - 1);
#pragma unroll
      for (int p = 0; p < W; ++p) {
        const int v = (int)((x >> (8 * p)) & 0xFF);
        planes[(f * W + p) * stride + i] = (u8)v;
        mn[p] = min(mn[p], v);
        mx[p] = max(mx[p], v);
        if (sample) atomicAdd(&hist[p][v], 1);
      }
    }
  }
#pragma unroll
  for (int p = 0; p < W; ++p) { atomicMin(&lo[p], mn[p]); atomicMax(&hi[p], mx[p]); }
  __syncthreads();
  if (t < W) {
    int* at = stats + (f * W + t) * NSTATS;
    atomicMin(at, lo[t]);
    atomicMax(at + 1, hi[t]);
  }
  if (sample)
    for (int k = t; k < W * 256; k += THREADS) {
      const int c = (&hist[0][0])[k];
      if (c) atomicAdd(stats + (f * W + k / 256) * NSTATS + 2 + k % 256, c);
    }
}

/* Interleave frame blockIdx.y's plane rows back into words: row r lies at offsets[r] * 16
   in `stored` (sources[r] == STORED) or `decoded` (DECODED), or is the byte sources[r]. */
template <int W, bool ROT>
__device__ void merge(const u8* stored, const u8* decoded, const i64* offsets, const i64* sources,
                      typename Word<W>::T* out, i64 m) {
  typedef typename Word<W>::T T;
  __shared__ i64 off[W], src[W];
  const i64 b = blockIdx.x, f = blockIdx.y;
  const int t = threadIdx.x;
  if (t < W) { off[t] = offsets[f * W + t] * 16; src[t] = sources[f * W + t]; }
  __syncthreads();
#pragma unroll 4
  for (int k = 0; k < PER; ++k) {
    const i64 i = b * BLOCK + (i64)k * THREADS + t;
    if (i < m) {
      u64 acc = 0;
#pragma unroll
      for (int p = 0; p < W; ++p) {
        const i64 c = src[p];
        const u64 v = c == STORED ? stored[off[p] + i] : c == DECODED ? decoded[off[p] + i] : (u64)(c & 0xFF);
        acc |= v << (8 * p);
      }
      if (ROT) acc = (acc >> 1) | (acc << (8 * W - 1));
      out[f * m + i] = (T)acc;
    }
  }
}

#define SPLIT(W, R) extern "C" __global__ void __launch_bounds__(THREADS) \
  split_##W##_##R(const Word<W>::T* s, u8* p, int* st, i64 m, i64 stride) { split<W, R>(s, p, st, m, stride); }
#define MERGE(W, R) extern "C" __global__ void __launch_bounds__(THREADS) \
  merge_##W##_##R(const u8* a, const u8* d, const i64* o, const i64* s, Word<W>::T* out, i64 m) { \
    merge<W, R>(a, d, o, s, out, m); }

/* Copy range blockIdx.y (sizes[c] bytes at src_offsets[c] * 16) to dst_offsets[c] * 16,
   zero-filled to padded[c] bytes; in 4-byte words (ranges start 16-byte aligned). */
extern "C" __global__ void __launch_bounds__(THREADS)
gather(const u32* src, const i64* src_offsets, const i64* sizes, u32* dst, const i64* dst_offsets,
       const i64* padded) {
  const i64 c = blockIdx.y;
  const i64 n = sizes[c], words = padded[c] / 4, so = src_offsets[c] * 4, d = dst_offsets[c] * 4;
  for (int k = 0; k < PER; ++k) {
    const i64 w = (i64)blockIdx.x * BLOCK + (i64)k * THREADS + threadIdx.x;
    if (w < words) {
      const i64 keep = n - w * 4;
      u32 v = 0;
      if (keep > 0) {
        v = src[so + w];
        if (keep < 4) v &= (1u << (8 * keep)) - 1;
      }
      dst[d + w] = v;
    }
  }
}
SPLIT(1, 0)
SPLIT(2, 0)
SPLIT(2, 1)
SPLIT(4, 0)
SPLIT(4, 1)
SPLIT(8, 0)
SPLIT(8, 1)
MERGE(1, 0)
MERGE(2, 0)
MERGE(2, 1)
MERGE(4, 0)
MERGE(4, 1)
MERGE(8, 0)
MERGE(8, 1)
