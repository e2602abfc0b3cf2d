"""The native compress plane (ckptz/native_src/compress_plane.c): containers byte for byte
those of the Python pipeline on every kind of input, verify in the plane, progress, the stop
flag, Ctrl-C, read and write failures worded as the pipeline words them, and hostile plans
refused by its bounds checks."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np
import pytest
import torch
from conftest import ckptz
from test_cli import second_moments_of_a_short_training_run
from test_jobs import _start, _temps, _wait_for_temp
from test_sign2d import first_moments_of_a_short_training_run

from ckptz import api
from ckptz.codecs import frames as coder
from ckptz.codecs.native import native
from ckptz.codecs.table import HUFF1, HUFF2D, SIGN2D
from ckptz.container import read_index
from ckptz.digest import TREE
from ckptz.engines.cpu import CpuEngine
from ckptz.engines.hybrid import HybridEngine
from ckptz.errors import DeviceError, FormatError
from ckptz.formats import read_layout
from ckptz.pipeline import native_compress, native_restore
from ckptz.pipeline.compress import compress_file
from ckptz.pipeline.plan import frame_map, plan_streams
from ckptz.pipeline.restore import restore

pytestmark = pytest.mark.skipif(native is None, reason="the C extension is not built")


@pytest.fixture
def native_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files the native plane coded (by relative path), in order."""
    calls: list[str] = []
    real = native_compress.code

    def code(fd: int, out: int, relpath: str, *args: Any, **kwargs: Any) -> native_compress.Coded:
        calls.append(relpath)
        return real(fd, out, relpath, *args, **kwargs)

    monkeypatch.setattr(native_compress, "code", code)
    return calls


def _checkpoint() -> dict[str, torch.Tensor]:
    """Tensors of every kind the CPU coder handles: float noise (raw mantissas, Huffman
    exponents), bf16-exact fp32 (bitpacked signs), zero rows (exponents tried with LZ zstd
    too), ints, bools, bytes, a tiled pattern (zstd with matches), short and empty tensors."""
    g = torch.Generator().manual_seed(57)
    sparse = torch.randn(400, 250, generator=g) * 0.02
    sparse[torch.rand(400, generator=g) < 0.4] = 0
    return {
        "w32": torch.randn(300_001, generator=g) * 0.02,
        "w16": (torch.randn(200_003, generator=g) * 0.02).to(torch.bfloat16),
        "h16": torch.randn(70_001, generator=g).to(torch.float16),
        "exact": torch.randn(100_000, generator=g).to(torch.bfloat16).float(),
        "sparse": sparse,
        "zeros": torch.zeros(50_000),
        "ids": torch.randint(0, 7, (90_001,), generator=g, dtype=torch.int64),
        "mask": torch.rand(33_333, generator=g) > 0.5,
        "bytes": torch.randint(0, 3, (77_777,), generator=g, dtype=torch.uint8),
        "tiled": torch.arange(251, dtype=torch.int32).repeat(800),
        "f64": torch.randn(20_001, generator=g, dtype=torch.float64),
        "short": torch.ones(3),
        "empty": torch.zeros(0),
    }


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("sources")
    tensors = _checkpoint()
    save_file(tensors, str(root / "model.safetensors"))
    torch.save(tensors, root / "model.pt")
    g = torch.Generator().manual_seed(3)
    # Many small segments: frames of several pieces, digest leaves across many frames.
    many = {f"layer{i}.{k}": torch.randn(1000 + 37 * i, generator=g) for i in range(60) for k in ("w", "b")}
    torch.save(many, root / "many.pt")
    (root / "tiny.bin").write_bytes(b"ckptz!!")
    (root / "empty.bin").write_bytes(b"")
    return root


NAMES = ["model.safetensors", "model.pt", "many.pt", "tiny.bin", "empty.bin"]


def _engine(threads: int, frame: int | None) -> CpuEngine:
    engine = CpuEngine(threads)
    if frame is not None:  # small frames: many per stream, and leaves straddling them
        engine.frame_size = engine.largest_frame = frame
    return engine


def _compress(src: Path, out: Path, engine: CpuEngine, verify: bool = False) -> bytes:
    with open(out, "wb+") as f:
        compress_file(src, src.name, f, engine, verify=verify)
    return out.read_bytes()


