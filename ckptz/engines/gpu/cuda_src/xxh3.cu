/* xxh3_64 on the GPU (ckptz/engines/gpu/hash_source.py). HD marks the code that
   tests/test_hash_source.py also builds on the host, with its own HD, XXH_CONST and XXH_MULHI. */
#ifndef HD
#define HD __device__ __forceinline__
#define XXH_CONST __constant__
#define XXH_MULHI(a, b) __umul64hi(a, b)
#endif

HD u64 xxh_rd64(const u8* p) {
  u64 v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
HD u64 xxh_rd32(const u8* p) {
  return (u64)p[0] | ((u64)p[1] << 8) | ((u64)p[2] << 16) | ((u64)p[3] << 24);
}
HD u64 xxh_fold(u64 a, u64 b) { return (a * b) ^ XXH_MULHI(a, b); }
HD u64 xxh_swap64(u64 x) {
  u64 r = 0;
  for (int i = 0; i < 8; ++i) r = (r << 8) | ((x >> (8 * i)) & 0xFF);
  return r;
}
HD u64 xxh_rotl(u64 x, int r) { return (x << r) | (x >> (64 - r)); }

#define XP32_1 0x9E3779B1ull
#define XP32_2 0x85EBCA77ull
#define XP32_3 0xC2B2AE3Dull
#define XP64_1 0x9E3779B185EBCA87ull
#define XP64_2 0xC2B2AE3D27D4EB4Full
#define XP64_3 0x165667B19E3779F9ull
#define XP64_4 0x85EBCA77C2B2AE63ull
#define XP64_5 0x27D4EB2F165667C5ull
#define XMX_1 0x165667919E3779F9ull
#define XMX_2 0x9FB21C651E98DF25ull

XXH_CONST u8 XXH_SECRET[192] = {
  0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
  0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
  0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
  0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
  0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
  0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
  0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
  0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
  0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
  0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
  0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
  0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

HD u64 xxh_avalanche3(u64 h) { h ^= h >> 37; h *= XMX_1; return h ^ (h >> 32); }
HD u64 xxh_avalanche64(u64 h) {
  h ^= h >> 33; h *= XP64_2; h ^= h >> 29; h *= XP64_3; return h ^ (h >> 32);
}
HD u64 xxh_mix16(const u8* in, const u8* s) {
  return xxh_fold(xxh_rd64(in) ^ xxh_rd64(s), xxh_rd64(in + 8) ^ xxh_rd64(s + 8));
}

/* XXH3_64bits of len <= 240 bytes. */
HD u64 xxh3_short(const u8* in, u64 len) {
  const u8* s = XXH_SECRET;
  if (len == 0) return xxh_avalanche64(xxh_rd64(s + 56) ^ xxh_rd64(s + 64));
  if (len <= 3) {
    const u64 c = ((u64)in[0] << 16) | ((u64)in[len >> 1] << 24) | (u64)in[len - 1] | (len << 8);
    return xxh_avalanche64(c ^ ((xxh_rd32(s) ^ xxh_rd32(s + 4)) & 0xFFFFFFFFull));
  }
  if (len <= 8) {
    const u64 x = (xxh_rd32(in + len - 4) + (xxh_rd32(in) << 32)) ^ (xxh_rd64(s + 8) ^ xxh_rd64(s + 16));
    u64 h = x ^ xxh_rotl(x, 49) ^ xxh_rotl(x, 24);
    h *= XMX_2; h ^= (h >> 35) + len; h *= XMX_2;
    return h ^ (h >> 28);
  }
  if (len <= 16) {
    const u64 lo = xxh_rd64(in) ^ (xxh_rd64(s + 24) ^ xxh_rd64(s + 32));
    const u64 hi = xxh_rd64(in + len - 8) ^ (xxh_rd64(s + 40) ^ xxh_rd64(s + 48));
    return xxh_avalanche3(len + xxh_swap64(lo) + hi + xxh_fold(lo, hi));
  }
  u64 acc = len * XP64_1;
  if (len <= 128) {
    if (len > 32) {
      if (len > 64) {
        if (len > 96) {
          acc += xxh_mix16(in + 48, s + 96);
          acc += xxh_mix16(in + len - 64, s + 112);
        }
        acc += xxh_mix16(in + 32, s + 64);
        acc += xxh_mix16(in + len - 48, s + 80);
      }
      acc += xxh_mix16(in + 16, s + 32);
      acc += xxh_mix16(in + len - 32, s + 48);
    }
    acc += xxh_mix16(in, s);
    acc += xxh_mix16(in + len - 16, s + 16);
    return xxh_avalanche3(acc);
  }
  for (int i = 0; i < 8; ++i) acc += xxh_mix16(in + 16 * i, s + 16 * i);
  u64 end = xxh_mix16(in + len - 16, s + 136 - 17);
  acc = xxh_avalanche3(acc);
  const int rounds = (int)(len / 16);
  for (int i = 8; i < rounds; ++i) end += xxh_mix16(in + 16 * i, s + 16 * (i - 8) + 3);
  return xxh_avalanche3(acc + end);
}

/* One stripe's term for lane l: the neighbouring lane's word plus the product of the
   halves of this lane's word mixed with the key. */
HD u64 xxh_term(u64 mine, u64 other, u64 key) {
  const u64 k = mine ^ key;
  return other + (k & 0xFFFFFFFFull) * (k >> 32);
}

HD u64 xxh_init(int l) {
  return l == 0 ? XP32_3 : l == 1 ? XP64_1 : l == 2 ? XP64_2 : l == 3 ? XP64_3
       : l == 4 ? XP64_4 : l == 5 ? XP32_2 : l == 6 ? XP64_5 : XP32_1;
}

/* The last stripes of the long path (after `blocks` whole blocks), for lane l of group g
   (of 4): its share of the partial block's stripes, and (group 0 only) the last stripe. */
HD u64 xxh_tail(const u8* in, u64 len, u64 blocks, int l, int g) {
  const u64 stripes = ((len - 1) - blocks * 1024) / 64;
  const u8* p = in + blocks * 1024;
  u64 sum = 0;
  for (u64 st = g; st < stripes; st += 4)
    sum += xxh_term(xxh_rd64(p + st * 64 + 8 * l), xxh_rd64(p + st * 64 + 8 * (l ^ 1)),
                    xxh_rd64(XXH_SECRET + st * 8 + 8 * l));
  if (g == 0) {
    const u8* q = in + len - 64;
    sum += xxh_term(xxh_rd64(q + 8 * l), xxh_rd64(q + 8 * (l ^ 1)), xxh_rd64(XXH_SECRET + 121 + 8 * l));
  }
  return sum;
}

HD u64 xxh_scramble(u64 acc, int l) {
  acc ^= acc >> 47;
  acc ^= xxh_rd64(XXH_SECRET + 128 + 8 * l);
  return acc * XP32_1;
}

HD u64 xxh_merge(const u64* a, u64 len) {
  u64 r = len * XP64_1;
  for (int i = 0; i < 4; ++i)
    r += xxh_fold(a[2 * i] ^ xxh_rd64(XXH_SECRET + 11 + 16 * i), a[2 * i + 1] ^ xxh_rd64(XXH_SECRET + 19 + 16 * i));
  return xxh_avalanche3(r);
}

#ifdef __CUDACC_RTC__
#define FULL 0xFFFFFFFFu

template <bool ALIGNED>
__device__ __forceinline__ u64 xxh_load(const u8* p) {
  if (ALIGNED) return *(const u64*)p;
  return xxh_rd64(p);
}

/* The terms of one whole block at `p` (its group's first stripe) for lane l of group g,
   summed over the warp's four groups (the neighbouring lane's word comes from thread t ^ 1):
   every thread returns its lane's sum. */
template <bool ALIGNED>
__device__ __forceinline__ u64 xxh_block(const u8* p, const u64* key, int l) {
  u64 sum = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const u64 mine = xxh_load<ALIGNED>(p + j * 256 + 8 * l);
    sum += xxh_term(mine, __shfl_xor_sync(FULL, mine, 1), key[j]);
  }
  sum += __shfl_xor_sync(FULL, sum, 8);
  return sum + __shfl_xor_sync(FULL, sum, 16);
}

/* Phase 1 of the long path: sums[8 i + l] = lane l's terms of whole block i, the blocks of
   all inputs numbered one input after another (input h's first is starts[h]; starts[count]
   = total). Each warp takes BLOCKS_PER_WARP consecutive blocks. */
extern "C" __global__ void __launch_bounds__(THREADS)
xxh3_blocks(const u64* ptrs, const u64* starts, i64 count, i64 total, u64* sums) {
  const i64 first = ((i64)blockIdx.x * (THREADS / 32) + threadIdx.x / 32) * BLOCKS_PER_WARP;
  if (first >= total) return;  /* the whole warp */
  const int t = threadIdx.x & 31, l = t & 7, g = t >> 3;
  u64 key[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) key[j] = xxh_rd64(XXH_SECRET + (g + 4 * j) * 8 + 8 * l);
  i64 h = 0, hi = count - 1;  /* the last input whose first block is at most `first` */
  while (h < hi) {
    const i64 mid = (h + hi + 1) >> 1;
    if ((i64)starts[mid] <= first) h = mid; else hi = mid - 1;
  }
  const i64 last = first + BLOCKS_PER_WARP < total ? first + BLOCKS_PER_WARP : total;
  for (i64 i = first; i < last; ++i) {
    while ((i64)starts[h + 1] <= i) ++h;  /* inputs without whole blocks are skipped */
    const u8* p = (const u8*)ptrs[h] + (u64)(i - (i64)starts[h]) * 1024 + g * 64;
    const u64 sum = (ptrs[h] & 7) == 0 ? xxh_block<true>(p, key, l) : xxh_block<false>(p, key, l);
    if (g == 0) sums[8 * i + l] = sum;
  }
}

/* Lane l's words of 32 blocks from `round * 32` of one input's block sums `s`: thread
   (l, g) holds blocks round * 32 + 4 k + g (0 past the last). */
__device__ __forceinline__ void xxh_fetch(u64* v, const u64* s, u64 round, u64 blocks, int l, int g) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const u64 b = round * 32 + 4 * k + g;
    v[k] = b < blocks ? s[8 * b + l] : 0;
  }
}

