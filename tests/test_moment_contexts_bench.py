"""bench/moment_contexts.py: ideal and coded bits of moments' signs and exponents per context."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import bench


def test_reports_every_component_and_row_prediction_pays_on_second_moments(tmp_path: Path) -> None:
    run = bench("moment_contexts.py", str(tmp_path / "run"), "--small", timeout=600)
    assert run.returncode == 0, run.stderr
    blocks = dict(
        re.findall(
            r"^(\S.*)\n  ideal bits/element: .*\n  coded exponent bits/element: (.*)$", run.stdout, re.M
        )
    )
    assert set(blocks) == {"weights fp32", "exp_avg", "exp_avg_sq", "ft exp_avg", "ft exp_avg_sq"}, run.stdout
    for name in ("exp_avg_sq", "ft exp_avg_sq"):
        coded = dict(re.findall(r"(\S+) ([\d.]+|-)", blocks[name]))
        assert float(coded["huff2d"]) < min(float(coded["huff1"]), float(coded["huffman"])), blocks[name]
    ideal = re.search(r"^exp_avg_sq\n  ideal bits/element: (.*)$", run.stdout, re.M)
    assert ideal is not None
    bits = dict(re.findall(r"(\S+) ([\d.]+)", ideal.group(1)))
    assert float(bits["exp|planar"]) < min(float(bits["exp|left"]), float(bits["exp"]))
    assert float(bits["sign"]) < 0.01  # second moments are never negative
