"""``dpo-sweep trial``: one configuration, in this process, without Ray.

Run from a sweep's folder (``dpo-sweep trial recommended.yaml`` there, as the report says), it
writes beside the space file, not under a ``reports/`` of that folder, and prints the sweep's own
numbers for the same configuration (from that folder's results.csv) next to its own.

A results folder has one writer: ``trial`` holds the folder's lock (:mod:`~dpo_sweep.sweep.folder_lock`)
on its ``--output`` while it checks, trains and writes, and refuses (exit 2) an ``--output`` that
holds a sweep's rows, which its results.csv and steps.csv would replace.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path
from typing import Any

from dpo_sweep import preflight
from dpo_sweep import space as space_mod
from dpo_sweep.config import TrialConfig
from dpo_sweep.core import trial_facts
from dpo_sweep.core.dimensions import RESOURCE_COLUMNS
from dpo_sweep.core.status import Status
from dpo_sweep.errors import UserError
from dpo_sweep.records import TrialResult, read_csv_rows, write_results, write_steps
from dpo_sweep.results_dir import ResultsDir
from dpo_sweep.sweep.folder_lock import FolderLock

#: The sweep's columns a trial's own figures are put beside: (column, label, format).
_COMPARED = (("peak_mem_gb", "peak memory", "{:.3f} GB"), ("step_time_ms", "step time", "{:,.0f} ms"),
             ("tokens_per_s", "throughput", "{:,.0f} tokens/s"), ("loss_std", "loss std", "{:.4g}"))


def default_output(space_path: Path, name: str) -> Path:
    """``<sweep folder>/<name>-trial/`` for a space file in a sweep's results folder (its
    recommended.yaml or space.yaml); else ``reports/<name>-trial/``."""
    folder = space_path.resolve().parent
    if ResultsDir(folder).results.is_file():
        return space_path.parent / f"{name}-trial"
    return Path("reports") / f"{name}-trial"


def refuse_a_sweeps_folder(out: Path, name: str) -> None:
    """UserError (exit 2) when ``out`` holds a sweep's rows: its space.yaml or logs/ beside a
    results.csv with rows, or more rows than one trial writes."""
    files = ResultsDir(out)
    rows = read_csv_rows(files.results)
    if rows and (len(rows) > 1 or files.space.is_file() or files.logs.is_dir()):
        raise UserError(
            f"--output {out} holds a sweep's rows ({len(rows)} in {files.results}), which this trial's "
            f"{ResultsDir.RESULTS} and {ResultsDir.STEPS} would replace; give another --output, "
            f"e.g. --output {out / f'{name}-trial'} "
            "(without --output, a trial of a space file in a sweep's folder writes to such a sub-folder)")


def _same(value: str, wanted: Any) -> bool:
    try:
        return math.isclose(float(value), float(wanted), rel_tol=1e-9)
    except (TypeError, ValueError):
        return str(value) == str(wanted)


def sweep_row(space_path: Path, cfg: TrialConfig) -> dict[str, str] | None:
    """The row of the space file's sweep folder's results.csv with ``cfg``'s settings (knobs and
    swept train fields; an empty lever cell is the default), None when there is none."""
    results = ResultsDir(space_path.resolve().parent).results
    if not results.is_file():
        return None
    # The resources and effective_batch follow the sweep folder's space (rows of before them lack them).
    wanted = {**{k: v for k, v in cfg.knobs().items() if k not in (*RESOURCE_COLUMNS, "effective_batch")},
              **cfg.swept_columns(), "adapter": cfg.train.adapter, "optimizer": cfg.train.optimizer}
    defaults = {"adapter": "full", "optimizer": "adamw"}
    with results.open(newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            if all(_same(row.get(k) or defaults.get(k, ""), v) for k, v in wanted.items() if k in row):
                return row
    return None


def comparison_lines(row: dict[str, str], r: TrialResult) -> list[str]:
    """The sweep's figures for this configuration beside this run's."""
    lines = [f"the sweep's row for this configuration ({row.get('trial_id')}, status {row.get('status')}) "
             "beside this run:"]
    for column, label, fmt in _COMPARED:
        try:
            theirs = float(row.get(column) or "nan")
        except ValueError:
            theirs = math.nan
        ours = float(getattr(r, column))
        show = (lambda v: "-" if not math.isfinite(v) else fmt.format(v))
        change = f" ({100 * (ours - theirs) / theirs:+.1f}%)" if math.isfinite(ours) and math.isfinite(theirs) and theirs else ""
        lines.append(f"  {label}: sweep {show(theirs)}, this run {show(ours)}{change}")
    return lines


def cmd_trial(args: argparse.Namespace) -> int:
    sp = space_mod.load(args.space, args.overrides)
    # One process is one rank: a trial of several workers runs simulated here unless told otherwise.
    cfg = trial_facts.resolve_simulation(sp.trials[0], cluster_gpus=1, use_gpu=True)
    if trial_facts.ranks_simulated(cfg) and sp.trials[0].resources.simulate_ranks == "auto":
        print(f"resources.simulate_ranks auto: this process is one device, so the trial's "
              f"{cfg.resources.workers_per_trial} workers run as rank 0 alone through the fake process group "
              "(ranks_simulated; its step time modelled)", flush=True)
    out = Path(args.output) if args.output else default_output(Path(args.space), sp.name)
    preflight.check_output_dir(out)  # a file given as the folder: said before the lock makes it
    with FolderLock(out):  # exit 2 while a sweep (or another trial) writes there
        refuse_a_sweeps_folder(out, sp.name)
        return _trial(args, cfg, out)


def _trial(args: argparse.Namespace, cfg: TrialConfig, out: Path) -> int:
    preflight.check_trial(cfg, out)  # before the training, so that its result cannot be lost
    knobs = ", ".join(f"{k}={v}" for k, v in {**cfg.knobs(), **cfg.swept_columns()}.items())
    print(f"trial {cfg.trial_id}: {knobs}", flush=True)

    from dpo_sweep.train.faults import fault_for, fault_rules
    from dpo_sweep.train.loop import run_trial

    outcome = run_trial(cfg, log=lambda m: print(m, flush=True), fault=fault_for(fault_rules(), cfg))
    write_results(out, [outcome.result])
    write_steps(out, outcome.steps)
    r = outcome.result
    if r.status == Status.OK:
        print(f"done: peak memory {r.peak_mem_gb:.3f} GB ({r.mem_source}), step time {r.step_time_ms:.0f} ms "
              f"(median of {r.measured_steps}), {r.tokens_per_s:,.0f} tokens/s, loss std "
              f"{r.loss_std:.4g}" + ("" if math.isnan(r.mfu) else f", MFU {r.mfu:.1%}"))
        print(f"stability: {r.stability or 'no verdict (fewer than 5 steps)'} (loss slope {r.loss_slope:+.4g}/step, "
              f"spread {r.loss_spread:.4g}, grad-norm spike {r.grad_norm_spike:.3g}x, log-ratio std max "
              f"{r.logratio_std_max:.3g}" + (f", rollback trigger at step {r.rollback_step}" if r.rollback_step else "")
              + f"), eval_loss {r.eval_loss:.4g}")
        row = sweep_row(Path(args.space), cfg)
        if row is not None:
            print("\n".join(comparison_lines(row, r)))
    else:
        print(f"done: status {r.status}: {r.error}", file=sys.stderr)
    print(f"wrote {ResultsDir(out).results} and {ResultsDir(out).steps}")
    return 0 if r.status in (Status.OK, Status.OOM, Status.DIVERGED) else 1
