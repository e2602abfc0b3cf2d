"""Sum up a ckptz trace (``CKPTZ_TRACE=run.json``): where each kind of thread spends its time.

For each thread group (threads named alike: readers, writers, GPU workers, ...), each
stage's total time, its share of the group's thread-time over the traced window, and how
many times it ran; then what is left, time inside no stage (waiting on a pool's queue, or
Python between stages).

    python bench/timeline.py run.json [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict


def summarize(trace: dict[str, object]) -> dict[str, object]:
    events = trace["traceEvents"]
    assert isinstance(events, list)
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    spans = [e for e in events if e["ph"] == "X"]
    if not spans:
        return {"window_s": 0.0, "groups": {}}
    start = min(e["ts"] for e in spans)
    end = max(e["ts"] + e["dur"] for e in spans)
    window = (end - start) / 1e6
    groups: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    threads: dict[str, set[int]] = defaultdict(set)
    for e in spans:
        group = re.sub(r"[-_]?\d+(_\d+)?$", "", names.get(e["tid"], str(e["tid"])))
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--json", help="also write the summary here")
    args = ap.parse_args()
    with open(args.trace) as f:
        summary = summarize(json.load(f))
    print(f"traced window {summary['window_s']:.3f} s")
    for group, g in summary["groups"].items():  # type: ignore[union-attr]
        print(f"\n{group} ({g['threads']} threads)")
        for name, r in g["stages"].items():
            print(f"  {name:<20} {r['s']:9.3f} s  {100 * r['share']:5.1f} %  x{r['count']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
