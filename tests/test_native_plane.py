"""The native restore plane (ckptz/native_src/plane.c): byte-exact restores of every CPU
container, every check FORMAT.md promises with the Python loop's own messages, progress,
the stop flag, and hostile plans refused by its bounds checks."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import ckptz
from test_jobs import _start, _temps, _wait_for_temp
from test_native_compress import new_pages_of, small_tensors

from ckptz import api
from ckptz import load as ckptz_load
from ckptz.codecs.native import native
from ckptz.codecs.table import CTX, HUFF1
from ckptz.container import read_index
from ckptz.digest import Digest
from ckptz.engines.cpu import CpuEngine
from ckptz.errors import CorruptionError, MismatchError
from ckptz.pipeline import native_restore
from ckptz.pipeline.decoder import FrameDecoder
from ckptz.pipeline.restore import Comparer, DiscardSink, restore

pytestmark = pytest.mark.skipif(native is None, reason="the C extension is not built")

FIXTURES = Path(__file__).parent.parent / "fixtures"


@pytest.fixture
def native_calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each native restore's outcome (True: the file was restored by the native plane)."""
    calls: list[bool] = []
    real = native_restore.run

    def run(*args: Any, **kwargs: Any) -> Digest | None:
        digest = real(*args, **kwargs)
        calls.append(digest is not None)
        return digest

    monkeypatch.setattr(native_restore, "run", run)
    return calls


def _python_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Restore through the Python loop from here on (to hold the native plane against it)."""
    monkeypatch.setattr(native_restore, "plan", lambda decoder, gpu=False: None)


def _checkpoint(root: Path) -> dict[str, torch.Tensor]:
    """Tensors of every kind the CPU coder handles: floats (noise, bf16-exact, zeros), ints,
    bools, a tiled pattern (zstd with matches), a size that leaves short frames."""
    g = torch.Generator().manual_seed(5)
    pattern = torch.arange(251, dtype=torch.int32).repeat(800)
    return {
        "w32": torch.randn(300_001, generator=g) * 0.02,
        "w16": (torch.randn(200_003, generator=g) * 0.02).to(torch.bfloat16),
        "h16": torch.randn(70_001, generator=g).to(torch.float16),
        "exact": (torch.randn(100_000, generator=g)).to(torch.bfloat16).float(),
        "zeros": torch.zeros(50_000),
        "ids": torch.randint(0, 7, (90_001,), generator=g, dtype=torch.int64),
        "mask": torch.rand(33_333, generator=g) > 0.5,
        "bytes": torch.randint(0, 3, (77_777,), generator=g, dtype=torch.uint8),
        "tiled": pattern,
        "empty": torch.zeros(0),
    }


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("plane")
    tensors = _checkpoint(root)
    save_file(tensors, str(root / "model.safetensors"))
    torch.save(tensors, root / "model.pt")
    for name in ("model.safetensors", "model.pt"):
        assert ckptz("compress", str(root / name), "-q").returncode == 0
    return root


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", ["model.safetensors", "model.pt"])
def test_cli_restores_byte_exact(files: Path, tmp_path: Path, name: str) -> None:
    out = tmp_path / name
    done = ckptz("decompress", str(files / f"{name}.ckptz"), "-o", str(out), "--device", "cpu")
    assert done.returncode == 0, done.stderr
    assert _sha(out) == _sha(files / name)
    checked = ckptz("verify", str(files / f"{name}.ckptz"), "--device", "cpu")
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize("name", ["model.safetensors", "model.pt"])
def test_api_restores_natively(files: Path, tmp_path: Path, name: str, native_calls: list[bool]) -> None:
    out = tmp_path / name
    api.decompress(files / f"{name}.ckptz", out, device="cpu")
    assert _sha(out) == _sha(files / name)
    assert api.verify(files / f"{name}.ckptz", device="cpu").ok
    assert native_calls == [True, True]


def test_in_place_restore_reads_back_natively(files: Path, tmp_path: Path, native_calls: list[bool]) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "model.safetensors.ckptz").write_bytes((files / "model.safetensors.ckptz").read_bytes())
    api.decompress(work, in_place=True, device="cpu")
    assert _sha(work / "model.safetensors") == _sha(files / "model.safetensors")
    assert not (work / "model.safetensors.ckptz").exists() and _temps(work) == []
    assert native_calls == [True]


def test_compare_against_original_natively(files: Path, tmp_path: Path, native_calls: list[bool]) -> None:
    name = "model.safetensors"
    container = files / f"{name}.ckptz"
    with open(container, "rb") as c, open(files / name, "rb") as o:
        comparer = Comparer(o, name)
        restore(c, name, CpuEngine(2), comparer)
    changed = tmp_path / name
    data = bytearray((files / name).read_bytes())
    data[len(data) // 2] ^= 1
    changed.write_bytes(bytes(data))
    where = f"differs from the original at byte {len(data) // 2}"
    with open(container, "rb") as c, open(changed, "rb") as o, pytest.raises(MismatchError, match=where):
        restore(c, name, CpuEngine(2), Comparer(o, name))
    assert native_calls == [True]  # the second raised from inside the native restore


FIXTURE_CASES = [
    (version, name, expected)
    for version in sorted(p for p in FIXTURES.iterdir() if p.is_dir())
    for name, expected in json.loads((version / "manifest.json").read_text()).items()
]


@pytest.mark.parametrize(
    ("version", "name", "expected"), FIXTURE_CASES, ids=[f"{v.name}/{n}" for v, n, _ in FIXTURE_CASES]
)
def test_every_fixture_restores(
    version: Path, name: str, expected: dict[str, object], tmp_path: Path, native_calls: list[bool]
) -> None:
    out = tmp_path / name.removesuffix(".ckptz")
    api.decompress(version / name, out, device="cpu")
    assert _sha(out) == expected["sha256"]
    with open(version / name, "rb") as f:
        index = read_index(f, name)
        tables = native_restore.plan(FrameDecoder(f.fileno(), name, index, CpuEngine(1)))
    # The native plane restores every container it can plan: all but those of bitstreams it
    # lacks (ctx); deflate, xxh3_128 digests (in file order) and series deltas, too.
    assert native_calls == ([True] if tables is not None else [])
    lacks = {CTX.id} & set(index.chunks["codec"].tolist())
    assert (tables is None) == bool(lacks)
    assert tables is None or (tables.delta is not None) == ("reference" in index.header)


@pytest.fixture
def in_order_calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each restore in file order's outcome (True: by the native plane), windows of 64 KiB:
    many, and frames reaching across them."""
    calls: list[bool] = []
    real = native_restore.run_in_order

    def run(*args: Any, **kwargs: Any) -> Digest | None:
        digest = real(*args, **kwargs)
        calls.append(digest is not None)
        return digest

    monkeypatch.setattr(native_restore, "run_in_order", run)
    monkeypatch.setattr(native_restore, "WINDOW", 64 << 10)
    return calls


