"""The sweep's Tune callback: each trial's rows appended to results.csv / steps.csv the moment it
finishes (a killed sweep keeps every finished trial; ``--resume`` skips them), and its progress line."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

from ray import tune

from dpo_sweep.config import TrialConfig
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
    if result.error:
        line += f"  | {result.error[:120]}"
    return line


class SweepRecorder(tune.Callback):
    """A Tune callback (driver process) that appends each finished trial to the CSVs and prints
    its progress line. Output goes through the module-level :func:`say` (a picklable reference:
    Tune pickles its callbacks with the experiment state)."""

    def __init__(self, out_dir: Path, configs: Iterable[TrialConfig], total: int, already_done: int) -> None:
        self.out_dir = out_dir
        # The configs the sweep already validated, by trial id: a Tune trial's config dict is
        # only looked up here, never validated again.
        self.configs = {c.trial_id: c for c in configs}
        self.total = total
        self.collector = driver.TrialCollector()
        self.finished = already_done
        self.written: set[str] = set()
        self.crashed: list[str] = []
        self.worker_environment_written = False

    def _cfg(self, trial: Any) -> TrialConfig:
        return self.configs[trial.config["trial"]["trial_id"]]

    def _write(self, done: driver.CollectedTrial) -> None:
        if done.result.trial_id in self.written:
            return
        self.written.add(done.result.trial_id)
        # Steps first: a kill between the two writes leaves orphan steps, which --resume drops.
        write_steps(self.out_dir, done.steps, append=True)
        write_results(self.out_dir, [done.result], append=True)
        if done.environment and not self.worker_environment_written:
            # The workers' machine, not the driver's: replaces the driver-side environment.json.
            save_environment(self.out_dir, say, done.environment)
            self.worker_environment_written = True
        self.finished += 1
        say(progress_line(self.finished, self.total, done.result))

    def on_trial_result(self, iteration, trials, trial, result, **info):
        done = self.collector.add(trial.trial_id, self._cfg(trial), result)
        if done is not None:
            self._write(done)

    def on_trial_error(self, iteration, trials, trial, **info):
        cfg = self._cfg(trial)
        if cfg.trial_id in self.written:
            return
        self.crashed.append(cfg.trial_id)
        err = getattr(trial, "error_msg", None) or "the Tune trial process failed"
        self._write(self.collector.abandon(trial.trial_id, cfg, str(err)))
