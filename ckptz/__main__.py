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
    except SystemExit:
        if not _signals.received:
            raise
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


if __name__ == "__main__":
    main()
