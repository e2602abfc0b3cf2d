"""What ckptz runs on, for a bug report (``ckptz env``), and the one table of its settings.

:data:`ckptz.settings.SETTINGS` lists every environment variable ckptz reads;
``docs/configuration.md`` is written from it and ``ckptz env`` reports which are set. Probing
never fails: whatever cannot be found (torch, a CUDA driver, nvCOMP, a GPU) is reported as
absent. torch is imported only here, when asked, never by ``ckptz --help``.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.metadata
import importlib.util
import os
import platform
import sys
from typing import Any

from ckptz._version import __version__
from ckptz.cache import cache_folder
from ckptz.settings import overridden


def _distribution_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _torch() -> dict[str, Any]:
    if importlib.util.find_spec("torch") is None:
        return {"version": None, "cuda": None}
    try:
        import torch
    except Exception as exc:  # a broken install is worth reporting, not raising
        return {"version": None, "cuda": None, "error": f"{type(exc).__name__}: {exc}"}
    return {"version": str(torch.__version__), "cuda": torch.version.cuda}


def _driver() -> tuple[str | None, list[dict[str, Any]], str | None]:
    """The CUDA driver's version, the GPUs it sees, and why there are none (or None)."""
    from ckptz import cuda

    try:
        number = cuda.driver_version()
    except (OSError, AttributeError):
        return None, [], "no CUDA driver (libcuda.so.1) on this machine"
    except cuda.DriverError as exc:
        return None, [], str(exc)
    version = f"{number // 1000}.{number % 1000 // 10}"
    try:
        gpus = []
        for index in range(cuda.device_count()):
            major, minor = cuda.capability(index)
            gpus.append({"index": index, "name": cuda.device_name(index), "capability": f"{major}.{minor}"})
    except (OSError, cuda.DriverError) as exc:
        return version, [], str(exc)
    return version, gpus, None


def _nvrtc_version() -> str | None:
    """NVRTC's version (the CUDA runtime the GPU kernels are compiled with), or None."""
    found = []
    for root in sys.path:
        found += glob.glob(os.path.join(root, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.*"))
    for path in [*sorted(found), "libnvrtc.so"]:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        major, minor = ctypes.c_int(), ctypes.c_int()
        if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) == 0:
            return f"{major.value}.{minor.value}"
    return None


def _native() -> dict[str, Any]:
    """Whether the C extension is built and loaded, and the instruction sets it uses."""
    built = importlib.util.find_spec("ckptz._native") is not None
    try:
        from ckptz.codecs.native import native as loaded
    except ImportError:
        loaded = None  # type: ignore[assignment]
    x86_linux = platform.machine() in ("x86_64", "AMD64") and sys.platform.startswith("linux")
    return {
        "built": built,
        "loaded": loaded is not None,
        "baseline": "SSE2" if x86_linux else platform.machine(),
        "avx2": bool(getattr(loaded, "avx2", 0)),
        "runtime_dispatch": ["AVX2", "BMI2"] if x86_linux else [],
    }


def describe() -> dict[str, Any]:
    """Everything a bug report needs about this installation, as plain JSON-ready data."""
    from ckptz.devices import nvcomp_installed

    driver, gpus, no_gpu = _driver()
    torch = _torch()
    nvcomp = nvcomp_installed()
    return {
        "ckptz": __version__,
        "ckptz_path": os.path.dirname(os.path.abspath(__file__)),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch,
        "cuda": {"driver": driver, "runtime": _nvrtc_version() or torch.get("cuda"), "problem": no_gpu},
        "gpus": gpus,
        "nvcomp": {
            "installed": nvcomp,
            "version": _distribution_version("nvidia-libnvcomp-cu12", "nvidia-nvcomp-cu12")
            if nvcomp
            else None,
        },
        "native": _native(),
        "kernel_cache": cache_folder("kernels"),
        "settings": overridden(),
    }


__all__ = ["describe"]
