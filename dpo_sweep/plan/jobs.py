"""What the sweep's plan (:mod:`~dpo_sweep.plan.schedule`) hands out: the phases a job belongs
to, and the job, one Ray trial.

A job's trial id is built here from the configuration it runs for (its ``source``) and its kind,
and only here: results files carry these ids (``measured_by``, ``stability_from``, ``timed_by``)
and ``--resume`` reads them back, so their shape is a contract. The plan never parses an id: a
job says its source and kind as fields.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from dpo_sweep.config import TrialConfig


class JobKind(enum.StrEnum):
    """The sweep's phases, and so the kinds of job: each job belongs to the phase that asked for
    it. A str, so that the console prints it as it is (``trial t000 (measure, grad_acc 2)``)."""

    MEASURE = "measure"  # a group's memory/time measurement, at a short accumulation
    LEARN = "learn"      # a learning set-up's loss trajectory (the rows' stability columns)
    RUNOFF = "runoff"    # a row's step time in full at its own grad_acc, where a tie rests on it

    @property
    def suffix(self) -> str:
        """What a job of this kind appends to its source's trial id."""
        return _SUFFIXES[self]


_SUFFIXES = {JobKind.MEASURE: "", JobKind.LEARN: "-learning", JobKind.RUNOFF: "-runoff"}


def job_id(kind: JobKind, source: TrialConfig, variant: str = "") -> str:
    """``<source>`` (measure), ``<source>-learning[-<variant>]``, ``<source>-runoff``: ``variant``
    tells apart a second job of one kind and source (a learning trial again in the space's
    precision after the learning precision ran out of memory)."""
    return source.trial_id + kind.suffix + (f"-{variant}" if variant else "")


@dataclass(frozen=True)
class Job:
    """One Ray trial the plan wants run: ``cfg`` as it runs, ``cfg.trial_id == job_id``."""

    job_id: str
    cfg: TrialConfig
    kind: JobKind
    key: str   # its measurement_key (measure, runoff) or learning_key (learn)
    source: TrialConfig  # the space's configuration it runs for (cfg is that one, changed for the job)
    note: str = ""  # learn: why it runs in the space's precision (stability_note), else ""
    times_row: bool = False  # learn: it times its source in full too, in place of its runoff

    @classmethod
    def of(cls, kind: JobKind, source: TrialConfig, cfg: TrialConfig, key: str, note: str = "",
           variant: str = "") -> Job:
        """The job of ``kind`` for ``source``, running ``cfg`` under the job's own trial id."""
        jid = job_id(kind, source, variant)
        cfg = cfg if cfg.trial_id == jid else cfg.model_copy(update={"trial_id": jid})
        return cls(jid, cfg, kind, key, source, note)


@dataclass(frozen=True)
class Due:
    """A trial the plan will run (or runs), as far as it is known now, for the estimate of what is
    left: its configuration as it runs, and its optimizer step's time when a measurement of that
    configuration gives it (ms; NaN for one not measured yet)."""

    cfg: TrialConfig
    kind: JobKind
    step_ms: float


def without_worst_case(cfg: TrialConfig) -> TrialConfig:
    """``cfg`` for a trial whose peak no row takes (a runoff, a learning trial): no worst-case step
    after its steps (``train.worst_case_step``): the row's peak is its measurement's, and the
    extra step would cost one more full step (benchmarks/README.md#trial-costs)."""
    return cfg.model_copy(update={"train": cfg.train.model_copy(update={"worst_case_step": False})})


def without_eval(cfg: TrialConfig) -> TrialConfig:
    """``cfg`` for a trial that only measures or times it: no held-batch evaluation after its
    steps (``train.evaluate``; benchmarks/README.md#trial-costs), whose ``eval_loss`` no row
    would take."""
    return cfg.model_copy(update={"train": cfg.train.model_copy(update={"evaluate": False})})
