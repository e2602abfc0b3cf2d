"""The restore loop's runs of frames (what a GPU engine decodes as one batch), on the CPU.

A GPU engine asks for runs of frames whose payloads lie back to back (``span_bytes``); the
restore loop reads each run with one ``pread`` and checks it there. :class:`SpanningCpu` is
the CPU engine asking for runs, so the run path's reading, checks and error reports are
tested where there is no GPU. Also: ``ckptz.load`` decoding straight into the storages.
"""

from __future__ import annotations

import importlib
import io
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pytest
import torch

import ckptz
from ckptz import api
from ckptz.container import read_index
from ckptz.engines.base import DecodedSpan, EncodedSpan, FrameToCode, Place, Ranges, StoredSpan
from ckptz.engines.cpu import CpuEngine
from ckptz.engines.gpu.memory import Buf, DeviceBytes
from ckptz.errors import CorruptionError, FormatError
from ckptz.pipeline import DiscardSink, FileSink, compress_file, restore
from ckptz.pipeline.decoder import FrameDecoder
from ckptz.pipeline.device import DeviceRanges
from ckptz.pipeline.plan import Frame, frame_map, frame_runs

#: The restore loop's module (``ckptz.pipeline.restore`` is its function there).
restore_module = importlib.import_module("ckptz.pipeline.restore")


class SpanningCpu(CpuEngine):
    """The CPU engine with small frames, asking the restore loop for runs of frames."""

    frame_size = 64 << 10
    span_bytes = 1 << 20


def _checkpoint(path: Path) -> Path:
    gen = torch.Generator().manual_seed(3)
    state = {
        "w": torch.randn(300_000, generator=gen),
        "m": (torch.randn(200_000, generator=gen) * 1e-3).to(torch.bfloat16),
        "zeros": torch.zeros(70_000),
        "step": 7,
    }
    torch.save(state, path)
    return path


@pytest.fixture
def packed(tmp_path: Path) -> tuple[Path, Path]:
    src = _checkpoint(tmp_path / "model.pt")
    out = tmp_path / "model.pt.ckptz"
    with open(out, "wb") as f, SpanningCpu(threads=4) as engine:
        compress_file(src, "model.pt", f, engine)
    return src, out


def test_runs_join_back_to_back_frames_up_to_the_limit(packed: tuple[Path, Path]) -> None:
    _, out = packed
    with open(out, "rb") as f:
        index = read_index(f, str(out))
        decoder = FrameDecoder(f.fileno(), str(out), index, SpanningCpu())
        runs = decoder.spans(SpanningCpu.span_bytes)
        assert [i for r in runs for i in r] == list(range(len(decoder.frames)))
        assert max(len(r) for r in runs) > 1
        for r in runs:
            if len(r) > 1:
                assert sum(decoder.frames[i].length for i in r) <= SpanningCpu.span_bytes
        assert all(len(r) == 1 for r in decoder.spans(0))


def test_restore_by_runs_gives_the_original_bytes(packed: tuple[Path, Path], tmp_path: Path) -> None:
    src, out = packed
    back = tmp_path / "back.pt"
    with open(out, "rb") as f, open(back, "wb") as sink, SpanningCpu(threads=4) as engine:
        index = read_index(f, str(out))
        sink.truncate(index.source_size)
        restore(f, str(out), engine, FileSink(sink), index=index)
    assert back.read_bytes() == src.read_bytes()


class BlockCpu(SpanningCpu):
    """The CPU engine handing back each run's data area as one block, as a GPU engine does."""

    def encode_span(self, frames: list[FrameToCode], buffer: np.ndarray | None):  # type: ignore[no-untyped-def]
        span = super().encode_span(frames, buffer).result()
        parts = []
        for frame in span.frames:
            for chunk in frame.chunks:
                payload = bytes(chunk.payload)
                parts.append(payload + bytes(-len(payload) % 16))
        done: Future[EncodedSpan] = Future()
        done.set_result(EncodedSpan(span.frames, np.frombuffer(b"".join(parts), np.uint8)))
        return done


def test_frame_runs_are_consecutive_and_bounded() -> None:
    frames = frame_map([(0, 5000), (1, 3000), (0, 900), (1, 7000)], [1000, 2048])
    for limit in (0, 1, 2048, 4096, 1 << 20):
        runs = frame_runs(frames, limit)
        assert [i for r in runs for i in r] == list(range(len(frames)))
        for r in runs:
            assert len(r) == 1 or sum(frames[i].length for i in r) <= limit
    assert len(frame_runs(frames, 1 << 20)) == 1
    assert all(len(r) == 1 for r in frame_runs(frames, 0))


