"""The runoff's finalists (dpo_sweep/plan/runoff.py): which rows get timed in full."""
from __future__ import annotations

import dataclasses
import math

import pandas as pd

from dpo_sweep.core.noise import throughput_interval
from dpo_sweep.plan.runoff import finalists, frontier_ties
from dpo_sweep.records import TrialResult


def row(tid, mb, tps, spread=0.01, peak=20.0, source="extrapolated", measured_by=None, grad_acc=None, status="ok"):
    """A row whose step time is 1000 ms, p10/p90 at -/+ spread: tokens/s interval tps / (1 +- spread)."""
    return TrialResult(trial_id=tid, status=status, model="m", seq_len=1024, micro_batch=mb, checkpoint_level="none",
                       grad_acc=grad_acc or 64 // mb, beta=0.1, workers_per_trial=1, effective_batch=64,
                       peak_mem_gb=peak, step_time_ms=1000.0, step_time_p10_ms=1000.0 * (1 - spread),
                       step_time_p90_ms=1000.0 * (1 + spread), tokens_per_s=tps,
                       step_time_source=source, measured_by=measured_by or tid)


def test_interval_is_the_throughput_at_p90_and_p10():
    # the analyser's interval (dpo_sweep/core/noise.py), which the runoff reads ties with
    frame = pd.DataFrame([dataclasses.asdict(row("a", 8, 1000.0, spread=0.25))])
    low, high = (float(x[0]) for x in throughput_interval(frame))
    assert low == 800.0 and math.isclose(high, 1000.0 / 0.75)


def test_the_h200_tie_is_timed_in_full():
    # The planned 1B sweep: mb 16 none 53,425 tokens/s (-0.31/+0.38%), mb 8 none 52,820 (-1.17/+0.40%)
    # overlap; mb 4 none 51,496 (-0.03/+0.86%) does not; mb 16 L1 46,523 is far behind.
    mb16 = row("t060", 16, 53425.0, spread=0.0035, peak=47.58)
    mb8 = row("t045", 8, 52820.0, spread=0.0117, peak=31.78)
    mb4 = row("t030", 4, 51496.0, spread=0.0086, peak=23.90)
    l1 = row("t063", 16, 46523.0, peak=30.55)
    assert [r.trial_id for r in finalists([mb4, l1, mb8, mb16], usable_gb=None)] == ["t060", "t045"]
    # On a 40 GB card mb 16 none does not fit: mb 8 none leads alone (mb 4 none's interval is apart)
    assert [r.trial_id for r in finalists([mb4, l1, mb8, mb16], usable_gb=38.0)] == ["t045"]


def test_measured_rows_and_shared_measurements_are_not_run_again():
    best = row("a", 16, 1000.0, source="measured", grad_acc=4)
    tied = row("b", 8, 995.0)
    twin = row("b-beta2", 8, 995.0, measured_by="b")  # another beta of b's configuration
    assert [r.trial_id for r in finalists([best, tied, twin], usable_gb=None)] == ["b"]
    assert finalists([best], usable_gb=None) == []  # the leader was measured in full: nothing to do


def test_failed_rows_do_not_count_and_the_number_is_capped():
    rows = [row(f"t{i}", 8, 1000.0 - i, spread=0.05) for i in range(6)]
    assert len(finalists(rows, usable_gb=None)) == 3 and len(finalists(rows, None, limit=5)) == 5
    oom = row("big", 16, 2000.0, status="oom")
    assert finalists([oom], usable_gb=None) == [] and finalists(rows + [oom], None)[0].trial_id == "t0"


def _frontier(rows):
    """The analyser's memory/throughput frontier (analysis/pareto.py) of ``rows``: trial ids on it."""
    from dpo_sweep.analysis.pareto import analyse_frontier, objectives_from_spec

    frame = pd.DataFrame([dataclasses.asdict(r) for r in rows])
    out = analyse_frontier(frame, objectives_from_spec({"memory": "min", "throughput": "max"}))
    return set(out.loc[out["on_frontier"], "trial_id"])


