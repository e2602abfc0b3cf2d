"""``ckptz env``: the facts a bug report needs, as a table and as JSON."""

from __future__ import annotations

import json
import re

from conftest import ckptz


def test_env_json_reports_every_fact_for_a_bug_report() -> None:
    result = ckptz("env", "--json", env={"CKPTZ_PEER_TIMEOUT": "90"})
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    for key in ("ckptz", "python", "torch", "cuda", "nvcomp", "gpus", "native", "kernel_cache", "settings"):
        assert key in info, key
    import torch

    assert info["torch"]["version"] == str(torch.__version__)
    assert set(info["cuda"]) >= {"driver", "runtime"}
    assert isinstance(info["nvcomp"]["installed"], bool)
    assert isinstance(info["gpus"], list)
    assert set(info["native"]) >= {"built", "loaded", "avx2"}
    assert info["kernel_cache"].endswith("kernels")
    # The CLI tests run with CKPTZ_DEVICE=cpu; both overrides are reported with their values.
    assert info["settings"]["CKPTZ_DEVICE"] == "cpu"
    assert info["settings"]["CKPTZ_PEER_TIMEOUT"] == "90"


def test_env_prints_a_table() -> None:
    result = ckptz("env")
    assert result.returncode == 0, result.stderr
    for label in (
        "ckptz",
        "Python",
        "torch",
        "CUDA driver",
        "nvCOMP",
        "GPUs",
        "native extension",
        "kernel cache",
    ):
        assert re.search(rf"^\s*{label}\s{{2,}}\S", result.stdout, re.M), label
    assert "CKPTZ_DEVICE=cpu" in result.stdout
