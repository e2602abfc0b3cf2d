"""Every frozen container under fixtures/ still decodes to the bytes it was made from (series
containers through their frozen references)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ckptz import api
from ckptz.container import read_index

FIXTURES = Path(__file__).parent.parent / "fixtures"
CASES = [
    (version, name, expected)
    for version in sorted(p for p in FIXTURES.iterdir() if p.is_dir())
    for name, expected in json.loads((version / "manifest.json").read_text()).items()
]


def test_there_are_fixtures() -> None:
    assert len(CASES) >= 3


@pytest.mark.parametrize(("version", "name", "expected"), CASES, ids=[f"{v.name}/{n}" for v, n, _ in CASES])
def test_fixture_decodes(version: Path, name: str, expected: dict[str, object], tmp_path: Path) -> None:
    container = version / name
    with open(container, "rb") as f:
        assert read_index(f, name).source_size == expected["size"]
    restored = tmp_path / name.removesuffix(".ckptz")
    restored.parent.mkdir(parents=True, exist_ok=True)  # series fixtures keep their run's folders
    api.decompress(container, restored, device="cpu")
    assert hashlib.sha256(restored.read_bytes()).hexdigest() == expected["sha256"]
    assert api.verify(container, device="cpu").ok