@pytest.fixture
def python_pipeline(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], None]]:
    """Call it to send every file through the Python pipeline from there on."""
    yield lambda: monkeypatch.setattr(native_compress, "suits", lambda *args, **kwargs: False)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("threads", "frame"), [(1, None), (3, None), (3, 64 << 10), (2, 4096)])
def test_containers_are_the_python_pipelines(
    sources: Path,
    tmp_path: Path,
    name: str,
    threads: int,
    frame: int | None,
    native_calls: list[str],
    python_pipeline: Callable[[], None],
) -> None:
    src = sources / name
    natively = _compress(src, tmp_path / "native.ckptz", _engine(threads, frame))
    assert native_calls == [name]
    python_pipeline()
    assert natively == _compress(src, tmp_path / "python.ckptz", _engine(threads, frame))
    out = tmp_path / "back"
    api.decompress(tmp_path / "native.ckptz", out, device="cpu")
    assert out.read_bytes() == src.read_bytes()


def test_the_plane_chooses_by_the_coders_own_thresholds(
    sources: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, python_pipeline: Callable[[], None]
) -> None:
    """frames.py's thresholds are the plane's: moved there, both paths move together."""
    src = sources / "model.safetensors"
    before = _compress(src, tmp_path / "before.ckptz", _engine(2, 4096))
    monkeypatch.setattr(coder, "ZSTD_ZEROS", 0.5)  # exponents with zero rows: Huffman only
    rules = native_compress.RULES.copy()
    rules[3] = coder.ZSTD_ZEROS
    monkeypatch.setattr(native_compress, "RULES", rules)
    natively = _compress(src, tmp_path / "native.ckptz", _engine(2, 4096))
    assert natively != before
    python_pipeline()
    assert natively == _compress(src, tmp_path / "python.ckptz", _engine(2, 4096))


@pytest.mark.parametrize("name", ["model.safetensors", "many.pt"])
def test_verify_runs_in_the_plane(
    sources: Path, tmp_path: Path, name: str, native_calls: list[str], python_pipeline: Callable[[], None]
) -> None:
    src = sources / name
    natively = _compress(src, tmp_path / "native.ckptz", _engine(2, 64 << 10), verify=True)
    assert native_calls == [name]
    python_pipeline()
    assert natively == _compress(src, tmp_path / "python.ckptz", _engine(2, 64 << 10), verify=True)


def test_in_place_compression_runs_natively(sources: Path, tmp_path: Path, native_calls: list[str]) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "model.pt").write_bytes((sources / "model.pt").read_bytes())
    api.compress(work, in_place=True, device="cpu")
    assert native_calls == ["model.pt"] and _temps(work) == []
    api.decompress(work, in_place=True, device="cpu")
    assert (work / "model.pt").read_bytes() == (sources / "model.pt").read_bytes()


@pytest.mark.skipif(not os.access("/dev/shm", os.W_OK), reason="no writable /dev/shm")
def test_in_place_on_tmpfs_keeps_the_data_area(sources: Path, native_calls: list[str]) -> None:
    """On tmpfs the output is written through mappings (ckptz.mapped), which keep their own
    record of the file's size: the index written after the plane must not cut its payloads."""
    import shutil
    import tempfile

    work = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        for name in ("model.pt", "many.pt"):
            shutil.copy(sources / name, work / name)
        api.compress(work, in_place=True, device="cpu")
        assert sorted(native_calls) == ["many.pt", "model.pt"]
        api.decompress(work, in_place=True, device="cpu")
        for name in ("model.pt", "many.pt"):
            assert (work / name).read_bytes() == (sources / name).read_bytes()
    finally:
        shutil.rmtree(work)


def _moments(rows: int, seed: int) -> torch.Tensor:
    """Adam's second moments: rows of one scale each, where order-1 exponents pay."""
    rng = np.random.default_rng(seed)
    scales = np.exp(rng.uniform(-14, -4, rows)).astype(np.float32)
    return torch.from_numpy(
        np.abs(rng.standard_normal(rows * 128)).astype(np.float32) * np.repeat(scales, 128)
    )


