"""How ckptz starts Python processes of its own (helper processes and
``--nproc`` ranks), and how it talks to them: pickled tuples over a socket, each after its
length, with file descriptors passed beside them (``SCM_RIGHTS``).

A child runs the very ``ckptz`` its parent imported: the package's folder leads its
``PYTHONPATH``, and ``-P`` keeps ``python -m`` from putting the working directory first on
the path, where another checkout of ckptz (or a planted ``ckptz`` folder) would be imported
instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any, cast

from ckptz.errors import CkptzError

#: The folder that holds the ``ckptz`` package this process imported.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def command(module: str, *args: str) -> list[str]:
    """``python -P -m module args...`` with this interpreter."""
    return [sys.executable, "-P", "-m", module, *args]


def environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment, ``extra`` added, with :data:`ROOT` first on ``PYTHONPATH``."""
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return env


def spawn(
    module: str, *args: str, extra: Mapping[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """Start ``python -m module FD args...`` (:func:`command`, :func:`environment` with
    ``extra``) with one end of a socket pair as descriptor ``FD``; return it and our end.
    A child that calls :func:`die_with_parent` dies with the *thread* that started it."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        child = subprocess.Popen(
            command(module, str(theirs.fileno()), *args),
            pass_fds=[theirs.fileno()],
            env=environment(extra),
            stdin=subprocess.DEVNULL,
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    return child, ours


def run_child(argv: list[str], body: Callable[[socket.socket, list[str]], None]) -> None:
    """A child's life as :func:`spawn` started it (``argv``: the descriptor of its socket, then
    its own arguments): Ctrl-C left to the caller (it reaches the whole process group), dead
    with its parent (:func:`die_with_parent`), and ``body(socket, arguments)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    with socket.socket(fileno=int(argv[0])) as sock:
        body(sock, argv[1:])


def die_with_parent() -> None:
    """In a child: be killed when the thread that started it ends (``PR_SET_PDEATHSIG``), and
    exit now if that has happened already."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        os._exit(1)


# -- the wire ---------------------------------------------------------------------------------

#: Descriptors one message may carry.
MAX_FDS = 16


def send(sock: socket.socket, message: object, fds: list[int] | None = None) -> None:
    """Send ``message`` pickled, after its length (``fds`` beside its first bytes). Callers
    that send from several threads hold a lock of their own around it."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    head = struct.pack("<Q", len(data))
    if fds:
        socket.send_fds(sock, [head], fds)
        sock.sendall(data)
    else:
        sock.sendall(head + data)


def receive(sock: socket.socket, fds: list[int] | None = None) -> tuple[Any, ...]:
    """The next message (its descriptors appended to ``fds``).

    Raises:
        EOFError: the other side closed the socket.
    """
    if fds is not None:
        head, got, _, _ = socket.recv_fds(sock, 8, MAX_FDS)
        fds.extend(got)
    else:
        head = sock.recv(8)
    head += _exactly(sock, 8 - len(head)) if head else b""
    if len(head) < 8:
        raise EOFError
    return cast(tuple[Any, ...], pickle.loads(_exactly(sock, struct.unpack("<Q", head)[0])))


def _exactly(sock: socket.socket, n: int) -> bytes:
    parts, left = [], n
    while left:
        part = sock.recv(min(left, 1 << 20))
        if not part:
            raise EOFError
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def portable_error(exc: BaseException) -> tuple[str, str, str, dict[str, object]]:
    """An exception as plain data: ckptz's own errors keep their fields (path, chunk, hint)."""
    fields: dict[str, object] = {k: v for k, v in vars(exc).items() if isinstance(v, str | int | type(None))}
    return type(exc).__module__, type(exc).__qualname__, str(exc), fields


def rebuild_error(data: tuple[str, str, str, dict[str, object]]) -> BaseException:
    """The exception :func:`portable_error` gave as data (ckptz's errors and ``OSError`` as
    they were; anything else as a ``RuntimeError`` naming it)."""
    module, name, text, fields = data
    cls = getattr(sys.modules.get(module), name, None)
    if isinstance(cls, type) and issubclass(cls, CkptzError):
        exc = cls.__new__(cls)
        Exception.__init__(exc, fields.get("message", text))
        vars(exc).update(fields)
        return exc
    if isinstance(cls, type) and issubclass(cls, OSError):
        return cls(fields.get("errno"), fields.get("strerror") or text)
    return RuntimeError(f"another ckptz process failed: {name}: {text}")


__all__ = [
    "MAX_FDS",
    "ROOT",
    "command",
    "die_with_parent",
    "environment",
    "portable_error",
    "rebuild_error",
    "receive",
    "run_child",
    "send",
    "spawn",
]
