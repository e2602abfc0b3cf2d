"""How the command line stops: Ctrl-C and SIGTERM both become ``KeyboardInterrupt``.

Installed by ``ckptz/__main__.py`` before anything heavy is imported. Until a command
starts its work (:func:`arm`), a signal is only recorded: raising inside Typer's start-up
(which evaluates annotations with ``eval``) would make CPython end the process with SIGINT
whatever ckptz then does. Once armed, the first signal raises in the main thread, which
stops the run cleanly (:mod:`ckptz.runs.jobs`); a later SIGTERM is ignored while that cleanup
runs, a later Ctrl-C raises again and is absorbed by it. The exit code is 128 plus the first
signal's number, as shells report a signal (130, 143).
"""

from __future__ import annotations

import signal
from types import FrameType

received: list[int] = []
#: Whether the CLI already said that the run stopped (and how far it got).
announced: list[bool] = []
_armed: list[bool] = []


def _handler(signum: int, _frame: FrameType | None) -> None:
    first = not received
    if first:
        received.append(signum)
    if _armed and (first or signum == signal.SIGINT):
        raise KeyboardInterrupt


def install() -> None:
    """Route SIGINT and SIGTERM through :func:`_handler` (main thread only)."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _handler)


def arm() -> None:
    """From now on a signal raises; one that came during start-up raises at once."""
    if not _armed:
        _armed.append(True)
    if received:
        raise KeyboardInterrupt


def hold() -> None:
    """From now on a signal is only recorded, then ignored: the command is over, and
    neither a handler that runs after ``main`` returned nor the interpreter's exit (which
    puts the default handlers back) may end the process by the signal instead."""
    _armed.clear()
    # Ignored, not blocked: another thread would still take a blocked signal, and CPython
    # leaves an ignored one ignored through its exit.
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)


def exit_code() -> int:
    """The exit code of a stopped run: 130 for Ctrl-C, 143 for SIGTERM."""
    return 128 + (received[0] if received else signal.SIGINT)