@pytest.mark.parametrize(
    ("level", "frame"), [(3, None), (3, 64 << 10), (10, None), (10, 64 << 10), (19, None)]
)
def test_order1_exponents_are_coded_natively_as_the_python_pipeline_codes_them(
    tmp_path: Path,
    level: int,
    frame: int | None,
    native_calls: list[str],
    python_pipeline: Callable[[], None],
) -> None:
    state = {
        i: {"exp_avg_sq": _moments(1500 + 300 * i, i), "exp_avg": torch.randn(4000) * 1e-3} for i in range(3)
    }
    src = tmp_path / "optimizer.pt"
    torch.save({"state": state, "param_groups": [{"params": [0, 1, 2]}]}, src)

    def engine() -> CpuEngine:
        made = CpuEngine(2, level=level)
        if frame is not None:
            made.frame_size = made.largest_frame = frame
        return made

    natively = _compress(src, tmp_path / "native.ckptz", engine(), verify=True)
    assert native_calls == ["optimizer.pt"]
    with open(tmp_path / "native.ckptz", "rb") as f:
        # The default level's sparse estimate leaves 16 KiB exponent planes (64 KiB frames),
        # whose buckets' own costs weigh more, to Huffman coding; larger ones take huff1.
        assert (HUFF1.id in read_index(f, "optimizer.pt").chunks["codec"]) == (level >= 10 or frame is None)
    python_pipeline()
    assert natively == _compress(src, tmp_path / "python.ckptz", engine(), verify=True)
    api.decompress(tmp_path / "native.ckptz", tmp_path / "back.pt", device="cpu")
    assert (tmp_path / "back.pt").read_bytes() == src.read_bytes()


def _row_patterned_mantissas() -> torch.Tensor:
    """fp32 whose third plane (an exponent bit and the mantissa's top bits) repeats along
    rows: zstd's matches code it far below any order-0 or order-1 coder."""
    rng = np.random.default_rng(0)
    rows = 4000
    top = rng.integers(0, 128, rows)[:, None] | rng.integers(0, 3, (rows, 256))
    words = (rng.integers(100, 102, rows)[:, None] << 23) | (top << 16)
    return torch.from_numpy(words.astype(np.uint32).view(np.float32).reshape(-1))


@pytest.mark.parametrize("case", ["plain names", "row patterns"])
def test_order1_choice_by_measured_size_is_the_python_pipelines(
    tmp_path: Path, case: str, native_calls: list[str], python_pipeline: Callable[[], None]
) -> None:
    """At level 19 every float stream's exponents try context coding, whatever its keys:
    real second moments under parameter names take it (row-predicted, huff2d: their
    exponents are a row term plus a column term), and the plane keeps it to exponent planes
    as the Python coder does (a mantissa plane that zstd codes smaller stays zstd)."""
    from safetensors.torch import save_file

    if case == "plain names":
        tensors = second_moments_of_a_short_training_run()
    else:
        tensors = {"optimizer.state.0.exp_avg_sq": _row_patterned_mantissas()}
    src = tmp_path / "state.safetensors"
    save_file(tensors, str(src))
    natively = _compress(src, tmp_path / "native.ckptz", CpuEngine(2, level=19), verify=True)
    assert native_calls == ["state.safetensors"]
    with open(tmp_path / "native.ckptz", "rb") as f:
        chunks = read_index(f, "state.safetensors").chunks
    exponents = chunks["codec"][chunks["plane"] == 3]
    assert (HUFF2D.id in exponents) == (case == "plain names")
    assert HUFF1.id not in exponents or case == "plain names"
    assert not {HUFF1.id, HUFF2D.id} & set(chunks["codec"][chunks["plane"] != 3].tolist())
    python_pipeline()
    assert natively == _compress(src, tmp_path / "python.ckptz", CpuEngine(2, level=19), verify=True)
    api.decompress(tmp_path / "native.ckptz", tmp_path / "back.safetensors", device="cpu")
    assert (tmp_path / "back.safetensors").read_bytes() == src.read_bytes()


@pytest.mark.parametrize(("level", "frame"), [(3, None), (19, None), (19, 64 << 10)])
def test_row_predicted_signs_are_coded_natively_as_the_python_pipeline_codes_them(
    tmp_path: Path,
    level: int,
    frame: int | None,
    native_calls: list[str],
    python_pipeline: Callable[[], None],
) -> None:
    """At the default level as at level 19, real first moments whose embedding rows see no
    tokens code their lowest planes sign2d, natively byte for byte as the Python coder does
    (verified in the plane), on large frames and on small ones where fewer rows fit."""
    from safetensors.torch import save_file

    src = tmp_path / "moments.safetensors"
    save_file(first_moments_of_a_short_training_run(), str(src))

    def engine() -> CpuEngine:
        made = CpuEngine(2, level=level)
        if frame is not None:
            made.frame_size = made.largest_frame = frame
        return made

    natively = _compress(src, tmp_path / "native.ckptz", engine(), verify=True)
    assert native_calls == [src.name]
    with open(tmp_path / "native.ckptz", "rb") as f:
        chunks = read_index(f, src.name).chunks
    assert SIGN2D.id in chunks["codec"][chunks["plane"] == 0]
    assert SIGN2D.id not in chunks["codec"][chunks["plane"] != 0]
    python_pipeline()
    assert natively == _compress(src, tmp_path / "python.ckptz", engine(), verify=True)
    api.decompress(tmp_path / "native.ckptz", tmp_path / "back.safetensors", device="cpu")
    assert (tmp_path / "back.safetensors").read_bytes() == src.read_bytes()


