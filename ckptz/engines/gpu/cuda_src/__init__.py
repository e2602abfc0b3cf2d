"""ckptz's CUDA kernels as ``.cu`` files, shipped with the package and compiled by NVRTC at
first use (:mod:`ckptz.engines.gpu.kernels`).

* ``planes.cu``: split, merge and gather;
* ``xxh3.cu``: xxh3_64 of device memory (:mod:`ckptz.engines.gpu.hash_source`);
* ``literals.cu``: the portable zstd literal blocks and bitpack (:mod:`ckptz.engines.gpu.literals`).
"""

from __future__ import annotations

from importlib import resources

#: Every kernel file, in the order the GPU engine's one program concatenates them.
FILES = ("planes.cu", "xxh3.cu", "literals.cu")


def read(name: str) -> str:
    """The source text of the kernel file ``name`` (one of :data:`FILES`)."""
    return resources.files(__name__).joinpath(name).read_text(encoding="utf-8")


__all__ = ["FILES", "read"]
