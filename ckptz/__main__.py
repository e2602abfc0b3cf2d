"""``python -m ckptz`` and the ``ckptz`` console script.

Signal handlers go in before anything heavy is imported (:mod:`ckptz._signals`), so Ctrl-C
or SIGTERM at any instant after start-up ends in one line and exit code 130 or 143, never a
traceback.
"""

from __future__ import annotations

import os
import sys

from ckptz import _signals


def main() -> None:
    """Console-script entry point."""
    _signals.install()
    try:
        from ckptz.cli import app

        app(prog_name="ckptz")
    except KeyboardInterrupt:
        pass
    except SystemExit as exc:
        if not _signals.received:
            _leave_if_gpu_starting(exc.code)
            raise
    else:
        _leave_if_gpu_starting(0)
    if not _signals.received:
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
