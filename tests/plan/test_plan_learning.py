"""The planner's learning trials: how many steps, in which precision, which
configuration runs them, and what the rows say about it (stability_steps, stability_precision,
stability_note). Pure SweepPlan tests, driven as in test_plan_schedule.py (no Ray)."""
from __future__ import annotations

import dataclasses

import pytest

from dpo_sweep.config import DEFAULT_LEARNING_STEPS, TrainSpec
from dpo_sweep.plan.memory import MemoryEstimate
from dpo_sweep.plan.rules import learning_config, learning_key, measurement_key
from dpo_sweep.plan.jobs import JobKind
from dpo_sweep.plan.schedule import SweepPlan
from tests.plan.test_plan_schedule import collect, drive, estimate, run, space
from tests.testkit import make_cfg

MIXED_EXTRA_GB = 10.0  # the stand-in model's fp32 master weights and AdamW state of bf16-mixed


def estimate_by_precision(cfg) -> MemoryEstimate:
    """test_plan_schedule's stand-in, with bf16-mixed 10 GB above pure bf16."""
    est = estimate(cfg)
    extra = MIXED_EXTRA_GB if cfg.train.precision == "bf16-mixed" else 0.0
    return dataclasses.replace(est, optimizer_gb=est.optimizer_gb + extra, total_gb=est.total_gb + extra)


def learn_jobs(jobs):
    return [j for j in jobs if j.kind == JobKind.LEARN]


def test_learning_steps_default_to_sixteen_or_the_space_s_steps_when_more():
    assert DEFAULT_LEARNING_STEPS == 16
    assert TrainSpec(steps=5, warmup_steps=2).learning_steps_resolved() == 16
    assert TrainSpec(steps=20, warmup_steps=2).learning_steps_resolved() == 20
    assert TrainSpec(steps=20, warmup_steps=2, learning_steps=8).learning_steps_resolved() == 8


@pytest.mark.parametrize("space_precision, learning_precision, expected", [
    ("bf16", "auto", "bf16-mixed"), ("fp32", "auto", "fp32"), ("fp16", "auto", "fp16"),
    ("bf16-mixed", "auto", "bf16-mixed"), ("bf16", "bf16", "bf16"), ("fp32", "bf16-mixed", "bf16-mixed"),
])
def test_auto_learning_precision_turns_only_pure_bf16_into_bf16_mixed(space_precision, learning_precision, expected):
    train = TrainSpec(precision=space_precision, learning_precision=learning_precision)
    assert train.learning_precision_resolved() == expected


def test_the_learning_configuration_keeps_warm_up_below_its_steps_and_drops_a_bf16_weight_dtype():
    cfg = make_cfg(steps=20, warmup_steps=10, learning_steps=8, precision="bf16", model={"preset": "tiny-llama",
                                                                                          "dtype": "bfloat16"})
    lcfg = learning_config(cfg)
    assert (lcfg.train.steps, lcfg.train.warmup_steps, lcfg.train.precision) == (8, 7, "bf16-mixed")
    assert lcfg.model.dtype is None  # fp32 master weights: what lets lr 5e-6 updates happen
    assert learning_config(lcfg) == lcfg
    # The knobs are no memory and no learning set-up of their own: they change nothing shared.
    other = make_cfg(steps=20, warmup_steps=10, learning_steps=32, learning_precision="fp32", precision="bf16",
                     model={"preset": "tiny-llama", "dtype": "bfloat16"})
    assert measurement_key(cfg) == measurement_key(other)
    assert learning_key(cfg) != learning_key(other)  # they learn differently: not one set-up


