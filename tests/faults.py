"""Real write faults for the fault tests, met by every writer of a process alike (Python's
own writes and the native plane's threads): a file system that is really full, and a disk
that lies about what it wrote.

- :func:`on_small_tmpfs` runs a Python script with a tmpfs of a chosen size mounted in a
  private user and mount namespace (``unshare -rm``): a full disk there is the kernel's own
  ``ENOSPC``. :func:`leave_free` fills it up to a number of free bytes.
- :func:`lying_disk` builds a small library that, preloaded (``LD_PRELOAD``), changes what
  one ``pwrite``/``pwritev`` under a folder puts on disk: its middle byte flipped, nothing
  written at all, or a byte written past the end of the file as well.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CLI_ENV, REPO

_MOUNT = r"""
set -u
mount -t tmpfs -o size="$1" ckptz-test "$2" || exit 77
shift
exec "$PY" -c "$SCRIPT" "$@"
"""


def on_small_tmpfs(
    script: str, size: int, mount: Path, *args: str, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``python -c script MOUNT ARGS...`` with a ``size``-byte tmpfs mounted at ``mount``
    (an empty folder) for it alone; the tree under test and ``tests/`` are importable. Skips
    the test where this machine lets no private tmpfs be mounted."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    env = {
        **CLI_ENV,
        "PY": sys.executable,
        "SCRIPT": script,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
    }
    result = subprocess.run(
        ["unshare", "-rm", "sh", "-c", _MOUNT, "sh", str(size), str(mount), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if result.returncode == 77:
        pytest.skip(f"cannot mount a private tmpfs here: {result.stderr.strip()[:200]}")
    return result


def leave_free(mount: Path, free: int) -> Path:
    """Fill the file system of ``mount`` until only about ``free`` bytes are left; the
    filler's path (removing it gives the room back)."""
    st = os.statvfs(mount)
    filler = mount / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        size = st.f_bavail * st.f_frsize - free
        if size > 0:
            os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)
    return filler


_LYING_DISK = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

typedef ssize_t (*pwritev_fn)(int, const struct iovec *, int, off_t);
typedef ssize_t (*pwritev2_fn)(int, const struct iovec *, int, off_t, int);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);

static atomic_long writes;

static pwrite_fn real_pwrite(void) {
    static pwrite_fn fn;
    if (!fn) fn = (pwrite_fn)dlsym(RTLD_NEXT, "pwrite64");
    return fn;
}

/* Whether this write to fd is the one to go wrong: the FAULTY_WRITE-th under FAULTY_DIR. */
static int faulty(int fd) {
    const char *dir = getenv("FAULTY_DIR"), *nth = getenv("FAULTY_WRITE");
    char link[64], path[4096];
    if (!dir || !nth) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 0) return 0;
    path[n] = 0;
    if (strncmp(path, dir, strlen(dir)) != 0) return 0;
    return atomic_fetch_add(&writes, 1) + 1 == atol(nth);
}

/* The write gone wrong, as FAULTY_KIND says: flip, lose or past. */
static ssize_t lie(int fd, const struct iovec *iov, int count, off_t at) {
    const char *kind = getenv("FAULTY_KIND");
    size_t total = 0;
    for (int k = 0; k < count; k++) total += iov[k].iov_len;
    if (kind && !strcmp(kind, "lose")) return (ssize_t)total;
    char *bytes = malloc(total ? total : 1);
    if (!bytes) return -1;
    size_t put = 0;
    for (int k = 0; k < count; k++) {
        memcpy(bytes + put, iov[k].iov_base, iov[k].iov_len);
        put += iov[k].iov_len;
    }
    if (kind && !strcmp(kind, "flip") && total) bytes[total / 2] ^= 0x80;
    ssize_t got = real_pwrite()(fd, bytes, total, at);
    free(bytes);
    if (kind && !strcmp(kind, "past") && got >= 0) {
        const char *end = getenv("FAULTY_AT");
        real_pwrite()(fd, "x", 1, end ? atoll(end) : 0);
    }
    return got;
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t at) {
    struct iovec one = {(void *)buf, n};
    return faulty(fd) ? lie(fd, &one, 1, at) : real_pwrite()(fd, buf, n, at);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t at) { return pwrite64(fd, buf, n, at); }

ssize_t pwritev64(int fd, const struct iovec *iov, int count, off_t at) {
    static pwritev_fn fn;
    if (!fn) fn = (pwritev_fn)dlsym(RTLD_NEXT, "pwritev64");
    return faulty(fd) ? lie(fd, iov, count, at) : fn(fd, iov, count, at);
}

ssize_t pwritev(int fd, const struct iovec *iov, int count, off_t at) { return pwritev64(fd, iov, count, at); }

ssize_t pwritev64v2(int fd, const struct iovec *iov, int count, off_t at, int flags) {
    static pwritev2_fn fn;
    if (!fn) fn = (pwritev2_fn)dlsym(RTLD_NEXT, "pwritev64v2");
    return faulty(fd) ? lie(fd, iov, count, at) : fn(fd, iov, count, at, flags);
}

ssize_t pwritev2(int fd, const struct iovec *iov, int count, off_t at, int flags) {
    return pwritev64v2(fd, iov, count, at, flags);
}
"""


def lying_disk(build: Path) -> Path:
    """Build the preloaded library of a disk that lies (module docstring) in ``build``; its
    path. Set ``LD_PRELOAD`` to it and ``FAULTY_DIR`` (a folder: only files under it are
    touched), ``FAULTY_WRITE`` (which write to them goes wrong, 1 the first), ``FAULTY_KIND``
    (``flip``, ``lose`` or ``past``) and, for ``past``, ``FAULTY_AT`` (where the extra byte
    goes). Skips the test where no C compiler is found."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the lying disk")
    source, library = build / "lying_disk.c", build / "lying_disk.so"
    source.write_text(_LYING_DISK)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(library), str(source), "-ldl"], check=True)
    return library


__all__ = ["leave_free", "lying_disk", "on_small_tmpfs"]