def test_a_frontier_point_lost_to_an_extrapolated_tie_is_timed_back():
    # The planned 1B sweep on the H200: mb 4 / full at grad_acc 16 extrapolated to 40,753-44,053
    # tokens/s (16.64 GB) reached mb 8 / full's 43,936-44,441 (17.27 GB), so mb 8 / full was off the
    # frontier; timed in full, mb 4 / full ran 40,877 tokens/s and mb 8 / full is back on it.
    mb4 = row("t014", 4, 42335.0, spread=0.039, peak=16.64)
    mb8 = row("t019", 8, 44188.0, spread=0.0057, peak=17.27)
    mb16 = row("t024", 16, 44651.0, spread=0.003, peak=19.43, source="measured", grad_acc=4)
    slow = row("t013", 4, 30000.0, spread=0.05, peak=18.78)  # dominated beyond the noise: left alone
    rows = [mb4, mb8, mb16, slow]
    assert _frontier(rows) == {"t014", "t024"}
    assert finalists(rows, usable_gb=None) == []  # mb 16 leads, measured: the recommendation is settled
    assert [r.trial_id for r in frontier_ties(rows)] == ["t019", "t014"]
    timed = dataclasses.replace(mb4, tokens_per_s=40877.0, step_time_p10_ms=995.0, step_time_p90_ms=1005.0,
                                step_time_source="runoff")
    assert _frontier([timed, mb8, mb16, slow]) == {"t014", "t019", "t024"}  # the full grid's frontier
    assert frontier_ties([timed, mb8, mb16, slow]) == []  # nothing left to settle


def test_frontier_ties_time_only_extrapolated_rows_once_per_configuration():
    lean = row("a", 4, 1000.0, spread=0.05, peak=10.0, source="measured")
    tied = row("b", 8, 1010.0, spread=0.01, peak=12.0)
    twin = row("b-beta2", 8, 1010.0, spread=0.01, peak=12.0, measured_by="b")
    assert [r.trial_id for r in frontier_ties([lean, tied, twin])] == ["b"]  # a was measured in full
    same_peak = row("c", 8, 1010.0, spread=0.01, peak=10.0)  # equal peaks: neither dominates
    assert frontier_ties([lean, same_peak]) == []
    ties = [row(f"t{i}", 8, 1000.0 + i, spread=0.05, peak=10.0 + i) for i in range(6)]
    assert len(frontier_ties(ties)) == 3 and len(frontier_ties(ties, limit=6)) == 6


# --- the runoff in the plan (no Ray): stand-in trials of tests/plan/test_plan_schedule.py ---------

from dpo_sweep.plan.jobs import JobKind  # noqa: E402
from dpo_sweep.plan.schedule import SweepPlan  # noqa: E402
from dpo_sweep.records import read_csv_rows, replace_results, write_results  # noqa: E402
from tests.plan.test_plan_schedule import drive, estimate, run, space  # noqa: E402


def learning_apart(trials):
    """``trials`` learning in another precision than theirs (bf16-mixed): their learning trials
    cannot time a row, so the runoffs time every one."""
    return [t.model_copy(update={"train": t.train.model_copy(update={"learning_precision": "bf16-mixed"})})
            for t in trials]


def timers(jobs):
    """The jobs that timed a configuration in full: runoffs, and learning trials that did it in
    place of one (they run in the rows' precision, before the runoff)."""
    return [j for j in jobs if j.kind == JobKind.RUNOFF or j.times_row]


def test_tied_extrapolated_configurations_are_timed_in_full_after_every_measurement():
    # Two levels at grad_acc 8, measured at 2: the stand-in times them alike, so they tie.
    trials = space(checkpoint_level=["none", "L1"], grad_acc=[8], beta=[0.1, 0.2])
    jobs, rows = drive(SweepPlan(trials, estimate=estimate))
    kinds = [j.kind for j in jobs]
    # After both measurements: the first beta's learning trial times the fastest (none) in full at the
    # real effective batch, then a runoff the other; the second beta's learning trial times nothing new.
    assert kinds == [JobKind.MEASURE, JobKind.MEASURE, JobKind.LEARN, JobKind.RUNOFF, JobKind.LEARN]
    assert [(j.cfg.grad_acc, j.cfg.checkpoint_level, j.kind) for j in timers(jobs)] == [
        (8, "none", JobKind.LEARN), (8, "L1", JobKind.RUNOFF)]
    runoff = [j for j in jobs if j.kind == JobKind.RUNOFF]
    assert all(j.job_id.endswith("-runoff") for j in runoff)
    assert not any(j.cfg.train.evaluate for j in runoff)  # a time, no held-batch loss
    # No worst-case step where no row takes the peak: the rows' peaks are their measurements'.
    assert not any(j.cfg.train.worst_case_step for j in jobs if j.kind != JobKind.MEASURE)
    assert all(j.cfg.train.worst_case_step for j in jobs if j.kind == JobKind.MEASURE)
    for r in rows.values():  # both betas of each level take their level's time in full
        level = next(j for j in timers(jobs) if j.cfg.checkpoint_level == r.checkpoint_level)
        assert (r.step_time_source, r.timed_by, r.measured_by) == ("runoff", level.job_id, r.measured_by)
        assert r.measured_by != level.job_id  # the memory still comes from the short measurement


