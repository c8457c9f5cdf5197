"""One timeline from a DPO_TRACE_DIR of sitecustomize.py (this folder): every event of every
process in time order, in seconds from the start of the ``dpo-sweep`` command's process; printed,
and with ``--csv`` saved (columns t_s, pid, thread, event). Ray's idle default workers' start
lines are left out of the print (``--all`` keeps them)."""
from __future__ import annotations

import argparse
import csv
from pathlib import Path


def read_events(trace_dir: Path) -> list[tuple[float, str, str, str]]:
    events = []
    for log in trace_dir.glob("*.log"):
        for line in log.read_text().splitlines():
            t, pid, thread, event = line.split(" ", 3)
            events.append((float(t), pid, thread, event))
    return sorted(events, key=lambda e: e[0])  # stable: a process's own order where times tie (1 ms)


def command_start(events: list[tuple[float, str, str, str]]) -> float:
    """The first ``start`` of a process that runs ``dpo_sweep`` (else the first event)."""
    starts = [t for t, _, _, e in events if e.startswith("start") and ("dpo_sweep" in e or "dpo-sweep" in e or " run " in e)]
    return min(starts) if starts else (events[0][0] if events else 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("trace_dir", type=Path)
    ap.add_argument("--csv", type=Path, help="also write the timeline here")
    ap.add_argument("--all", action="store_true", help="keep Ray's default workers' start lines")
    args = ap.parse_args()
    events = read_events(args.trace_dir)
    t0 = command_start(events)
    rows = [(round(t - t0, 3), pid, thread, event) for t, pid, thread, event in events]
    for t, pid, thread, event in rows:
        if args.all or not (event.startswith("start") and "default_worker" in event):
            print(f"{t:8.3f} {pid:>7} {thread[:12]:12} {event}")
    if args.csv:
        with args.csv.open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["t_s", "pid", "thread", "event"])
            w.writerows(rows)


if __name__ == "__main__":
    main()
