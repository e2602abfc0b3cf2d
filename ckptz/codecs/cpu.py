"""CPU codecs: stored bytes, constant runs, and zstd through the `zstandard` binding."""

from __future__ import annotations

import threading

import numpy as np
import zstandard

from ckptz.codecs.base import Codec
from ckptz.codecs.native import native
from ckptz.errors import CodecError


class RawCodec(Codec):
    """Bytes stored as they are: what a chunk gets when no coding makes it smaller."""

    def encode(self, data: np.ndarray) -> bytes:
        # A copy that does not hold the GIL (tobytes() does, for the frame's largest payload).
        return native.copy(data) if data.flags.c_contiguous else data.tobytes()

    def decode(self, payload: bytes | memoryview, size: int) -> np.ndarray:
        if len(payload) != size:
            raise CodecError(f"stored chunk holds {len(payload)} bytes, expected {size}", codec=self.name)
        return np.frombuffer(payload, dtype=np.uint8).copy()


class ConstCodec(Codec):
    """A chunk whose bytes are all one value (zero rows, frozen parameters): one byte."""

    def encode(self, data: np.ndarray) -> bytes:
        if data.size == 0:
            return b""
        first = data[0]
        if not bool(np.all(data == first)):
            raise CodecError("chunk is not constant", codec=self.name)
        return bytes([int(first)])

    def decode(self, payload: bytes | memoryview, size: int) -> np.ndarray:
        if size == 0:
            return np.empty(0, dtype=np.uint8)
        if len(payload) != 1:
            raise CodecError(f"constant chunk payload is {len(payload)} bytes, expected 1", codec=self.name)
        return np.full(size, payload[0], dtype=np.uint8)


#: Encoder parameters that leave zstd little but Huffman-coding literals (see ZstdCodec).
_LITERAL_PARAMS = {
    "strategy": zstandard.STRATEGY_FAST,
    "target_length": 0,  # > 0 with the fast strategy would turn literal Huffman coding off
    "min_match": 7,
    "hash_log": 6,  # the minimum: few candidates, so few (costly) short matches
    "chain_log": 6,
    "search_log": 1,
    "window_log": 15,  # blocks are at most one window: 32 KiB Huffman tables adapt locally
}


class ZstdCodec(Codec):
    """Standard zstd frames (RFC 8878); nvCOMP's Zstd with RAW bitstreams reads and writes them.

    With ``literal=True`` the encoder is set to all but skip LZ matching (fast strategy,
    7-byte minimum match, a 64-entry hash table, 32 KiB window and so blocks): the frame is
    then mostly Huffman-coded literals, one table per block, four streams, which zstd
    decodes 2-3x faster than inflate reads a Huffman-only deflate stream and encodes 2x
    faster than zlib-ng writes one, at 0.1-0.7% more size on exponent planes. ``level``
    is ignored then. Either way the payload is a plain zstd frame.

    Compressor objects are not thread-safe, so each thread keeps its own. With the C
    extension, a frame whose blocks hold only literals (no LZ sequences) is decoded by
    :mod:`ckptz.codecs.native`'s multi-symbol Huffman decoder; any other frame, and any it
    finds malformed, by libzstd.
    """

    def __init__(self, level: int = 3, *, literal: bool = False) -> None:
        self.level = level
        self.literal = literal
        self._local = threading.local()

    def _cctx(self) -> zstandard.ZstdCompressor:
        cctx = getattr(self._local, "cctx", None)
        if cctx is None:
            # No checksum or size flags: the container keeps its own checksums and sizes,
            # and nvCOMP writes bare frames too.
            if self.literal:
                params = zstandard.ZstdCompressionParameters(
                    write_content_size=True, write_checksum=False, **_LITERAL_PARAMS
                )
                cctx = zstandard.ZstdCompressor(compression_params=params)
            else:
                cctx = zstandard.ZstdCompressor(
                    level=self.level, write_content_size=True, write_checksum=False
                )
            self._local.cctx = cctx
        return cctx

    def _dctx(self) -> zstandard.ZstdDecompressor:
        dctx = getattr(self._local, "dctx", None)
        if dctx is None:
            dctx = zstandard.ZstdDecompressor()
            self._local.dctx = dctx
        return dctx

    def encode(self, data: np.ndarray) -> bytes:
        return self._cctx().compress(np.ascontiguousarray(data).data)

    def decode(self, payload: bytes | memoryview, size: int) -> np.ndarray:
        return self.decode_into(payload, size, None)

    def decode_into(self, payload: bytes | memoryview, size: int, out: np.ndarray | None) -> np.ndarray:
        # Frames of literal-only blocks (HuffmanZstd's, and libzstd's where it found no
        # matches) decode in C, 1.1-1.6x libzstd's speed, straight into the array.
        array = np.empty(size, np.uint8) if out is None else out
        if native.literals_decode(payload, array):
            return array
        try:
            declared = zstandard.frame_content_size(payload)
        except zstandard.ZstdError as exc:
            raise CodecError(f"corrupt zstd frame ({exc})", codec=self.name) from None
        if declared not in (-1, size):
            # Checked before decoding so a damaged header cannot make zstd allocate its claim.
            raise CodecError(f"zstd frame declares {declared} bytes, expected {size}", codec=self.name)
        try:
            decoded = self._dctx().decompress(payload, max_output_size=size)
        except zstandard.ZstdError as exc:
            raise CodecError(f"corrupt zstd frame ({exc})", codec=self.name) from None
        if len(decoded) != size:
            raise CodecError(f"zstd frame decoded to {len(decoded)} bytes, expected {size}", codec=self.name)
        return np.frombuffer(decoded, dtype=np.uint8)


class HuffmanZstd(ZstdCodec):
    """zstd frames of Huffman-coded literals only, written by the C extension (bitstream 2).

    What ZipNN gets from zstd's Huffman coder, as frames any zstd decoder reads: blocks
    whose sequence section is empty, each a new Huffman table (FSE-compressed weights), the
    previous block's table, one repeated byte, or stored bytes, whichever is smallest;
    block ends are planned from the plane's statistics (8-128 KiB). On trained exponent
    planes this is 0.2-1.6% smaller than Huffman-only deflate and decodes 2-3x faster.

    Where a block would need a table it cannot describe, it falls back to the literal-mostly
    zstd encoder: still a valid zstd frame.
    """

    def __init__(self) -> None:
        super().__init__(literal=True)

    def encode(self, data: np.ndarray) -> bytes:
        frame: bytes | None = native.huffman_zstd(np.ascontiguousarray(data))
        return frame if frame is not None else super().encode(data)