def test_a_short_bf16_space_learns_for_sixteen_steps_in_bf16_mixed():
    # grad_acc 1: every configuration runs in full, but in 5 steps of pure bf16: none may stand in.
    trials = space(micro_batch=[1, 2], beta=[0.1, 0.2])
    trials = [t.model_copy(update={"train": t.train.model_copy(update={"steps": 5, "warmup_steps": 2,
                                                                       "precision": "bf16"})}) for t in trials]
    jobs, rows = drive(SweepPlan(trials, estimate=estimate))
    learn = learn_jobs(jobs)
    assert len(learn) == 4  # two effective batches x two betas
    assert {(j.cfg.train.steps, j.cfg.train.warmup_steps, j.cfg.train.precision) for j in learn} == {(16, 2, "bf16-mixed")}
    assert all(j.cfg.train.steps == 5 and j.cfg.train.precision == "bf16" for j in jobs if j.kind == JobKind.MEASURE)
    # Only the learning trials' held-batch loss reaches a row: the measurements skip it (train.evaluate).
    assert [j.cfg.train.evaluate for j in jobs if j.kind == JobKind.MEASURE] == [False, False]
    assert all(j.cfg.train.evaluate for j in learn)
    for r in rows.values():
        assert r.stability_from.endswith("-learning") and r.stability_from != r.trial_id
        assert (r.stability_steps, r.stability_precision, r.stability_note) == (16, "bf16-mixed", "")


def test_a_configuration_that_ran_in_full_with_the_learning_steps_and_precision_is_its_own_learning_trial():
    trials = space(micro_batch=[1, 2], beta=[0.1])
    trials = [t.model_copy(update={"train": t.train.model_copy(update={"steps": 2, "warmup_steps": 0,
                                                                       "learning_steps": 2})})
              for t in trials]  # steps 2 in fp32
    jobs, rows = drive(SweepPlan(trials, estimate=estimate))
    assert learn_jobs(jobs) == []
    assert all(j.cfg.train.evaluate for j in jobs)  # each is its rows' learning trial: eval_loss is theirs
    for t in trials:
        r = rows[t.trial_id]
        assert (r.stability_from, r.stability_steps, r.stability_precision) == (t.trial_id, 2, "fp32")


def bf16_space(**search):
    trials = space(**search)
    return [t.model_copy(update={"train": t.train.model_copy(update={"steps": 5, "warmup_steps": 2, "precision": "bf16"})})
            for t in trials]


def test_the_fastest_configuration_whose_learning_precision_fits_learns():
    # Effective batch 4: mb 2 x ga 2 (230 ms) is faster than mb 1 x ga 4 (430 ms), but with bf16-mixed's
    # +10 GB only mb 1 fits the 23.5 GB budget (mb 1 L1: 24 GB predicted, within 5 %; mb 2 L1: 27 GB).
    trials = [c for c in bf16_space(micro_batch=[1, 2], grad_acc=[4, 2], checkpoint_level=["L1"])
              if c.effective_batch() == 4]
    plan = SweepPlan(trials, estimate=estimate_by_precision, budget_gb=23.5)
    jobs, rows = drive(plan)
    (job,) = learn_jobs(jobs)
    assert (job.cfg.micro_batch, job.cfg.grad_acc, job.cfg.train.precision) == (1, 4, "bf16-mixed")
    notes = plan.take_notes()
    assert [n for n in notes if not n.startswith(("runoff:", "learning:"))] == []
    # what it costs and why, said as it starts: 16 steps at the stand-in's 430 ms
    assert f"learning: {job.job_id} runs 16 steps at grad_acc 4, ~6.9 s of steps at 0.4 s each: a stability verdict " \
           "needs 16 steps at the real effective batch (4 pairs)" in notes
    assert {(r.stability_from, r.stability_precision, r.stability_note) for r in rows.values()} == {
        (job.job_id, "bf16-mixed", "")}


def test_when_no_configuration_fits_in_the_learning_precision_it_learns_in_the_space_s_and_says_so():
    # bf16 peaks 14-17 GB under a 17 GB budget; bf16-mixed would be 24-27 GB: over it by more than 5 %.
    trials = bf16_space(micro_batch=[1, 2], grad_acc=[4, 2], checkpoint_level=["L1"])
    trials = [c for c in trials if c.effective_batch() == 4]
    plan = SweepPlan(trials, estimate=estimate_by_precision, budget_gb=17.0)
    notes, jobs, rows = [], [], {}
    while (job := plan.next_job()) is not None:
        notes += plan.take_notes()
        jobs.append(job)
        plan.finish(job.job_id, *run(job))
        collect(plan, rows)
    (job,) = learn_jobs(jobs)
    assert (job.cfg.micro_batch, job.cfg.train.steps, job.cfg.train.precision) == (2, 16, "bf16")  # the fastest
    notes = [n for n in notes if not n.startswith(("runoff:", "learning:"))]  # their own lines (test_plan_runoff.py)
    assert len(notes) == 1 and notes[0].startswith(f"note: learning trial {job.job_id} runs in bf16")
    assert "in bf16-mixed no configuration of its set-up fits" in notes[0] and "17.0 GB budget" in notes[0]
    for r in rows.values():
        assert (r.stability_from, r.stability_steps, r.stability_precision) == (job.job_id, 16, "bf16")
        assert r.stability_note == job.note and "bf16-mixed" in r.stability_note


