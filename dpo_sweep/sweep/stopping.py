"""Ending a sweep before its last trial: Ctrl-C, and a failure that every trial meets the same way.

Both go through one :class:`StopRequest`, read by Tune through :class:`SweepStopper` once per turn
of its loop (every 0.1 s): Tune then schedules nothing more and stops the running trials (whose
trial processes own the Train controllers, which own the workers: they end with them). Tune's own
SIGINT handler is switched off for the sweep (``TUNE_DISABLE_SIGINT_HANDLER``): it let the next
trial start, waited for a last experiment checkpoint and printed ``Tuner.restore(...)`` advice, the
wrong way to continue a dpo-sweep (``--resume`` is). A second Ctrl-C is Python's default again.
"""
from __future__ import annotations

import logging
import re
import shlex
import signal
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

from ray import tune

from dpo_sweep.core.status import Status
from dpo_sweep.plan.jobs import Job
from dpo_sweep.sweep.collector import CollectedTrial
from dpo_sweep.sweep.signals import STOP_SIGNALS

#: Trials that must all fail the same way before their first step to end the sweep (or every
#: trial, when the sweep has fewer). Two: one failure can be the trial's own; the second with the
#: same cause says the cause is the sweep's (the model, the data, the machine).
EARLY_FAILURE_TRIALS = 2

INTERRUPTED = "interrupted"

#: A trial may run this many times the sweep's estimate of it (sweep/estimate.py) before it is
#: ended as ``timeout``; never less than the floor (``--trial-timeout-s``), which alone applies while
#: no trial has ended to price it (the first trial pays the imports and the first model load).
TIMEOUT_FACTOR = 4.0
DEFAULT_TRIAL_TIMEOUT_FLOOR_S = 900.0


def trial_timeout_s(estimate_s: float, floor_s: float = DEFAULT_TRIAL_TIMEOUT_FLOOR_S) -> float:
    """How long a trial estimated at ``estimate_s`` (NaN: unknown) may run; ``floor_s`` <= 0: for ever."""
    if floor_s <= 0:
        return float("inf")
    return max(floor_s, TIMEOUT_FACTOR * estimate_s) if estimate_s == estimate_s else floor_s

#: Tune's driver-side loggers that report the trials we kill on a stop as failed ("Trial task
#: failed ... ActorDiedError" with its traceback, "Trials did not complete"), and its experiment
#: state's save, whose traceback a full disk (the stop's own cause, said in one line) would print.
TUNE_TRIAL_LOGGERS = ("ray.tune.execution.tune_controller", "ray.tune.tune", "ray.tune.execution.experiment_state")


@dataclass
class StopRequest:
    """Why the sweep should stop now; None while it should go on. Set by the SIGINT handler
    (:data:`INTERRUPTED`), by :class:`SameFailureStop` (a failure's cause) or by the recorder (a
    results file that cannot be written). Plain data: Tune pickles its
    stopper and callbacks with the experiment state."""

    reason: str | None = None
    trials_ended: bool = False  # the recorder killed the running trials (Tune's stop may go on)
    signum: int = signal.SIGINT  # the stop signal that interrupted it (signals.STOP_SIGNALS)
    write_error: str | None = None  # a results file could not be written (a full disk): the sweep stops

    @property
    def interrupted(self) -> bool:
        return self.reason == INTERRUPTED


class SweepStopper(tune.Stopper):
    """Stops the whole experiment once its :class:`StopRequest` has a reason; never one trial."""

    def __init__(self, request: StopRequest) -> None:
        self.request = request

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def stop_all(self) -> bool:
        # Only once the running trials were killed: a running trial that Tune stops itself gets
        # 10 s to end on its own, and ours sit in fit() for all of them.
        return self.request.reason is not None and self.request.trials_ended


#: The Tune trials (``str(trial)``, the name Tune's logs give) whose process this sweep killed: on
#: a stop, or past its time limit (recorder.end_running_trials). Module-level: the driver's
#: loggers read it, and Tune pickles the callbacks that write it.
ENDED_BY_SWEEP: set[str] = set()


