"""Each phase of the plan owns its state and its next job (plan/measure_phase.py, learn_phase.py,
runoff_phase.py), driven here without the coordinator; and the plan's keys are typed values."""
from __future__ import annotations

from dpo_sweep.plan.keys import LearningKey, MeasurementKey, TimingKey
from dpo_sweep.plan.learn_phase import LearnPhase, Learning
from dpo_sweep.plan.measure_phase import MeasurePhase
from dpo_sweep.plan.peaks import PeakModel
from dpo_sweep.plan.rules import BUDGET_MARGIN, learning_key, measurement_key
from dpo_sweep.plan.runoff_phase import RunoffPhase
from dpo_sweep.plan.state import GroupState, Rows
from tests.plan.test_plan_schedule import estimate, run, space


def _phases(trials):
    rows = Rows()
    peaks = PeakModel(estimate, budget_gb=None, margin=BUDGET_MARGIN)
    measure = MeasurePhase(trials, False, peaks, rows, {})
    runoff = RunoffPhase(measure, peaks, rows)
    return rows, measure, runoff, LearnPhase(trials, measure, runoff, peaks, rows)


def _measure_all(measure, outcome=run):
    while (job := measure.next_job()) is not None:
        measure.finish(job, *outcome(job))


def test_a_set_up_goes_from_pending_to_running_to_learned_from_its_trial():
    trials = space(micro_batch=[1, 2], grad_acc=[4, 2])  # effective batches 4, 2, 8, 4: three set-ups
    rows, measure, runoff, learn = _phases(trials)
    assert [len(s.members) for s in learn.set_ups] == [2, 1, 1]
    assert all(s.state is Learning.PENDING for s in learn.set_ups)
    assert learn.next_job() is None  # nothing measured yet: the fastest is not known
    _measure_all(measure)
    assert all(g.state is GroupState.DONE for g in measure.groups) and not measure.ongoing()
    job = learn.next_job()
    set_up = learn.of(job.source)
    assert set_up.state is Learning.RUNNING and set_up.source is None and not set_up.decided
    other = learn.next_job()
    assert learn.of(other.source) is not set_up  # one trial per set-up: the next is another's
    assert learn.finish(job, run(job)[0])
    assert set_up.state is Learning.LEARNED and set_up.source.trial_id == job.job_id and set_up.decided
    assert any(n.startswith(f"learning: {job.job_id} runs") for n in rows.notes)


def test_a_set_up_none_of_whose_configurations_ran_is_decided_without_a_source():
    trials = space(micro_batch=[2], grad_acc=[4])
    rows, measure, runoff, learn = _phases(trials)
    _measure_all(measure, lambda job: run(job, "oom"))
    assert learn.next_job() is None
    (set_up,) = learn.set_ups
    assert set_up.state is Learning.NONE and set_up.source is None and set_up.decided


def test_a_learning_trial_that_runs_out_in_the_learning_precision_leaves_its_set_up_pending():
    trials = [t.model_copy(update={"train": t.train.model_copy(update={"precision": "bf16"})})
              for t in space(micro_batch=[2], grad_acc=[4])]
    rows, measure, runoff, learn = _phases(trials)
    _measure_all(measure)
    job = learn.next_job()
    assert job.cfg.train.precision == "bf16-mixed"
    assert not learn.finish(job, run(job, "oom")[0])
    (set_up,) = learn.set_ups
    assert set_up.state is Learning.PENDING and set_up.ran_out == f"{job.job_id} ran out of memory"
    again = learn.next_job()
    assert again.cfg.train.precision == "bf16" and again.job_id == f"{job.job_id}-bf16"


def test_the_runoff_phase_keeps_timings_by_measurement_and_grad_acc():
    trials = space(micro_batch=[2], grad_acc=[4], beta=[0.1, 0.2])  # two betas: one measurement
    rows, measure, runoff, learn = _phases(trials)
    a, b = trials
    assert runoff.key(a) == runoff.key(b) == TimingKey(measured_by=measure.of(a).measuring.trial_id, grad_acc=4)
    assert runoff.next_job(busy=False) is None  # nothing measured: no round yet
    _measure_all(measure)
    assert runoff.needs_timing(a) and runoff.time_row(b).step_time_source == "extrapolated"
    runoff.claim(runoff.key(a), by_learning=True)
    assert not runoff.needs_timing(b)  # claimed for both betas
    runoff.release(runoff.key(a))
    assert runoff.needs_timing(b)


def test_keys_are_typed_values():
    a, b = space(micro_batch=[2], beta=[0.1, 0.2])
    assert isinstance(measurement_key(a), MeasurementKey) and measurement_key(a) == measurement_key(b)
    assert isinstance(learning_key(a), LearningKey) and learning_key(a) != learning_key(b)
    assert len({measurement_key(a), measurement_key(b)}) == 1  # hashable by content
    same = MeasurementKey(measurement_key(a).values)
    assert LearningKey(same.values) != same  # a measurement key never equals a learning key
