"""ckptz's CUDA kernels compile, on a machine without a GPU.

NVRTC (the ``nvidia-cuda-nvrtc-cu12`` wheel of the ``dev`` extra, or torch's CUDA libraries)
compiles the very program the GPU engine compiles at first use, for every architecture ckptz
supports, so a kernel that does not compile fails here with NVRTC's log rather than on a
user's GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptz.engines.gpu import cuda_src, kernels

KERNEL_DIR = Path(cuda_src.__file__).parent


def _nvrtc() -> kernels.Nvrtc:
    try:
        return kernels.Nvrtc(kernels.nvrtc_path())
    except OSError as exc:
        pytest.fail(f"NVRTC is missing ({exc}): pip install -e '.[dev]' installs nvidia-cuda-nvrtc-cu12")


def test_every_kernel_file_is_part_of_the_program() -> None:
    on_disk = sorted(p.name for p in KERNEL_DIR.glob("*.cu"))
    assert on_disk == sorted(cuda_src.FILES)
    for name in cuda_src.FILES:
        assert cuda_src.read(name) in kernels.SOURCE


@pytest.mark.parametrize("arch", kernels.ARCHITECTURES)
def test_kernels_compile_with_nvrtc(arch: str) -> None:
    cubin, log = _nvrtc().build(kernels.SOURCE, arch)
    if cubin is None:
        pytest.fail(f"NVRTC could not compile ckptz's kernels for {arch}:\n{log}")
    for name in kernels.NAMES:  # every kernel the engine loads by name is in the image
        assert name.encode() + b"\0" in cubin, name
