"""The sweep's Tune callback: each trial's reports collected into its summary and steps, handed to
the planner (:class:`~dpo_sweep.plan.schedule.SweepPlan`), and every results row the planner then
has ready appended to results.csv / steps.csv at once (a killed sweep keeps every finished row;
``--resume`` skips them), with its progress line."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ray import tune

from dpo_sweep.config import TrialConfig
from dpo_sweep.plan.schedule import SweepPlan
from dpo_sweep.records import TrialResult, write_results, write_steps
from dpo_sweep.sweep import driver
from dpo_sweep.sweep.output_dir import save_environment


def say(line: str) -> None:
    """Progress output of the sweep (flushed: the sweep's output is often piped to a log)."""
    print(line, flush=True)


def progress_line(index: int, total: int, result: TrialResult) -> str:
    def num(x: float, fmt: str) -> str:
        return format(x, fmt) if isinstance(x, (int, float)) and math.isfinite(x) else "-"

    line = (f"[{index}/{total}] {result.trial_id:<32} {result.status:<8} "
            f"peak {num(result.peak_mem_gb, '.2f')} GB  step {num(result.step_time_ms, '.0f')} ms  "
            f"startup {num(result.startup_s, '.1f')} s")
    if result.measured_by and result.measured_by != result.trial_id:
        line += f"  (measured by {result.measured_by})"
    if result.step_time_source == "extrapolated":
        line += "  (step time extrapolated)"
    if result.error:
        line += f"  | {result.error[:120]}"
    return line


class SweepRecorder(tune.Callback):
    """A Tune callback (driver process): collects each trial's reports, tells the plan when a
    trial ended, and appends the rows the plan has ready (:meth:`flush`; the planner's Searcher
    calls it too, for rows pruned before anything ran). Output goes through the module-level
    :func:`say` (a picklable reference: Tune pickles its callbacks with the experiment state)."""

    def __init__(self, out_dir: Path, plan: SweepPlan, total: int, already_done: int) -> None:
        self.out_dir = out_dir
        # The plan's jobs hold the configs the sweep already validated: a Tune trial's config
        # dict is only looked up here (by its trial id), never validated again.
        self.plan = plan
        self.total = total
        self.collector = driver.TrialCollector()
        self.finished = already_done
        self.ended: set[str] = set()
        self.crashed: list[str] = []
        self.worker_environment_written = False

    def _cfg(self, trial: Any) -> TrialConfig:
        return self.plan.job(trial.config["trial"]["trial_id"]).cfg

    def flush(self) -> None:
        steps, rows = self.plan.take_output()
        # Steps first: a kill between the two writes leaves orphan steps, which --resume drops.
        if steps:
            write_steps(self.out_dir, steps, append=True)
        if rows:
            write_results(self.out_dir, rows, append=True)
        for row in rows:
            self.finished += 1
            say(progress_line(self.finished, self.total, row))

    def _end(self, done: driver.CollectedTrial) -> None:
        job_id = done.result.trial_id
        if job_id in self.ended:
            return
        self.ended.add(job_id)
        if done.environment and not self.worker_environment_written:
            # The workers' machine, not the driver's: replaces the driver-side environment.json.
            save_environment(self.out_dir, say, done.environment)
            self.worker_environment_written = True
        self.plan.finish(job_id, done.result, done.steps)
        self.flush()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if trial.config["trial"]["trial_id"] in self.ended:
            return  # a report after the trial's last one: the plan no longer holds its job
        done = self.collector.add(trial.trial_id, self._cfg(trial), result)
        if done is not None:
            self._end(done)

    def on_trial_error(self, iteration, trials, trial, **info):
        job_id = trial.config["trial"]["trial_id"]
        if job_id in self.ended:
            return
        cfg = self._cfg(trial)
        self.crashed.append(cfg.trial_id)
        err = getattr(trial, "error_msg", None) or "the Tune trial process failed"
        self._end(self.collector.abandon(trial.trial_id, cfg, str(err)))