def test_a_first_learning_trial_timed_slower_hands_the_timing_of_the_other_level_to_the_second():
    # As above, but the first beta's learning trial times none in full slower (900 ms) than L1's
    # extrapolation (830 ms): L1 is the fastest now, so the second beta's learning trial runs L1 and
    # times it in place of the runoff; no runoff is left (CI saw this order in a real sweep).
    trials = space(checkpoint_level=["none", "L1"], grad_acc=[8], beta=[0.1, 0.2])

    def outcome(job):
        result, steps = run(job)
        if job.kind == JobKind.LEARN and job.cfg.checkpoint_level == "none":
            result = dataclasses.replace(result, step_time_ms=900.0, step_time_p10_ms=899.0, step_time_p90_ms=901.0)
        return result, steps

    jobs, rows = drive(SweepPlan(trials, estimate=estimate), outcome)
    assert [(j.kind, j.cfg.checkpoint_level, j.cfg.beta, j.times_row) for j in jobs] == [
        (JobKind.MEASURE, "L1", 0.1, False), (JobKind.MEASURE, "none", 0.1, False),
        (JobKind.LEARN, "none", 0.1, True), (JobKind.LEARN, "L1", 0.2, True)]
    learn_none, learn_l1 = jobs[2], jobs[3]
    for r in rows.values():
        timer = learn_none if r.checkpoint_level == "none" else learn_l1
        assert (r.step_time_source, r.timed_by) == ("runoff", timer.job_id)
        assert r.step_time_ms == (900.0 if r.checkpoint_level == "none" else 830.0)
        assert r.stability_from == (learn_none if r.beta == 0.1 else learn_l1).job_id


def test_a_finalist_must_fit_the_budget_less_the_recommendation_margin():
    # Peaks 15 GB (none) and 14 GB (L1): a 15.5 GB budget leaves 14.7 GB after 5 %: only L1 is a
    # finalist of the recommendation. none is timed after it, for the frontier: the stand-in times
    # the two alike, so leaner L1's interval reaches none's and keeps it off the frontier by a tie.
    trials = space(checkpoint_level=["none", "L1"], grad_acc=[8])
    plan = SweepPlan(trials, estimate=estimate, budget_gb=15.5, margin=0.5)
    jobs, rows = drive(plan)
    # The learning trial times the fastest measured (none: every row fits the learning precision) first.
    assert [(j.cfg.checkpoint_level, j.kind) for j in timers(jobs)] == [("none", JobKind.LEARN), ("L1", JobKind.RUNOFF)]
    assert {r.checkpoint_level: r.step_time_source for r in rows.values()} == {"none": "runoff", "L1": "runoff"}
    l1 = next(t.trial_id for t in trials if t.checkpoint_level == "L1")
    notes = plan.take_notes()
    # 14 steps at the stand-in's extrapolated 830 ms: ~12 s (what the runoff costs, said before it runs)
    assert f"runoff: {l1} tied with the fastest within the step-time noise on extrapolated step times; " \
           "timing each in full at its grad_acc (14 steps: ~12 s)" in notes


def _timed(job, tps, spread):
    """The stand-in trainer's result for ``job`` with its rows' throughput set to ``tps`` and
    its step times' p10/p90 at -/+ ``spread``: a measure trial (2 of grad_acc 8 micro-steps) gets
    the short-run numbers that extrapolate to it, a runoff the numbers themselves."""
    result, steps = run(job)
    work, ratio = (8 / job.cfg.grad_acc, 830.0 / result.step_time_ms) if job.kind == JobKind.MEASURE else (1.0, 1.0)
    ms = result.step_time_ms
    return dataclasses.replace(result, tokens_per_s=tps * ratio / work, step_time_p10_ms=ms * (1 - spread),
                               step_time_p90_ms=ms * (1 + spread)), steps