@pytest.mark.parametrize("name", ["model.safetensors", "model.pt"])
def test_a_stream_is_restored_natively_in_file_order(
    files: Path, name: str, in_order_calls: list[bool]
) -> None:
    pieces: list[bytes] = []
    with open(files / f"{name}.ckptz", "rb") as f:
        restore(f, name, CpuEngine(3), lambda piece: pieces.append(bytes(piece)))
    assert in_order_calls == [True]
    assert b"".join(pieces) == (files / name).read_bytes()


def test_cli_stdout_is_byte_exact(files: Path) -> None:
    import subprocess
    import sys

    from conftest import CLI_ENV

    got = subprocess.run(
        [sys.executable, "-m", "ckptz", "decompress", str(files / "model.pt.ckptz"), "-c", "-q"],
        capture_output=True,
        env=CLI_ENV,
        timeout=120,
        check=True,
    ).stdout
    assert got == (files / "model.pt").read_bytes()


@pytest.mark.parametrize("command", ["compress", "decompress"])
def test_a_stdout_reader_going_away_is_one_line_and_exit_1(files: Path, command: str) -> None:
    """`ckptz ... -c | head`: a write that the pipe takes only part of is not the end of it."""
    import subprocess
    import sys

    from conftest import CLI_ENV

    src = files / ("model.pt" if command == "compress" else "model.pt.ckptz")
    run = subprocess.Popen(
        [sys.executable, "-m", "ckptz", command, str(src), "-c", "-q", "--device", "cpu"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=CLI_ENV,
    )
    assert run.stdout is not None and run.stderr is not None
    time.sleep(2)  # the whole output is waiting to be written: more than the pipe holds
    assert len(run.stdout.read(100)) == 100
    run.stdout.close()
    assert run.wait(timeout=120) == 1
    assert (
        run.stderr.read().decode().strip() == "ckptz: error: stdout was closed before everything was written"
    )


def _sequential_container(files: Path, tmp_path: Path) -> Path:
    """model.pt coded with an xxh3_128 digest, as containers before the tree digest were."""
    from ckptz.digest import SEQUENTIAL
    from ckptz.pipeline.compress import compress_file

    out = tmp_path / "model.pt.ckptz"
    with open(out, "wb") as f:
        compress_file(files / "model.pt", "model.pt", f, CpuEngine(2), digest=SEQUENTIAL)
    return out


def test_xxh3_128_containers_restore_natively_to_every_sink(
    files: Path, tmp_path: Path, native_calls: list[bool], in_order_calls: list[bool]
) -> None:
    container = _sequential_container(files, tmp_path)
    original = (files / "model.pt").read_bytes()
    api.decompress(container, tmp_path / "back.pt", device="cpu")
    assert (tmp_path / "back.pt").read_bytes() == original
    with open(container, "rb") as c, open(files / "model.pt", "rb") as o:
        restore(c, "model.pt", CpuEngine(2), Comparer(o, "model.pt"))
    assert ckptz_load(container, weights_only=True).keys() == torch.load(files / "model.pt").keys()
    pieces: list[bytes] = []
    with open(container, "rb") as f:
        restore(f, "model.pt", CpuEngine(2), lambda piece: pieces.append(bytes(piece)))
    assert b"".join(pieces) == original
    assert all(native_calls) and all(in_order_calls) and len(in_order_calls) >= 3


def test_xxh3_128_digest_mismatch_and_differences_are_worded_as_before(
    files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_order_calls: list[bool]
) -> None:
    container = _sequential_container(files, tmp_path)
    changed = tmp_path / "changed.pt"
    data = bytearray((files / "model.pt").read_bytes())
    data[200_000] ^= 1
    changed.write_bytes(bytes(data))
    messages = []
    for _ in range(2):
        with open(container, "rb") as c, open(changed, "rb") as o, pytest.raises(MismatchError) as differs:
            restore(c, "model.pt", CpuEngine(2), Comparer(o, "model.pt"))
        with open(container, "rb") as f:
            index = read_index(f, "model.pt")
            index.header["source"]["xxh3_128"] = "0" * 32
            with pytest.raises(CorruptionError) as wrong:
                restore(f, "model.pt", CpuEngine(2), DiscardSink(), index=index)
        messages.append((str(differs.value), str(wrong.value)))
        _python_loop(monkeypatch)
    assert in_order_calls == [True]  # the comparison raised from inside it
    assert messages[0] == messages[1] and "at byte 200000" in messages[0][0]


def test_a_window_of_a_bitstream_the_plane_lacks_is_decoded_by_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_order_calls: list[bool]
) -> None:
    """Past the first window (bytes already given to a stream), frames the plane turns down
    (as a zstd frame with matches where libzstd is missing; here an older container's
    ``ctx`` exponents, let through) are decoded by Python, window by window."""
    from ckptz.codecs import frames
    from ckptz.codecs.ctx import CtxCodec
    from ckptz.pipeline import native_compress
    from ckptz.pipeline.compress import compress_file

    src = tmp_path / "model.pt"
    torch.save({"w": torch.randn(40_000, generator=torch.Generator().manual_seed(1)) * 0.02}, src)
    container = tmp_path / "model.pt.ckptz"
    with monkeypatch.context() as old_coder:  # exponents coded ctx, as older versions did
        old_coder.setattr(frames, "_HUFFMAN", CtxCodec())
        old_coder.setattr(native_compress, "suits", lambda *args, **kwargs: False)
        with open(container, "wb") as f:
            index = compress_file(src, "model.pt", f, CpuEngine(2)).index
    assert CTX.id in index.chunks["codec"] and index.chunks["codec"][0] != CTX.id
    monkeypatch.setattr(native_restore, "NATIVE_CODECS", native_restore.NATIVE_CODECS | {CTX.id})
    with open(container, "rb") as f:  # the first window ends where the ctx-coded bytes begin
        decoder = FrameDecoder(f.fileno(), "model.pt", index, CpuEngine(1))
        _, first, counts, _ = decoder.layout()
        coded = index.chunks["codec"]
        starts = [
            min(at for at, _, _ in frame.pieces)
            for frame, a, n in zip(decoder.frames, first, counts, strict=True)
            if CTX.id in coded[a : a + n]
        ]
    monkeypatch.setattr(native_restore, "WINDOW", min(starts))
    pieces: list[bytes] = []
    with open(container, "rb") as f:
        restore(f, "model.pt", CpuEngine(2), lambda piece: pieces.append(bytes(piece)))
    assert b"".join(pieces) == src.read_bytes()
    assert in_order_calls == [True]


