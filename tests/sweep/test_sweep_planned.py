"""The planner in a real Ray sweep (Tune + Train V2, CPU, tiny-llama, in this process): 2 betas x
2 micro_batch x 2 levels, the biggest micro_batch running out of memory. Fewer Ray trials than
configurations; every configuration gets a row: measured, sharing a measurement (``measured_by``),
its step time extrapolated from a short accumulation, its stability from a learning trial, or
``pruned`` after the OOM it follows from; the frontier and the recommendation cover every row."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray

from dpo_sweep import space as space_mod
from dpo_sweep.commands.report import analyse_dir
from dpo_sweep.sweep.slots import absolute_paths, trial_slots
from dpo_sweep.sweep.tuner import run_sweep
from oom_from_micro_batch_2 import run_trial as oom_from_micro_batch_2
from sweep_cluster import read_csv, write_space

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


@pytest.fixture
def local_ray(monkeypatch):
    # The Train workers import the trainer stand-in from this folder.
    path = f"{HERE}:{HERE.parents[1]}"
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray.cluster_resources()
    ray.shutdown()


def test_planned_sweep_runs_fewer_trials_and_writes_every_row(local_ray, tmp_path):
    path = write_space(tmp_path / "planned.yaml", "planned", """\
        micro_batch: [1, 2]
        checkpoint_level: [none, L1]
        grad_acc: [3]
        beta: [0.1, 0.2]
        """, train_extra=", learning_steps: 5")  # the space's steps: 3
    sp = space_mod.load(path)
    out = tmp_path / "out"
    summary = run_sweep(sp, out, trials=[absolute_paths(t) for t in sp.trials], slots=trial_slots(sp, local_ray, 1),
                        done_ids=set(), trainer=oom_from_micro_batch_2)
    rows = {r["trial_id"]: r for r in read_csv(out / "results.csv")}
    assert set(rows) == {t.trial_id for t in sp.trials}
    steps = read_csv(out / "steps.csv")
    runoffs = {s["trial_id"] for s in steps if s["trial_id"].endswith("-runoff")}
    timed_by = {r["timed_by"] for r in rows.values()} - {""}
    # mb 1: one measurement per level (the betas share it); mb 2 L1 (predicted cheaper than none)
    # runs out; mb 2 none is pruned; one learning trial per beta at mb 1, the first of which, in
    # fp32 as the rows, times the fastest mb 1 level in full at grad_acc 3. The other level is then
    # timed by the second learning trial when the first's time in full made it the fastest (CI ran
    # that way: 201 ms in full against 189 ms extrapolated), else by a runoff if their times tie, else
    # by none (tests/plan/test_plan_runoff.py drives both orders).
    learners = timed_by - runoffs
    assert all(t.endswith("-learning") for t in learners)
    assert (len(learners), len(runoffs)) in ((1, 0), (1, 1), (2, 0)), (runoffs, timed_by)
    ran = {s["trial_id"] for s in steps}
    assert summary.ray_trials == 5 + len(runoffs) < len(sp.trials) and not summary.crashed, (
        summary, sorted(ran), (out / "sweep.log").read_text() if (out / "sweep.log").exists() else "")
    by = {(int(r["micro_batch"]), r["checkpoint_level"], float(r["beta"])): r for r in rows.values()}
    if len(learners) == 2:  # each mb 1 level timed once for both betas, the two by different trials
        timers = {level: {by[(1, level, b)]["timed_by"] for b in (0.1, 0.2)} for level in ("none", "L1")}
        assert all(len(t) == 1 for t in timers.values()) and timers["none"] | timers["L1"] == learners, timers
    oom = by[(2, "L1", 0.1)]
    assert oom["status"] == "oom" and by[(2, "L1", 0.2)]["status"] == "oom"
    assert by[(2, "L1", 0.2)]["measured_by"] == oom["trial_id"]
    for beta in (0.1, 0.2):
        pruned = by[(2, "none", beta)]
        assert pruned["status"] == "pruned" and oom["trial_id"] in pruned["error"], pruned
        for level in ("none", "L1"):
            r = by[(1, level, beta)]
            assert r["status"] == "ok" and r["measured_by"] == by[(1, level, 0.1)]["trial_id"]
            assert r["step_time_source"] in ("extrapolated", "runoff") and float(r["step_time_ms"]) > 0
            # a runoff's row names it, and results.csv was rewritten with its time if need be
            assert (r["timed_by"] != "") == (r["step_time_source"] == "runoff")
            assert r["stability_from"].endswith("-learning") and r["loss_std"] != ""
            assert (r["stability_steps"], r["stability_precision"], r["stability_note"]) == ("5", "fp32", "")
            assert int(r["grad_acc"]) == 3 and int(r["effective_batch"]) == 3
            assert float(r["predicted_peak_gb"]) >= 0
    # The two betas learn separately: their stability columns come from different trials.
    assert by[(1, "none", 0.1)]["stability_from"] != by[(1, "none", 0.2)]["stability_from"]

    learned = {r["stability_from"] for r in rows.values() if r["stability_from"]}
    assert learned <= ran
    assert runoffs <= timed_by  # every runoff timed its rows
    for trial_id in learned:  # a learning trial runs train.learning_steps, the measurements train.steps
        typical = [s for s in steps if s["trial_id"] == trial_id and s["worst_case"] != "True"]
        assert [int(s["step"]) for s in typical] == [1, 2, 3, 4, 5]
    assert max(int(s["step"]) for s in steps if s["trial_id"] == by[(1, "L1", 0.1)]["trial_id"]
               and s["worst_case"] != "True") == 3
    # The short measurement runs 2 micro-steps a step: micro-step and optimizer times are recorded.
    short = [s for s in steps if s["trial_id"] == by[(1, "L1", 0.1)]["trial_id"]]
    assert short and all(float(s["micro_step_ms"]) > 0 and float(s["optimizer_ms"]) > 0 for s in short)

    analysis = analyse_dir(out)
    assert analysis.frontier_markdown.count("\n|") >= len(sp.trials)  # header, rule and one per row
    rec = json.loads(analysis.recommendation_path.read_text())
    if rec["trial_id"] is None:  # 5 steps of random pairs at lr 1e-3 may rise: then every row says so
        assert "every completed configuration diverged" in rec["reason"]
        assert all(r["stability"] == "diverging" for r in rows.values() if r["status"] == "ok")
    else:
        assert rows[rec["trial_id"]]["status"] == "ok"
