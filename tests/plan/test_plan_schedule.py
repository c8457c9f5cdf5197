"""The sweep's plan driven by hand (no Ray): order, shared measurements, pruning after an OOM and
over budget, short accumulation with its extrapolated step time, learning trials, --full-grid."""
from __future__ import annotations

import math

import pytest

from dpo_sweep.plan.memory import MemoryEstimate
from dpo_sweep.plan.jobs import JobKind
from dpo_sweep.plan.labels import plan_labels
from dpo_sweep.plan.schedule import SweepPlan
from dpo_sweep.records import StepRecord, TrialResult
from tests.testkit import make_cfg

#: Activation GB per micro-batch element of the stand-in memory model, by level.
_ACT = {"none": 4.0, "L1": 3.0, "L2": 2.0, "L3": 1.5, "full": 1.0}
T_OPT_MS, T_MICRO_MS = 30.0, 100.0  # the stand-in trainer's step: t_opt + grad_acc x t_micro


def estimate(cfg) -> MemoryEstimate:
    """A memory model with round numbers: 10 GB static, 1 GB context, activations by level."""
    act = cfg.micro_batch * _ACT[cfg.checkpoint_level]
    return MemoryEstimate(weights_gb=4.0, grads_gb=2.0, optimizer_gb=4.0, reference_gb=0.0, ema_gb=0.0, casts_gb=0.0,
                          activations_gb=act, head_gb=0.0, allocator_gb=0.0, context_gb=1.0,
                          total_gb=11.0 + act, peak_at="backward start",
                          tokens=2 * cfg.micro_batch * cfg.train.max_length)


def space(**search):
    """The cross product of ``search`` (micro_batch, checkpoint_level, grad_acc, beta), in order;
    12 measured steps, so that a measure trial times its micro-steps at grad_acc 2
    (rules.measure_grad_acc)."""
    import itertools

    keys = list(search)
    return [make_cfg(trial_id=f"t{i:03d}_" + "_".join(f"{k}{v}" for k, v in zip(keys, vals)), steps=14,
                     warmup_steps=2, **dict(zip(keys, vals)))
            for i, vals in enumerate(itertools.product(*search.values()))]


def run(job, status="ok", peak_gb=None):
    """What the trainer would return for ``job``: steps of t_opt + G x t_micro, a peak, losses."""
    cfg = job.cfg
    step_ms = T_OPT_MS + cfg.grad_acc * T_MICRO_MS
    steps = tuple(StepRecord(trial_id=cfg.trial_id, step=s, loss=0.69 - 0.01 * s * cfg.grad_acc, grad_norm=1.0,
                             step_time_ms=step_ms, peak_mem_gb=1.0, reward_accuracy=0.5, reward_margin=0.0,
                             logps_chosen=-1.0, logps_rejected=-1.0, kl=0.0, micro_step_ms=T_MICRO_MS,
                             optimizer_ms=T_OPT_MS - 1) for s in (1, 2, 3))
    peak = estimate(cfg).total_gb if peak_gb is None else peak_gb
    result = TrialResult(trial_id=cfg.trial_id, status=status, **cfg.knobs(),
                         peak_mem_gb=peak if status == "ok" else math.nan, step_time_ms=step_ms,
                         step_time_p10_ms=step_ms - 1, step_time_p90_ms=step_ms + 1,
                         tokens_per_s=1000.0 * cfg.grad_acc / step_ms, mfu=0.1,
                         loss_std=0.01 * cfg.grad_acc, loss_mean=0.5, error="" if status == "ok" else "OOM",
                         startup_s=5.0, measure_s=1.0)
    return result, steps


def collect(plan: SweepPlan, rows: dict) -> dict:
    """``rows`` (by trial id) with what the plan handed out since: new rows, then rewritten ones,
    as the recorder appends and rewrites results.csv."""
    rows.update((r.trial_id, r) for r in plan.take_output()[1])
    for r in plan.take_replaced():
        assert r.trial_id in rows, f"{r.trial_id} rewritten before it was written"
        rows[r.trial_id] = r
    return rows


def drive(plan: SweepPlan, outcome=lambda job: run(job)):
    """Start every job the plan offers, one at a time, finish it with ``outcome``; all rows, as
    results.csv holds them at the end."""
    jobs, rows = [], {}
    while (job := plan.next_job()) is not None:
        jobs.append(job)
        plan.finish(job.job_id, *outcome(job))
        collect(plan, rows)
    collect(plan, rows)
    assert not plan.running() and plan.unwritten() == [] and plan.unfinished() == []
    assert not any(r.stability == "pending" for r in rows.values())
    return jobs, rows