def test_order1_and_level_10_restore_natively(tmp_path: Path, native_calls: list[bool]) -> None:
    # Adam's second moments with a scale per row: where huff1 is chosen (from --level 10).
    rng = np.random.default_rng(3)
    scales = np.exp(rng.uniform(-14, -4, 4096)).astype(np.float32)
    moments = np.abs(rng.standard_normal(4096 * 128)).astype(np.float32) * np.repeat(scales, 128)
    state = {
        "state": {0: {"exp_avg_sq": torch.from_numpy(moments), "step": torch.tensor(3.0)}},
        "param_groups": [{"lr": 1e-3, "params": [0]}],
    }
    src = tmp_path / "optimizer.pt"
    torch.save(state, src)
    api.compress(src, device="cpu", level=10)
    with open(tmp_path / "optimizer.pt.ckptz", "rb") as f:
        assert HUFF1.id in read_index(f, "o").chunks["codec"].tolist()
    out = tmp_path / "back.pt"
    api.decompress(tmp_path / "optimizer.pt.ckptz", out, device="cpu")
    assert out.read_bytes() == src.read_bytes()
    assert native_calls == [True]


@pytest.mark.parametrize("threads", [1, 2])
def test_leaves_across_pieces_are_checked_without_a_copy_of_the_file(
    tmp_path: Path, threads: int, native_calls: list[bool]
) -> None:
    """A restore hashes the digest's leaves that straddle tensors and frames from the
    decoded frames as they come in file order, not from a copy of each leaf (a fresh page
    for every 4 KiB of such a file)."""
    from ckptz.pipeline.compress import compress_file

    src = small_tensors(tmp_path)
    engine = CpuEngine(2)
    engine.frame_size = engine.largest_frame = 64 << 10  # leaves straddle frames too
    with open(tmp_path / "small.ckptz", "wb") as f:
        compress_file(src, src.name, f, engine)
    pages = src.stat().st_size // 4096
    container = tmp_path / "small.ckptz"
    assert new_pages_of(
        lambda: api.decompress(container, None, discard=True, device="cpu", threads=threads)
    ) < (pages // 4)
    assert native_calls and all(native_calls)


# ---------------------------------------------------------------- corruption, same messages


def _restore_error(
    container: Path, name: str, monkeypatch: pytest.MonkeyPatch, edit: Callable[[Any], Any]
) -> str:
    """The error restoring ``container`` with its index edited by ``edit``, by the native
    plane and then by the Python loop: both must raise the same error."""
    messages = []
    for python in (False, True):
        if python:
            _python_loop(monkeypatch)
        with open(container, "rb") as c:
            index = edit(read_index(c, name))
            with pytest.raises(CorruptionError) as caught:
                restore(c, name, CpuEngine(2), DiscardSink(), index=index)
        messages.append(str(caught.value))
    monkeypatch.undo()
    assert messages[0] == messages[1]
    return messages[0]


def _flipped(files: Path, tmp_path: Path, at: Callable[[Any], int]) -> Path:
    src = files / "model.safetensors.ckptz"
    dst = tmp_path / "model.safetensors.ckptz"
    data = bytearray(src.read_bytes())
    with open(src, "rb") as f:
        where = at(read_index(f, "m"))
    data[where] ^= 0x10
    dst.write_bytes(bytes(data))
    return dst


def test_flipped_payload_byte(files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def middle_of_largest(index: Any) -> int:
        c = index.chunks[int(np.argmax(index.chunks["size"]))]
        return int(c["offset"]) + int(c["size"]) // 2

    bad = _flipped(files, tmp_path, middle_of_largest)
    message = _restore_error(bad, "model.safetensors", monkeypatch, lambda i: i)
    assert "stored" in message and "at offset" in message and "fail their checksum" in message
    done = ckptz("decompress", str(bad), "-o", str(tmp_path / "out.safetensors"), "--device", "cpu")
    assert done.returncode != 0 and "fail their checksum" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out.safetensors").exists() and _temps(tmp_path) == []


def test_nonzero_padding(files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def padding(index: Any) -> int:
        padded = [c for c in index.chunks if int(c["size"]) % 16]
        return int(padded[0]["offset"]) + int(padded[0]["size"])

    bad = _flipped(files, tmp_path, padding)
    assert "padding after a chunk is not zero" in _restore_error(bad, "m", monkeypatch, lambda i: i)


def test_flipped_frame_checksum(files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def flip(index: Any) -> Any:
        frames = index.frames.copy()
        frames["checksum"][len(frames) // 2] ^= 1
        return replace(index, frames=frames)

    message = _restore_error(files / "model.safetensors.ckptz", "m", monkeypatch, flip)
    assert "decoded bytes" in message and "offset" in message and "fail their checksum" in message


def test_digest_mismatch(files: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def wrong(index: Any) -> Any:
        d = index.source_digest
        other = Digest(d.kind, ("0" if d.hex[0] != "0" else "1") + d.hex[1:])
        return replace(
            index, header={**index.header, "source": {**index.header["source"], **other.to_json()}}
        )

    message = _restore_error(files / "model.safetensors.ckptz", "m", monkeypatch, wrong)
    assert "does not match the original's digest" in message


def test_truncated_container(files: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = files / "model.safetensors.ckptz"
    with open(src, "rb") as f:
        index = read_index(f, "m")
    cut = tmp_path / "cut.ckptz"
    cut.write_bytes(src.read_bytes()[: int(index.chunks["offset"].max()) + 1])
    messages = []
    for python in (False, True):
        if python:
            _python_loop(monkeypatch)
        with open(cut, "rb") as c, pytest.raises(CorruptionError) as caught:
            restore(c, "m", CpuEngine(2), DiscardSink(), index=index)
        messages.append(str(caught.value))
    assert messages[0] == messages[1] and "truncated" in messages[0]


# ---------------------------------------------------------------- progress and stopping


def test_progress_reaches_the_total(files: Path) -> None:
    seen: list[int] = []
    with open(files / "model.pt.ckptz", "rb") as c:
        index = restore(c, "m", CpuEngine(2), DiscardSink(), progress=seen.append)
    assert sum(seen) == index.source_size and all(n >= 0 for n in seen)


def _tables(files: Path) -> tuple[Any, Any, native_restore.Plan]:
    f = open(files / "model.safetensors.ckptz", "rb")  # noqa: SIM115 - closed by the caller
    index = read_index(f, "m")
    tables = native_restore.plan(FrameDecoder(f.fileno(), "m", index, CpuEngine(1)))
    assert tables is not None
    return f, index, tables


def _call(
    f: Any, index: Any, tables: native_restore.Plan, stop: int = 0
) -> tuple[int, np.ndarray, np.ndarray]:
    assert native is not None
    counter, error = np.zeros(1, np.int64), np.zeros(3, np.int64)
    leaf = index.source_digest.kind.leaf
    hashes = np.zeros(-(-index.source_size // leaf), "<u8")
    kind = native.restore_plan(
        f.fileno(), -1, -1, np.empty(0, np.uint8), tables.frames, tables.chunks, tables.pieces, index.source_size, leaf,
        hashes, 2, counter, np.full(1, stop, np.uint8), error,
    )  # fmt: skip
    return kind, counter, error


def test_stop_flag_ends_the_call_before_any_frame(files: Path) -> None:
    f, index, tables = _tables(files)
    with f:
        assert _call(f, index, tables)[:2][0] == 0
        kind, counter, _ = _call(f, index, tables, stop=1)
    assert kind == 9 and counter[0] == 0


def test_sigint_stops_a_native_restore(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    work = tmp_path / "run"
    work.mkdir()
    rng = np.random.default_rng(1)
    save_file(
        {"w": (rng.standard_normal(24_000_000) * 0.02).astype(np.float32)}, str(work / "big.safetensors")
    )
    original = _sha(work / "big.safetensors")
    assert ckptz("compress", str(work), "--in-place", "-q").returncode == 0
    before = {p.name: _sha(p) for p in work.iterdir()}
    proc = _start("decompress", str(work / "big.safetensors.ckptz"), "-o", str(work / "out.safetensors"))
    assert _wait_for_temp(work, proc), "the restore ended before it was in flight"
    time.sleep(0.05)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 2.0
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert _temps(work) == []
    # The signal may land after the file was complete and renamed: then it is whole.
    out = work / "out.safetensors"
    assert not out.exists() or _sha(out) == original
    assert {p.name: _sha(p) for p in work.iterdir() if p != out} == before


# ---------------------------------------------------------------- hostile plans


def _hostile(files: Path, edit: Callable[[native_restore.Plan], None]) -> None:
    f, index, tables = _tables(files)
    copy = native_restore.Plan(tables.frames.copy(), tables.chunks.copy(), tables.pieces.copy())
    edit(copy)
    with f, pytest.raises(ValueError, match="restore plan rejected"):
        _call(f, index, copy)


@pytest.mark.parametrize(
    "edit",
    [
        lambda p: p.pieces.__setitem__((0, 0), 1 << 50),  # a write past the file's end
        lambda p: p.pieces.__setitem__((0, 1), p.frames[0, 3]),  # a piece past its frame
        lambda p: p.pieces.__setitem__((0, 0), -1),
        lambda p: p.frames.__setitem__((0, 0), len(p.chunks)),  # chunks past the table
        lambda p: p.frames.__setitem__((0, 5), len(p.pieces)),  # pieces past the table
        lambda p: p.frames.__setitem__((0, 1), 3),  # no such word size
        lambda p: p.chunks.__setitem__((0, 1), -5),
    ],
    ids=["past-file", "past-frame", "negative-at", "chunks", "pieces", "word", "size"],
)
def test_hostile_plan_is_rejected(files: Path, edit: Callable[[native_restore.Plan], None]) -> None:
    _hostile(files, edit)


def test_chunk_past_the_container_is_truncation(files: Path) -> None:
    f, index, tables = _tables(files)
    tables.chunks[:, 0] += os.fstat(f.fileno()).st_size
    with f:
        kind = _call(f, index, tables)[0]
    assert kind == 1  # truncated: the Python loop words it


def test_whole_file_into_memory_natively(files: Path, native_calls: list[bool]) -> None:
    from ckptz.pipeline.whole import restore_to_memory

    with open(files / "model.pt.ckptz", "rb") as c:
        data = restore_to_memory(c, "model.pt")
    assert data.tobytes() == (files / "model.pt").read_bytes()
    assert native_calls == [True]
    loaded = ckptz_load(files / "model.pt.ckptz", weights_only=True)
    assert all(
        torch.equal(loaded[k], v) for k, v in torch.load(files / "model.pt", weights_only=True).items()
    )


def test_memory_of_another_size_is_rejected(files: Path) -> None:
    f, index, tables = _tables(files)
    assert native is not None
    with f, pytest.raises(ValueError, match="memory must hold the whole file"):
        native.restore_plan(
            f.fileno(), -1, -1, np.empty(index.source_size - 1, np.uint8), tables.frames, tables.chunks,
            tables.pieces, index.source_size, index.source_digest.kind.leaf,
            np.zeros(-(-index.source_size // index.source_digest.kind.leaf), "<u8"), 1, np.zeros(1, np.int64),
            np.zeros(1, np.uint8), np.zeros(3, np.int64),
        )  # fmt: skip


def test_a_container_declaring_countless_leaves_is_left_to_the_bounded_loop(files: Path) -> None:
    """A header may declare a huge file cut into tiny digest leaves: the native plane, which
    holds every leaf's hash at once, leaves such a container to the loop that hashes as it goes."""
    from ckptz.pipeline import native_restore

    with open(files / "model.safetensors.ckptz", "rb") as f:
        index = read_index(f, "m")
    assert native_restore.suits(index)
    source = index.header["source"]
    tiny = {"xxh3_tree": {**source["xxh3_tree"], "leaf": 4096}}
    huge = replace(index, header={**index.header, "source": {**source, **tiny, "size": 1 << 40}})
    assert huge.source_size == 1 << 40
    assert not native_restore.suits(huge)
