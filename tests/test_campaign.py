"""A seeded campaign of hostile containers, run through the public API in a child process
whose address space is capped (``RLIMIT_AS`` = 3 GiB), so bounded memory is the kernel's
verdict, not a timing.

Classes of cases, each drawn from a fixed seed:

* ``intact``: containers of several formats, which must verify ok and read back exactly;
* ``bit flip``: one bit flipped in the magic, the header, the index or the footer;
* ``payload flip``: one bit flipped in the payloads (the data area);
* ``truncation``: the container cut at a random length;
* ``hostile field``: an index field the readers use set to a value of another JSON type or
  out of range, re-sealed with valid checksums;
* ``bomb``: constant frames with valid checksums that expand far past the container, with
  frames at or above the format's limit.

Every case must end in a verdict or a :class:`~ckptz.errors.CkptzError`, never another
exception; a damaged container must never verify ok or read back as some other bytes; an
intact one must always verify ok. Set ``CKPTZ_CAMPAIGN_REPORT=path`` for the counts in
RELIABILITY.md.
"""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

SEED = 20261207
#: Cases per class (intact containers: one per format and seed draw).
CASES = {
    "intact": 12,
    "bit flip": 100,
    "payload flip": 40,
    "truncation": 40,
    "hostile field": 200,
    "bomb": 12,
}
MEMORY_CAP = 3 << 30

VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    7,
    2**31,
    2**63,
    2**70,
    0.5,
    -1e308,
    "",
    "abc",
    "0",
    [],
    [1],
    ["a"],
    [[1]],
    [[None]],
    [{"a": 1}],
    {},
    {"a": 1},
    {"leaf": 1, "digest": 5},
]


def _sources(root: Path) -> list[Path]:
    """Small originals of the formats ckptz reads."""
    import numpy as np
    import torch
    from safetensors.numpy import save_file

    rng = np.random.default_rng(SEED)
    root.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "w": torch.from_numpy(rng.standard_normal(3000).astype(np.float32)),
            "step": 3,
            "b": torch.zeros(64),
        },
        root / "model.pt",
    )
    save_file(
        {"w": rng.standard_normal(2000).astype(np.float32), "z": np.zeros(500, np.float16)},
        str(root / "model.safetensors"),
    )
    torch.save({"w": torch.arange(100)}, root / "legacy.pt", _use_new_zipfile_serialization=False)
    (root / "blob.bin").write_bytes(rng.integers(0, 4, 20_000, dtype=np.uint8).tobytes())
    return [root / "model.pt", root / "model.safetensors", root / "legacy.pt", root / "blob.bin"]


