"""Sum up a ckptz trace (``CKPTZ_TRACE=run.json``): where each kind of thread spends its time.

For each thread group (threads named alike: readers, writers, GPU workers, ...), each
stage's total time, its share of the group's thread-time over the traced window, and how
many times it ran; then what is left, time inside no stage (waiting on a pool's queue, or
Python between stages).

Then, with ``--bins N``, the run cut into N slices of time: in each, how many threads of
each group were inside a stage other than a wait (how busy the group was, and when).

    python bench/timeline.py run.json [--json out.json] [--bins 20]
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from typing import Any


def _spans(trace: dict[str, object]) -> tuple[dict[int, str], list[dict[str, Any]]]:
    """The trace's thread names by id, and its spans."""
    events = trace["traceEvents"]
    assert isinstance(events, list)
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    return names, [e for e in events if e["ph"] == "X"]


def summarize(trace: dict[str, object]) -> dict[str, object]:
    names, spans = _spans(trace)
    if not spans:
        return {"window_s": 0.0, "groups": {}}
    start = min(e["ts"] for e in spans)
    end = max(e["ts"] + e["dur"] for e in spans)
    window = (end - start) / 1e6
    groups: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    threads: dict[str, set[int]] = defaultdict(set)
    for e in spans:
        group = _group(names.get(e["tid"], str(e["tid"])))
        threads[group].add(e["tid"])
        row = groups[group][e["name"]]
        row[0] += e["dur"] / 1e6
        row[1] += 1
    out: dict[str, object] = {"window_s": round(window, 4), "groups": {}}
    for group, stages in sorted(groups.items()):
        n = len(threads[group])
        capacity = n * window
        busy = sum(s for s, _ in stages.values())
        rows = {
            name: {"s": round(s, 4), "share": round(s / capacity, 3), "count": int(c)}
            for name, (s, c) in sorted(stages.items(), key=lambda kv: -kv[1][0])
        }
        rows["(outside stages)"] = {
            "s": round(capacity - busy, 4),
            "share": round(1 - busy / capacity, 3),
            "count": 0,
        }
        out["groups"][group] = {"threads": n, "stages": rows}  # type: ignore[index]
    return out


def busy_over_time(trace: dict[str, object], bins: int) -> dict[str, list[float]]:
    """Per thread group, the mean number of its threads inside a stage that is not a wait,
    in each of ``bins`` equal slices of the traced window."""
    names, spans = _spans(trace)
    spans = [e for e in spans if not e["name"].startswith("wait")]
    if not spans:
        return {}
    start = min(e["ts"] for e in spans)
    width = (max(e["ts"] + e["dur"] for e in spans) - start) / bins or 1.0
    out: dict[str, list[float]] = defaultdict(lambda: [0.0] * bins)
    for e in spans:
        row = out[_group(names.get(e["tid"], str(e["tid"])))]
        a, b = e["ts"] - start, e["ts"] - start + e["dur"]
        for k in range(int(a // width), min(bins, int(b // width) + 1)):
            row[k] += max(0.0, min(b, (k + 1) * width) - max(a, k * width)) / width
    return dict(sorted(out.items()))


def _group(thread: str) -> str:
    return re.sub(r"[-_]?\d+(_\d+)?$", "", thread)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--json", help="also write the summary here")
    ap.add_argument("--bins", type=int, default=0, help="also show busy threads over time")
    args = ap.parse_args()
    with open(args.trace) as f:
        doc = json.load(f)
    summary = summarize(doc)
    print(f"traced window {summary['window_s']:.3f} s")
    for group, g in summary["groups"].items():  # type: ignore[union-attr]
        print(f"\n{group} ({g['threads']} threads)")
        for name, r in g["stages"].items():
            print(f"  {name:<20} {r['s']:9.3f} s  {100 * r['share']:5.1f} %  x{r['count']}")
    if args.bins:
        print(f"\nbusy threads per slice of {summary['window_s'] / args.bins * 1e3:.0f} ms")
        for group, row in busy_over_time(doc, args.bins).items():
            print(f"  {group:<14} " + " ".join(f"{x:4.1f}" for x in row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
