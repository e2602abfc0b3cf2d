"""In place, the proof made from the bytes in flight catches what decoding the file again did.

A coder that writes a payload which does not decode back, and a write that puts a wrong
byte on disk, must each stop ``compress --in-place`` with the original untouched and no
container left (RELIABILITY.md, *Crash safety*).
"""

from __future__ import annotations

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
from ckptz.pipeline import compress_file


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
