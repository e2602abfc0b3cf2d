"""Raw deflate (bitstream 5, ``deflate``): order-0 Huffman coding of a plane, block-adaptive.

The payload is one raw deflate stream (RFC 1951: no zlib or gzip wrapper), ending in a
final block, that inflates to exactly the chunk's size. Any valid deflate stream is a
valid payload. ckptz no longer writes this bitstream (Huffman-coded zstd frames code the
same planes as small and decode faster); it reads it in older containers, and
:meth:`DeflateCodec.encode` writes Huffman-only streams (zlib strategy ``Z_HUFFMAN_ONLY``,
window bits -15, memory level 8) for tests and conformance vectors.

nvCOMP's Deflate with ``bitstream_kind=RAW`` reads and writes the same bitstream, so a GPU
can decode these chunks (its decoder wants 4-byte aligned input: the container aligns
payloads to 16 bytes).

Encoding uses zlib-ng (``zlib_ng``) when importable, else stdlib zlib: both write the same
Huffman-only stream (same sizes on every plane measured), zlib-ng 1.6-1.9x faster. ISA-L
(``isal``) has no Huffman-only mode, and its LZ matching costs 9-37% more on exponent planes
(1-3% even with a 2-byte window). Decoding uses ISA-L's inflate when ``isal`` is importable
(measured 2.3x zlib's on these streams, GIL released), else zlib's; both read any valid raw
deflate stream.

Decoding fails with :class:`~ckptz.errors.CodecError` if the stream is malformed, ends
early, or would inflate past the expected size (output is capped at that size, so a
damaged stream cannot allocate more).
"""

from __future__ import annotations

import zlib
from types import ModuleType

import numpy as np

from ckptz.codecs.base import Codec
from ckptz.errors import CodecError

_WBITS = -15  # raw deflate, 32 KiB window
_MEM_LEVEL = 8  # 16 K literals per block: finer adaptation than 9 measured no worse

_deflate: ModuleType
try:
    from zlib_ng import zlib_ng as _deflate
except ImportError:  # pragma: no cover - zlib-ng is a dependency; zlib writes the same stream
    _deflate = zlib

_inflate: ModuleType
try:
    from isal import isal_zlib as _inflate
except ImportError:  # pragma: no cover - isal is a dependency; zlib reads the same stream
    _inflate = zlib
#: What a malformed stream raises (isal's error is not a subclass of zlib's).
_INFLATE_ERRORS: tuple[type[Exception], ...] = (zlib.error, _inflate.error)


class DeflateCodec(Codec):
    """Huffman-only raw deflate (see module docs)."""

    def encode(self, data: np.ndarray) -> bytes:
        obj = _deflate.compressobj(1, _deflate.DEFLATED, _WBITS, _MEM_LEVEL, _deflate.Z_HUFFMAN_ONLY)
        return obj.compress(np.ascontiguousarray(data).data) + obj.flush()

    def decode(self, payload: bytes | memoryview, size: int) -> np.ndarray:
        obj = _inflate.decompressobj(_WBITS)
        try:
            out = obj.decompress(payload, size) if size else obj.decompress(payload, 1)
        except _INFLATE_ERRORS as exc:
            raise CodecError(f"corrupt deflate stream ({exc})", codec=self.name) from None
        if len(out) != size or not obj.eof or obj.unconsumed_tail:
            raise CodecError(f"deflate stream does not inflate to exactly {size} bytes", codec=self.name)
        return np.frombuffer(out, dtype=np.uint8)
