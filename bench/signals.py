"""The signal campaign: SIGINT and SIGTERM at random instants of in-place runs, files in flight.

Each round copies a folder of checkpoint files, starts ``ckptz compress --in-place`` (then,
on the compressed copy, ``ckptz decompress --in-place``), sends SIGINT or SIGTERM at an
instant drawn uniformly over a measured full run, and records how long the process took to
exit after the signal, how many temp files it left, whether every file is still there in
one form or the other, and how many files it reported finished. The same command is then
rerun to completion and the tree compared with the originals (sha256). RELIABILITY.md
quotes its output.

Usage::

    python bench/signals.py [--rounds 40] [--files 8] [--mb 32] [--seed 14] [--json OUT]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ENV = {**os.environ, "CKPTZ_DEVICE": "cpu", "PYTHONDONTWRITEBYTECODE": "1"}
TEMP = re.compile(r"\..+\.ckptz-tmp-[0-9]+-[0-9a-f]{8}")


def _make(root: Path, files: int, mb: int) -> None:
    from safetensors.numpy import save_file

    root.mkdir(parents=True)
    rng = np.random.default_rng(14)
    for i in range(files):
        w = (rng.standard_normal(mb * (1 << 18)) * 0.02).astype(np.float32)
        save_file({"w": w}, str(root / f"model-{i:02d}.safetensors"))
    (root / "config.json").write_text('{"hidden_size": 64}')


def _digests(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ckptz", *args]


def _run(*args: str) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(_cli(*args), env=ENV, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"ckptz {' '.join(args)} failed: {done.stderr}")
    return time.perf_counter() - t0


def _signal_at(delay: float, sig: int, work: Path, *args: str) -> dict[str, object]:
    proc = subprocess.Popen(
        _cli(*args), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        proc.wait(timeout=delay)
        return {"hit": False}
    except subprocess.TimeoutExpired:
        pass
    in_flight = sum(bool(TEMP.fullmatch(p.name)) for p in work.iterdir())
    sent = time.perf_counter()
    proc.send_signal(sig)
    _, err = proc.communicate()
    stop = time.perf_counter() - sent
    finished = re.search(r"stopped: (\d+) files? finished", err)
    return {
        "hit": True,
        "in_flight": in_flight,
        "stop_s": stop,
        "code": proc.returncode,
        "finished": int(finished.group(1)) if finished else None,
        "one_line": err.count("\n") == 1 and "Traceback" not in err,
        "stderr": err[-3000:],
    }


def main() -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--mb", type=int, default=32, help="MiB per file")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="ckptz-signals-") as scratch:
        base = Path(scratch)
        pristine = base / "pristine"
        _make(pristine, args.files, args.mb)
        want = _digests(pristine)
        calib = base / "calib"
        shutil.copytree(pristine, calib)
        full_c = _run("compress", str(calib), "--in-place", "-q")
        full_d = _run("decompress", str(calib), "--in-place", "-q")
        stops: list[float] = []
        hits = lost = temps_left = bad_codes = not_one_line = before_start = misreported = 0
        finished: list[int] = []
        anomalies: list[dict[str, object]] = []
        flight: list[int] = []
        for i in range(args.rounds):
            work = base / f"round-{i}"
            shutil.copytree(pristine, work)
            for command, full in (("compress", full_c), ("decompress", full_d)):
                sig = rng.choice((signal.SIGINT, signal.SIGTERM))
                r = _signal_at(rng.uniform(0, full), sig, work, command, str(work), "--in-place", "-q")
                if r["hit"]:
                    hits += 1
                    flight.append(int(r["in_flight"]))  # type: ignore[call-overload]
                    stops.append(float(r["stop_s"]))  # type: ignore[arg-type]
                    if r["code"] == -sig or "init_import_site" in str(r["stderr"]):
                        # Delivered before the interpreter ran ckptz's first line: the
                        # default action ended it, with nothing begun.
                        before_start += 1
                    else:
                        bad_codes += r["code"] != 128 + sig
                        not_one_line += not r["one_line"]
                        if r["code"] != 128 + sig or not r["one_line"]:
                            anomalies.append({"signal": sig, "code": r["code"], "stderr": r["stderr"]})
                    if r["finished"] is not None:
                        finished.append(int(r["finished"]))  # type: ignore[call-overload]
                names = {p.name for p in work.iterdir()}
                if r["hit"] and r["finished"] is not None:
                    models = [n for n in want if n.endswith(".safetensors")]
                    done_now = sum(((n + ".ckptz") in names) == (command == "compress") for n in models)
                    misreported += done_now != r["finished"]
                temps_left += sum(bool(TEMP.fullmatch(n)) for n in names)
                lost += sum(rel not in names and rel + ".ckptz" not in names for rel in want)
                _run(command, str(work), "--in-place", "-q")
            lost += sum(1 for rel, d in _digests(work).items() if want.get(rel) != d)
            lost += len(set(want) - set(_digests(work)))
            shutil.rmtree(work)
    figures = {
        "rounds": args.rounds,
        "signals_sent": 2 * args.rounds,
        "signals_hitting_a_running_process": hits,
        "of_which_before_python_started": before_start,
        "files_per_round": len(want),
        "bytes_per_round": args.files * args.mb * (1 << 20),
        "full_compress_s": round(full_c, 3),
        "full_decompress_s": round(full_d, 3),
        "signals_with_files_in_flight": sum(n > 0 for n in flight),
        "files_in_flight_at_signal": {str(k): flight.count(k) for k in sorted(set(flight))},
        "stop_s_median": round(statistics.median(stops), 3) if stops else None,
        "stop_s_max": round(max(stops), 3) if stops else None,
        "files_lost_or_wrong": lost,
        "temp_files_left": temps_left,
        "wrong_exit_codes": bad_codes,
        "messages_not_one_line": not_one_line,
        "finished_counts_wrong": misreported,
        "anomalies": anomalies,
        "files_reported_finished": dict(sorted((str(k), finished.count(k)) for k in set(finished))),
    }
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
