"""A trainer stand-in for the planner's end-to-end sweep (``run_sweep(..., trainer=run_trial)``,
which Ray pickles by reference: the Train workers import this module): the real trainer, with an
OOM injected (:mod:`dpo_sweep.train.faults`) into every trial of micro_batch 2 or more - the
biggest micro-batch of that sweep runs out of memory, as it would on a card too small for it."""
from __future__ import annotations

from dpo_sweep.train.faults import InjectedFault
from dpo_sweep.train.loop import run_trial as _run_trial

OOM_FROM_MICRO_BATCH = 2


def run_trial(cfg, **kw):
    if cfg.micro_batch >= OOM_FROM_MICRO_BATCH:
        kw["fault"] = InjectedFault(1, "oom")
    return _run_trial(cfg, **kw)
