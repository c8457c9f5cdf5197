"""The planner as a Ray Tune ``Searcher``: Tune asks it for the next trial, it asks the sweep's
:class:`~dpo_sweep.plan.schedule.SweepPlan` (cheapest predicted memory first, pruned and shared
configurations never start a trial). What finished reaches the plan through the sweep's
:class:`~dpo_sweep.sweep.recorder.SweepRecorder`, which sees every report of a trial; Tune calls
the callbacks' ``on_trial_result`` with a trial's last report before the Searcher's
``on_trial_complete``, so the plan knows a trial's outcome before it is asked for the next one.
"""
from __future__ import annotations

from typing import Any

from ray.tune.search import Searcher

from dpo_sweep.nvml_session import nvml_session
from dpo_sweep.plan.schedule import SweepPlan
from dpo_sweep.sweep.recorder import SweepRecorder
from dpo_sweep.sweep.task import TrialTask
from dpo_sweep.train.faults import FaultRule, fault_for


class PlanSearcher(Searcher):
    """Suggests the plan's jobs, one Tune trial each, until the plan has none left: each as its
    :class:`~dpo_sweep.sweep.task.TrialTask` (``task``: what every trial's task shares; ``faults``:
    tests only, :mod:`~dpo_sweep.train.faults`)."""

    def __init__(self, plan: SweepPlan, recorder: SweepRecorder, task: TrialTask,
                 faults: tuple[FaultRule, ...] = ()) -> None:
        super().__init__()
        self.plan = plan
        self.recorder = recorder
        self.task = task
        self.faults = faults

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        return True  # the plan is the search space; Tune's param_space holds only fixed values

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        job = self.plan.next_job()
        self.recorder.flush()  # rows pruned over budget before anything ran
        if job is None:
            # None: nothing to start until a running trial ends; FINISHED: the sweep is done.
            return None if self.plan.running() else Searcher.FINISHED
        return self.task.for_trial(job.cfg, fault_for(self.faults, job.cfg)).as_config()

    def save(self, checkpoint_path: str) -> None:
        """Nothing to save: ``--resume`` rebuilds the plan from the rows in results.csv (and Tune
        would otherwise log "save not implemented" on the sweep's console)."""

    def restore(self, checkpoint_path: str) -> None:
        """See :meth:`save`."""

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """Nothing to do: the recorder handed the trial's outcome to the plan already."""


def card_memory_gb() -> float | None:
    """This host's first GPU's memory in GB (the budget for pruning over budget), or None when
    NVML sees no GPU here (a CPU-only head node: then only resources.gpu_memory_gb prunes)."""
    try:
        with nvml_session() as nvml:
            return nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(0)).total / 1e9
    except Exception:  # noqa: BLE001 - no library, no driver, no GPU: no card budget
        return None
