/* The portable zstd bitstream's literal blocks and the bitpack bitstream on the GPU
   (ckptz/engines/gpu/literals.py). HD marks the code that tests/test_literals_gpu.py also
   builds on the host. */
#ifndef HD
#define HD __device__ __forceinline__
#endif

/* Stream k of a block of m bytes codes bytes [k * seg, ...) with seg = ceil(m / 4). */
HD i64 lit_quarter(i64 m, int k, i64* start) {
  const i64 seg = (m + 3) / 4, lo = k * seg < m ? k * seg : m, hi = (k + 1) * seg < m ? (k + 1) * seg : m;
  *start = lo;
  return k < 3 ? hi - lo : m - lo;
}

/* One Huffman stream (RFC 8878 4.2.2): src[count - 1] down to src[0] coded with `ce` (code |
   length << 16 per byte value), first in the lowest bits, then the end mark; whole bytes out
   only (the next stream starts right after this one's last byte). */
HD void lit_stream(const u8* src, i64 count, const u32* ce, u8* out) {
  u64 acc = 0;
  unsigned nbits = 0;
  for (i64 i = count - 1; i >= 0; --i) {
    const u32 e = ce[src[i]];
    acc |= (u64)(e & 0xFFFF) << nbits;
    nbits += e >> 16;
    if (nbits >= 32) {
      out[0] = (u8)acc; out[1] = (u8)(acc >> 8); out[2] = (u8)(acc >> 16); out[3] = (u8)(acc >> 24);
      out += 4;
      acc >>= 32;
      nbits -= 32;
    }
  }
  acc |= (u64)1 << nbits;
  nbits += 1;
  for (; nbits > 0; nbits = nbits > 8 ? nbits - 8 : 0) {
    *out++ = (u8)acc;
    acc >>= 8;
  }
}

/* Group j (8 bytes) of a chunk of n bytes bit-packed (ckptz.codecs.bitpack): for each bit
   position not in `fixed`, ascending, one byte (bit t of it: that bit of byte 8j + t) at
   row r of `out` (rows m bytes apart); bytes past n count as 0. */
HD void bitpack_group(const u8* s, i64 n, i64 j, int fixed, u8* out, i64 m) {
  u8 x[8];
  for (int t = 0; t < 8; ++t) x[t] = j * 8 + t < n ? s[j * 8 + t] : 0;
  int row = 0;
  for (int b = 0; b < 8; ++b) {
    if ((fixed >> b) & 1) continue;
    u8 o = 0;
    for (int t = 0; t < 8; ++t) o |= (u8)(((x[t] >> b) & 1) << t);
    out[row * m + j] = o;
    ++row;
  }
}

/* The highest set bit of x > 0. */
HD int lit_highbit(unsigned x) {
#ifdef LITERALS_HOST
  return 31 - __builtin_clz(x);
#else
  return 31 - __clz(x);
#endif
}

/* 8 bytes at p, little-endian, p anywhere: two aligned loads on the device, each holding a
   byte of the 8 (so neither leaves the allocation). */
HD u64 lit_load(const u8* p) {
#ifdef LITERALS_HOST
  u64 v = 0;
  for (int k = 0; k < 8; ++k) v |= (u64)p[k] << (8 * k);
  return v;
#else
  const unsigned long long a = (unsigned long long)p;
  const u64* w = (const u64*)(a & ~7ull);
  const unsigned sh = (unsigned)(a & 7) * 8;
  const u64 lo = __ldg(w);
  return sh ? (lo >> sh) | (__ldg(w + 1) << (64 - sh)) : lo;
#endif
}

/* m symbols of one Huffman stream of n bytes (RFC 8878 4.2.2, read backwards from the end
   mark in its last byte) by lookups of the next 11 bits in `code` (symbol | length << 8),
   five a load while 64+ bits are left; 1 if the stream ends exactly. Bits below the
   stream's start read as 0 (a corrupt stream decodes to wrong bytes, which the frame's
   checksum finds), and nothing is read before it or written past out[m - 1]. */
HD int lit_decode_stream(const u8* in, i64 n, const u16* code, u8* out, i64 m) {
  i64 pos = 8 * (n - 1) + lit_highbit(in[n - 1]), i = 0;
  while (pos >= 64 && m - i >= 5) {
    const i64 top = (pos + 7) >> 3;
    const u64 c = lit_load(in + top - 8) << (8 * top - pos);
    unsigned used = 0;
    for (int q = 0; q < 5; ++q) {
      const u16 e = code[(c << used) >> 53];
      out[i++] = (u8)e;
      used += e >> 8;
    }
    pos -= used;
  }
  for (; i < m; ++i) {
    u64 c = 0;
    if (pos > 0) {
      const i64 top = (pos + 7) >> 3;
      if (top >= 8) {
        c = lit_load(in + top - 8) << (8 * top - pos);
      } else {
        for (i64 k = 0; k < top; ++k) c |= (u64)in[k] << (8 * k);
        c <<= 64 - pos;
      }
    }
    const u16 e = code[c >> 53];
    out[i] = (u8)e;
    pos -= e >> 8;
  }
  return pos == 0;
}