def test_cheapest_predicted_memory_runs_first():
    trials = space(micro_batch=[4, 1, 2], checkpoint_level=["none", "full"])
    jobs, _ = drive(SweepPlan(trials, estimate=estimate))
    jobs = [j for j in jobs if j.kind == JobKind.MEASURE]  # the learning trial comes after them
    peaks = [estimate(j.cfg).total_gb for j in jobs]
    assert peaks == sorted(peaks) and len(jobs) == 6
    assert [(j.cfg.micro_batch, j.cfg.checkpoint_level) for j in jobs[:2]] == [(1, "full"), (2, "full")]


def test_two_betas_share_one_measurement_and_say_which_trial_measured_them():
    trials = space(micro_batch=[1, 2], beta=[0.1, 0.2])  # grad_acc 1: each measurement is a full run
    jobs, rows = drive(SweepPlan(trials, estimate=estimate))
    measure = [j for j in jobs if j.kind == JobKind.MEASURE]
    assert [j.job_id for j in measure] == [trials[0].trial_id, trials[2].trial_id]
    for t in trials:
        r = rows[t.trial_id]
        head = trials[0] if t.micro_batch == 1 else trials[2]
        assert r.status == "ok" and r.measured_by == head.trial_id and r.beta == t.beta
        assert r.peak_mem_gb == estimate(t).total_gb and r.step_time_source == "measured"
    assert math.isnan(rows[trials[1].trial_id].startup_s)  # it cost no start-up of its own
    assert rows[trials[0].trial_id].startup_s == 5.0


def test_after_an_oom_what_dominates_it_is_pruned_naming_the_trial():
    trials = space(micro_batch=[1, 2, 4], checkpoint_level=["none", "L1"])
    oom_at = {(2, "L1")}
    jobs, rows = drive(SweepPlan(trials, estimate=estimate),
                       lambda job: run(job, "oom" if (job.cfg.micro_batch, job.cfg.checkpoint_level) in oom_at else "ok"))
    ran = {(j.cfg.micro_batch, j.cfg.checkpoint_level) for j in jobs}
    oom_id = next(t.trial_id for t in trials if (t.micro_batch, t.checkpoint_level) == (2, "L1"))
    # mb 2 none and mb 4 at either level need at least mb 2 L1's memory: never started.
    assert ran == {(1, "L1"), (1, "none"), (2, "L1")}
    pruned = {(r.micro_batch, r.checkpoint_level) for r in rows.values() if r.status == "pruned"}
    assert pruned == {(2, "none"), (4, "L1"), (4, "none")}
    assert all(oom_id in r.error for r in rows.values() if r.status == "pruned")
    cfgs = {t.trial_id: t for t in trials}  # pruned before their turn, they still say what was predicted
    assert all(r.predicted_peak_gb == pytest.approx(estimate(cfgs[r.trial_id]).total_gb)
               for r in rows.values() if r.status == "pruned")
    assert rows[oom_id].status == "oom" and len(rows) == 6


def test_over_budget_by_more_than_the_margin_is_pruned_before_it_runs():
    trials = space(micro_batch=[1, 2, 4], checkpoint_level=["none"])  # 15, 19, 27 GB predicted
    jobs, rows = drive(SweepPlan(trials, estimate=estimate, budget_gb=18.5))
    assert [j.cfg.micro_batch for j in jobs if j.kind == JobKind.MEASURE] == [1, 2]  # 19 GB is within 5 % of 18.5: it runs
    r = rows[trials[2].trial_id]
    assert r.status == "pruned" and "over the 18.5 GB budget" in r.error and r.predicted_peak_gb == 27.0
    assert plan_labels(trials, 18.5, estimate)[trials[2].trial_id] == r.error


def test_an_emulated_card_bounds_the_allocator_without_the_context():
    # resources.gpu_memory_gb caps torch's allocator: the 1 GB context is not held against it.
    trials = [make_cfg(trial_id="a", micro_batch=4, resources={"use_gpu": False, "gpu_memory_gb": 25.0})]
    assert SweepPlan(trials, estimate=estimate).over_budget(trials[0]) is None  # 26 GB - 1 GB context
    trials = [make_cfg(trial_id="b", micro_batch=4, resources={"use_gpu": False, "gpu_memory_gb": 23.0})]
    assert "budget" in SweepPlan(trials, estimate=estimate).over_budget(trials[0])


