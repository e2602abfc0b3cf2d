"""The table of bitstreams (ckptz/codecs/table.py) and every copy of it outside Python.

The C extension's ``CODEC_*`` enum and docs/FORMAT.md's codec table name ids too; both are
held against the table here. (Each row's CPU codec runs the conformance cases in
test_codecs.py.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ckptz.codecs import BITSTREAMS, PORTABLE, codec_name, cpu_codec
from ckptz.codecs.table import BUILTIN, CHOOSABLE, TABLE, Bitstream, by_id, by_name
from ckptz.errors import CodecUnavailableError

ROOT = Path(__file__).resolve().parent.parent
#: The C extension's sources (module.c includes the others: setup.py builds one unit).
C_SOURCES = sorted((ROOT / "ckptz" / "native_src").glob("*.[ch]"))

_C_ENUM = re.compile(r"enum\s*\{([^}]*)\}")
_C_MEMBER = re.compile(r"\bCODEC_([A-Z0-9_]+)\s*=\s*(\d+)")
_FORMAT_ROW = re.compile(r"^\| (\d+) \| `([a-z0-9_-]+)` \| ([^|]+?) \|", re.MULTILINE)


def c_codec_ids() -> dict[str, int]:
    """``CODEC_<NAME> = <id>`` of every enum in the C sources, by lower-case name."""
    found: dict[str, int] = {}
    for path in C_SOURCES:
        for body in _C_ENUM.findall(path.read_text()):
            for name, value in _C_MEMBER.findall(body):
                assert name.lower() not in found, f"CODEC_{name} is defined twice"
                found[name.lower()] = int(value)
    return found


def format_rows() -> list[tuple[int, str, str]]:
    """``(id, name, decodes on)`` of each row of FORMAT.md's "Codec bitstreams" table."""
    text = (ROOT / "docs" / "FORMAT.md").read_text()
    section = text.split("## Codec bitstreams", 1)[1].split("\n## ", 1)[0]
    return [(int(i), name, where) for i, name, where in _FORMAT_ROW.findall(section)]


def test_ids_and_names_are_unique_bytes() -> None:
    assert len({b.id for b in TABLE}) == len(TABLE)
    assert len({b.name for b in TABLE}) == len(TABLE)
    assert all(0 <= b.id <= 255 for b in TABLE)
    assert [b.id for b in TABLE] == sorted(b.id for b in TABLE)


def test_each_codec_class_belongs_to_one_row() -> None:
    classes = [b.cpu for b in TABLE if b.cpu is not None]
    assert len(set(classes)) == len(classes)
    for row in TABLE:
        if row.cpu is not None:
            assert (row.cpu.id, row.cpu.name) == (row.id, row.name)


@pytest.mark.parametrize("row", TABLE, ids=lambda b: b.name)
def test_registry_follows_the_table(row: Bitstream) -> None:
    assert by_id(row.id) is row and by_name(row.name) is row
    assert BITSTREAMS[row.id] == codec_name(row.id) == row.name
    assert (row.id in PORTABLE) == row.portable
    if row.cpu is None:
        with pytest.raises(CodecUnavailableError):
            cpu_codec(row.id)
    else:
        assert type(cpu_codec(row.id)) is row.cpu


def test_unknown_ids_are_named_not_implemented() -> None:
    unused = next(i for i in range(256) if by_id(i) is None)
    assert codec_name(unused) == f"#{unused}"
    with pytest.raises(CodecUnavailableError):
        cpu_codec(unused)


def test_gpu_kinds() -> None:
    assert {b.name for b in TABLE if b.gpu == BUILTIN} == {"raw", "const"}
    assert {b.name: b.nvcomp for b in CHOOSABLE} == {"zstd": "Zstd", "ans": "ANS"}


def test_engines_derive_their_codec_lists() -> None:
    from ckptz.engines import CODECS_CPU, GPU_ONLY_CODECS
    from ckptz.engines.gpu import GPU_CODECS

    assert CODECS_CPU == ("auto", "zstd")
    assert GPU_ONLY_CODECS == ("ans",)
    assert GPU_CODECS == ("zstd", "ans")


def test_c_extension_ids_match_the_table() -> None:
    """The bitstreams the C frame decoder handles itself carry the table's ids."""
    ids = c_codec_ids()
    assert ids, f"no CODEC_* enum found in {[str(p) for p in C_SOURCES]}"
    for name, value in ids.items():
        row = by_name(name)
        assert row is not None, f"CODEC_{name.upper()} names no bitstream of the table"
        assert row.id == value, f"CODEC_{name.upper()} = {value}, the table says {row.id}"
        assert row.portable, f"the C extension decodes {name}, so a CPU must be able to"


def test_format_md_matches_the_table() -> None:
    rows = format_rows()
    assert [(i, name) for i, name, _ in rows] == [(b.id, b.name) for b in TABLE]
    for (_, _, where), row in zip(rows, TABLE, strict=True):
        if not row.portable:
            expected = "GPU only"
        elif row.gpu is None:
            expected = "CPU (GPU machines decode it on their CPU)"
        else:
            expected = "CPU, GPU"
        assert where == expected, f"FORMAT.md: {row.name} decodes on {where!r}, the table says {expected!r}"
