"""A trainer stand-in for the planner's end-to-end sweep (``run_sweep(..., trainer=...)``): the
real trainer, with an OOM injected through the ``train.fail_at_step`` hook into every trial of
micro_batch 2 or more - the biggest micro-batch of that sweep runs out of memory, as it would on
a card too small for it."""
from __future__ import annotations

from dpo_sweep.train.loop import run_trial as _run_trial

OOM_FROM_MICRO_BATCH = 2


def run_trial(cfg, **kw):
    if cfg.micro_batch >= OOM_FROM_MICRO_BATCH:
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"fail_at_step": 1, "fail_kind": "oom"})})
    return _run_trial(cfg, **kw)
