"""Builds ckptz's optional C extension (everything else is in pyproject.toml).

``ckptz._native`` holds the CPU coder's inner loops (ckptz/native_src/: one file per concern,
which module.c includes into one compilation unit). It is optional: where no C compiler is
found the install still succeeds and ckptz uses its numpy and zstd/deflate paths, which
read and write the same container format.
"""

from pathlib import Path

from setuptools import Extension, setup

#: Every file module.c includes: a change to any of them rebuilds the extension, and the
#: source distribution carries them.
NATIVE_SOURCES = sorted(p.as_posix() for p in Path("ckptz/native_src").glob("*.[ch]"))

setup(
    ext_modules=[
        Extension(
            "ckptz._native",
            ["ckptz/native_src/module.c"],
            depends=NATIVE_SOURCES,
            extra_compile_args=["-O3", "-std=c11"],
            libraries=["dl", "pthread"],
            optional=True,
        )
    ]
)
