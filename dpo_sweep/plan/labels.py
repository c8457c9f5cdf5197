"""``dpo-sweep validate``'s plan column: what the sweep's plan would do with each configuration,
read from a :class:`~dpo_sweep.plan.schedule.SweepPlan` before anything runs."""
from __future__ import annotations

from typing import Mapping, Sequence

from dpo_sweep.config import TrialConfig
from dpo_sweep.plan.rules import measure_grad_acc
from dpo_sweep.plan.schedule import Estimator, SweepPlan
from dpo_sweep.core.lengths import LengthProfile


def plan_labels(trials: Sequence[TrialConfig], budget_gb: float | None = None,
                estimate: Estimator | None = None,
                lengths: Mapping[str, LengthProfile | None] | None = None) -> dict[str, str]:
    """``dpo-sweep validate``'s plan column, by trial id: ``run`` (at which grad_acc), ``shares
    measurement with X`` or ``pruned: ...`` over budget (pruning after an OOM is known only when
    the sweep runs); ``estimate`` / ``lengths`` as for :class:`SweepPlan`."""
    plan = SweepPlan(trials, budget_gb=budget_gb, estimate=estimate, lengths=lengths)
    labels: dict[str, str] = {}
    for group in plan.groups():
        reason = plan.over_budget(group.measuring)
        head = group.measuring
        short = measure_grad_acc(head)
        for m in group.members:
            if reason:
                labels[m.trial_id] = reason
            elif m is head:
                labels[m.trial_id] = "run" if short == m.grad_acc else f"run at grad_acc {short}, time extrapolated"
            else:
                labels[m.trial_id] = f"shares measurement with {head.trial_id}"
    return labels