def test_runoff_rounds_go_on_until_the_frontier_has_no_tie_left():
    # Peaks: L2 13 GB < L1 14 GB < none 15 GB (stand-in model), all extrapolated from 2 of 8 micro-steps.
    # Round 1: none (the fastest) and L1 tie within the noise -> both timed in full. L1 turns out
    # slower, 940 tokens/s, inside L2's wide short-run interval (818-941), which it did not reach before: a new tie that
    # round 2 settles by timing L2, found at 850.
    trials = space(checkpoint_level=["none", "L1", "L2"], grad_acc=[8])
    short = {"none": (965.0, 0.005), "L1": (960.0, 0.005), "L2": (875.0, 0.07)}
    full = {"none": 965.0, "L1": 940.0, "L2": 850.0}

    def outcome(job):
        level = job.cfg.checkpoint_level
        return _timed(job, *short[level]) if job.kind == JobKind.MEASURE else _timed(job, full[level], 0.001)

    plan = SweepPlan(trials, estimate=estimate)
    jobs, rows = drive(plan, outcome)
    assert [(j.cfg.checkpoint_level, j.kind) for j in timers(jobs)] == [
        ("none", JobKind.LEARN), ("L1", JobKind.RUNOFF), ("L2", JobKind.RUNOFF)]
    assert {r.checkpoint_level: round(r.tokens_per_s) for r in rows.values()} == full
    assert all(r.step_time_source == "runoff" for r in rows.values())
    assert _frontier(list(rows.values())) == {r.trial_id for r in rows.values()}  # each leaner, each slower
    notes = [n for n in plan.take_notes() if n.startswith("runoff:") and "timing each" in n]
    assert len(notes) == 2 and "tie on the memory/throughput frontier" in notes[-1] and "L2" in notes[-1]


def test_runoffs_stop_at_the_cap(monkeypatch):
    from dpo_sweep.plan import runoff_phase

    monkeypatch.setattr(runoff_phase, "runoff_cap", lambda measurements: 1)  # the same sweep, capped at 1 runoff
    trials = space(checkpoint_level=["none", "L1", "L2"], grad_acc=[8])
    short = {"none": (965.0, 0.005), "L1": (960.0, 0.005), "L2": (875.0, 0.07)}
    full = {"none": 965.0, "L1": 940.0, "L2": 850.0}
    jobs, rows = drive(SweepPlan(trials, estimate=estimate), lambda j: _timed(
        j, *short[j.cfg.checkpoint_level]) if j.kind == JobKind.MEASURE else _timed(j, full[j.cfg.checkpoint_level], 0.001))
    # The learning trial's timing is no runoff (it runs anyway): none by it, L1 by the one runoff.
    assert [(j.cfg.checkpoint_level, j.kind) for j in timers(jobs)] == [("none", JobKind.LEARN), ("L1", JobKind.RUNOFF)]
    assert rows[next(t.trial_id for t in trials if t.checkpoint_level == "L2")].step_time_source == "extrapolated"
    from dpo_sweep.plan.runoff import runoff_cap
    assert runoff_cap(25) == 12 and runoff_cap(5) == 3  # one per two measurements, at least 3


def test_rows_written_before_their_runoff_ended_are_handed_back_rewritten():
    trials = learning_apart(space(grad_acc=[8]))
    plan = SweepPlan(trials, estimate=estimate)
    measure = plan.next_job()
    plan.finish(measure.job_id, *run(measure))
    runoff, learn = plan.next_job(), plan.next_job()  # both start: two trials at a time
    assert (runoff.kind, learn.kind) == (JobKind.RUNOFF, JobKind.LEARN)
    plan.finish(learn.job_id, *run(learn))
    (written,) = plan.take_output()[1]  # written when measured, its stability to come
    assert written.step_time_source == "extrapolated" and written.stability == "pending"
    (learned,) = plan.take_replaced()
    assert learned.stability_from == learn.job_id and learned.step_time_source == "extrapolated"
    result, steps = run(runoff)
    plan.finish(runoff.job_id, dataclasses.replace(result, step_time_ms=999.0), steps)
    (again,) = plan.take_replaced()
    assert (again.trial_id, again.step_time_ms, again.step_time_source) == (written.trial_id, 999.0, "runoff")
    assert again.stability_from == learned.stability_from  # the rest of the row is unchanged
    # the stand-in's extrapolation: t_opt 30 ms + 8 x 100 ms
    assert f"runoff: {runoff.job_id} 999 ms per step in full (extrapolated 830 ms)" in plan.take_notes()