class _QuietOnceStopping(logging.Filter):
    def __init__(self, request: StopRequest) -> None:
        super().__init__()
        self.request = request

    def filter(self, record: logging.LogRecord) -> bool:
        if self.request.reason is not None:
            return False
        message = record.getMessage()
        return not any(name in message for name in ENDED_BY_SWEEP)


@contextmanager
def quiet_tune_once_stopping(request: StopRequest) -> Iterator[None]:
    """Within the block, Tune's trial-failure logs are dropped once ``request`` has a reason (the
    trials it would name are the ones the stop ended), and those that name a trial the sweep
    killed past its time limit: the sweep's own lines say what happened (one line each, and the
    last line counts them), not Ray's traceback of the ``ray.kill``."""
    quiet = _QuietOnceStopping(request)
    loggers = [logging.getLogger(name) for name in TUNE_TRIAL_LOGGERS]
    for lg in loggers:
        lg.addFilter(quiet)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(quiet)


@contextmanager
def stop_on_sigint(request: StopRequest) -> Iterator[None]:
    """Within the block the first stop signal (SIGINT, SIGTERM or SIGHUP: signals.STOP_SIGNALS)
    sets ``request`` (the sweep stops at Tune's next turn) and gives the signals back to the
    handlers they had, so a second one interrupts at once."""
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}

    def on_stop(signum: int, frame: object) -> None:
        request.reason, request.signum = INTERRUPTED, signum
        for s, handler in previous.items():
            signal.signal(s, handler)

    for s in STOP_SIGNALS:
        signal.signal(s, on_stop)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def normalise_cause(error: str, trial_id: str = "") -> str:
    """An error text with what differs from trial to trial taken out (its trial id, numbers such
    as ranks, pids, addresses and sizes), so that two trials' failures compare by their cause."""
    text = error.replace(trial_id, "<trial>") if trial_id else error
    text = re.sub(r"0x[0-9a-fA-F]+", "<n>", text)
    text = re.sub(r"\d+(\.\d+)?", "<n>", text)
    return " ".join(text.split())


@dataclass(frozen=True)
class Ending:
    """A finished trial as the early stop sees it."""

    trial_id: str
    status: str
    steps: int
    error: str


def same_early_failure(endings: Sequence[Ending], todo: int,
                       window: int = EARLY_FAILURE_TRIALS) -> str | None:
    """The first trial's error when the first ``window`` trials of this run to finish (every trial
    when there are fewer: ``todo``) all ended ``error`` before their first step with the same
    normalised cause; else None (also while fewer than that have finished)."""
    need = min(window, todo)
    first = list(endings[:need])
    if need < 1 or len(first) < need:
        return None
    if any(e.status != Status.ERROR or e.steps > 0 for e in first):
        return None
    causes = {normalise_cause(e.error, e.trial_id) for e in first}
    return first[0].error if len(causes) == 1 else None


class SameFailureStop:
    """Asks ``request`` to stop the sweep when its first trials all failed the same way before
    their first step (:func:`same_early_failure`; ``total``: the sweep's trials): an end hook of
    the planner's Searcher, which calls :meth:`trial_ended` once the plan knows each trial's outcome."""

    def __init__(self, request: StopRequest, total: int) -> None:
        self.request = request
        self.total = total
        self.endings: list[Ending] = []  # this run's ended Ray trials, in the order they ended

    def trial_ended(self, job: Job, done: CollectedTrial) -> None:
        r = done.result
        self.endings.append(Ending(job.job_id, r.status, len(done.steps), r.error))
        cause = same_early_failure(self.endings, self.total)
        if cause is not None and self.request.reason is None:
            self.request.reason = cause  # SweepStopper: nothing more is scheduled


def interrupted_line(finished: int, total: int, resume_command: str) -> str:
    return f"interrupted: {finished} of {total} trials finished; continue with: {resume_command}"


def resume_command(space_path: str, out_dir: str, overrides: Sequence[str] = ()) -> str:
    """The command that continues this sweep, with its ``--set`` overrides (quoted for a shell
    where they need it)."""
    sets = "".join(f" --set {shlex.quote(item)}" for item in overrides)
    return f"dpo-sweep run {shlex.quote(space_path)}{sets} --output {shlex.quote(out_dir)} --resume"
