"""Every setting ckptz reads from the environment, in one table.

Each :class:`Setting` is overridden by the variable its name gives (``CKPTZ_`` and the name
in capitals: ``device`` by ``CKPTZ_DEVICE``) and read through :func:`value` alone, so the
table is the whole list of what the environment can change. Command-line flags and API
arguments win over these; an unset or empty variable leaves the default. (A variable whose
name begins with an underscore, such as ``_CKPTZ_STARTED_AT``, is how one ckptz process tells
the processes it starts something; it is not a setting.)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

from ckptz.errors import UsageError

#: What a variable may hold: a ``bool`` is off for 0, false, no or off, on for anything else.
Kind = type[str] | type[bool] | type[int] | type[float]
Value = str | bool | int | float | None


class Setting(NamedTuple):
    """One setting: its name, its value when the variable is unset, what kind of value the
    variable holds, and one sentence for the user."""

    name: str
    default: Value
    kind: Kind
    help: str

    @property
    def variable(self) -> str:
        """The environment variable that overrides it."""
        return "CKPTZ_" + self.name.upper()


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "device", "auto", str, "Where the codec runs when no --device is given: auto, cpu, cuda or cuda:N."
    ),
    Setting("debug", False, bool, "Show the traceback behind an error, and torch's own C++ log lines."),
    Setting(
        "trace",
        None,
        str,
        "Write a timeline of every pipeline stage, and of each native thread's steps, to this file (Chrome"
        " trace JSON).",
    ),
    Setting(
        "progress_seconds",
        10.0,
        float,
        "Seconds between plain progress lines where stderr is not a terminal.",
    ),
    Setting("peer_timeout", 60.0, float, "Seconds a rank waits for the others under --nproc or torchrun."),
    Setting(
        "distributed",
        None,
        bool,
        "1: take RANK and WORLD_SIZE as this run's ranks (ranks started by srun or by hand); 0: ignore"
        " them; unset: only in torchrun's own workers.",
    ),
)

_BY_NAME = {s.name: s for s in SETTINGS}
_OFF = ("0", "false", "no", "off")


def value(name: str, env: Mapping[str, str] | None = None) -> Value:
    """The setting ``name``: its variable's value in ``env`` (default: this process's
    environment) as the setting's kind, else its default.

    Raises:
        KeyError: no setting has that name.
        UsageError: the variable holds no value of the setting's kind.
    """
    setting = _BY_NAME[name]
    raw = (os.environ if env is None else env).get(setting.variable, "").strip()
    if not raw:
        return setting.default
    if setting.kind is bool:
        return raw.lower() not in _OFF
    if setting.kind is str:
        return raw
    try:
        return setting.kind(raw)
    except ValueError:
        pass
    example = "an integer" if setting.kind is int else "a number"
    raise UsageError(
        f"{setting.variable}={raw!r} is not {example}", hint=f"unset {setting.variable} or give {example}"
    )


def overridden(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings that ``env`` (default: this process's environment) overrides: each
    variable set to a non-empty value, with that value."""
    env = os.environ if env is None else env
    return {s.variable: env[s.variable] for s in SETTINGS if env.get(s.variable, "").strip()}


__all__ = ["SETTINGS", "Setting", "overridden", "value"]
