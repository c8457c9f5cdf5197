"""The sweep's Tune callback, its record and its console: each trial's reports collected into its
summary and steps (the planner's Searcher hands them to the plan: :mod:`~dpo_sweep.sweep.planner`),
then every results row the plan has ready appended to results.csv / steps.csv at once (a killed
sweep keeps every finished row; ``--resume`` skips them), with its progress line (the sweep's
elapsed time and the estimate of what is left: :mod:`~dpo_sweep.sweep.estimate`); a heartbeat
while trials run, and the end of trials past their time limit (:mod:`~dpo_sweep.sweep.stopping`)."""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import ray
from ray import tune

from dpo_sweep.config import TrialConfig
from dpo_sweep.core.status import Status, TimeSource
from dpo_sweep.errors import os_error_line
from dpo_sweep.files import unwritable
from dpo_sweep.plan.jobs import Job
from dpo_sweep.plan.schedule import SweepPlan
from dpo_sweep.records import TrialResult, replace_results, write_results, write_steps
from dpo_sweep.results_dir import ResultsDir
from dpo_sweep.sweep.collector import CollectedTrial, TrialCollector
from dpo_sweep.sweep.console import say
from dpo_sweep.sweep.early_stop import EarlyStop
from dpo_sweep.sweep.estimate import TrialPricing
from dpo_sweep.sweep.output_dir import save_environment
from dpo_sweep.sweep.task import trial_id_of
from dpo_sweep.sweep.stopping import (DEFAULT_TRIAL_TIMEOUT_FLOOR_S, ENDED_BY_SWEEP, TIMEOUT_FACTOR, StopRequest,
                                      trial_timeout_s)


def widened_line(path: str | Path, added: list[str]) -> str:
    """The console's note that appending widened ``path``'s header."""
    return (f"{path}: its header lacked {len(added)} column(s) of this version ({', '.join(added)}); "
            "rewrote it with every column of both, earlier rows empty in the new ones")


def duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``1 h 02 min``; ``?`` when unknown."""
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _num(x: float, fmt: str) -> str:
    return format(x, fmt) if isinstance(x, (int, float)) and math.isfinite(x) else "-"


def _peak_and_step(result: TrialResult) -> str:
    """Peak and step time, then throughput: the frontier's time objective is tokens/s."""
    line = f"peak {_num(result.peak_mem_gb, '.2f')} GB  step {_num(result.step_time_ms, '.0f')} ms"
    return line + (f"  {_num(result.tokens_per_s, ',.0f')} tok/s" if math.isfinite(result.tokens_per_s) else "")


#: Characters of a trial's error on its console line; the whole text (a CUDA OOM message with its
#: traceback) is in DIR/logs/<trial>.log and results.csv.
CONSOLE_ERROR_CHARS = 100
#: Seconds without a console line while trials run after which the sweep says what is running.
HEARTBEAT_S = 30.0


def console_error(error: str) -> str:
    """The first line of ``error``, cut to CONSOLE_ERROR_CHARS (``...`` marks a cut)."""
    first = error.strip().split("\n", 1)[0].strip()
    return first if len(first) <= CONSOLE_ERROR_CHARS else first[:CONSOLE_ERROR_CHARS - 3].rstrip() + "..."


def running_line(running: Sequence[tuple[str, float]], elapsed_s: float, left_s: float = math.nan) -> str:
    """``  running: t003 (1 min 05 s), t004 (12 s) | 2 min 10 s elapsed, ~3 min 20 s left``: what a
    quiet sweep is doing (the estimate when known)."""
    named = ", ".join(f"{trial_id} ({duration(s)})" for trial_id, s in running)
    return f"  running: {named} | {duration(elapsed_s)} elapsed" + (
        f", ~{duration(left_s)} left" if math.isfinite(left_s) else "")