class _Appender:
    """A file object without a descriptor, written in order (as a caller's stream is)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes | memoryview) -> int:
        self.data += data
        return len(data)


def _to_pipe(src: Path, engine: CpuEngine) -> bytes:
    """What compressing ``src`` into a pipe writes there."""
    read, write = os.pipe()
    got: list[bytes] = []
    drain = threading.Thread(target=lambda: got.append(b"".join(iter(lambda: os.read(read, 1 << 16), b""))))
    drain.start()
    try:
        with open(write, "wb") as f:
            compress_file(src, src.name, f, engine)
    finally:
        drain.join()
        os.close(read)
    return got[0]


@pytest.mark.parametrize("name", ["model.safetensors", "many.pt", "empty.bin"])
def test_pipes_and_streams_are_written_natively_in_order(
    sources: Path, tmp_path: Path, name: str, native_calls: list[str], python_pipeline: Callable[[], None]
) -> None:
    src = sources / name
    piped = _to_pipe(src, _engine(3, 64 << 10))
    stream = _Appender()
    compress_file(src, src.name, cast(BinaryIO, stream), _engine(3, 64 << 10), verify=True)
    assert native_calls == [name, name]
    python_pipeline()
    expected = _compress(src, tmp_path / "python.ckptz", _engine(3, 64 << 10))
    assert piped == expected and bytes(stream.data) == expected
    assert _to_pipe(src, _engine(3, 64 << 10)) == expected


def test_a_stream_whose_write_fails_raises_its_error(sources: Path, native_calls: list[str]) -> None:
    class Full(_Appender):
        def write(self, data: bytes | memoryview) -> int:
            if len(self.data) > 100_000:
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().write(data)

    with pytest.raises(OSError) as raised:
        compress_file(sources / "model.pt", "model.pt", cast(BinaryIO, Full()), _engine(2, 64 << 10))
    assert raised.value.errno == errno.ENOSPC and native_calls == ["model.pt"]


def _but_the_time(container: bytes, scratch: Path) -> tuple[bytes, dict[str, Any], list[list[Any]]]:
    """A container's data area, header and tables, less the new file's time that its
    header records (two saves a moment apart differ there)."""
    start = container.index(b"CKPTZ", 5) if container.startswith(b"before") else 0
    scratch.write_bytes(container[start:])
    with open(scratch, "rb") as f:
        index = read_index(f, "saved")
    index.header["source"].pop("mtime_ns", None)
    end = int((index.chunks["offset"] + index.chunks["size"]).max(initial=0))
    tables = [t.tolist() for t in (index.segments, index.frames, index.chunks)]
    return container[: start + end], index.header, tables


@pytest.mark.parametrize("to", ["path", "stream"])
def test_saving_in_memory_state_is_coded_natively_from_memory(
    tmp_path: Path, to: str, native_calls: list[str], python_pipeline: Callable[[], None]
) -> None:
    import ckptz

    state = _checkpoint()

    def save(folder: str) -> bytes:
        if to == "path":  # the same name: torch.save names the archive inside after it
            (tmp_path / folder).mkdir()
            ckptz.save(state, tmp_path / folder / "model.pt.ckptz", device="cpu", verify=True)
            return (tmp_path / folder / "model.pt.ckptz").read_bytes()
        stream = io.BytesIO()
        stream.write(b"before")  # written from where the stream stands
        ckptz.save(state, stream, device="cpu")
        return stream.getvalue()

    natively = save("native")
    assert native_calls == ["model.pt" if to == "path" else "<stream>"]
    python_pipeline()
    scratch = tmp_path / "scratch.ckptz"
    assert _but_the_time(natively, scratch) == _but_the_time(save("python"), scratch)
    back = ckptz.load(io.BytesIO(natively[6:] if to == "stream" else natively), weights_only=True)
    assert all(torch.equal(back[k], v) for k, v in state.items())


def test_progress_reaches_the_total(sources: Path, tmp_path: Path) -> None:
    seen: list[int] = []
    with open(tmp_path / "c.ckptz", "wb") as f:
        written = compress_file(sources / "many.pt", "many.pt", f, _engine(2, 4096), progress=seen.append)
    assert sum(seen) == written.layout.size and all(n >= 0 for n in seen)


def new_pages_of(call: Callable[[], object]) -> int:
    """Pages this process faulted in while ``call`` ran (every thread's), after a first
    call that gave the coders' buffers from the allocator."""
    import resource

    call()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    call()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def small_tensors(root: Path) -> Path:
    """A torch.save file of 750 tensors of 32 KB: each digest leaf holds zip headers (all in
    the first frame) and parts of several tensors."""
    g = torch.Generator().manual_seed(5)
    torch.save({f"t{i}": torch.randn(8000, generator=g) for i in range(750)}, root / "small.pt")
    return root / "small.pt"


@pytest.mark.parametrize("threads", [1, 2])
def test_leaves_across_pieces_are_hashed_without_a_copy_of_the_file(tmp_path: Path, threads: int) -> None:
    """The digest's leaves that straddle tensors and frames are hashed from the frames' own
    bytes as they come in file order: the plane once copied each into memory of its own,
    a fresh page for every 4 KiB of such a file, which cost more than coding it."""
    src = small_tensors(tmp_path)
    pages = src.stat().st_size // 4096
    assert new_pages_of(lambda: compress_file(src, src.name, None, _engine(threads, 64 << 10))) < pages // 4


# ---------------------------------------------------------------- failures


def _code(src: Path, out: int, size: int | None = None, fd: int | None = None) -> native_compress.Coded:
    """The plane's coding of ``src`` (its frames planned as if it were ``size`` bytes)."""
    engine = CpuEngine(2)
    layout = read_layout(src, src.name)
    own = os.open(src, os.O_RDONLY)
    try:
        plan = plan_streams(layout, engine.frame_size, own, frozenset(), engine.largest_frame)
        segments = [(sid, seg.length) for seg, sid in zip(layout.segments, plan.segment_streams, strict=True)]
        if size is not None:
            segments[-1] = (segments[-1][0], segments[-1][1] + size - layout.size)
        frames = frame_map(segments, [s.frame_size for s in plan.streams])
        total = layout.size if size is None else size
        return native_compress.code(
            own if fd is None else fd,
            out,
            src.name,
            frames,
            plan.streams,
            total,
            TREE,
            engine,
            lambda n: None,
        )
    finally:
        os.close(own)


def test_a_file_cut_short_while_read_is_a_format_error(sources: Path) -> None:
    with pytest.raises(FormatError, match="changed or was truncated while being read"):
        _code(sources / "model.pt", -1, size=(sources / "model.pt").stat().st_size + 100_000)


def test_a_read_error_is_an_os_error(sources: Path, tmp_path: Path) -> None:
    folder = os.open(tmp_path, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as caught:
            _code(sources / "model.pt", -1, fd=folder)
    finally:
        os.close(folder)
    assert caught.value.errno == errno.EISDIR


def test_a_full_device_is_enospc(sources: Path) -> None:
    """/dev/full answers every write with ENOSPC, as a full file system does."""
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        with pytest.raises(OSError) as caught:
            _code(sources / "model.pt", full)
    finally:
        os.close(full)
    assert caught.value.errno == errno.ENOSPC


def test_an_output_not_open_for_writing_fails_cleanly(sources: Path, tmp_path: Path) -> None:
    (tmp_path / "ro").write_bytes(b"")
    ro = os.open(tmp_path / "ro", os.O_RDONLY)
    try:
        with pytest.raises(OSError) as caught:
            _code(sources / "model.pt", ro)
    finally:
        os.close(ro)
    assert caught.value.errno == errno.EBADF


def _tables(src: Path) -> tuple[native_compress.Plan, int]:
    engine = CpuEngine(1)
    layout = read_layout(src, src.name)
    fd = os.open(src, os.O_RDONLY)
    try:
        plan = plan_streams(layout, engine.frame_size, fd, frozenset(), engine.largest_frame)
    finally:
        os.close(fd)
    segments = [(sid, seg.length) for seg, sid in zip(layout.segments, plan.segment_streams, strict=True)]
    frames = frame_map(segments, [s.frame_size for s in plan.streams])
    return native_compress.plan(frames, plan.streams, engine), layout.size


def _call(
    src: Path, tables: native_compress.Plan, size: int, stop: int = 0, memory: np.ndarray | None = None
) -> tuple[int, np.ndarray]:
    counter, error = np.zeros(1, np.int64), np.zeros(3, np.int64)
    hashes = np.zeros(-(-size // TREE.leaf), "<u8")
    fd = os.open(src, os.O_RDONLY) if memory is None else -1
    try:
        kind = native.compress_plan(
            fd, np.zeros((0, 3), np.int64) if memory is None else memory, -1, False, False, -1, 16, tables.frames, tables.chunks, tables.pieces, size, TREE.leaf, hashes, 3,
            native_compress.RULES, 2, counter, np.full(1, stop, np.uint8), error,
        )  # fmt: skip
    finally:
        if fd >= 0:
            os.close(fd)
    return kind, counter


def test_stop_flag_ends_the_call_before_any_frame(sources: Path) -> None:
    tables, size = _tables(sources / "model.pt")
    assert _call(sources / "model.pt", tables, size)[0] == 0
    kind, counter = _call(sources / "model.pt", tables, size, stop=1)
    assert kind == 9 and counter[0] == 0


@pytest.mark.parametrize(
    "edit",
    [
        lambda p: p.pieces.__setitem__((0, 0), 1 << 50),  # a read past the file's end
        lambda p: p.pieces.__setitem__((0, 1), p.frames[0, 3]),  # a piece past its frame
        lambda p: p.pieces.__setitem__((0, 2), 1),  # pieces that do not tile the frame
        lambda p: p.frames.__setitem__((0, 0), 5),  # chunks out of order
        lambda p: p.frames.__setitem__((0, 5), len(p.pieces)),  # pieces past the table
        lambda p: p.frames.__setitem__((0, 1), 3),  # no such word size
    ],
    ids=["past-file", "past-frame", "untiled", "chunks", "pieces", "word"],
)
def test_hostile_plan_is_rejected(sources: Path, edit: Callable[[native_compress.Plan], None]) -> None:
    tables, size = _tables(sources / "model.pt")
    copy = native_compress.Plan(tables.frames.copy(), tables.pieces.copy(), tables.chunks.copy())
    edit(copy)
    with pytest.raises(ValueError, match="compress plan rejected"):
        _call(sources / "model.pt", copy, size)


def test_memory_regions_are_read_where_they_tile_the_file(sources: Path) -> None:
    """The plane reads memory only through regions that tile the file from its start."""
    tables, size = _tables(sources / "model.pt")
    data = np.frombuffer((sources / "model.pt").read_bytes(), np.uint8)
    half = size // 2
    regions = native_compress.memory_table([(0, data[:half]), (half, data[half:])])
    assert _call(sources / "model.pt", tables, size, memory=regions)[0] == 0
    for wrong in ([(0, data[:half])], [(0, data[:half]), (half + 1, data[half + 1 :])], [(1, data[1:])]):
        with pytest.raises(ValueError, match="memory regions do not tile the file"):
            _call(sources / "model.pt", tables, size, memory=native_compress.memory_table(wrong))


def test_sigint_stops_a_native_compression(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    work = tmp_path / "run"
    work.mkdir()
    rng = np.random.default_rng(1)
    # Large enough that one thread is still coding it when the signal lands.
    save_file(
        {"w": (rng.standard_normal(40_000_000) * 0.02).astype(np.float32)}, str(work / "big.safetensors")
    )
    original = hashlib.sha256((work / "big.safetensors").read_bytes()).hexdigest()
    proc = _start("compress", str(work / "big.safetensors"), "-o", str(work / "big.ckptz"), "-T", "1")
    assert _wait_for_temp(work, proc), "the compression ended before it was in flight"
    time.sleep(0.05)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 2.0
    assert proc.returncode == 130, err
    assert "Traceback" not in err and _temps(work) == []
    assert hashlib.sha256((work / "big.safetensors").read_bytes()).hexdigest() == original
    out = work / "big.ckptz"  # the signal may land after the container was complete
    if out.exists():
        with open(out, "rb") as f:
            assert read_index(f, "big").source_size == (work / "big.safetensors").stat().st_size


def test_a_signal_as_the_command_ends_never_kills_it_by_the_signal(tmp_path: Path) -> None:
    """Ctrl-C landing while a finished compression exits ends it as stopped (130) or as done
    (0), never by the signal itself (CPython puts the default handlers back as it exits)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(2)
    src = tmp_path / "m.safetensors"
    save_file({"w": (rng.standard_normal(2_000_000) * 0.02).astype(np.float32)}, str(src))
    codes = []
    for delay in np.linspace(0.0, 0.3, 10):
        out = tmp_path / "m.ckptz"
        out.unlink(missing_ok=True)
        proc = _start("compress", str(src), "-o", str(out), "-T", "1", "-q")
        assert _wait_for_temp(tmp_path, proc) or proc.poll() is not None
        time.sleep(float(delay))
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert "Traceback" not in err
        codes.append(proc.returncode)
    assert set(codes) <= {0, 130}, codes


def test_a_hybrid_engine_codes_each_file_natively_until_its_gpu_joins(
    sources: Path, tmp_path: Path, native_calls: list[str], python_pipeline: Callable[[], None]
) -> None:
    """``--device auto`` on a machine with nvCOMP opens a hybrid engine: until its GPU joins,
    whole files go through the native planes both ways, and count towards the GPU joining."""
    started: list[bool] = []

    def start_gpu() -> CpuEngine:
        started.append(True)
        raise DeviceError("no GPU in this test")

    hybrid = HybridEngine(CpuEngine(2), start_gpu, required=False)
    src = sources / "model.pt"
    with open(tmp_path / "hybrid.ckptz", "wb+") as f:
        compress_file(src, src.name, f, hybrid)
    assert native_calls == ["model.pt"] and not started
    restored: list[str] = []
    real_run = native_restore.run

    def run(fd: int, path: str, *args: Any, **kwargs: Any) -> Any:
        restored.append(path)
        return real_run(fd, path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(native_restore, "run", run)
        with open(tmp_path / "hybrid.ckptz", "rb") as container, open(tmp_path / "back", "wb") as out:
            restore(container, "hybrid.ckptz", hybrid, out.write)
    assert restored == ["hybrid.ckptz"]
    assert (tmp_path / "back").read_bytes() == src.read_bytes()
    python_pipeline()
    assert (tmp_path / "hybrid.ckptz").read_bytes() == _compress(src, tmp_path / "python.ckptz", CpuEngine(2))
    hybrid.join_after = 1  # a long job: the next file's bytes bring the GPU up
    with open(tmp_path / "again.ckptz", "wb+") as f:
        compress_file(src, src.name, f, hybrid)
    hybrid.wait_for_gpu(5)
    assert started == [True]


def test_verify_decodes_back_a_short_frame_before_a_long_one(tmp_path: Path) -> None:
    """`compress --level 19 --verify` on one thread, where the first context-coded frame is a
    short one (a small tensor's stream) and a longer one follows: the plane's decode-back
    scratch fits the longest frame, so the run finishes and restores byte for byte (it once
    sized that scratch by the first such frame and corrupted the heap: the process aborted)."""
    from safetensors.torch import save_file

    moments = second_moments_of_a_short_training_run()
    small = next(t for t in moments.values() if 20_000 < t.numel() < 60_000)
    large = torch.cat([t.reshape(-1) for t in moments.values()])[: 1 << 20]
    src = tmp_path / "state.safetensors"
    save_file({"a.weight": small.contiguous(), "z.state.0.exp_avg_sq": large.contiguous()}, str(src))
    out = tmp_path / "state.ckptz"
    done = ckptz(
        "compress", str(src), "-o", str(out), "--level", "19", "--verify", "-T", "1", "--device", "cpu"
    )
    assert done.returncode == 0, done.stderr
    with open(out, "rb") as f:
        chunks = read_index(f, src.name).chunks
    contextual = chunks[np.isin(chunks["codec"], [HUFF1.id, HUFF2D.id])]
    assert contextual["raw_size"].tolist() == sorted(contextual["raw_size"].tolist())  # short first
    assert len(contextual) == 2
    back = tmp_path / "back.safetensors"
    assert ckptz("decompress", str(out), "-o", str(back), "--device", "cpu").returncode == 0
    assert back.read_bytes() == src.read_bytes()