class Campaign:
    """Runs the cases and counts their outcomes (in the capped child)."""

    def __init__(self, work: Path) -> None:
        import ckptz  # noqa: F401 - imported before any case: its cost is not a case's
        from ckptz import api

        self.work = work
        self.rng = random.Random(SEED)
        self.outcomes: dict[str, Counter[str]] = {}
        self.failures: list[str] = []
        self.originals: dict[str, bytes] = {}
        self.containers: dict[str, bytes] = {}
        for src in _sources(work / "src"):
            out = work / "packed" / (src.name + ".ckptz")
            out.parent.mkdir(exist_ok=True)
            api.compress(src, out, device="cpu")
            self.originals[src.name] = src.read_bytes()
            self.containers[src.name] = out.read_bytes()

    def run(self) -> dict[str, Any]:
        classes: dict[str, Callable[[int], None]] = {
            "intact": self._intact,
            "bit flip": self._bit_flip,
            "payload flip": self._payload_flip,
            "truncation": self._truncation,
            "hostile field": self._hostile_field,
            "bomb": self._bomb,
        }
        for name, case in classes.items():
            self.outcomes[name] = Counter()
            for i in range(CASES[name]):
                try:
                    case(i)
                except Exception:
                    self._fail(name, f"case {i}: escaped the checks: {traceback.format_exc(limit=-3)}")
        return {
            "seed": SEED,
            "outcomes": {k: dict(v) for k, v in self.outcomes.items()},
            "failures": self.failures,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }

    # -- the checks -----------------------------------------------------------------------

    def _fail(self, kind: str, what: str) -> None:
        self.outcomes[kind]["FAILED"] += 1
        self.failures.append(f"{kind}: {what}")

    def _judge(self, kind: str, data: bytes, original: bytes | None, label: str) -> str:
        """Write ``data`` as a container, verify it and read it through the library. With
        ``original`` None the container is damaged (it must never verify ok nor read back);
        else it may verify ok only if it reads back as exactly ``original``."""
        import ckptz
        from ckptz import api
        from ckptz.errors import CkptzError

        path = self.work / "case" / (label + ".ckptz")
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        try:
            verdict = "verifies ok" if api.verify(path, device="cpu").ok else "verify: damaged"
        except CkptzError as exc:
            verdict = f"verify: {type(exc).__name__}"
        except Exception as exc:
            self._fail(kind, f"{label}: verify raised {exc!r}")
            return "FAILED"
        try:
            with ckptz.open(path) as f:
                back: bytes | None = f.read()
            read = "reads back"
        except CkptzError as exc:
            back, read = None, f"read: {type(exc).__name__}"
        except Exception as exc:
            self._fail(kind, f"{label}: ckptz.open raised {exc!r}")
            return "FAILED"
        if label.endswith(".pt"):  # torch.save files: ckptz.load must agree with the read
            try:
                ckptz.load(path)
                if back is None:
                    self._fail(kind, f"{label}: ckptz.load loaded a container ckptz.open refuses")
                    return "FAILED"
            except CkptzError:
                pass
            except Exception as exc:
                self._fail(kind, f"{label}: ckptz.load raised {exc!r}")
                return "FAILED"
        ok = verdict == "verifies ok"
        if original is None and (ok or back is not None):
            self._fail(kind, f"{label}: a damaged container was taken for intact ({verdict}, {read})")
            return "FAILED"
        if back is not None and back != original:
            self._fail(kind, f"{label}: read back other bytes than the original ({verdict})")
            return "FAILED"
        if ok and back is None:
            self._fail(kind, f"{label}: verifies ok but the library refuses it ({read})")
            return "FAILED"
        outcome = verdict if ok else f"{verdict}, {read}"
        self.outcomes[kind][outcome] += 1
        return outcome

    def _pick(self) -> tuple[str, bytes]:
        name = self.rng.choice(sorted(self.containers))
        return name, self.containers[name]

    def _intact(self, i: int) -> None:
        name, data = self._pick()
        outcome = self._judge("intact", data, self.originals[name], f"intact-{i}-{name}")
        if outcome not in ("verifies ok", "FAILED"):
            self.outcomes["intact"][outcome] -= 1
            self._fail("intact", f"{name}: an intact container did not verify ok ({outcome})")

    def _bit_flip(self, i: int) -> None:
        from crafted import split

        from ckptz.container import FOOTER

        name, data = self._pick()
        off = split(data)[2]
        region = self.rng.choice(["magic", "header", "index", "footer"])
        end = len(data) - FOOTER.size
        lo, hi = {"magic": (0, 8), "header": (8, 16), "index": (off, end), "footer": (end, len(data))}[region]
        bit = self.rng.randrange(lo * 8, hi * 8)
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        self._judge("bit flip", bytes(flipped), None, f"flip-{i}-{region}-{name}")

    def _payload_flip(self, i: int) -> None:
        from crafted import split

        name, data = self._pick()
        off = split(data)[2]
        bit = self.rng.randrange(16 * 8, off * 8)
        flipped = bytearray(data)
        flipped[bit // 8] ^= 1 << (bit % 8)
        self._judge("payload flip", bytes(flipped), None, f"payload-{i}-{name}")

    def _truncation(self, i: int) -> None:
        name, data = self._pick()
        n = self.rng.choice([self.rng.randrange(0, 16), self.rng.randrange(0, len(data))])
        self._judge("truncation", data[:n], None, f"cut-{i}-{n}-{name}")

    def _hostile_field(self, i: int) -> None:
        from crafted import HEADER_FIELDS, with_field

        name, data = self._pick()
        field = self.rng.choice(HEADER_FIELDS)
        value = self.rng.choice(VALUES)
        try:
            edited = with_field(data, field, value)
        except (KeyError, IndexError, TypeError, ValueError):
            self.outcomes["hostile field"]["field absent here"] += 1
            return
        # Re-sealed, it may still be intact (a field that changes nothing): it may then
        # verify ok, but only if it reads back as the original.
        self._judge("hostile field", edited, self.originals[name], f"field-{i}-{'.'.join(field)}-{name}")

    def _bomb(self, i: int) -> None:
        from crafted import bomb

        from ckptz.container import MAX_FRAME_BYTES

        frame = self.rng.choice([1 << 20, 16 << 20, MAX_FRAME_BYTES, MAX_FRAME_BYTES * 2, 1 << 30, 1 << 40])
        frames = self.rng.choice([1, 3, 8]) if frame <= MAX_FRAME_BYTES else self.rng.choice([8, 1000])
        # Digest checked only where the bomb is small enough to hash here; others must fail.
        honest = frame * frames <= 32 << 20
        data = bomb(frame, frames, digest=honest)
        original = bytes(frame * frames) if honest else None
        self._judge("bomb", data, original, f"bomb-{i}-{frame}x{frames}")


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def test_seeded_campaign(tmp_path: Path) -> None:
    here = Path(__file__).parent
    code = (
        "import json, sys; from pathlib import Path;"
        f"sys.path.insert(0, {str(here)!r}); import test_campaign as t;"
        f"print(json.dumps(t.Campaign(Path({str(tmp_path)!r})).run()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit,
        env={**os.environ, "CKPTZ_DEVICE": "cpu"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    report = os.environ.get("CKPTZ_CAMPAIGN_REPORT")
    if report:
        Path(report).write_text(json.dumps(result, indent=2))
    assert result["failures"] == [], "\n".join(result["failures"][:20])
    total = sum(sum(c.values()) for c in result["outcomes"].values())
    assert total == sum(CASES.values())
