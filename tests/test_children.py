"""ckptz's own child processes run the parent's ckptz (:mod:`ckptz.children`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ckptz import children
from ckptz._version import __version__


def test_a_child_runs_the_parents_ckptz_not_one_in_its_working_directory(tmp_path: Path) -> None:
    planted = tmp_path / "ckptz"
    planted.mkdir()
    (planted / "__init__.py").write_text("")
    (planted / "__main__.py").write_text("print('planted')\n")
    done = subprocess.run(
        children.command("ckptz", "--version"),
        env=children.environment({"PYTHONPATH": str(tmp_path)}),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "planted" not in done.stdout and __version__ in done.stdout
