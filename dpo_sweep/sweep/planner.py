"""The planner as a Ray Tune ``Searcher``: Tune asks it for the next trial, it asks the sweep's
:class:`~dpo_sweep.plan.schedule.SweepPlan` (cheapest predicted memory first, pruned and shared
configurations never start a trial) and hands Tune the trial's
:class:`~dpo_sweep.sweep.task.TrialTask`.

When a trial ends, Tune calls :meth:`PlanSearcher.on_trial_complete` - with the trial's last
report, or ``error=True`` when its process failed - and only then the callbacks'
``on_trial_complete`` / ``on_trial_error`` (Ray Tune's ``TuneController.stop_trial`` and
``_process_trial_failure``). So the plan learns a trial's outcome here, first: the outcome is the
trial's reports as the sweep's :class:`~dpo_sweep.sweep.recorder.SweepRecorder` collected them
(Tune hands a Searcher only the last report, flattened, and none of the step rows); then the end
hooks run (the ETA's pricing, :class:`~dpo_sweep.sweep.estimate.TrialPricing`; the same-failure
early stop, :class:`~dpo_sweep.sweep.stopping.SameFailureStop`); then Tune calls the recorder's
own hooks, which write the rows the plan has ready and say them.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ray.tune.search import Searcher

from dpo_sweep.nvml_session import nvml_session
from dpo_sweep.plan.jobs import Job
from dpo_sweep.plan.schedule import SweepPlan
from dpo_sweep.sweep.collector import CollectedTrial
from dpo_sweep.sweep.recorder import SweepRecorder
from dpo_sweep.sweep.task import TrialTask
from dpo_sweep.train.faults import FaultRule, fault_for

#: What runs once the plan knows a trial's outcome: the job and what the trial reported.
EndHook = Callable[[Job, CollectedTrial], None]


class PlanSearcher(Searcher):
    """Suggests the plan's jobs, one Tune trial each, until the plan has none left: each as its
    :class:`~dpo_sweep.sweep.task.TrialTask` (``task``: what every trial's task shares; ``faults``:
    tests only, :mod:`~dpo_sweep.train.faults`); hands each ended trial's outcome to the plan, then
    to ``end_hooks`` in their order."""

    def __init__(self, plan: SweepPlan, recorder: SweepRecorder, task: TrialTask,
                 faults: tuple[FaultRule, ...] = (), end_hooks: Sequence[EndHook] = ()) -> None:
        super().__init__()
        self.plan = plan
        self.recorder = recorder
        self.task = task
        self.faults = faults
        self.end_hooks = tuple(end_hooks)
        self._jobs: dict[str, str] = {}  # Tune's trial id -> the job it runs

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        return True  # the plan is the search space; Tune's param_space holds nothing

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        job = self.plan.next_job()
        self.recorder.flush()  # rows pruned over budget before anything ran
        if job is None:
            # None: nothing to start until a running trial ends; FINISHED: the sweep is done.
            return None if self.plan.running() else Searcher.FINISHED
        self._jobs[trial_id] = job.job_id
        return self.task.for_trial(job.cfg, fault_for(self.faults, job.cfg)).as_config()

    def save(self, checkpoint_path: str) -> None:
        """Nothing to save: ``--resume`` rebuilds the plan from the rows in results.csv (and Tune
        would otherwise log "save not implemented" on the sweep's console)."""

    def restore(self, checkpoint_path: str) -> None:
        """See :meth:`save`."""

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """The trial ``trial_id`` ended (see the module doc): the plan learns its outcome, then the
        end hooks run. A trial that a stop ended before it reported its end has no outcome: it did
        not run (the plan keeps it as unfinished; ``--resume`` runs it)."""
        job_id = self._jobs.pop(trial_id, None)
        if job_id is None:
            return
        job = self.plan.job(job_id)
        done = self.recorder.outcome(trial_id, job, error)
        if done is None:
            return
        self.plan.finish(job_id, done.result, done.steps)
        for hook in self.end_hooks:
            hook(job, done)


def card_memory_gb() -> float | None:
    """This host's first GPU's memory in GB (the budget for pruning over budget), or None when
    NVML sees no GPU here (a CPU-only head node: then only resources.gpu_memory_gb prunes)."""
    try:
        with nvml_session() as nvml:
            return nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(0)).total / 1e9
    except Exception:  # noqa: BLE001 - no library, no driver, no GPU: no card budget
        return None