@pytest.mark.parametrize("verify", [False, True])
def test_a_run_written_from_the_engines_block_is_the_same_container(
    packed: tuple[Path, Path], tmp_path: Path, verify: bool
) -> None:
    src, out = packed
    again = tmp_path / "again.ckptz"
    with open(again, "wb+") as f, BlockCpu(threads=4) as engine:
        compress_file(src, "model.pt", f, engine, verify=verify)
    assert again.read_bytes() == out.read_bytes()
    piped = io.BytesIO()
    with BlockCpu(threads=4) as engine:
        compress_file(src, "model.pt", piped, engine)
    assert piped.getvalue() == out.read_bytes()


def _payload_offsets(out: Path) -> tuple[int, int, int]:
    """Offset, size and index of a coded chunk in the middle of the container."""
    with open(out, "rb") as f:
        chunks = read_index(f, str(out)).chunks
    coded = np.flatnonzero((chunks["size"] > 64) & (chunks["size"] % 16 != 0))
    k = int(coded[len(coded) // 2])
    return int(chunks["offset"][k]), int(chunks["size"][k]), k


@pytest.mark.parametrize("where", ["payload", "padding"])
def test_a_damaged_run_names_the_chunk(packed: tuple[Path, Path], where: str) -> None:
    _, out = packed
    offset, size, k = _payload_offsets(out)
    data = bytearray(out.read_bytes())
    at = offset + size // 2 if where == "payload" else offset + size  # the first pad byte
    data[at] ^= 0x5A
    out.write_bytes(bytes(data))
    with open(out, "rb") as f, SpanningCpu(threads=4) as engine, pytest.raises(CorruptionError) as err:
        restore(f, str(out), engine, DiscardSink())
    assert err.value.chunk == k
    assert ("padding" in err.value.reason) == (where == "padding")


class PlacingCpu(SpanningCpu):
    """A CPU engine that, like a GPU engine, hands each decoded frame of a run to ``place``
    before the restore loop checks it (here in host memory, device index -1)."""

    def decode_span(
        self,
        span: StoredSpan,
        place: Place | None = None,
        keep: bool = False,
        check: bool = False,
        leaves: Ranges | None = None,
    ) -> Future[DecodedSpan]:
        done = super().decode_span(span, place, keep, check, leaves)
        if place is not None:
            for k, got in enumerate(done.result().frames):
                if not isinstance(got, BaseException):
                    host = np.array(got)
                    place(k, DeviceBytes(Buf(host.ctypes.data, host.size), -1, 0))
        return done


@pytest.mark.parametrize("damaged", [False, True])
def test_frames_placed_where_decoded_reach_their_targets_once(
    packed: tuple[Path, Path], damaged: bool
) -> None:
    src, out = packed
    if damaged:
        offset, size, _ = _payload_offsets(out)
        data = bytearray(out.read_bytes())
        data[offset + size // 2] ^= 0x5A
        out.write_bytes(bytes(data))
    original = src.read_bytes()
    head = len(original) // 3
    # Two targets: a tensor and a host array, both placed from the engine.
    tensor = torch.zeros(len(original) - head, dtype=torch.uint8)
    host = np.zeros(head, np.uint8)
    sink = DeviceRanges([(0, host), (head, tensor)])
    puts: list[object] = []
    put = sink.put

    def counted(frame: object, data: np.ndarray) -> None:
        puts.append(frame)
        put(frame, data)  # type: ignore[arg-type]

    sink.put = counted  # type: ignore[method-assign]
    with open(out, "rb") as f, PlacingCpu(threads=4) as engine:
        if damaged:
            with pytest.raises(CorruptionError):
                restore(f, str(out), engine, sink)
            return
        restore(f, str(out), engine, sink)
    assert host.tobytes() + tensor.numpy().tobytes() == original
    assert puts and not sink._placed  # every placed frame was also put (and checked)


def test_load_decodes_straight_into_the_storages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = torch.arange(40_000, dtype=torch.float32)
    state = {
        "a": base[:100],
        "b": base[50:20_000].view(-1, 10),
        "c": torch.ones(5, dtype=torch.int64),
        "n": 3,
    }
    plain = tmp_path / "s.pt"
    torch.save(state, plain)
    ckptz.save(state, tmp_path / "s.pt.ckptz")
    import ckptz.library.loading as loading

    def whole_file(*_: object, **__: object) -> None:
        raise AssertionError("decoded the whole file instead of into the storages")

    monkeypatch.setattr(loading, "restore_to_memory", whole_file)
    got = ckptz.load(tmp_path / "s.pt.ckptz")
    want = torch.load(plain, weights_only=True)
    assert got.keys() == want.keys() and got["n"] == 3
    for k in ("a", "b", "c"):
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k])
        assert got[k].stride() == want[k].stride()
    # Views of one storage stay views of one storage.
    assert got["a"].untyped_storage().data_ptr() == got["b"].untyped_storage().data_ptr()
    assert got["b"].storage_offset() == 50


def test_load_of_a_legacy_pickle_decodes_the_whole_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = {"w": torch.randn(1000)}
    buf = io.BytesIO()
    torch.save(state, buf, _use_new_zipfile_serialization=False)
    (tmp_path / "old.pt").write_bytes(buf.getvalue())
    api.compress(tmp_path / "old.pt", tmp_path / "old.pt.ckptz", device="cpu")
    import ckptz.library.storages as storages

    def no_storages(*_: object, **__: object) -> None:
        raise AssertionError("a legacy file has no records to decode into")

    monkeypatch.setattr(storages, "DeviceRanges", no_storages)
    got = ckptz.load(tmp_path / "old.pt.ckptz")
    assert torch.equal(got["w"], state["w"])
    assert os.path.exists(tmp_path / "old.pt")


@pytest.mark.gpu
@pytest.mark.parametrize("codec", ["zstd", "ans"])
def test_gpu_load_decodes_on_the_gpu_into_the_storages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, codec: str
) -> None:
    from ckptz.engines import gpu_unavailable_reason, nvcomp_installed

    if not nvcomp_installed() or gpu_unavailable_reason() is not None:
        pytest.skip("no GPU engine here")
    gen = torch.Generator().manual_seed(5)
    state = {f"l{i}": torch.randn(1 << 20, generator=gen) * (i + 1) for i in range(12)}
    state["half"] = state["l0"].to(torch.bfloat16)
    state["l0_view"] = state["l0"][10:20]
    plain = tmp_path / "s.pt"
    torch.save(state, plain)
    api.compress(plain, tmp_path / "s.pt.ckptz", device="cuda" if codec == "ans" else "cpu", codec=codec)
    import ckptz.library.loading as loading
    import ckptz.library.storages as storages

    monkeypatch.setattr(loading, "restore_to_memory", None)  # never the whole-file path
    got = ckptz.load(tmp_path / "s.pt.ckptz", map_location="cuda:0")
    engine = storages._engines[0]
    assert engine.span_bytes > 0
    for k, v in torch.load(plain, weights_only=True).items():
        assert got[k].is_cuda and torch.equal(got[k].cpu(), v)
    assert got["l0_view"].untyped_storage().data_ptr() == got["l0"].untyped_storage().data_ptr()
    # A damaged payload is caught on this path too.
    offset, size, k = _payload_offsets(tmp_path / "s.pt.ckptz")
    data = bytearray((tmp_path / "s.pt.ckptz").read_bytes())
    data[offset + size // 2] ^= 1
    (tmp_path / "s.pt.ckptz").write_bytes(bytes(data))
    with pytest.raises(CorruptionError) as err:
        ckptz.load(tmp_path / "s.pt.ckptz", map_location="cuda:0")
    assert err.value.chunk == k


class _Shrunk:
    """The checkpoint's bytes, cut short after ``end`` (the file shrank while read)."""

    def __init__(self, path: Path, end: int) -> None:
        self.data, self.end = path.read_bytes(), end

    def readinto(self, views: list[memoryview], offset: int) -> int:
        done = 0
        for view in views:
            part = self.data[offset + done : min(offset + done + len(view), self.end)]
            view[: len(part)] = part
            done += len(part)
            if len(part) < len(view):
                break
        return done

    def read_at(self, offset: int, n: int) -> bytes:
        return self.data[offset : min(offset + n, self.end)]

    def host_regions(self) -> None:
        return None  # read through readinto, as a source whose bytes are elsewhere


@pytest.mark.parametrize("engine_type", [CpuEngine, SpanningCpu])
def test_a_file_cut_short_after_its_layout_is_refused(
    tmp_path: Path, engine_type: type[CpuEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reads of a real file (one native call per run where the extension is built) find
    it shorter than its layout said."""
    from ckptz.pipeline import compress as stage

    src = _checkpoint(tmp_path / "model.pt")
    planned = stage.plan_streams

    def plan_then_cut(*args: object, **kwargs: object) -> object:
        plan = planned(*args, **kwargs)  # type: ignore[arg-type]
        os.truncate(src, src.stat().st_size * 2 // 3)
        return plan

    monkeypatch.setattr(stage, "plan_streams", plan_then_cut)
    with (
        open(tmp_path / "out.ckptz", "wb") as f,
        engine_type(threads=2) as engine,
        pytest.raises(FormatError, match="changed or was truncated"),
    ):
        compress_file(src, "model.pt", f, engine)


@pytest.mark.parametrize("engine_type", [CpuEngine, SpanningCpu])
def test_a_file_that_shrinks_while_read_is_refused(tmp_path: Path, engine_type: type[CpuEngine]) -> None:
    src = _checkpoint(tmp_path / "model.pt")
    with (
        open(tmp_path / "out.ckptz", "wb") as f,
        engine_type(threads=2) as engine,
        pytest.raises(FormatError, match="changed or was truncated"),
    ):
        compress_file(src, "model.pt", f, engine, source=_Shrunk(src, src.stat().st_size * 2 // 3))


class _Watched(Future[DecodedSpan]):
    """A future that knows when someone waits on it through a callback."""

    def __init__(self) -> None:
        super().__init__()
        self.watched = threading.Event()

    def add_done_callback(self, fn: Callable[[Future[DecodedSpan]], object]) -> None:
        super().add_done_callback(fn)
        self.watched.set()


class LaterCpu(SpanningCpu):
    """A span engine that, like a GPU engine, hands back each run later, from a thread of
    its own (once the restore loop has asked to be called back: never already done when it
    looks), with the digest's leaves inside the run hashed where it decoded them."""

    hashes = True

    def __init__(self, threads: int) -> None:
        super().__init__(threads=threads)
        self._later = ThreadPoolExecutor(2, thread_name_prefix="later")

    def decode_span(
        self,
        span: StoredSpan,
        place: Place | None = None,
        keep: bool = False,
        check: bool = False,
        leaves: Ranges | None = None,
    ) -> Future[DecodedSpan]:
        out = _Watched()
        decoded = super().decode_span(span, place, keep, check, leaves)

        def hand_back() -> None:
            out.watched.wait(20)
            try:
                out.set_result(decoded.result())
            except BaseException as exc:
                out.set_exception(exc)

        self._later.submit(hand_back)
        return out

    def close(self) -> None:
        self._later.shutdown()
        super().close()


class TwoWritersMeet(FileSink):
    """A file sink that makes the first put of each thread for the frames at ``offsets`` (a
    run's) wait until a second thread puts one of them too: a run put by one thread alone
    fails the restore with a broken barrier."""

    def __init__(self, f: BinaryIO, offsets: set[int]) -> None:
        super().__init__(f)
        self.offsets, self.meet, self.seen = offsets, threading.Barrier(2, timeout=20), set[str]()
        self.lock = threading.Lock()

    def put(self, frame: Frame, data: np.ndarray) -> None:
        me = threading.current_thread().name
        with self.lock:
            wait = frame.pieces[0][0] in self.offsets and me not in self.seen and len(self.seen) < 2
            if wait:
                self.seen.add(me)
        if wait:
            self.meet.wait()
        super().put(frame, data)


def test_a_decoded_run_is_put_by_several_writers(
    packed: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run decoded later (a GPU's batch) is checked and put in shares of ``PUT_BYTES`` by
    as many writer tasks, byte-exact, with the leaves the engine hashed in the digest."""
    monkeypatch.setattr(restore_module, "PUT_BYTES", 128 << 10)  # two 64 KiB frames a share
    src, out = packed
    back = tmp_path / "back.pt"
    with open(out, "rb") as f, open(back, "wb") as file, LaterCpu(threads=4) as engine:
        index = read_index(f, str(out))
        decoder = FrameDecoder(f.fileno(), str(out), index, engine)
        run = next(r for r in decoder.spans(engine.span_bytes) if len(r) >= 6)
        file.truncate(index.source_size)
        sink = TwoWritersMeet(file, {decoder.frames[i].pieces[0][0] for i in run})
        restore(f, str(out), engine, sink, index=index)
    assert back.read_bytes() == src.read_bytes()
    assert len(sink.seen) >= 2 and all(name.startswith("ckptz-write") for name in sink.seen)


def test_a_damaged_frame_in_a_share_of_a_run_fails_the_restore(
    packed: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(restore_module, "PUT_BYTES", 128 << 10)
    _, out = packed
    offset, size, k = _payload_offsets(out)
    data = bytearray(out.read_bytes())
    data[offset + size // 2] ^= 0x5A
    out.write_bytes(bytes(data))
    with open(out, "rb") as f, LaterCpu(threads=4) as engine, pytest.raises(CorruptionError) as err:
        restore(f, str(out), engine, DiscardSink())
    assert err.value.chunk == k