/* Phase 2 of the long path, XXH3_64bits of len > 240 bytes at `in` whose whole blocks' sums
   are `s`, by the 32 threads of a warp (thread t is lane t % 8 of group t / 8): the
   scrambles in order, the last stripes, the merge. Every thread returns the hash. */
__device__ u64 xxh3_long(const u8* in, u64 len, const u64* s, int t) {
  const int l = t & 7, g = t >> 3;
  const u64 scramble_key = xxh_rd64(XXH_SECRET + 128 + 8 * l);
  u64 acc = xxh_init(l);
  const u64 blocks = (len - 1) / 1024, rounds = (blocks + 31) / 32;
  u64 next[8], cur[8];
  if (rounds) xxh_fetch(next, s, 0, blocks, l, g);
  for (u64 r = 0; r < rounds; ++r) {
#pragma unroll
    for (int k = 0; k < 8; ++k) cur[k] = next[k];
    if (r + 1 < rounds) xxh_fetch(next, s, r + 1, blocks, l, g);
    const u64 left = blocks - r * 32;
#pragma unroll
    for (int m = 0; m < 32; ++m) {
      const u64 v = __shfl_sync(FULL, cur[m >> 2], (m & 3) * 8 + l);
      if ((u64)m < left) {
        acc += v;
        acc ^= acc >> 47;
        acc ^= scramble_key;
        acc *= XP32_1;
      }
    }
  }
  u64 sum = xxh_tail(in, len, blocks, l, g);
  sum += __shfl_xor_sync(FULL, sum, 8);
  sum += __shfl_xor_sync(FULL, sum, 16);
  acc += sum;
  u64 a[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] = __shfl_sync(FULL, acc, i);
  return xxh_merge(a, len);
}