def test_an_8b_model_on_an_80_gb_card_learns_in_bf16_with_the_real_memory_model():
    # The seed table's shape: 8B in pure bf16 (2 + 2 + 4 B/param) peaks near 80 GB; bf16-mixed adds
    # fp32 master weights and AdamW state (~+10 B/param, ~80 GB more): it cannot fit.
    cfg = make_cfg(trial_id="8b", model={"preset": "llama-3-8b"}, micro_batch=1, checkpoint_level="full",
                   precision="bf16", steps=5, warmup_steps=2, max_length=512,
                   resources={"use_gpu": True, "gpu_memory_gb": 80.0}, device="cuda")
    plan = SweepPlan([cfg])
    assert plan.over_budget(cfg) is None
    reason = plan.over_budget(learning_config(cfg))
    assert reason is not None and "80.0 GB budget" in reason


def test_full_grid_runs_each_configuration_with_its_own_steps_and_precision():
    trials = bf16_space(micro_batch=[1, 2], grad_acc=[2], beta=[0.1, 0.2])
    jobs, rows = drive(SweepPlan(trials, estimate=estimate, full_grid=True))
    assert learn_jobs(jobs) == [] and {(j.cfg.train.steps, j.cfg.train.precision) for j in jobs} == {(5, "bf16")}
    assert {(r.stability_from == r.trial_id, r.stability_steps, r.stability_precision)
            for r in rows.values()} == {(True, 5, "bf16")}


def test_a_learning_trial_that_runs_out_of_memory_in_the_learning_precision_is_run_again_in_the_space_s():
    # Predicted to fit (no budget known), but bf16-mixed runs out on the card: learn in bf16 instead.
    trials = bf16_space(micro_batch=[2], grad_acc=[2])
    plan = SweepPlan(trials, estimate=estimate)
    notes, jobs, rows = [], [], {}
    while (job := plan.next_job()) is not None:
        notes += plan.take_notes()
        jobs.append(job)
        plan.finish(job.job_id, *run(job, "oom" if job.cfg.train.precision == "bf16-mixed" else "ok"))
        collect(plan, rows)
    first, again = learn_jobs(jobs)
    assert (first.job_id, first.cfg.train.precision) == (f"{trials[0].trial_id}-learning", "bf16-mixed")
    assert (again.job_id, again.cfg.train.precision) == (f"{trials[0].trial_id}-learning-bf16", "bf16")
    notes = [n for n in notes if not n.startswith("learning:")]
    assert notes == [f"note: learning trial {again.job_id} runs in bf16, the space's precision: in bf16-mixed "
                     f"{first.job_id} ran out of memory"]
    (row,) = rows.values()
    assert (row.status, row.stability_from, row.stability_precision, row.stability_note) == (
        "ok", again.job_id, "bf16", notes[0].removeprefix("note: "))


def test_a_learning_trial_that_runs_out_of_memory_in_the_space_s_own_precision_is_not_run_again():
    trials = bf16_space(micro_batch=[2], grad_acc=[2])
    trials = [t.model_copy(update={"train": t.train.model_copy(update={"learning_precision": "bf16"})}) for t in trials]
    jobs, rows = drive(SweepPlan(trials, estimate=estimate), lambda job: run(job, "oom" if job.kind == JobKind.LEARN else "ok"))
    assert [j.job_id for j in learn_jobs(jobs)] == [f"{trials[0].trial_id}-learning"]
    (row,) = rows.values()  # ok in memory and time; no stability columns to give
    assert row.status == "ok" and row.stability == "" and row.stability_from == trials[0].trial_id + "-learning"