def test_short_accumulation_runs_two_micro_steps_and_extrapolates_the_step_time():
    trials = space(grad_acc=[8, 64])
    jobs, rows = drive(SweepPlan(trials, estimate=estimate))
    measure = [j for j in jobs if j.kind == JobKind.MEASURE]
    assert [(j.job_id, j.cfg.grad_acc) for j in measure] == [(trials[0].trial_id, 2)]
    # Two effective batches, two learning set-ups: each one's learning trial times its configuration in
    # full at its grad_acc, in place of a runoff (test_plan_runoff.py); no runoff is left to run.
    assert [j.job_id for j in jobs if j.kind != JobKind.MEASURE] == [t.trial_id + "-learning" for t in trials]
    assert all(j.times_row for j in jobs if j.kind == JobKind.LEARN)
    for t in trials:
        r = rows[t.trial_id]
        assert r.grad_acc == t.grad_acc and (r.step_time_source, r.timed_by) == ("runoff", t.trial_id + "-learning")
        assert r.step_time_ms == pytest.approx(T_OPT_MS + t.grad_acc * T_MICRO_MS)
        # tokens/s: the measured rate scaled by the work per step over the time per step
        assert r.tokens_per_s == pytest.approx(1000.0 * t.grad_acc / r.step_time_ms)
        assert r.effective_batch == t.grad_acc


def test_one_learning_trial_per_set_up_gives_the_stability_columns():
    trials = space(micro_batch=[1, 2], grad_acc=[4], beta=[0.1, 0.2], checkpoint_level=["none", "L1"])
    jobs, rows = drive(SweepPlan(trials, estimate=estimate))
    learn = [j for j in jobs if j.kind == JobKind.LEARN]
    # Effective batch 4 and 8 x two betas: four learning set-ups, each run once at its grad_acc 4.
    assert len(learn) == 4 and all(j.cfg.grad_acc == 4 for j in learn)
    assert len([j for j in jobs if j.kind == JobKind.MEASURE]) == 4  # mb x level; the betas share them
    for r in rows.values():
        assert r.stability_from.endswith("-learning") and r.loss_std == pytest.approx(0.04)
        job = next(j for j in learn if j.job_id == r.stability_from)
        assert (job.cfg.beta, job.cfg.effective_batch()) == (r.beta, r.effective_batch)
    # The fastest of the set-up learns: every stand-in step takes the same time, so the first.
    assert {j.cfg.checkpoint_level for j in learn} == {"none"}


def test_full_grid_runs_every_configuration_in_full_in_the_space_order():
    trials = space(micro_batch=[2, 1], checkpoint_level=["none", "L1"], grad_acc=[4], beta=[0.1, 0.2])
    jobs, rows = drive(SweepPlan(trials, estimate=estimate, full_grid=True, budget_gb=1.0),
                       lambda job: run(job, "oom" if job.cfg.micro_batch == 2 else "ok"))
    assert [j.job_id for j in jobs] == [t.trial_id for t in trials]
    assert all(j.cfg.grad_acc == 4 and j.kind == JobKind.MEASURE for j in jobs)
    assert {r.status for r in rows.values()} == {"ok", "oom"}
    assert all(r.measured_by == r.trial_id for r in rows.values())
    assert all(r.step_time_source == "measured" and r.stability_from == r.trial_id
               for r in rows.values() if r.status == "ok")


def test_calibration_moves_the_next_prediction_to_what_was_measured():
    trials = space(micro_batch=[1, 2, 4], checkpoint_level=["none"])
    plan = SweepPlan(trials, estimate=estimate)
    for job in (plan.next_job(), plan.next_job()):
        # Measured peaks 2 GB above the model's at every micro_batch: the line through them says so.
        plan.finish(job.job_id, *run(job, peak_gb=estimate(job.cfg).total_gb + 2.0))
    assert plan.predict(trials[2]) == pytest.approx(estimate(trials[2]).total_gb + 2.0)