def progress_line(index: int, total: int, result: TrialResult, elapsed_s: float = math.nan,
                  left_s: float = math.nan) -> str:
    line = (f"[{index}/{total}] {result.trial_id:<32} {result.status:<8} "
            f"{_peak_and_step(result)}  startup {_num(result.startup_s, '.1f')} s")
    if result.measured_by and result.measured_by != result.trial_id:
        line += f"  (measured by {result.measured_by})"
    if result.step_time_source == TimeSource.EXTRAPOLATED:
        line += "  (step time extrapolated)"
    if math.isfinite(elapsed_s):
        line += f"  | {duration(elapsed_s)} elapsed, ~{duration(left_s)} left"
    if result.error:
        line += f"  | {console_error(result.error)}"
    return line


def trial_line(job_id: str, kind: str, grad_acc: int, result: TrialResult, elapsed_s: float,
               left_s: float = math.nan) -> str:
    """``  trial t000 (measure, grad_acc 2) ok  peak 17.71 GB  step 380 ms | 25 s elapsed, ~1 min 10 s
    left``: a Ray trial that ended without a results row of its own yet (the estimate when known)."""
    line = (f"  trial {job_id} ({kind}, grad_acc {grad_acc}) {result.status}  {_peak_and_step(result)}  "
            f"| {duration(elapsed_s)} elapsed" + (f", ~{duration(left_s)} left" if math.isfinite(left_s) else ""))
    return line + (f"  | {console_error(result.error)}" if result.error else "")


def stability_lines(rows: Sequence[TrialResult]) -> list[str]:
    """``  stability of t000, t001 from t002-learning: stable, noisy``: rows written when measured
    whose learning trial has now ended (rows re-timed by a runoff say so in the runoff's note)."""
    by_source: dict[str, list[TrialResult]] = {}
    for r in rows:
        if r.stability_from:
            by_source.setdefault(r.stability_from, []).append(r)
    return [f"  stability of {', '.join(r.trial_id for r in group)} from {source}: "
            f"{', '.join(dict.fromkeys(r.stability or r.status for r in group))}"
            for source, group in by_source.items()]


def end_running_trials(trials: Iterable[Any]) -> None:
    """Kill the process of every running trial, now. Tune's own stop asks the trial to stop and
    then gives it 10 s (a constant of its controller) before it kills it, while our trial sits in
    ``fit()``; killing its process ends its Train controller and workers too (Ray ends the actors
    an actor owns with it)."""
    for trial in trials:
        actor = getattr(trial.temporary_state, "ray_actor", None)
        if trial.status == "RUNNING" and actor is not None:
            ENDED_BY_SWEEP.add(str(trial))  # Tune's report of its death is ours to say (stopping.py)
            ray.kill(actor, no_restart=True)


