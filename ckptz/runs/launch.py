"""``--nproc N``: start N ckptz ranks on this machine, as ``torchrun --nproc-per-node N`` would.

The launcher starts ``python -m ckptz`` with the same arguments N times, each with the
variables ``torchrun`` sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_PORT``, ...);
rank 0 hosts the c10d store, on a port the kernel picked for the launcher a moment before.
The launcher itself never imports torch: the ranks import it at once, side by side, so
``import torch``'s seconds are paid once in parallel rather than again before any rank
starts. The ranks share stdout and
stderr (rank 0 alone prints the summary). A signal to the launcher goes on to the ranks;
a rank killed outright takes the others down, as under ``torchrun``.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Sequence

from ckptz import _signals, children

#: How long the ranks get to stop after a signal before they are killed.
GRACE_SECONDS = 30.0


def spawn(nproc: int, argv: Sequence[str]) -> int:
    """Run ``python -m ckptz ARGV`` as ``nproc`` ranks (this process's ckptz:
    :mod:`ckptz.children`); return their exit code.

    The code is the first non-zero one by rank (they agree on it), 128 plus the signal for
    a rank that was killed, else 0.
    """
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "CKPTZ_DISTRIBUTED": "1",
    }
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for r in range(nproc):
            rank_env = children.environment({**env, "RANK": str(r), "LOCAL_RANK": str(r)})
            procs.append(subprocess.Popen(children.command("ckptz", *argv), env=rank_env))
        _wait(procs)
    except KeyboardInterrupt:
        # Ctrl-C reached every rank from the terminal; SIGTERM reached only this process.
        sig = _signals.received[0] if _signals.received else signal.SIGINT
        _stop(procs, sig)
    finally:
        _settle(procs)
    codes = [_code(p.returncode) for p in procs]
    return next((c for c in codes if c != 0), 0)


def _free_port() -> int:
    """A TCP port on the loopback that nothing listens on now (rank 0 binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(procs: list[subprocess.Popen[bytes]]) -> None:
    """Wait for every rank; one killed by a signal ends the others (their peer is gone)."""
    while any(p.poll() is None for p in procs):
        if any(p.returncode is not None and p.returncode < 0 for p in procs):
            _stop(procs, signal.SIGTERM)
            return
        time.sleep(0.05)


def _stop(procs: list[subprocess.Popen[bytes]], sig: int) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(sig)


def _settle(procs: list[subprocess.Popen[bytes]]) -> None:
    """Wait for the ranks to end, further Ctrl-C presses aside; kill them after the grace."""
    deadline = time.monotonic() + GRACE_SECONDS
    for p in procs:
        while True:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
                break
            except subprocess.TimeoutExpired:
                p.kill()
            except KeyboardInterrupt:
                continue


def _code(returncode: int | None) -> int:
    if returncode is None:
        return 1
    return 128 - returncode if returncode < 0 else returncode