/* out[h] = XXH3_64bits(lengths[h] bytes at address ptrs[h]), one warp per input, once
   xxh3_blocks has summed their whole blocks into `sums` (input h's from starts[h]). */
extern "C" __global__ void __launch_bounds__(THREADS)
xxh3_many(const u64* ptrs, const u64* lengths, const u64* starts, const u64* sums, u64* out, i64 count) {
  const i64 h = (i64)blockIdx.x * (THREADS / 32) + threadIdx.x / 32;
  if (h >= count) return;  /* the whole warp: h is the same for its threads */
  const int t = threadIdx.x & 31;
  const u8* in = (const u8*)ptrs[h];
  const u64 len = lengths[h];
  u64 r;
  if (len <= 240) r = t == 0 ? xxh3_short(in, len) : 0;
  else r = xxh3_long(in, len, sums + 8 * starts[h], t);
  if (t == 0) out[h] = r;
}

/* Copy range blockIdx.y: lengths[c] bytes from address src[c] to address dst[c]. */
extern "C" __global__ void __launch_bounds__(THREADS)
copy_ranges(const u64* src, const u64* dst, const u64* lengths) {
  const i64 c = blockIdx.y;
  const u8* s = (const u8*)src[c];
  u8* d = (u8*)dst[c];
  const i64 n = (i64)lengths[c];
  for (i64 i = (i64)blockIdx.x * THREADS + threadIdx.x; i < n; i += (i64)gridDim.x * THREADS) d[i] = s[i];
}
#endif
