"""The GPU's xxh3_64 (``ckptz/engines/gpu/hash_source.py``) checked on any machine.

The CUDA source shares its arithmetic with a host build: this compiles the short paths and
a model of the warp's long path (the same four groups of stripes per block, summed before
each scramble) with the host's C++ compiler and compares every length path with
``xxhash.xxh3_64``. The GPU tests run the kernel itself.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import xxhash
from conftest import host_build

from ckptz.engines.gpu.hash_source import SOURCE

_HARNESS = (
    r"""
typedef unsigned char u8;
typedef unsigned long long u64;
typedef long long i64;
#define HD static inline
#define XXH_CONST static const
#define XXH_MULHI(a, b) ((u64)(((unsigned __int128)(a) * (b)) >> 64))
"""
    + SOURCE
    + r"""
/* The long path as the two launches run it, thread by thread. Phase 1 (xxh3_blocks): for
   each whole block, group g of lane l sums stripes g, g+4, g+8, g+12 and the four partial
   sums are added. Phase 2 (xxh3_many): every lane scrambles the block sums in order. */
extern "C" u64 host_xxh3(const u8* in, u64 len) {
  if (len <= 240) return xxh3_short(in, len);
  const u64 blocks = (len - 1) / 1024;
  u64* sums = new u64[8 * blocks + 1];
  for (u64 b = 0; b < blocks; ++b)
    for (int l = 0; l < 8; ++l) {
      u64 sum = 0;
      for (int g = 0; g < 4; ++g)
        for (int j = 0; j < 4; ++j) {
          const u8* p = in + b * 1024 + g * 64 + j * 256;
          sum += xxh_term(xxh_rd64(p + 8 * l), xxh_rd64(p + 8 * (l ^ 1)),
                          xxh_rd64(XXH_SECRET + (g + 4 * j) * 8 + 8 * l));
        }
      sums[8 * b + l] = sum;
    }
  u64 acc[8];
  for (int l = 0; l < 8; ++l) acc[l] = xxh_init(l);
  for (u64 b = 0; b < blocks; ++b)
    for (int l = 0; l < 8; ++l) acc[l] = xxh_scramble(acc[l] + sums[8 * b + l], l);
  delete[] sums;
  for (int l = 0; l < 8; ++l)
    for (int g = 0; g < 4; ++g) acc[l] += xxh_tail(in, len, blocks, l, g);
  return xxh_merge(acc, len);
}
"""
)


@pytest.fixture(scope="module")
def host_xxh3(tmp_path_factory: pytest.TempPathFactory) -> ctypes._CFuncPtr:
    fn = host_build(tmp_path_factory, "hash_source", _HARNESS).host_xxh3
    fn.restype = ctypes.c_uint64
    fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    return fn


def _lengths() -> list[int]:
    # Every short path and its edges, the long path around block and stripe edges, big ones.
    edges = [k * 1024 + d for k in range(1, 6) for d in (-65, -64, -63, -1, 0, 1, 63, 64, 65)]
    return [*range(0, 300), *edges, 16 * 1024 + 7, (1 << 19), (1 << 19) + 13, 3 << 20]


def test_host_model_of_gpu_xxh3_matches_xxhash(host_xxh3: ctypes._CFuncPtr) -> None:
    data = np.random.default_rng(7).integers(0, 256, (3 << 20) + 64, dtype=np.uint8)
    for n in _lengths():
        for skew in (0, 3):  # the GPU reads unaligned inputs byte by byte
            view = data[skew : skew + n]
            assert host_xxh3(view.ctypes.data, n) == xxhash.xxh3_64_intdigest(view.tobytes()), (n, skew)


def test_host_model_on_runs_of_one_byte(host_xxh3: ctypes._CFuncPtr) -> None:
    # Constant inputs: the planes and padding the checks see most.
    for n in (241, 4096, 1 << 20):
        for value in (0, 255):
            data = np.full(n, value, np.uint8)
            assert host_xxh3(data.ctypes.data, n) == xxhash.xxh3_64_intdigest(data.tobytes())


def test_source_lists_its_kernels() -> None:
    for name in ("xxh3_blocks", "xxh3_many", "copy_ranges"):
        assert f"{name}(" in SOURCE
