"""The planner's Ray Tune Searcher driven by hand, as Tune's controller would (no cluster): it
suggests the plan's trials, waits (None) while one runs, and says FINISHED at the end; the
recorder hands each trial's reports to the plan and appends the rows the plan has ready."""
from __future__ import annotations


from ray.tune.search import ConcurrencyLimiter, Searcher

from dpo_sweep.plan.schedule import SweepPlan
from dpo_sweep.records import StepRecord, TrialResult, read_csv_rows
from dpo_sweep.sweep.protocol import OutcomeReport, StepReport, TrialEnding, TrialFailure
from dpo_sweep.sweep.output_dir import prepare_output
from dpo_sweep.sweep.planner import PlanSearcher
from dpo_sweep.sweep.recorder import SweepRecorder
from dpo_sweep.sweep.task import TrialTask, task_of
from testkit import end_trial, make_cfg


def _reports(cfg, status: str) -> list[dict]:
    """The Tune results of one trial: a step, rank 0's outcome, the trainable's summary."""
    step = StepRecord(trial_id=cfg.trial_id, step=1, loss=0.7, grad_norm=1.0, step_time_ms=230.0, peak_mem_gb=2.0,
                      reward_accuracy=0.5, reward_margin=0.0, logps_chosen=-1.0, logps_rejected=-1.0, kl=0.0,
                      micro_step_ms=100.0, optimizer_ms=29.0)
    row = TrialResult(trial_id=cfg.trial_id, status="ok", **cfg.knobs(), peak_mem_gb=2.0, step_time_ms=230.0,
                      loss_std=0.1)
    if status == "oom":
        return [TrialEnding(TrialFailure("oom", "rank 0: OOM")).to_report()]
    return [StepReport(step).to_report(), OutcomeReport(row).to_report(), TrialEnding().to_report()]


def test_searcher_runs_fewer_trials_than_configurations_and_writes_every_row(tmp_path):
    trials = [make_cfg(trial_id=f"t{i}_mb{mb}_{lv}_b{b}", micro_batch=mb, checkpoint_level=lv, beta=b, grad_acc=1)
              for i, (mb, lv, b) in enumerate((mb, lv, b) for mb in (1, 2) for lv in ("none", "L1") for b in (0.1, 0.2))]
    plan = SweepPlan(trials)
    rec = SweepRecorder(tmp_path, plan, total=len(trials), already_done=0)
    searcher = ConcurrencyLimiter(PlanSearcher(plan, rec, TrialTask(trials[0])), max_concurrent=1)  # as tune.TuneConfig wraps it
    started, running, waited = [], [], 0
    while True:
        config = searcher.suggest(f"tune-{len(started)}")
        if config == Searcher.FINISHED:
            assert not running
            break
        if config is not None:  # Tune starts it; ask again
            trial = type("T", (), {"trial_id": f"tune-{len(started)}", "config": config})()
            started.append(task_of(config).cfg)
            running.append(trial)
            continue
        waited += 1  # None: nothing can start until a running trial ends; end the oldest
        trial = running.pop(0)
        end_trial(rec, searcher, trial, _reports(rec._cfg(trial), "oom" if task_of(trial.config).cfg.micro_batch == 2 else "ok"))
    assert waited >= 1
    rows = {r["trial_id"]: r for r in read_csv_rows(tmp_path / "results.csv")}
    assert set(rows) == {t.trial_id for t in trials} and len(started) < len(trials)
    assert {r["status"] for r in rows.values()} == {"ok", "oom", "pruned"}
    for r in rows.values():
        if r["status"] == "pruned":
            assert "ran out of memory" in r["error"] and r["micro_batch"] == "2"
        if r["status"] == "ok":
            assert r["measured_by"] and r["stability_from"]
    steps = read_csv_rows(tmp_path / "steps.csv")
    learning = {s["trial_id"] for s in steps if s["trial_id"].endswith("-learning")}
    assert learning and learning <= {r["stability_from"] for r in rows.values()}
    # --resume keeps the learning trials' steps: rows name them.
    space = tmp_path / "space.yaml"
    space.write_text("name: x\n")
    prepare_output(space, tmp_path, resume=True)
    assert {s["trial_id"] for s in read_csv_rows(tmp_path / "steps.csv")} >= learning


def test_the_plan_learns_a_trials_outcome_in_the_searcher_and_the_recorder_then_writes_it(tmp_path):
    # Tune's order when a trial ends: the Searcher's on_trial_complete, then the callbacks' hook.
    cfg = make_cfg(trial_id="t0", grad_acc=1, learning_steps=2)  # its own learning trial: its row is final
    plan = SweepPlan([cfg], full_grid=True)
    rec = SweepRecorder(tmp_path, plan, total=1, already_done=0)
    ended = []
    searcher = PlanSearcher(plan, rec, TrialTask(cfg), end_hooks=(lambda job, done: ended.append(job.job_id),))
    config = searcher.suggest("tune-0")
    trial = type("T", (), {"trial_id": "tune-0", "config": config})()
    for report in _reports(cfg, "ok"):
        rec.on_trial_result(0, [], trial, report)
    assert plan.running() and not (tmp_path / "results.csv").exists()  # the reports alone: nothing learnt
    searcher.on_trial_complete("tune-0", result={})
    assert not plan.running() and ended == ["t0"]  # the plan knows, the end hooks ran
    assert not (tmp_path / "results.csv").exists()
    rec.on_trial_complete(0, [], trial)
    assert [r["trial_id"] for r in read_csv_rows(tmp_path / "results.csv")] == ["t0"]
    assert searcher.suggest("tune-1") == Searcher.FINISHED