def test_a_runoff_that_fails_leaves_the_extrapolated_time_and_says_so():
    trials = learning_apart(space(grad_acc=[8]))
    plan = SweepPlan(trials, estimate=estimate)
    jobs, rows = drive(plan, outcome=lambda j: run(j, status="oom") if j.kind == JobKind.RUNOFF else run(j))
    assert [j.kind for j in jobs].count(JobKind.RUNOFF) == 1
    assert rows[trials[0].trial_id].step_time_source == "extrapolated"
    assert any("runoff" in n and "oom" in n for n in plan.take_notes())


def test_full_grid_and_measured_rows_have_no_runoff():
    trials = space(checkpoint_level=["none", "L1"], grad_acc=[8])
    jobs, _ = drive(SweepPlan(trials, estimate=estimate, full_grid=True))
    assert JobKind.RUNOFF not in {j.kind for j in jobs}
    jobs, _ = drive(SweepPlan(space(micro_batch=[1, 2], grad_acc=[2]), estimate=estimate))  # ran at their grad_acc
    assert JobKind.RUNOFF not in {j.kind for j in jobs}


def test_replace_results_rewrites_only_the_rows_of_those_trial_ids(tmp_path):
    a, b = row("a", 8, 100.0), row("b", 16, 200.0)
    write_results(tmp_path, [a, b])
    replace_results(tmp_path, [dataclasses.replace(b, tokens_per_s=250.0, step_time_source="runoff", timed_by="b-runoff")])
    got = {r["trial_id"]: r for r in read_csv_rows(tmp_path / "results.csv")}
    assert list(got) == ["a", "b"] and got["a"]["tokens_per_s"] == "100.0"
    assert (got["b"]["tokens_per_s"], got["b"]["timed_by"], got["b"]["step_time_source"]) == ("250.0", "b-runoff", "runoff")


def test_a_peak_at_exactly_the_usable_budget_fits():
    # 24 x 0.95 is 22.799999999999997 in floating point; 22.80 GB printed beside 22.80 GB fits.
    edge = row("t0", 8, 1000.0, peak=22.80)
    assert [r.trial_id for r in finalists([edge], usable_gb=24 * 0.95)] == ["t0"]
    assert finalists([dataclasses.replace(edge, peak_mem_gb=22.81)], usable_gb=24 * 0.95) == []
    # The plan: both levels peak at 22.80 GB on a 24 GB card, tie, and are timed in full.
    trials = space(checkpoint_level=["none", "L1"], grad_acc=[8])
    jobs, _ = drive(SweepPlan(trials, estimate=estimate, budget_gb=24.0), lambda job: run(job, peak_gb=22.80))
    assert [j.cfg.checkpoint_level for j in timers(jobs)] == ["none", "L1"]


def test_a_resumed_row_timed_by_a_runoff_keeps_the_runoff_time_after_its_learning_trial():
    # Seen on the H200: a resumed sweep's pending row was timed in full by a runoff, then its
    # learning trial ended and the row written again from the restored copy: extrapolated again.
    from tests.plan.test_plan_schedule import collect

    trials = learning_apart(space(grad_acc=[8]))
    first = SweepPlan(trials, estimate=estimate)
    measure = first.next_job()
    first.finish(measure.job_id, *run(measure))
    (written,) = first.take_output()[1]
    assert written.stability == "pending" and written.step_time_source == "extrapolated"
    plan = SweepPlan(trials, estimate=estimate, measured=[written])  # killed, then --resume
    jobs, rows = [], {written.trial_id: written}
    while (job := plan.next_job()) is not None:
        jobs.append(job)
        result, steps = run(job)
        if job.kind == JobKind.RUNOFF:
            result = dataclasses.replace(result, step_time_ms=999.0)
        plan.finish(job.job_id, result, steps)
        collect(plan, rows)
    assert [j.kind for j in jobs] == [JobKind.RUNOFF, JobKind.LEARN]
    (row,) = rows.values()
    assert (row.step_time_ms, row.step_time_source, row.timed_by) == (999.0, "runoff", jobs[0].job_id)
    assert row.stability_from == jobs[1].job_id