class SweepRecorder(tune.Callback):
    """A Tune callback (driver process): collects each trial's reports (:meth:`outcome`: what the
    planner's Searcher hands the plan), and once a trial ended appends the rows the plan has ready
    (:meth:`flush`; the Searcher calls it too, for rows pruned before anything ran) and says them.
    Output goes through the module-level :func:`say` (a picklable reference: Tune pickles its
    callbacks with the experiment state)."""

    def __init__(self, out_dir: Path, plan: SweepPlan, total: int, already_done: int,
                 stop: StopRequest | None = None, concurrent: int = 1,
                 timeout_floor_s: float = DEFAULT_TRIAL_TIMEOUT_FLOOR_S, pool_name: str | None = None,
                 on_rows: Callable[[], None] | None = None) -> None:
        self.out_dir = out_dir
        # The plan's jobs hold the configs the sweep already validated: a Tune trial's config
        # dict is only looked up here (by its trial id), never validated again.
        self.plan = plan
        self.total = total
        self.collector = TrialCollector()
        self.finished = already_done
        self.ended: set[str] = set()
        self.crashed: list[str] = []
        self.timeouts: list[str] = []  # job ids ended past their time limit (their rows: timeout)
        self.worker_environment_written = False
        self.stop = stop if stop is not None else StopRequest()
        self.concurrent = concurrent
        self.started_at = time.monotonic()
        self.last_said = self.started_at  # when the last progress line was printed (heartbeat)
        #: The ETA's feed: the Searcher's end hook prices each ended trial (estimate.py).
        self.pricing = TrialPricing(concurrent)
        self.estimate = self.pricing.estimate
        self.trial_started = self.pricing.started  # job id -> when its Tune trial started
        self.timeout_floor_s = timeout_floor_s
        self.pool_name = pool_name  # the warm workers' pool: a timed-out trial's worker is replaced
        self.timed_out: dict[str, str] = {}  # job id -> why it was ended (its row's error)
        self.early_stop: EarlyStop | None = None  # search.scheduler's, which stops learning trials at rungs
        self._reported: dict[str, CollectedTrial] = {}  # Tune trial id -> its reports, to its end
        self._ending: dict[str, tuple[Job, CollectedTrial]] = {}  # the plan knows; to write and say
        self.on_rows = on_rows  # after rows are written: the live report (commands/run.py)

    def _cfg(self, trial: Any) -> TrialConfig:
        return self.plan.job(trial_id_of(trial.config)).cfg

    def flush(self) -> list[TrialResult]:
        """Write what the plan has ready and say it; the rows written."""
        for note in self.plan.take_notes():  # e.g. a learning trial that falls back to the space's precision
            say(note)
        steps, rows = self.plan.take_output()
        replaced = self.plan.take_replaced()  # their stability, or a runoff's time, came after them
        if self.stop.write_error is not None:
            return []  # the disk failed before: nothing more is written, the sweep is stopping
        try:
            # Steps first: a kill between the two writes leaves orphan steps, which --resume drops.
            if steps and (added := write_steps(self.out_dir, steps, append=True)):
                say(widened_line(ResultsDir(self.out_dir).steps, added))
            if rows and (added := write_results(self.out_dir, rows, append=True)):
                say(widened_line(ResultsDir(self.out_dir).results, added))  # --resume into an older results.csv
            if replaced:
                replace_results(self.out_dir, replaced)
        except OSError as err:  # a full disk, a read-only folder: the files stay whole (records.py); stop
            self.stop.write_error = os_error_line(err)
            self.stop.reason = self.stop.reason or self.stop.write_error
            return []
        for line in stability_lines(replaced):
            say(line)
        left = self.left_s()  # once per flush: the rows of one flush are all done
        # The rows that ran first: a row pruned for the memory of a trial of the same flush (it ran
        # out) follows that trial's own line. results.csv keeps the plan's order.
        for row in sorted(rows, key=lambda r: r.status == Status.PRUNED):
            self.finished += 1
            say(progress_line(self.finished, self.total, row, time.monotonic() - self.started_at, left))
        if rows:
            self.last_said = time.monotonic()
        if (rows or replaced) and self.on_rows is not None:
            self.on_rows()
        return rows

    def left_s(self) -> float:
        """The estimate of what is left (:mod:`~dpo_sweep.sweep.estimate`): the trials the plan
        has still to start and the running ones, less what these ran. A job the plan has handed
        out that Tune has not started yet counts whole (it is no longer due; leaving it out made
        the ETA drop by a learning trial between the last measurement and that trial's start)."""
        now, running = time.monotonic(), self.plan.running_due()
        ran = [(due, now - self.trial_started.get(jid, now)) for jid, due in running.items()]
        return self.estimate.left_s(self.plan.trials_due(), ran, self.concurrent)

    def outcome(self, tune_id: str, job: Job, error: bool) -> CollectedTrial | None:
        """What the Tune trial ``tune_id`` of ``job`` ended with, as the planner's Searcher asks when
        Tune ends it (``error``: its process failed): its reports to the last one, else a row for a
        process that died (``timeout`` when :meth:`end_overdue` ended it); None when a stop ended it
        before its end (not run, not failed)."""
        done = self._reported.pop(tune_id, None)
        if done is None and not error and self.early_stop is not None:
            if (step := self.early_stop.stopped_at(tune_id)) is not None:  # its scheduler ended it at a rung
                done = self.collector.stopped(tune_id, job.cfg, step, self.early_stop.rule(step))
        if done is None and error and self.stop.reason is None:
            if job.job_id in self.timed_out:
                self.timeouts.append(job.job_id)
                done = self.collector.abandon(tune_id, job.cfg, self.timed_out[job.job_id], status=Status.TIMEOUT)
            else:
                self.crashed.append(job.job_id)
                done = self.collector.abandon(tune_id, job.cfg, "the Tune trial process failed")
        if done is None:
            return None
        self.ended.add(job.job_id)
        self._ending[tune_id] = (job, done)
        return done

    def _record_end(self, tune_id: str) -> None:
        """After the plan learnt the trial's outcome: the rows it has ready, written and said."""
        if (ending := self._ending.pop(tune_id, None)) is None:
            return
        job, done = ending
        if done.environment and not self.worker_environment_written:
            # The workers' machine, not the driver's: replaces the driver-side environment.json.
            save_environment(self.out_dir, say, done.environment)
            self.worker_environment_written = True
        if job.job_id not in {row.trial_id for row in self.flush()}:
            # Its rows come later (they wait for their learning trial) or it has none (a learning or
            # runoff trial): say it ended, so that minutes of measuring are not minutes of silence.
            r = done.result
            say(trial_line(job.job_id, job.kind, job.cfg.grad_acc, r, time.monotonic() - self.started_at, self.left_s()))
            self.last_said = time.monotonic()

    def on_step_begin(self, iteration, trials, **info):
        if self.stop.reason is not None:
            end_running_trials(trials)
            self.stop.trials_ended = True
            return
        if problem := unwritable(self.out_dir):
            # Before Ray Tune's own state files fail on it (with tracebacks and a lost cause):
            # the sweep stops as on Ctrl-C at the next turn, its rows on disk whole.
            self.stop.write_error = problem
            self.stop.reason = problem
            return
        now = time.monotonic()
        self.end_overdue(trials, now)
        self.heartbeat(now)

    def limit_s(self, job_id: str) -> float:
        """How long the running job may take (stopping.trial_timeout_s of the estimate of it)."""
        due = self.plan.running_due().get(job_id)
        return trial_timeout_s(self.estimate.trial_s(due) if due is not None else math.nan, self.timeout_floor_s)

    def end_overdue(self, trials: Iterable[Any], now: float) -> None:
        """End every running trial past its limit (a hung or stopped worker would hold the sweep
        for ever, its ETA frozen): its process is killed, its warm worker replaced, and Tune's
        report of the dead trial becomes a ``timeout`` row (:meth:`outcome`)."""
        for trial in trials:
            job_id = trial_id_of(trial.config)
            started = self.trial_started.get(job_id)
            if trial.status != "RUNNING" or started is None or job_id in self.timed_out:
                continue
            limit = self.limit_s(job_id)
            if now - started <= limit:
                continue
            self.timed_out[job_id] = (f"no end after {duration(now - started)}, past its limit of {duration(limit)} "
                                      f"(--trial-timeout-s, or {TIMEOUT_FACTOR:g}x the estimate of the trial): ended")
            say(f"  trial {job_id}: {self.timed_out[job_id]}; --resume runs it again")
            self.last_said = now
            if self.pool_name:
                ray.get_actor(self.pool_name).abandon.remote(job_id)
            end_running_trials([trial])

    def heartbeat(self, now: float) -> None:
        """After HEARTBEAT_S without a line while trials run: which are running and for how long."""
        if now - self.last_said < HEARTBEAT_S or not self.trial_started:
            return
        running = sorted(((t, now - started) for t, started in self.trial_started.items()), key=lambda x: -x[1])
        say(running_line(running, now - self.started_at, self.left_s()))
        self.last_said = now

    def on_trial_start(self, iteration, trials, trial, **info):
        self.trial_started[trial_id_of(trial.config)] = time.monotonic()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if trial_id_of(trial.config) in self.ended or trial.trial_id in self._reported:
            return  # a report after the trial's last one: the plan no longer holds its job
        done = self.collector.add(trial.trial_id, self._cfg(trial), result)
        if done is not None:  # its last report: the plan learns it when Tune ends the trial
            self._reported[trial.trial_id] = done

    # Tune calls these after the Searcher's on_trial_complete (planner.py): the plan knows the trial.
    def on_trial_complete(self, iteration, trials, trial, **info):
        self._record_end(trial.trial_id)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._record_end(trial.trial_id)
