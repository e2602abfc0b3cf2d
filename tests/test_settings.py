"""One table of settings: every variable ckptz reads is in it, and each is read from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import ckptz

from ckptz import settings
from ckptz.errors import UsageError
from ckptz.settings import SETTINGS, overridden, value

PACKAGE = Path(settings.__file__).parent


def test_every_variable_in_the_package_is_in_the_table() -> None:
    """A ``CKPTZ_*`` name anywhere in the package's Python is a setting's variable, and the
    C extension reads no environment at all: the table is the whole list."""
    variables = {s.variable for s in SETTINGS}
    found = {
        (path.relative_to(PACKAGE).as_posix(), name)
        for path in PACKAGE.rglob("*.py")
        for name in re.findall(r"\bCKPTZ_[A-Z0-9_]+", path.read_text())
    }
    assert found, "the scan found no variable at all"
    assert {(where, name) for where, name in found if name not in variables} == set()
    assert not [p.name for p in (PACKAGE / "native_src").glob("*.[ch]") if "getenv" in p.read_text()]


def test_names_give_their_variables() -> None:
    assert len({s.name for s in SETTINGS}) == len(SETTINGS)
    for s in SETTINGS:
        assert s.variable == "CKPTZ_" + s.name.upper() and s.help.endswith(".")
        assert s.default is None or isinstance(s.default, s.kind)


def test_an_override_is_read_as_its_kind() -> None:
    assert value("progress_seconds", {}) == 10.0
    assert value("progress_seconds", {"CKPTZ_PROGRESS_SECONDS": " 2.5 "}) == 2.5
    assert value("progress_seconds", {"CKPTZ_PROGRESS_SECONDS": ""}) == 10.0  # empty: the default
    assert value("device", {"CKPTZ_DEVICE": "cpu"}) == "cpu"
    assert value("distributed", {}) is None
    assert value("distributed", {"CKPTZ_DISTRIBUTED": "0"}) is False
    assert value("distributed", {"CKPTZ_DISTRIBUTED": "1"}) is True
    assert value("debug", {"CKPTZ_DEBUG": "off"}) is False
    with pytest.raises(UsageError, match="CKPTZ_PEER_TIMEOUT='soon' is not a number"):
        value("peer_timeout", {"CKPTZ_PEER_TIMEOUT": "soon"})
    assert overridden({"CKPTZ_DEVICE": "cpu", "CKPTZ_TRACE": "", "OTHER": "1"}) == {"CKPTZ_DEVICE": "cpu"}


def test_the_cli_reads_overrides_and_refuses_a_bad_one(tmp_path: Path) -> None:
    src = tmp_path / "model.pt"
    src.write_bytes(b"not a checkpoint, copied as it is")
    done = ckptz("compress", str(src), "-o", str(tmp_path / "out/"), env={"CKPTZ_DEVICE": "tpu"})
    assert done.returncode == 2 and "unknown device 'tpu'" in done.stderr
    done = ckptz("compress", str(src), "-o", str(tmp_path / "out/"), env={"CKPTZ_PROGRESS_SECONDS": "often"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "ckptz: error: CKPTZ_PROGRESS_SECONDS='often' is not a number (unset CKPTZ_PROGRESS_SECONDS or give a number)"
    ]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