def test_trials_due_previews_the_round_the_rows_so_far_call_for_then_the_queue():
    trials = learning_apart(space(checkpoint_level=["none", "L1"], grad_acc=[8]))
    plan = SweepPlan(trials, estimate=estimate)

    def due(kind):
        return [(d.cfg.trial_id, d.step_ms) for d in plan.trials_due() if d.kind == kind]

    assert [t for t, _ in due(JobKind.MEASURE)] == [t.trial_id for t in trials]
    assert all(math.isnan(ms) for _, ms in due(JobKind.MEASURE))  # not measured: no step time
    first = plan.next_job()
    plan.finish(first.job_id, *run(first))
    # the fastest so far, extrapolated (t_opt 30 ms + 8 x 100 ms), at its grad_acc
    assert due(JobKind.RUNOFF) == [(first.source.trial_id + "-runoff", 830.0)]
    assert [(t, ms) for t, ms in due(JobKind.LEARN)] == [(first.source.trial_id + "-learning", 830.0)]
    second = plan.next_job()
    plan.finish(second.job_id, *run(second))
    assert not [n for n in plan.take_notes() if n.startswith("runoff")]  # a look: nothing said, nothing marked
    ahead = [t for t, _ in due(JobKind.RUNOFF)]
    runoff = plan.next_job()  # the round starts: the same two
    assert runoff.kind == JobKind.RUNOFF and ahead == [runoff.job_id] + [t for t, _ in due(JobKind.RUNOFF)]
    assert len(ahead) == 2 and due(JobKind.MEASURE) == []
    assert plan.running_due()[runoff.job_id].step_ms == 830.0
    full = SweepPlan(trials, estimate=estimate, full_grid=True)
    assert {d.kind for d in full.trials_due()} == {JobKind.MEASURE} and len(full.trials_due()) == 2


def test_a_learning_trial_in_the_rows_precision_times_its_row_in_place_of_a_runoff():
    trials = space(grad_acc=[8])
    plan = SweepPlan(trials, estimate=estimate)
    measure = plan.next_job()
    plan.finish(measure.job_id, *run(measure))
    (ahead,) = plan.trials_due()  # the learning trial alone: it will time the row, no runoff due
    learn = plan.next_job()
    assert (ahead.kind, learn.kind, learn.times_row, learn.cfg.grad_acc) == (JobKind.LEARN, JobKind.LEARN, True, 8)
    notes = plan.take_notes()
    assert any(n.startswith(f"learning: {learn.job_id} runs 16 steps at grad_acc 8, ~13 s of steps at 0.8 s each: "
                            "a stability verdict needs 16 steps at the real effective batch")
               and n.endswith(f"it times {trials[0].trial_id} in full too, in place of a runoff") for n in notes), notes
    result, steps = run(learn)
    plan.finish(learn.job_id, dataclasses.replace(result, step_time_ms=900.0), steps)
    assert plan.next_job() is None and not plan.running()
    (row,) = plan.take_replaced()
    assert (row.step_time_ms, row.step_time_source, row.timed_by, row.stability_from) == (
        900.0, "runoff", learn.job_id, learn.job_id)
    assert f"learn: {learn.job_id} timed {trials[0].trial_id}: 900 ms per step in full (extrapolated 830 ms)" in plan.take_notes()


def test_a_learning_trial_that_diverges_leaves_the_timing_to_a_runoff():
    trials = space(grad_acc=[8])
    jobs, rows = drive(SweepPlan(trials, estimate=estimate),
                       lambda j: run(j, status="diverged") if j.kind == JobKind.LEARN else run(j))
    assert [(j.kind, j.times_row) for j in jobs] == [(JobKind.MEASURE, False), (JobKind.LEARN, True), (JobKind.RUNOFF, False)]
    (row,) = rows.values()
    assert (row.step_time_source, row.timed_by) == ("runoff", jobs[2].job_id)
