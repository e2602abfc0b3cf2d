"""``--device`` means what it says: the rule that picks a job's engine
(:func:`ckptz.engines.engine_kind`), held without a GPU. ``cuda[:N]`` codes every job on the
GPU in both directions; ``auto`` follows the one rule its ``--help`` states."""

from __future__ import annotations

import itertools

import pytest

from ckptz import settings
from ckptz.engines import GPU_ONLY_CODECS, PORTABLE_CODECS, engine_kind
from ckptz.engines.hybrid import GPU_JOIN_BYTES

#: Job sizes from empty to far past every size a rule could turn on.
SIZES = (0, 1, 1 << 20, (4 << 30) - 1, 4 << 30, GPU_JOIN_BYTES - 1, GPU_JOIN_BYTES, 1 << 40)
CODECS = (*PORTABLE_CODECS, *GPU_ONLY_CODECS)


@pytest.mark.parametrize("want", ["cuda", "cuda:0", "cuda:3"])
def test_a_gpu_named_codes_every_job_on_the_gpu(want: str) -> None:
    for codec, writes, job_bytes, nvcomp in itertools.product(CODECS, (True, False), SIZES, (True, False)):
        kind = engine_kind(want, codec, writes=writes, job_bytes=job_bytes, nvcomp=nvcomp)
        assert kind == "gpu", (codec, writes, job_bytes, nvcomp)


def test_cpu_never_opens_a_gpu() -> None:
    for codec, writes, job_bytes, nvcomp in itertools.product(CODECS, (True, False), SIZES, (True, False)):
        assert engine_kind("cpu", codec, writes=writes, job_bytes=job_bytes, nvcomp=nvcomp) == "cpu"


@pytest.mark.parametrize(
    ("codec", "writes", "job_bytes", "nvcomp", "kind"),
    [
        ("auto", True, 0, True, "hybrid"),  # the CPU threads, the GPU joining a long job
        ("auto", True, GPU_JOIN_BYTES - 1, True, "hybrid"),
        ("auto", True, GPU_JOIN_BYTES, True, "gpu"),  # a compression that large: the GPU writes it
        ("zstd", True, 1 << 40, True, "gpu"),
        ("auto", False, 1 << 40, True, "hybrid"),  # restores: the CPU threads, the GPU joining
        ("auto", True, 1 << 40, False, "cpu"),  # no nvCOMP: the CPU threads alone
        ("zstd", False, 0, False, "cpu"),
        ("ans", True, 0, True, "gpu"),  # a GPU-only codec uses the GPU
        ("ans", False, 0, False, "gpu"),  # ... or fails there, saying it needs one
    ],
)
def test_auto_follows_its_stated_rule(
    codec: str, writes: bool, job_bytes: int, nvcomp: bool, kind: str
) -> None:
    assert engine_kind("auto", codec, writes=writes, job_bytes=job_bytes, nvcomp=nvcomp) == kind


def test_no_environment_variable_moves_the_gpu_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job-size thresholds are constants: the variables that once moved them are no
    settings (``ckptz env`` would list them), and setting them changes no choice."""
    names = {s.variable for s in settings.SETTINGS}
    assert not names & {"CKPTZ_GPU_JOIN_BYTES", "CKPTZ_GPU_WRITE_BYTES"}
    assert len(settings.SETTINGS) <= 6
    from ckptz.engines.cpu import CpuEngine
    from ckptz.engines.hybrid import HybridEngine

    monkeypatch.setenv("CKPTZ_GPU_JOIN_BYTES", "0")
    monkeypatch.setenv("CKPTZ_GPU_WRITE_BYTES", "0")
    hybrid = HybridEngine(CpuEngine(1), lambda: CpuEngine(1), required=False)
    assert hybrid.join_after == GPU_JOIN_BYTES
    hybrid.close()
    assert engine_kind("auto", "auto", writes=True, job_bytes=1 << 20, nvcomp=True) == "hybrid"
