"""In place, the proof made from the bytes in flight catches what decoding the file again did.

A coder that writes a payload which does not decode back, and a write that puts a wrong
byte on disk, must each stop ``compress --in-place`` with the original untouched and no
container left (RELIABILITY.md, *Crash safety*); a wrong, lost or extra byte restoring in
place must stop ``decompress --in-place`` with the container kept. The disk's faults are
made below every writer, by a preloaded library (:func:`faults.lying_disk`), so the native
restore plane meets them as the Python pipeline does.
"""

from __future__ import annotations

import os
import re
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest
from conftest import ckptz, tree_digests
from faults import lying_disk

from ckptz import api, mapped, safeio
from ckptz.codecs.frames import EncodedChunk
from ckptz.container import StreamInfo, read_index
from ckptz.engines.base import EncodedFrame, EncodedSpan, FrameToCode
from ckptz.engines.cpu import CpuEngine
from ckptz.errors import CorruptionError
from ckptz.pipeline import FileSink, compress_file


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


@pytest.fixture(scope="module")
def lying(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return lying_disk(tmp_path_factory.mktemp("lying-disk"))


def test_a_wrong_byte_on_disk_is_caught_in_place(model: Path, lying: Path) -> None:
    if _written_through_mappings(model.parent):
        pytest.skip("outputs on tmpfs are written through mappings, which the lying disk does not see")
    before = tree_digests(model.parent)
    # The first write is a run of payloads: the header and the index are written after them.
    env = {
        "LD_PRELOAD": str(lying),
        "FAULTY_DIR": str(model.parent),
        "FAULTY_WRITE": "1",
        "FAULTY_KIND": "flip",
    }
    result = ckptz("compress", str(model.parent), "--in-place", env=env)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert "written payload differs" in result.stderr
    assert tree_digests(model.parent) == before  # the original is there, no container, no temp


def _written_through_mappings(folder: Path) -> bool:
    fd = os.open(folder, os.O_RDONLY)
    try:
        return mapped.file_system(fd) in mapped.FILE_SYSTEMS
    finally:
        os.close(fd)


@pytest.fixture
def compressed(model: Path) -> Path:
    api.compress(model.parent, in_place=True, device="cpu")
    return model.parent


def _restore_in_place_on_a_lying_disk(folder: Path, lying: Path, kind: str, **more: str) -> str:
    """``ckptz decompress --in-place`` whose second write under ``folder`` goes wrong as
    ``kind`` says (:func:`faults.lying_disk`): it must fail, keep the container, and leave
    no restored file or temp file beside it; its stderr."""
    before = tree_digests(folder)
    env = {"LD_PRELOAD": str(lying), "FAULTY_DIR": str(folder), "FAULTY_WRITE": "2", "FAULTY_KIND": kind}
    result = ckptz("decompress", str(folder), "--in-place", env={**env, **more})
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert tree_digests(folder) == before
    return result.stderr


@pytest.mark.parametrize("fault", ["flip", "lose"])
def test_a_wrong_or_lost_write_is_caught_restoring_in_place(
    compressed: Path, lying: Path, fault: str
) -> None:
    stderr = _restore_in_place_on_a_lying_disk(compressed, lying, fault)
    assert "read back differs from what was written" in stderr


def test_a_restored_file_longer_than_the_original_is_caught_in_place(
    compressed: Path, model: Path, lying: Path
) -> None:
    with open(compressed / (model.name + ".ckptz"), "rb") as f:
        size = read_index(f, model.name).source_size  # the extra byte lands just past the end
    stderr = _restore_in_place_on_a_lying_disk(compressed, lying, "past", FAULTY_AT=str(size))
    assert re.search("is not the original's .* bytes long", stderr), stderr


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
