"""nvCOMP's batched codecs over torch buffers: the only module that imports ``nvidia.nvcomp``.

Every call codes a whole batch of chunks that lie in one device buffer at 16-byte-aligned
offsets (``nvcomp.as_arrays``), on one CUDA stream. Two bitstreams:

* ``zstd`` (id 2): nvCOMP Zstd with ``bitstream_kind=RAW``: standard zstd frames, so the
  CPU codec of the same id decodes them and nvCOMP decodes the CPU's.
* ``ans`` (id 3): nvCOMP ANS on bytes; no CPU decoder exists, and 6.0 streams are not
  readable by older nvCOMP, so containers record :func:`nvcomp_version`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import nvidia.nvcomp as nvc
import torch

from ckptz.codecs.table import TABLE
from ckptz.errors import CodecError

#: nvCOMP's algorithm for each bitstream it codes, by id.
_ALGORITHM: dict[int, str] = {b.id: alg for b in TABLE if (alg := b.nvcomp) is not None}
#: Name of each of those bitstreams, by id.
NAMES: dict[int, str] = {b.id: b.name for b in TABLE if b.id in _ALGORITHM}


def nvcomp_version() -> str:
    """The nvCOMP library version, e.g. ``6.0.0`` (recorded in containers with ANS chunks)."""
    return str(getattr(nvc, "__version__", "unknown"))


def _pow2_at_least(n: int) -> int:
    return 1 << max(16, (max(n, 1) - 1).bit_length())


def _size_classes(sizes: Sequence[int]) -> dict[int, list[int]]:
    """Indices of ``sizes`` grouped by power-of-two size class."""
    classes: dict[int, list[int]] = {}
    for i, n in enumerate(sizes):
        classes.setdefault(_pow2_at_least(n), []).append(i)
    return classes


class NvcompCodecs:
    """nvCOMP codecs bound to one device and one CUDA stream (one per worker thread).

    Args:
        device_index: the CUDA device.
        stream: a torch stream of that device; every call is ordered on it.
    """

    def __init__(self, device_index: int, stream: torch.cuda.Stream) -> None:
        self.device_index = device_index
        self.stream = stream
        self._codecs: dict[tuple[int, int], Any] = {}
        self._max_size: dict[tuple[int, int], int] = {}
        self._out_param_ok: bool | None = None
        self._configs: dict[tuple[int, tuple[int, ...]], Any] = {}

    def _codec(self, codec_id: int, chunk: int) -> Any:
        # RAW bitstreams: one stream per batch entry, so the codec's chunk size must cover the
        # largest entry (a smaller one could split an entry into several frames).
        key = (codec_id, _pow2_at_least(chunk))
        codec = self._codecs.get(key)
        if codec is None:
            codec = nvc.Codec(
                algorithm=_ALGORITHM[codec_id],
                device_id=self.device_index,
                cuda_stream=self.stream.cuda_stream,
                bitstream_kind=nvc.BitstreamKind.RAW,
                uncomp_chunk_size=key[1],
            )
            self._codecs[key] = codec
        return codec

    def max_compressed_size(self, codec_id: int, size: int) -> int:
        """Room one chunk's payload needs in :meth:`encode`'s output (cached per size class).

        nvCOMP sizes every output of a call for the codec's chunk size, so the bound is that
        of the chunk's power-of-two size class, not of the chunk itself.
        """
        cls = _pow2_at_least(size)
        key = (codec_id, cls)
        bound = self._max_size.get(key)
        if bound is None:
            probe = torch.empty(cls, dtype=torch.uint8, device=f"cuda:{self.device_index}")
            arr = nvc.as_array(probe, self.stream.cuda_stream)
            bound = int(self._codec(codec_id, cls).get_max_comp_buffer_size(arr))
            self._max_size[key] = bound
        return bound

    def _config(self, codec: Any, sizes: list[int]) -> Any:
        # Batches repeat the same sizes (whole frames' planes): building a config per call
        # cost more than a small batch's coding.
        key = (id(codec), tuple(sizes))
        config = self._configs.get(key)
        if config is None:
            if len(self._configs) > 64:
                self._configs.clear()
            config = self._configs[key] = codec.compression_config(list(sizes))
        return config

    def _batch(self, buffer: torch.Tensor, offsets: Sequence[int], sizes: Sequence[int]) -> Any:
        return nvc.as_arrays(buffer, list(offsets), list(sizes), self.stream.cuda_stream)

    def encode(
        self,
        codec_id: int,
        src: torch.Tensor,
        offsets: Sequence[int],
        sizes: Sequence[int],
        dst: torch.Tensor,
        dst_offsets: Sequence[int],
        capacities: Sequence[int],
    ) -> list[int]:
        """Encode chunks of ``src`` into ``dst``; return each payload's size (waits for the GPU).

        One nvCOMP call per power-of-two size class of the chunks (usually one or two).

        Args:
            codec_id: a bitstream with an nvCOMP algorithm (``zstd`` or ``ans``).
            src: flat uint8 device buffer holding the chunks.
            offsets: byte offset of each chunk in ``src`` (16-byte aligned).
            sizes: byte size of each chunk (> 0).
            dst: flat uint8 device buffer for the payloads.
            dst_offsets: where each payload goes in ``dst`` (16-byte aligned).
            capacities: room at each ``dst_offsets`` (at least :meth:`max_compressed_size`).
        """
        got = [0] * len(sizes)
        for members in _size_classes(sizes).values():
            sub = self._encode_class(
                codec_id,
                src,
                [offsets[i] for i in members],
                [sizes[i] for i in members],
                dst,
                [dst_offsets[i] for i in members],
                [capacities[i] for i in members],
            )
            for i, n in zip(members, sub, strict=True):
                got[i] = n
        return got

    def _encode_class(
        self,
        codec_id: int,
        src: torch.Tensor,
        offsets: list[int],
        sizes: list[int],
        dst: torch.Tensor,
        dst_offsets: list[int],
        capacities: list[int],
    ) -> list[int]:
        codec = self._codec(codec_id, max(sizes))
        batch = self._batch(src, offsets, sizes)
        config = self._config(codec, sizes)
        if self._out_param_ok is not False:
            out = self._batch(dst, dst_offsets, capacities)
            result = codec.encode(batch, out=out, compression_config=config)
            got = [int(s) for s in result.buffer_sizes]
            if self._out_param_ok is None:
                # nvCOMP documents that a caller's batch "keeps its fixed capacity"; whether the
                # result then reports the payload sizes is checked once, on real output.
                self._out_param_ok = got != list(capacities)
            if self._out_param_ok:
                return got
        result = codec.encode(batch, compression_config=config)
        got = [int(s) for s in result.buffer_sizes]
        with torch.cuda.stream(self.stream):
            for i, size in enumerate(got):
                view = torch.from_dlpack(result[i])
                dst[dst_offsets[i] : dst_offsets[i] + size].copy_(view.view(torch.uint8).reshape(-1)[:size])
        return got

    def decode(
        self,
        codec_id: int,
        src: torch.Tensor,
        offsets: Sequence[int],
        sizes: Sequence[int],
        dst: torch.Tensor,
        dst_offsets: Sequence[int],
        raw_sizes: Sequence[int],
    ) -> None:
        """Decode payloads of ``src`` into ``dst``, queued on the stream.

        The payloads must already have passed their checksums: nvCOMP decoders assume valid
        input. The caller checks the decoded frames too.

        Raises:
            CodecError: nvCOMP rejected a payload.
        """
        for members in _size_classes(raw_sizes).values():
            codec = self._codec(codec_id, max(raw_sizes[i] for i in members))
            batch = self._batch(src, [offsets[i] for i in members], [sizes[i] for i in members])
            out = self._batch(dst, [dst_offsets[i] for i in members], [raw_sizes[i] for i in members])
            try:
                codec.decode(batch, out=out)
            except (RuntimeError, ValueError) as exc:
                raise CodecError(f"nvCOMP could not decode a batch ({exc})", codec=NAMES[codec_id]) from None

    def close(self) -> None:
        """Release the codecs (and the device memory nvCOMP holds for them)."""
        for codec in self._codecs.values():
            codec.__exit__(None, None, None)
        self._codecs.clear()


class RawNvcomp:
    """The blog's recipe, for ``ckptz bench``'s reference rows: one nvCOMP codec straight on
    the raw bytes (nvCOMP's own chunked format, default chunk size), host memory in and out.

    Args:
        algorithm: ``zstd`` or ``ans``.
        device: a CUDA device (``cuda`` or ``cuda:N``).
    """

    def __init__(self, algorithm: str, device: str) -> None:
        dev = torch.device(device)
        self.device = torch.device(
            "cuda", dev.index if dev.index is not None else torch.cuda.current_device()
        )
        self._stream = torch.cuda.current_stream(self.device)
        name = {NAMES[i]: a for i, a in _ALGORITHM.items()}[algorithm]
        self._codec = nvc.Codec(
            algorithm=name, device_id=self.device.index, cuda_stream=self._stream.cuda_stream
        )

    def encode(self, data: Any) -> bytes:
        """Compress host bytes (a uint8 ndarray) on the GPU; return the compressed bytes."""
        src = torch.from_numpy(data).to(self.device)
        out = self._codec.encode(nvc.as_array(src, self._stream.cuda_stream))
        size = int(out.buffer_size)
        blob = torch.from_dlpack(out).view(torch.uint8).reshape(-1)[:size]
        return bytes(blob.cpu().numpy().tobytes())

    def decode(self, blob: bytes, size: int) -> Any:
        """Decompress what :meth:`encode` wrote; return the original bytes as a uint8 ndarray."""
        src = torch.frombuffer(bytearray(blob), dtype=torch.uint8).to(self.device)
        out = self._codec.decode(nvc.as_array(src, self._stream.cuda_stream))
        data = torch.from_dlpack(out).view(torch.uint8).reshape(-1)[:size]
        return data.cpu().numpy()


__all__ = ["NAMES", "NvcompCodecs", "RawNvcomp", "nvcomp_version"]
