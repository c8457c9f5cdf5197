"""One timeline from a DPO_TRACE_DIR of sitecustomize.py (this folder): every event of every
process in time order, in seconds from the start of the ``dpo-sweep`` command's process; printed,
and with ``--csv`` saved (columns t_s, pid, thread, event). Ray's idle default workers' start
lines are left out of the print (``--all`` keeps them)."""
from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path


def read_events(trace_dir: Path) -> list[tuple[float, str, str, str]]:
    events = []
    for log in trace_dir.glob("*.log"):
        for line in log.read_text().splitlines():
            t, pid, thread, event = line.split(" ", 3)
            events.append((float(t), pid, thread, event))
    return sorted(events, key=lambda e: e[0])  # stable: a process's own order where times tie (1 ms)


def timeline(events: list[tuple[float, str, str, str]]) -> list[tuple[float, str, str, str]]:
    """``events`` with their times in seconds from the command's start (ms resolution)."""
    t0 = command_start(events)
    return [(round(t - t0, 3), pid, thread, event) for t, pid, thread, event in events]


def write_csv(events: list[tuple[float, str, str, str]], path: Path) -> None:
    """The timeline as CSV: t_s (from the command's start), pid, thread, event."""
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["t_s", "pid", "thread", "event"])
        w.writerows(timeline(events))


def command_start(events: list[tuple[float, str, str, str]]) -> float:
    """The first ``start`` of a process that runs ``dpo_sweep`` (else the first event)."""
    starts = [t for t, _, _, e in events if e.startswith("start") and ("dpo_sweep" in e or "dpo-sweep" in e or " run " in e)]
    return min(starts) if starts else (events[0][0] if events else 0.0)


#: What ``startup_marks`` reads: its key, and the first event that starts with this text.
MARKS = {
    "ray_up_s": "< ray._private.worker.init ",
    "preflight_done_s": "< dpo_sweep.sweep.startup.check_inputs ",
    "worker_imports_start_s": "> dpo_sweep.sweep.warm_worker.TrialWorker.__init__",
    "worker_imports_end_s": "< dpo_sweep.sweep.warm_worker.TrialWorker.__init__ ",
    "first_trial_s": "> dpo_sweep.sweep.trainable.tune_trainable",
    "first_step_s": "> dpo_sweep.train.loop.train_step",
}


def startup_marks(events: list[tuple[float, str, str, str]]) -> dict[str, float]:
    """When the start-up's milestones happened, in seconds from the command's start (NaN: not in
    the trace), and how long Ray's shutdown took (``ray_shutdown_s``)."""
    t0 = command_start(events)
    marks = {key: next((t - t0 for t, _, _, e in events if e.startswith(prefix)), math.nan)
             for key, prefix in MARKS.items()}
    shutdown = [float(e.split()[-1]) for _, _, _, e in events if e.startswith("< ray._private.worker.shutdown ")]
    marks["ray_shutdown_s"] = shutdown[0] if shutdown else math.nan
    return marks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("trace_dir", type=Path)
    ap.add_argument("--csv", type=Path, help="also write the timeline here")
    ap.add_argument("--all", action="store_true", help="keep Ray's default workers' start lines")
    args = ap.parse_args()
    events = read_events(args.trace_dir)
    for t, pid, thread, event in timeline(events):
        if args.all or not (event.startswith("start") and "default_worker" in event):
            print(f"{t:8.3f} {pid:>7} {thread[:12]:12} {event}")
    if args.csv:
        write_csv(events, args.csv)


if __name__ == "__main__":
    main()
