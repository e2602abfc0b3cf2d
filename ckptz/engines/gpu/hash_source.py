"""xxh3_64 on the GPU (``cuda_src/xxh3.cu``): the checksums of FORMAT.md taken where bytes were decoded.

``xxh3_blocks`` and ``xxh3_many`` hash any number of inputs lying anywhere in device memory
with xxHash's XXH3_64bits (seed 0, the default secret): exactly what ``xxhash.xxh3_64``
gives on the host, which the GPU tests compare over every length path.

XXH3's long path keeps eight 64-bit lanes; each 1024-byte block adds one term per lane and
stripe (16 stripes of 64 bytes), then scrambles every lane. The terms do not depend on the
lanes, only the scrambles do, so the work is split in two launches. ``xxh3_blocks`` sums the
terms of every whole block of every input at once, one warp per block (its four groups of
eight threads, one thread per lane, sum four stripes each, and two shuffles add the four
partial sums): all the bytes are read in parallel. ``xxh3_many`` then runs, one warp per
input, the only chain left, the scrambles: a 4 MiB input is 4096 dependent steps of a few
instructions each, fed by the block sums 32 blocks at a time, the next 32 loaded while these
are chained. (One warp reading its input block after block, as before, waited on memory at
every block, so an input took as long however many ran at once.) Inputs of at
most 240 bytes (XXH3's short paths) are hashed by the warp's first thread.

``copy_ranges`` copies byte ranges between device addresses: the leaves of a whole-file
digest that straddle two buffers are assembled with it before they are hashed.

``HD`` marks the code shared with the host build of the tests (``tests/test_hash_source.py``
compiles the short paths and a lane-by-lane model of the warp loop with a C++ compiler).
"""

from __future__ import annotations

from ckptz.engines.gpu import cuda_src

SOURCE = cuda_src.read("xxh3.cu")

#: The kernels the source defines.
NAMES = ("xxh3_blocks", "xxh3_many", "copy_ranges")

__all__ = ["NAMES", "SOURCE"]
