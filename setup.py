"""Builds ckptz's C extension (everything else is in pyproject.toml).

``ckptz._native`` holds the coders' inner loops (ckptz/native_src/: one file per concern,
which module.c includes into one compilation unit). ckptz needs it: where it cannot be built
the install fails with one line that says what to install.
"""

import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

#: Every file module.c includes: a change to any of them rebuilds the extension, and the
#: source distribution carries them.
NATIVE_SOURCES = sorted(p.as_posix() for p in Path("ckptz/native_src").glob("**/*.[ch]"))
#: zstd 1.5.7, the version the zstandard binding bundles (its zstd/zstd.c), built beside
#: module.c with its symbols kept inside the extension.
ZSTD_SOURCE = "ckptz/native_src/zstd/zstd.c"

#: What an install without a working C toolchain lacks (ckptz/codecs/native.py says it too).
BUILD_HINT = "ckptz needs a C compiler and Python headers: apt-get install build-essential python3-dev"


class BuildNative(build_ext):
    """build_ext that turns a compiler failure into one line naming what to install."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # CompileError, LinkError, a compiler that is not there
            sys.exit(f"error: {BUILD_HINT} (building {ext.name} failed: {type(exc).__name__})")


setup(
    cmdclass={"build_ext": BuildNative},
    ext_modules=[
        Extension(
            "ckptz._native",
            ["ckptz/native_src/module.c", ZSTD_SOURCE],
            depends=NATIVE_SOURCES,
            define_macros=[("ZSTDLIB_VISIBLE", ""), ("ZSTDERRORLIB_VISIBLE", ""), ("ZDICTLIB_VISIBLE", "")],
            extra_compile_args=["-O3", "-std=c11", "-fvisibility=hidden"],
            libraries=["dl", "pthread"],
            optional=False,
        )
    ],
)
