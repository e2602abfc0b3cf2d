"""docs/FORMAT.md is enough to read ckptz's containers: its conformance vectors, and every
frozen fixture, decode through tests/format_reader.py (written from FORMAT.md alone) to the
bytes and digests their manifests give, and ckptz agrees."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from format_reader import Container, FormatViolation, read

from ckptz import api

FIXTURES = Path(__file__).parent.parent / "fixtures"
VECTORS = FIXTURES / "conformance"
MANIFEST = json.loads((VECTORS / "manifest.json").read_text())


def _self_contained(path: Path) -> bool:
    """Whether a frozen container restores alone: a series delta needs its reference, which
    the spec reader (one container in, its bytes out) is not given."""
    from ckptz.container import read_index

    with path.open("rb") as f:
        return "reference" not in read_index(f, str(path)).header


def _read(name: str) -> Container:
    """A vector decoded by the spec reader, given its reference's original where it names one."""
    ref = MANIFEST[name].get("reference")
    return read((VECTORS / name).read_bytes(), (VECTORS / ref).read_bytes() if ref else None)


FROZEN = [
    (version / name, expected)
    for version in sorted(p for p in FIXTURES.iterdir() if p.is_dir() and p != VECTORS)
    for name, expected in json.loads((version / "manifest.json").read_text()).items()
    if _self_contained(version / name)
]


def test_the_vectors_cover_every_bitstream_a_cpu_decodes() -> None:
    from ckptz.codecs.table import TABLE

    used = set()
    for name in MANIFEST:
        container = _read(name)
        used |= {int(c) for c in container.header["codecs"]}
    assert used == {b.id for b in TABLE if b.portable}


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_vector_decodes_to_its_bytes(name: str, tmp_path: Path) -> None:
    expected = MANIFEST[name]
    container = _read(name)
    original = (VECTORS / name.removesuffix(".ckptz")).read_bytes()
    assert container.data == original
    assert hashlib.sha256(container.data).hexdigest() == expected["sha256"]
    assert len(container.data) == expected["size"]
    restored = tmp_path / "restored"
    api.decompress(VECTORS / name, restored, device="cpu")
    assert restored.read_bytes() == original


@pytest.mark.parametrize(("path", "expected"), FROZEN, ids=[f"{p.parent.name}/{p.name}" for p, _ in FROZEN])
def test_frozen_fixture_reads_from_the_spec_alone(path: Path, expected: dict[str, object]) -> None:
    container = read(path.read_bytes())
    assert hashlib.sha256(container.data).hexdigest() == expected["sha256"]


def test_a_flipped_payload_bit_violates_the_format() -> None:
    blob = bytearray((VECTORS / "mixed.bin.ckptz").read_bytes())
    blob[40] ^= 0x10
    with pytest.raises(FormatViolation):
        read(bytes(blob))


def test_the_vectors_cover_every_series_delta_kind() -> None:
    from ckptz.series.kinds import SCALED_SIGN_MAGNITUDE

    kinds = set()
    for name in MANIFEST:
        pairs = _read(name).header.get("reference", {}).get("pairs", [])
        kinds |= {p[2] if len(p) > 2 else 0 for p in pairs}
    assert kinds == set(range(SCALED_SIGN_MAGNITUDE + 1))


def test_a_delta_read_against_another_reference_violates_the_format() -> None:
    blob = (VECTORS / "scaled.bin.ckptz").read_bytes()
    other = bytearray((VECTORS / "scaled-ref.bin").read_bytes())
    other[100] ^= 1
    with pytest.raises(FormatViolation, match="reference digest"):
        read(blob, bytes(other))
    with pytest.raises(FormatViolation, match="needs its reference"):
        read(blob)