/* Group j (8 bytes) of a bit-packed chunk of n bytes from its rows (m bytes each, one per
   bit position not in `fixed`, ascending): bitpack_group's inverse; the fixed bits from
   `value`. */
HD void bitpack_ungroup(const u8* rows, i64 n, i64 j, int fixed, int value, u8* out, i64 m) {
  u8 x[8];
  for (int t = 0; t < 8; ++t) x[t] = (u8)value;
  int row = 0;
  for (int b = 0; b < 8; ++b) {
    if ((fixed >> b) & 1) continue;
    const u8 o = rows[row * m + j];
    for (int t = 0; t < 8; ++t) x[t] |= (u8)(((o >> t) & 1) << b);
    ++row;
  }
  for (int t = 0; t < 8 && j * 8 + t < n; ++t) out[j * 8 + t] = x[t];
}

#ifndef LITERALS_HOST
/* Byte counts of quarter blockIdx.x (q_at[q], q_len[q]) into counts[q][256]. */
extern "C" __global__ void __launch_bounds__(THREADS)
literals_hist(const u8* src, const i64* q_at, const i64* q_len, u16* counts) {
  __shared__ u32 h[256];
  const i64 q = blockIdx.x;
  h[threadIdx.x] = 0;
  __syncthreads();
  const u8* s = src + q_at[q];
  const i64 n = q_len[q];
  for (i64 i = threadIdx.x; i < n; i += THREADS) atomicAdd(&h[s[i]], 1u);
  __syncthreads();
  counts[q * 256 + threadIdx.x] = (u16)h[threadIdx.x];
}

/* Block blockIdx.x of the plan (literals_plan.c): its head, then its streams (threads 0-3)
   or its bytes (a raw block), and for coded blocks the closing Number_of_Sequences = 0. */
extern "C" __global__ void __launch_bounds__(THREADS)
literals_encode(const u8* src, u8* dst, const i64* plan, const u32* tables, const u8* blob) {
  const i64* p = plan + (i64)blockIdx.x * 16;
  const i64 at = p[0], m = p[1], mode = p[2], d = p[3], head = p[4], head_len = p[5];
  const int t = threadIdx.x;
  for (i64 i = t; i < head_len; i += THREADS) dst[d + i] = blob[head + i];
  if (mode == 0) {
    for (i64 i = t; i < m; i += THREADS) dst[d + head_len + i] = src[at + i];
  } else if (mode >= 2 && t < 4) {
    i64 start;
    const i64 count = lit_quarter(m, t, &start);
    lit_stream(src + at + start, count, tables + p[6] * 256, dst + p[7 + t]);
    if (t == 0) dst[p[11]] = 0;
  }
}

/* Chunk blockIdx.y of `rows` (src, n, dst, fixed | value << 8) bit-packed: its two header
   bytes, then each thread's groups of 8 bytes. */
extern "C" __global__ void __launch_bounds__(THREADS)
bitpack_encode(const u8* src, u8* dst, const i64* rows) {
  const i64* r = rows + (i64)blockIdx.y * 4;
  const i64 at = r[0], n = r[1], d = r[2], m = (n + 7) / 8;
  const int fixed = (int)(r[3] & 0xFF);
  for (i64 j = (i64)blockIdx.x * THREADS + threadIdx.x; j < m; j += (i64)gridDim.x * THREADS)
    bitpack_group(src + at, n, j, fixed, dst + d + 2, m);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    dst[d] = (u8)fixed;
    dst[d + 1] = (u8)((r[3] >> 8) & 0xFF);
  }
}
/* Row blockIdx.x * THREADS + threadIdx.x of `count` (literals_scan: kind, src, src bytes, dst,
   dst bytes, code or byte): a Huffman stream decoded, or a piece copied or filled. */
extern "C" __global__ void __launch_bounds__(THREADS)
literals_decode(const u8* src, u8* dst, const i64* rows, i64 count, const u16* codes) {
  const i64 r = (i64)blockIdx.x * THREADS + threadIdx.x;
  if (r >= count) return;
  const i64* p = rows + r * 6;
  const i64 kind = p[0], s = p[1], n = p[2], d = p[3], m = p[4], x = p[5];
  if (kind == 2) {
    lit_decode_stream(src + s, n, codes + x * 2048, dst + d, m);
  } else if (kind == 1) {
    for (i64 i = 0; i < m; ++i) dst[d + i] = (u8)x;
  } else {
    for (i64 i = 0; i < m; ++i) dst[d + i] = src[s + i];
  }
}

/* Chunk blockIdx.y of `rows` (payload, n, dst, fixed | value << 8) unpacked, 8 bytes a thread. */
extern "C" __global__ void __launch_bounds__(THREADS)
bitpack_decode(const u8* src, u8* dst, const i64* rows) {
  const i64* r = rows + (i64)blockIdx.y * 4;
  const i64 at = r[0], n = r[1], d = r[2], m = (n + 7) / 8;
  const int fixed = (int)(r[3] & 0xFF), value = (int)((r[3] >> 8) & 0xFF);
  for (i64 j = (i64)blockIdx.x * THREADS + threadIdx.x; j < m; j += (i64)gridDim.x * THREADS)
    bitpack_ungroup(src + at + 2, n, j, fixed, value, dst + d, m);
}
#endif
