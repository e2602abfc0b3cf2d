"""``python -m ckptz`` and the ``ckptz`` console script.

Signal handlers go in before anything heavy is imported (:mod:`ckptz._signals`), so Ctrl-C
or SIGTERM at any instant after start-up ends in one line and exit code 130 or 143, never a
traceback.
"""

from __future__ import annotations

import os
import sys
import time
from importlib.util import find_spec

from ckptz import _signals


def main() -> None:
    """Console-script entry point."""
    _signals.install()
    # When the command started, for ranks it starts (--nproc) to report the whole run's time.
    os.environ.setdefault("_CKPTZ_STARTED_AT", repr(time.time()))
    _cache_bytecode()
    _quiet_torch_logs()
    try:
        from ckptz.cli import app

        app(prog_name="ckptz")
    except KeyboardInterrupt:
        pass
    except SystemExit as exc:
        if not _signals.received:
            _leave_if_gpu_starting(exc.code)
            if _held():
                raise
    else:
        _leave_if_gpu_starting(0)
    if not _signals.received and _held():
        return
    if not _signals.announced:
        sys.stderr.write("ckptz: stopped (run the same command again to finish anything left)\n")
    # Every file is closed and every worker joined by now. Leaving through os._exit keeps
    # CPython from re-raising SIGINT on the way out (it does after a KeyboardInterrupt that
    # passed through exec or eval, e.g. inside a dataclass definition), so the exit code is
    # the one documented.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_signals.exit_code())


def _held() -> bool:
    """Whether signals are held for the exit of a command that ran to its end; False if
    one came just before (the run then ends as stopped)."""
    try:
        _signals.hold()
    except KeyboardInterrupt:
        return False
    return True


def _cache_bytecode() -> None:
    """Keep compiled bytecode in ckptz's cache folder where Python may not write it beside
    the sources and torch, or ckptz itself, has none there.

    Containers often set ``PYTHONDONTWRITEBYTECODE`` over a read-only ``site-packages``:
    every run that imports torch then compiles torch's Python sources again, which costs
    more than half of ``import torch``'s time. Run from a source tree under that variable,
    every command compiled ckptz's own modules again, a fifth of a small command's time.
    The cache (``$XDG_CACHE_HOME/ckptz/bytecode``, private to the user) holds only what Python
    itself would have written, checked by Python against each source's size and time.
    A ``PYTHONPYCACHEPREFIX`` of the user's own is kept; the library (``import ckptz``) never
    does this.
    """
    if not sys.dont_write_bytecode or sys.pycache_prefix:
        return
    if _has_bytecode("torch") and _has_bytecode("ckptz.api"):
        return  # their bytecode is there to read
    from ckptz.cache import cache_folder

    folder = cache_folder("bytecode")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError:
        return
    if os.access(folder, os.W_OK):
        sys.pycache_prefix = folder
        sys.dont_write_bytecode = False


def _has_bytecode(module: str) -> bool:
    """Whether ``module`` has its compiled bytecode beside its source (True where it is not
    installed: there is nothing to compile). A module that every command but ``--help``
    imports stands for its package: a folder of bytecode left by one ``--help`` is not one."""
    try:
        spec = find_spec(module)
    except (ImportError, ValueError):
        return True
    if spec is None or spec.origin is None or not spec.cached:
        return True
    return os.path.exists(spec.cached)


def _quiet_torch_logs() -> None:
    """Keep libtorch's own C++ log lines off stderr, where ckptz says one line per error.

    A peer that dies under ``--nproc`` or torchrun made Gloo log
    ``[E... ProcessGroupGloo.cpp] ...`` before ckptz's ``ckptz: error: cannot join the other
    ranks: ...``, which carries the same text. Set before torch loads (its logger reads the
    variable once); a value the user set, or ``CKPTZ_DEBUG``, keeps torch's default.
    """
    from ckptz.settings import value

    if "TORCH_CPP_LOG_LEVEL" not in os.environ and not value("debug"):
        os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"


def _leave_if_gpu_starting(code: object) -> None:
    """Exit now if a GPU bring-up is still importing torch (ckptz.engines.hybrid): the job
    is done, every file is closed, and waiting would add seconds to a small job."""
    hybrid = sys.modules.get("ckptz.engines.hybrid")
    if hybrid is None or not hybrid.bring_up_pending():
        return
    if isinstance(code, str):
        sys.stderr.write(code + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)


if __name__ == "__main__":
    main()
