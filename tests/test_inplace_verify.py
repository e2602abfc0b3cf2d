"""In place, the proof made from the bytes in flight catches what decoding the file again did.

A coder that writes a payload which does not decode back, and a write that puts a wrong
byte on disk, must each stop ``compress --in-place`` with the original untouched and no
container left (RELIABILITY.md, *Crash safety*).
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import tree_digests

from ckptz import api, safeio
from ckptz.codecs.frames import EncodedChunk
from ckptz.container import StreamInfo
from ckptz.engines.base import EncodedFrame, EncodedSpan, FrameToCode
from ckptz.engines.cpu import CpuEngine
from ckptz.errors import CorruptionError
from ckptz.pipeline import FileSink, compress_file
from ckptz.pipeline.plan import Frame


class _LyingEngine(CpuEngine):
    """Codes like the CPU engine, then changes one byte of every stored (raw) payload."""

    def _encode(self, stream: StreamInfo, data: np.ndarray, checksum: int) -> EncodedFrame:
        frame = super()._encode(stream, data, checksum)
        chunks = []
        for c in frame.chunks:
            if c.codec == 0 and len(c.payload):  # raw: changing a byte still "decodes"
                bad = bytearray(c.payload)
                bad[0] ^= 0x40
                c = EncodedChunk(c.codec, c.raw_size, bytes(bad))
            chunks.append(c)
        return EncodedFrame(frame.checksum, chunks)


class _LyingRuns(_LyingEngine):
    """The lying coder over runs of frames, handing back each run's block (as a GPU does):
    the run's verification must catch it too."""

    frame_size = 64 << 10
    span_bytes = 1 << 20

    def encode_span(self, frames: list[FrameToCode], buffer: np.ndarray | None) -> Future[EncodedSpan]:
        span = super().encode_span(frames, buffer).result()
        parts = [bytes(c.payload) + bytes(-len(c.payload) % 16) for f in span.frames for c in f.chunks]
        done: Future[EncodedSpan] = Future()
        done.set_result(EncodedSpan(span.frames, np.frombuffer(b"".join(parts), np.uint8)))
        return done


@pytest.fixture
def model(tmp_path: Path) -> Path:
    from safetensors.numpy import save_file

    path = tmp_path / "ck" / "model.safetensors"
    path.parent.mkdir()
    rng = np.random.default_rng(0)
    save_file({"w": rng.standard_normal(300_000).astype(np.float32)}, str(path))
    return path


@pytest.mark.parametrize("liar", [_LyingEngine, _LyingRuns])
def test_a_payload_that_does_not_decode_back_is_caught(model: Path, tmp_path: Path, liar: type) -> None:
    with open(tmp_path / "out.ckptz", "w+b") as f, liar(2) as engine:
        with pytest.raises(CorruptionError, match="does not decode back"):
            compress_file(model, model.name, f, engine, verify=True)
        # Without verification the same coder would have written a wrong container.
        f.seek(0)
        f.truncate()
        compress_file(model, model.name, f, engine, verify=False)


def test_a_wrong_byte_on_disk_is_caught_in_place(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = tree_digests(model.parent)
    real = safeio.pwrite_all
    calls = [0]

    def flip_one(fd: int, parts: Any, offset: int) -> None:
        calls[0] += 1
        if calls[0] == 1:  # a payload write: the header and the index are written after them
            first = bytearray(memoryview(parts[0]).cast("B"))
            first[len(first) // 2] ^= 1
            parts = [bytes(first), *parts[1:]]
        real(fd, parts, offset)

    monkeypatch.setattr(safeio, "pwrite_all", flip_one)
    with pytest.raises(CorruptionError, match="written payload differs"):
        api.compress(model.parent, in_place=True, device="cpu")
    monkeypatch.undo()
    assert tree_digests(model.parent) == before  # the original is there, no container, no temp


@pytest.fixture
def compressed(model: Path) -> Path:
    api.compress(model.parent, in_place=True, device="cpu")
    return model.parent


def _restore_in_place_fails(folder: Path, match: str) -> None:
    before = tree_digests(folder)
    with pytest.raises(CorruptionError, match=match):
        api.decompress(folder, in_place=True, device="cpu")
    # The container is kept, and no restored file or temp file is left beside it.
    assert tree_digests(folder) == before


@pytest.mark.parametrize("fault", ["flip", "lose"])
def test_a_wrong_or_lost_write_is_caught_restoring_in_place(
    compressed: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    real = safeio.pwrite_all
    calls = [0]

    def faulty(fd: int, parts: Any, offset: int) -> None:
        calls[0] += 1
        if calls[0] == 2:  # a frame's piece, not the first
            if fault == "lose":
                return
            first = bytearray(memoryview(parts[0]).cast("B"))
            first[-1] ^= 0x80
            parts = [bytes(first), *parts[1:]]
        real(fd, parts, offset)

    monkeypatch.setattr(safeio, "pwrite_all", faulty)
    _restore_in_place_fails(compressed, "read back differs from what was written")
    assert calls[0] >= 2


def test_a_restored_file_longer_than_the_original_is_caught_in_place(
    compressed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = FileSink.put

    def and_a_byte_past_the_end(self: FileSink, frame: Frame, data: np.ndarray) -> None:
        real(self, frame, data)
        assert self.size is not None
        os.pwrite(self.fd, b"x", self.size)  # every frame's own bytes are right

    monkeypatch.setattr(FileSink, "put", and_a_byte_past_the_end)
    _restore_in_place_fails(compressed, "is not the original's .* bytes long")


def test_first_difference_names_the_first_wrong_byte(tmp_path: Path) -> None:
    data = np.random.default_rng(1).integers(0, 256, 700_000, dtype=np.uint8)
    path = tmp_path / "f"
    path.write_bytes(data.tobytes())
    # Pieces of a frame: (file offset, offset in the frame's bytes, bytes), out of order.
    frame = np.concatenate([data[500_000:600_000], data[10:300_010]])
    pieces = [(500_000, 0, 100_000), (10, 100_000, 300_000)]
    fd = os.open(path, os.O_RDONLY)
    try:
        assert safeio.first_difference(fd, frame, pieces) is None
        wrong = frame.copy()
        wrong[100_000 + 299_000] ^= 1  # the second piece's byte at file offset 299_010
        assert safeio.first_difference(fd, wrong, pieces) == 299_010
        wrong[5] ^= 1  # the first piece is compared first
        assert safeio.first_difference(fd, wrong, pieces) == 500_005
        os.truncate(path, 550_000)  # the first piece is cut short where the file ends
        assert safeio.first_difference(fd, frame, pieces) == 550_000
        # A range outside the data is refused, never read past.
        one = np.array([frame.size], np.int64)
        with pytest.raises(ValueError, match="outside"):
            safeio.native.first_difference(fd, frame, np.zeros(1, np.int64), one, one // one)
    finally:
        os.close(fd)


def test_reading_back_needs_a_file_open_for_reading(tmp_path: Path) -> None:
    with open(tmp_path / "w", "wb") as f:
        with pytest.raises(ValueError, match="open for reading"):
            FileSink(f, 10, read_back=True)
        FileSink(f, 10)  # without reading back, a write-only file will do