def test_the_summary_line_says_how_many_measurements_and_the_budget():
    trials = space(micro_batch=[1, 2], beta=[0.1, 0.2, 0.3])
    assert SweepPlan(trials, estimate=estimate, budget_gb=80.0).summary_line() == (
        "planner: 6 configuration(s) share 2 memory/time measurement(s), cheapest predicted peak first; "
        "over-budget pruning against 80.0 GB; learning trials of 16 steps in fp32 (train.learning_steps, "
        "learning_precision)")
    assert "off (no budget known)" in SweepPlan(trials, estimate=estimate).summary_line()
    assert SweepPlan(trials, full_grid=True).summary_line().startswith("planner off (--full-grid)")


def test_rows_are_handed_out_when_measured_and_rewritten_when_their_learning_trial_ends():
    trials = space(micro_batch=[1, 2], grad_acc=[8])
    plan = SweepPlan(trials, estimate=estimate)
    rows = {}
    for _ in range(2):  # the two measurements
        job = plan.next_job()
        assert job.kind == JobKind.MEASURE
        plan.finish(job.job_id, *run(job))
        collect(plan, rows)
    assert set(rows) == {t.trial_id for t in trials}  # on disk before any learning trial ran
    assert {r.stability for r in rows.values()} == {"pending"} and plan.unfinished() == list(rows)
    while (job := plan.next_job()) is not None:
        plan.finish(job.job_id, *run(job))
        collect(plan, rows)
    assert plan.unfinished() == [] and all(r.stability_from.endswith("-learning") for r in rows.values())


def test_a_resumed_plan_keeps_measured_rows_and_runs_only_their_learning_trial():
    trials = space(micro_batch=[1, 2], grad_acc=[8])
    first = SweepPlan(trials, estimate=estimate)
    written = {}
    for _ in range(2):
        job = first.next_job()
        first.finish(job.job_id, *run(job))
        collect(first, written)
    # killed here: results.csv holds both rows, pending; resume hands them to a new plan
    plan = SweepPlan(trials, estimate=estimate, measured=list(written.values()))
    assert plan.restored() == set(written) and plan.unwritten() == []
    jobs, rows = [], dict(written)  # what results.csv holds
    while (job := plan.next_job()) is not None:
        jobs.append(job)
        plan.finish(job.job_id, *run(job))
        collect(plan, rows)
    assert [j.kind for j in jobs if j.kind == JobKind.MEASURE] == []  # nothing measured again
    assert [j.kind for j in jobs].count(JobKind.LEARN) == 2  # effective batches 8 and 16
    assert set(rows) == set(written)
    assert all(r.stability_from.endswith("-learning") for r in rows.values())


def test_a_pruned_row_quotes_the_predicted_peak_its_column_shows():
    # mb 4 none on a 20 GB emulated card: 27 GB predicted (the column), 26 GB of it in the allocator.
    trials = [make_cfg(trial_id="a", micro_batch=4, resources={"use_gpu": False, "gpu_memory_gb": 20.0})]
    _, rows = drive(SweepPlan(trials, estimate=estimate))
    r = rows["a"]
    assert r.status == "pruned" and r.predicted_peak_gb == 27.0
    assert r.error.startswith(f"pruned: predicted peak {r.predicted_peak_gb:.2f} GB (26.00 GB of it in torch's "
                              "allocator, which resources.gpu_memory_gb caps; the 1.00 GB CUDA context is outside it) "
                              "is over the 20.0 GB budget")


def test_a_leaner_level_is_measured_first_even_when_a_noisy_calibration_predicts_it_dearer():
    # On CPU a process's peak is noise-deep: a calibration can predict L1 above none at one
    # micro_batch. Measuring none first would cost a trial: its OOM prunes nothing leaner.
    def inverted(cfg) -> MemoryEstimate:
        e = estimate(cfg)
        act = cfg.micro_batch * {"none": 3.0, "L1": 3.1}[cfg.checkpoint_level]
        return MemoryEstimate(**{**e.__dict__, "activations_gb": act, "total_gb": 11.0 + act})

    trials = space(micro_batch=[1, 2], checkpoint_level=["none", "L1"])
    jobs, rows = drive(SweepPlan(trials, estimate=inverted),
                       lambda job: run(job, "oom" if job.cfg.micro_batch == 2 else "ok"))
    measured = [(j.cfg.micro_batch, j.cfg.checkpoint_level) for j in jobs if j.kind == JobKind.MEASURE]
    assert measured == [(1, "L1"), (1, "none"), (2, "L1")]
    assert [r.status for r in rows.values() if r.micro_batch == 2 and r.checkpoint_level == "none"] == ["pruned"]
