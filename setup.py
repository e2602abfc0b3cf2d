"""Builds ckptz's optional C extension (everything else is in pyproject.toml).

``ckptz._native`` holds the CPU coder's inner loops (see ckptz/_native.c). It is optional:
where no C compiler is found the install still succeeds and ckptz uses its numpy and
zstd/deflate paths, which read and write the same container format.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ckptz._native",
            ["ckptz/_native.c"],
            extra_compile_args=["-O3", "-std=c11"],
            optional=True,
        )
    ]
)
