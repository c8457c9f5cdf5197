"""What a sweep trial costs besides its optimizer steps: ``dpo-sweep run`` timed from outside.

Runs a space of ``--trials`` identical-cost trials (they differ only in beta) through the real
command, one trial at a time, and timestamps its console output as it arrives. Per trial:

- ``wall_s``: from the previous trial's progress line (for the first: from the "trial(s) to run"
  line) to this one's - what the user waits per trial;
- ``ray_s``: Tune trial start -> our worker loop running (Ray: trial, Train controller, worker
  processes), from rank 0's ``worker loop started`` line (in the sweep's DIR/logs/<trial>.log);
  ``import_s``: importing the trainer;
- ``data_s``, ``model_s``: the trainer's own marks; ``startup_s`` / ``measure_s``: results.csv
  (Tune trial start -> first optimizer step / the optimizer steps);
- ``rest_s`` = ``wall_s - startup_s - measure_s``: Tune scheduling, ``fit()`` teardown, reporting.

It needs no Ray state API (the GPU machine runs Ray without a dashboard). Prints a table, writes
``sweep_overhead.csv``, ``sweep_overhead.md``, the sweep's results.csv and environment.json,
its space and the timestamped console log under ``--out``.

    python benchmarks/sweep_overhead.py --out benchmarks/results/sweep_overhead/cpu-reused-trial-processes
    python benchmarks/sweep_overhead.py --model llama-3.2-1b --out DIR     # on a GPU

``--space PATH`` instead runs that space as a user would (planner on) and reports how much of the
sweep's wall time the device spent in optimizer steps: ``train_s`` = the sum of ``step_time_ms``
over every step of every Ray trial (steps.csv holds them all, learning trials' included),
``share`` = ``train_s`` / the command's wall time (Ray start, preflight and report included),
``first_row_s`` = the command's start -> its first progress line (the fixed start-up + the first trial).
Writes ``<name>_share.md`` / ``.csv`` and the sweep's results.csv, steps.csv, console log and
worker logs (``<name>_logs/``), and
``<name>_timeline.csv``: every Ray trial's start and end in seconds since the command's start
(Tune's own record of the trial, ``run_metadata.start_time`` and ``time_total_s`` in the
experiment state it keeps under DIR/ray/), so the wall time splits into the start before the
first trial, the trials, the gaps between them and the end after the last. ``--trace`` also
traces every process of the command (benchmarks/process_trace/): ``<name>_trace.csv``, and the
start-up's milestones (Ray up, the preflight done, the first warm worker's imports, the first
trial and step, Ray's shutdown) as a table in ``<name>_share.md``.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # h200_common puts the checkout on sys.path too

from h200_common import REPO_ROOT, results_dir  # noqa: E402
from dpo_sweep.analysis.tables import to_markdown  # noqa: E402  (no torch import either)
from dpo_sweep.records import read_csv_rows  # noqa: E402  (no torch import)
from process_trace import merge as process_trace  # noqa: E402  (benchmarks/: this script's folder)

TRACE_DIR = Path(__file__).resolve().parent / "process_trace"

#: model -> (space lines that make its trials, a short description). The GPU case is the 1B
#: shape at the seed's sequence length; the CPU case the quickstart's tiny model.
MODELS = {
    "tiny-llama": (
        "model: {preset: tiny-llama}\n"
        "data: {synthetic: {pairs: 32, prompt_tokens: 24, response_tokens: 23}}\n"
        "train: {steps: STEPS, warmup_steps: 1, lr: 1.0e-3, max_length: 64, precision: fp32, seed: 0}\n"
        "resources: {workers_per_trial: 1, use_gpu: auto}\n"
        "search: {micro_batch: [2], checkpoint_level: [none], grad_acc: [1], beta: BETAS}\n",
        "tiny-llama, fp32, micro_batch 2, 64 tokens",
    ),
    "llama-3.2-1b": (
        "model: {preset: llama-3.2-1b}\n"
        "data: {synthetic: {pairs: 256, prompt_tokens: 511, response_tokens: 511}}\n"
        "train: {steps: STEPS, warmup_steps: 1, lr: 5.0e-6, max_length: 1024, precision: bf16, seed: 0}\n"
        "resources: {workers_per_trial: 1, use_gpu: auto}\n"
        "search: {micro_batch: [8], checkpoint_level: [none], grad_acc: [1], beta: BETAS}\n",
        "Llama-3.2-1B shape, bf16, micro_batch 8, 1024 tokens",
    ),
}

PROGRESS = re.compile(r"^\[(\d+)/(\d+)\] (\S+)\s+(\S+)\s")
WORKER = re.compile(r"\[(\S+)\] worker loop started ([\d.]+) s after the trial, trainer imported in ([\d.]+) s")
MARK = re.compile(r"\[(\S+)\] (data|model)\b.*\[([\d.]+) s\]\s*$")
TODO = re.compile(r"^\d+ (trial|configuration)\(s\) to run")


@dataclass
class TrialTiming:
    trial_id: str
    status: str
    wall_s: float
    ray_s: float
    import_s: float
    data_s: float
    model_s: float
    startup_s: float
    measure_s: float
    rest_s: float


def write_space(path: Path, model: str, trials: int, steps: int) -> None:
    body, _ = MODELS[model]
    betas = "[" + ", ".join(f"{0.1 + 0.01 * i:.2f}" for i in range(trials)) + "]"
    path.write_text(f"# benchmarks/sweep_overhead.py: {trials} trials of equal cost\nname: overhead\n"
                    + body.replace("STEPS", str(steps)).replace("BETAS", betas)
                    + "objectives: {memory: min, throughput: max, loss_std: min}\n")


def run_timed(cmd: list[str], log: Path, env_extra: dict[str, str] | None = None) -> list[tuple[float, str]]:
    """Run ``cmd`` with stdout+stderr merged; every line with seconds since the start."""
    lines: list[tuple[float, str]] = []
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          cwd=REPO_ROOT, env=env) as proc, log.open("w") as fh:
        assert proc.stdout is not None
        for line in proc.stdout:
            t = time.monotonic() - t0
            lines.append((t, line.rstrip("\n")))
            fh.write(f"{t:8.2f} {line}")
            fh.flush()
            print(line, end="", flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"dpo-sweep run exited {proc.returncode}; see {log}")
    return lines


def worker_lines(sweep_dir: Path) -> list[tuple[float, str]]:
    """Rank 0's lines from the sweep's per-trial logs (DIR/logs/<trial>.log, not on the console);
    untimed: :func:`timings` reads their numbers, not when they came."""
    return [(math.nan, line) for log in sorted((sweep_dir / "logs").glob("*.log"))
            for line in log.read_text(errors="replace").splitlines()]


def _strip(line: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", line)


def timings(lines: list[tuple[float, str]], results: list[dict[str, str]]) -> list[TrialTiming]:
    """Per-trial timings from the timestamped console lines and the results.csv rows."""
    start = next((t for t, line in lines if TODO.search(_strip(line))), 0.0)
    worker: dict[str, tuple[float, float]] = {}
    marks: dict[tuple[str, str], float] = {}
    done: list[tuple[float, str, str]] = []
    for t, raw in lines:
        line = _strip(raw)
        if m := WORKER.search(line):
            worker[m[1]] = (float(m[2]), float(m[3]))
        elif m := MARK.search(line):
            marks[(m[1], m[2])] = float(m[3])
        elif m := PROGRESS.match(line):
            done.append((t, m[3], m[4]))
    rows = {r["trial_id"]: r for r in results}
    out: list[TrialTiming] = []
    previous = start
    nan = float("nan")
    for t, tid, status in done:
        r = rows.get(tid, {})
        startup, measure = float(r.get("startup_s") or nan), float(r.get("measure_s") or nan)
        ray_s, import_s = worker.get(tid, (nan, nan))
        out.append(TrialTiming(tid, status, t - previous, ray_s, import_s, marks.get((tid, "data"), nan),
                               marks.get((tid, "model"), nan), startup, measure,
                               (t - previous) - startup - measure))
        previous = t
    return out


def summarise(rows: list[TrialTiming]) -> dict[str, float]:
    """Medians over the trials after the first (the first also starts Tune's trial process)."""
    later = rows[1:] or rows
    return {f.name: statistics.median(getattr(r, f.name) for r in later)
            for f in fields(TrialTiming) if f.name not in ("trial_id", "status")}


def markdown(rows: list[TrialTiming], cmd: str, description: str, wall_s: float, machine: str = "") -> str:
    names = [f.name for f in fields(TrialTiming)]
    out = [f"# Sweep overhead: {description}", "",
           f"Command: `{cmd}`", "", *([f"Machine: {machine}", ""] if machine else []),
           f"{len(rows)} trials one at a time, sweep wall {wall_s:.1f} s (Ray start and the final "
           "report included). Seconds per trial; `rest_s` = wall - startup - measure.", "",
           "| " + " | ".join(names) + " |", "|" + " --- |" * len(names)]
    for r in rows:
        out.append("| " + " | ".join(v if isinstance(v, str) else f"{v:.1f}" for v in asdict(r).values()) + " |")
    med = summarise(rows)
    out.append("| median after the first | | " + " | ".join(f"{v:.1f}" for v in med.values()) + " |")
    return "\n".join(out) + "\n"


def first_row_s(lines: list[tuple[float, str]]) -> float:
    """When the first progress line came (seconds since the command's start): the sweep's fixed
    start-up (preflight, Ray, Tune, the first worker's imports) plus the first trial."""
    return next((t for t, line in lines if PROGRESS.match(_strip(line))), math.nan)


def training_share(steps: list[dict[str, str]], wall_s: float, first_row: float = math.nan) -> dict[str, float]:
    """What share of a sweep's wall time its optimizer steps took (see the module doc)."""
    train_s = sum(float(r["step_time_ms"]) for r in steps if r.get("step_time_ms") not in (None, "")) / 1e3
    trials = len({r["trial_id"] for r in steps})
    return {"wall_s": wall_s, "train_s": train_s, "share": train_s / wall_s if wall_s > 0 else math.nan,
            "ray_trials_with_steps": trials, "steps": len(steps), "first_row_s": first_row}


@dataclass
class TrialSpan:
    """One Ray trial of a ``--space`` run, in seconds since the command's start."""

    trial_id: str
    start_s: float
    end_s: float
    gap_s: float  # since the previous trial ended (the first: since the command started)


def trial_spans(sweep_dir: Path, started_at: float) -> list[TrialSpan]:
    """Every Ray trial's span from Tune's experiment state (see the module doc); ``started_at``:
    the command's start, as ``time.time()``."""
    spans: list[tuple[str, float, float]] = []
    for state in sorted(Path(sweep_dir, "ray").glob("*/experiment_state-*.json")):
        for trial_json, meta_json in json.loads(state.read_text())["trial_data"]:
            trial, meta = json.loads(trial_json), json.loads(meta_json)
            last = meta.get("last_result") or {}
            if meta.get("start_time") is None or "time_total_s" not in last:
                continue
            tid = trial["config"]["trial_id"]
            spans.append((tid, meta["start_time"] - started_at, meta["start_time"] - started_at + last["time_total_s"]))
    out, previous = [], 0.0
    for tid, start, end in sorted(spans, key=lambda s: s[1]):
        out.append(TrialSpan(tid, start, end, start - previous))
        previous = end
    return out


def timeline_summary(spans: list[TrialSpan], wall_s: float) -> dict[str, float]:
    """The wall time split: before the first trial, in trials, between them, after the last."""
    if not spans:
        return {}
    in_trials = sum(s.end_s - s.start_s for s in spans)
    return {"before_first_trial_s": spans[0].start_s, "in_trials_s": in_trials,
            "between_trials_s": sum(s.gap_s for s in spans[1:]), "after_last_trial_s": wall_s - spans[-1].end_s}


def trace_env(trace_dir: Path) -> dict[str, str]:
    """The environment that traces every process of the command into ``trace_dir``
    (benchmarks/process_trace/sitecustomize.py first on the path)."""
    path = [str(TRACE_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"DPO_TRACE_DIR": str(trace_dir), "PYTHONPATH": os.pathsep.join(path)}


def startup_table(marks: dict[str, float]) -> str:
    """``--trace``'s start-up milestones as a markdown table (seconds from the command's start)."""
    return to_markdown(list(marks), [[f"{v:.1f}" if math.isfinite(v) else "-" for v in marks.values()]])


def run_space(space: Path, out: Path, dashboard: bool, trace: bool = False) -> int:
    """``--space``: one user sweep, timed; the share of its wall time spent training."""
    out.mkdir(parents=True, exist_ok=True)
    name = space.stem
    with tempfile.TemporaryDirectory(prefix="sweep-share-") as sweep_dir:
        cmd = [sys.executable, "-m", "dpo_sweep", "run", str(space), "--output", sweep_dir,
               *([] if dashboard else ["--no-dashboard"])]
        trace_dir = Path(sweep_dir) / "trace"
        t0, started_at = time.monotonic(), time.time()
        lines = run_timed(cmd, out / f"{name}_console.log", trace_env(trace_dir) if trace else None)
        wall_s = time.monotonic() - t0
        for file in ("results.csv", "steps.csv", "environment.json"):
            shutil.copy(Path(sweep_dir) / file, out / f"{name}_{file}")
        shutil.copytree(Path(sweep_dir) / "logs", out / f"{name}_logs", dirs_exist_ok=True)  # the workers' lines
        spans = trial_spans(Path(sweep_dir), started_at)
        if trace:
            events = process_trace.read_events(trace_dir)
            marks = process_trace.startup_marks(events)
            process_trace.write_csv(events, out / f"{name}_trace.csv")
    with (out / f"{name}_timeline.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[f.name for f in fields(TrialSpan)])
        w.writeheader()
        w.writerows(asdict(s) for s in spans)
    split = timeline_summary(spans, wall_s)
    share = training_share(read_csv_rows(out / f"{name}_steps.csv"), wall_s, first_row_s(lines))
    with (out / f"{name}_share.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(share))
        w.writeheader()
        w.writerow(share)
    md = (f"# Training share of `dpo-sweep run {space}`\n\n"
          f"Command: `python benchmarks/sweep_overhead.py --space {space} --out {out}`\n\n"
          f"| wall_s | train_s | share | ray_trials_with_steps | steps | first_row_s |\n"
          f"| --- | --- | --- | --- | --- | --- |\n"
          f"| {share['wall_s']:.1f} | {share['train_s']:.1f} | {share['share']:.1%} | "
          f"{share['ray_trials_with_steps']} | {share['steps']} | {share['first_row_s']:.1f} |\n\n"
          "first_row_s: the command's start -> its first progress line (the fixed start-up and the "
          "first trial).\n")
    if split:
        md += (f"\nWhere the wall time went (Tune's trial spans, `{name}_timeline.csv`):\n\n"
               + to_markdown(list(split), [[f"{v:.1f}" for v in split.values()]]) + "\n"
               + to_markdown(["trial", "start_s", "end_s", "gap_s"],
                             [[s.trial_id, *(f"{v:.1f}" for v in (s.start_s, s.end_s, s.gap_s))] for s in spans]))
    if trace:
        md += (f"\nStart-up milestones (`--trace`: every process's events in `{name}_trace.csv`, "
               "benchmarks/process_trace/), seconds from the command's start:\n\n" + startup_table(marks) + "\n")
    (out / f"{name}_share.md").write_text(md)
    print("\n" + md)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny-llama")
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per trial")
    parser.add_argument("--out", type=Path, default=results_dir("sweep_overhead"))
    parser.add_argument("--dashboard", action="store_true", help="start Ray with its dashboard")
    parser.add_argument("--space", type=Path, help="run this space instead (planner on) and report the "
                        "share of the sweep's wall time spent in optimizer steps")
    parser.add_argument("--trace", action="store_true", help="with --space: trace every process of the "
                        "command (benchmarks/process_trace/): <name>_trace.csv and the start-up milestones")
    args = parser.parse_args(argv)
    if args.trace and args.space is None:
        parser.error("--trace needs --space")
    if args.space is not None:
        return run_space(args.space, args.out, args.dashboard, args.trace)
    if args.trials < 1 or args.steps < 2:
        parser.error("--trials must be at least 1 and --steps at least 2 (one warm-up step)")

    args.out.mkdir(parents=True, exist_ok=True)
    space = args.out / "space.yaml"
    write_space(space, args.model, args.trials, args.steps)
    with tempfile.TemporaryDirectory(prefix="sweep-overhead-") as sweep_dir:  # report.html is 5 MB
        # --full-grid: the trials differ only in beta, which the planner would measure once.
        cmd = [sys.executable, "-m", "dpo_sweep", "run", str(space), "--output", sweep_dir, "--full-grid",
               *([] if args.dashboard else ["--no-dashboard"])]
        t0 = time.monotonic()
        lines = run_timed(cmd, args.out / "console.log")
        wall_s = time.monotonic() - t0
        lines += worker_lines(Path(sweep_dir))
        for name in ("results.csv", "environment.json"):
            shutil.copy(Path(sweep_dir) / name, args.out / name)
    rows = timings(lines, read_csv_rows(args.out / "results.csv"))
    if len(rows) != args.trials:
        raise SystemExit(f"found {len(rows)} finished trials in the output, expected {args.trials}")

    with (args.out / "sweep_overhead.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[f.name for f in fields(TrialTiming)])
        w.writeheader()
        w.writerows(asdict(r) for r in rows)
    shown = "python benchmarks/sweep_overhead.py " + " ".join(argv if argv is not None else sys.argv[1:])
    env = json.loads((args.out / "environment.json").read_text())
    machine = (f"{env.get('gpu_count') or 0} x {env.get('gpu_name')}, " if env.get("gpu_name") else "no GPU, ") + (
        f"{env.get('cpu_count')} CPU cores, torch {env.get('torch')}, ray {env.get('ray')}, "
        f"transformers {env.get('transformers')}")
    md = markdown(rows, shown.strip(), MODELS[args.model][1], wall_s, machine)
    (args.out / "sweep_overhead.md").write_text(md)
    print("\n" + md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
