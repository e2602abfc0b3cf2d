"""Every file of the edge-case corpus restores with the same sha256, and no input is touched."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import sha256, tree_digests
from corpus import make_corpus

from ckptz import api
from ckptz.container import read_index


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_corpus(tmp_path_factory.mktemp("corpus"))


def test_every_corpus_file_round_trips(corpus: dict[str, Path], tmp_path: Path) -> None:
    assert len(corpus) >= 20
    for name, path in corpus.items():
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for src in files:
            before = sha256(src)
            out = tmp_path / name / (src.name + ".ckptz")
            api.compress(src, out, device="cpu", threads=2)
            assert sha256(src) == before, f"{src} was modified"
            restored = tmp_path / name / src.name
            api.decompress(out, restored, device="cpu")
            assert sha256(restored) == before, f"{name}: {src.name} did not round-trip"
            with open(out, "rb") as f:
                assert read_index(f, str(out)).source_size == src.stat().st_size


def test_folder_round_trip_with_verify(corpus: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "all"
    for name, path in corpus.items():
        if path.is_dir():
            shutil.copytree(path, root / name, symlinks=True)
        else:
            (root / name).mkdir(parents=True)
            shutil.copy2(path, root / name / path.name)
    before = tree_digests(root)
    summary = api.compress(root, tmp_path / "all.ckptz", threads=2)
    assert summary.files and summary.ratio is not None and summary.ratio > 1
    assert api.verify(tmp_path / "all.ckptz", root).ok
    api.decompress(tmp_path / "all.ckptz", tmp_path / "back")
    assert tree_digests(tmp_path / "back") == before == tree_digests(root)


def test_malicious_pickle_never_runs(corpus: dict[str, Path], tmp_path: Path) -> None:
    evil = [p for name, p in corpus.items() if "malicious" in name or "evil" in name]
    assert evil, "the corpus must hold a pickle whose __reduce__ would run code"
    for path in evil:
        markers = {p.name for p in path.parent.iterdir()}
        api.inspect(path)
        api.compress(path, tmp_path / (path.name + ".ckptz"))
        api.decompress(tmp_path / (path.name + ".ckptz"), tmp_path / path.name)
        assert sha256(tmp_path / path.name) == sha256(path)
        assert {p.name for p in path.parent.iterdir()} == markers
        assert not list(tmp_path.rglob("*PWNED*")) and not list(Path.cwd().glob("*PWNED*"))


@pytest.mark.slow
def test_zip64_file_over_4_gib(tmp_path: Path) -> None:
    """A > 4 GiB torch.save file (ZIP64 records, 24-byte data descriptors) round-trips."""
    if shutil.disk_usage(tmp_path).free < 16 * 2**30:
        pytest.skip("needs 16 GiB of free disk for the > 4 GiB file, its container and its copy")
    import torch

    big = torch.zeros(2**32 + 4096, dtype=torch.uint8)
    big[:: 2**20] = torch.arange(big[:: 2**20].numel()).to(torch.uint8)
    src = tmp_path / "big.pt"
    torch.save({"big": big, "after": torch.arange(1000, dtype=torch.float32)}, src)
    del big
    before = sha256(src)
    summary = api.compress(src, tmp_path / "big.pt.ckptz", threads=2)
    assert summary.files[0].format == "torch-zip"
    assert {c.name for c in summary.components} >= {"other", "metadata"} or summary.components
    src_size = src.stat().st_size
    api.decompress(tmp_path / "big.pt.ckptz", tmp_path / "back.pt")
    assert (tmp_path / "back.pt").stat().st_size == src_size
    assert sha256(tmp_path / "back.pt") == before


def test_a_failing_file_stops_a_folder_cleanly(
    small_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files run several at once: one failing leaves no temp file and no partial container,
    and every container that was finished is whole."""
    from ckptz import safeio
    from ckptz.errors import FormatError

    real = api.compress_file

    def flaky(src: Path, relpath: str, out: Any, engine: Any, **kw: Any) -> Any:
        if relpath.endswith("optimizer.pt"):
            out.write(b"some bytes reached the temp file")
            raise FormatError("file changed or was truncated while being read", path=relpath)
        return real(src, relpath, out, engine, **kw)

    monkeypatch.setattr(api, "compress_file", flaky)
    before = tree_digests(small_checkpoint)
    with pytest.raises(FormatError):
        api.compress(small_checkpoint, tmp_path / "out", device="cpu")
    out = tmp_path / "out"
    assert tree_digests(small_checkpoint) == before
    assert not [p for p in out.rglob("*") if safeio.is_temp(p)]
    assert not (out / "optimizer.pt.ckptz").exists()
    for container in out.rglob("*.ckptz"):
        assert api.verify(container, small_checkpoint / container.name.removesuffix(".ckptz")).ok


def test_corpus_tree_round_trips_and_verifies(corpus: dict[str, Path], tmp_path: Path) -> None:
    """The whole edge-case corpus as one tree: compress, verify against it, restore."""
    name, path = next(iter(corpus.items()))
    root = Path(str(path).removesuffix(name).rstrip("/"))
    before = tree_digests(root)
    api.compress(root, tmp_path / "all.ckptz", device="cpu")
    result = api.verify(tmp_path / "all.ckptz", root, device="cpu")
    assert result.ok, [f for f in result.files if not f.ok]
    api.decompress(tmp_path / "all.ckptz", tmp_path / "back", device="cpu")
    assert tree_digests(tmp_path / "back") == before
