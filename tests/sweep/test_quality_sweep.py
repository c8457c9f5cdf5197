"""Held-out quality and Ray Tune's ASHA in a real CPU sweep (search_spaces/quality-cpu.yaml, two
learning rates): the rate that learns reaches a held-out reward accuracy of at least 0.9 and is
recommended on it; ASHA stops the one that does not learn at its first rung, whose row is
``stopped`` at that step; the held-out curve is in steps.csv under TRL's names. One sweep serves
every assert."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray

from dpo_sweep import space as space_mod
from dpo_sweep.commands.report import analyse_dir
from dpo_sweep.sweep.slots import absolute_paths, trial_slots
from dpo_sweep.sweep.tuner import run_sweep
from sweep_cluster import read_csv

pytestmark = pytest.mark.slow
SPACE = Path(__file__).resolve().parents[2] / "search_spaces" / "quality-cpu.yaml"
GOOD, BAD = 1.0e-3, 1.0e-6


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    # The good rate first: async ASHA keeps the first trial at a rung and compares the later ones with it.
    sp = space_mod.load(SPACE, [f"search.lr=[{GOOD}, {BAD}]", "search.beta=[0.1]"])
    out = tmp_path_factory.mktemp("quality") / "out"
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        summary = run_sweep(sp, out, trials=[absolute_paths(t) for t in sp.trials],
                            slots=trial_slots(sp, ray.cluster_resources(), 1), done_ids=set())
    finally:
        ray.shutdown()
    analyse_dir(out)
    return sp, out, summary


def _by_lr(rows):
    return {float(r["lr"]): r for r in rows}


def test_the_rate_that_learns_passes_0_9_and_asha_stops_the_other(swept):
    _sp, out, summary = swept
    rows = _by_lr(read_csv(out / "results.csv"))
    assert not summary.crashed and summary.not_run == []
    good, bad = rows[GOOD], rows[BAD]
    assert good["status"] == "ok" and float(good["eval_rewards/accuracies"]) >= 0.9
    assert bad["status"] == "stopped" and int(bad["stopped_step"]) == 8, bad["error"]
    assert float(bad["eval_rewards/accuracies"]) < 0.8
    steps = read_csv(out / "steps.csv")
    curve = [(int(s["step"]), float(s["eval_rewards/accuracies"])) for s in steps
             if s["trial_id"] == good["trial_id"] + "-learning" and s["eval_rewards/accuracies"] not in ("", "nan")]
    assert [step for step, _ in curve] == [8, 16, 24]
    stopped = [s for s in steps if s["trial_id"] == bad["trial_id"] + "-learning"]
    assert max(int(s["step"]) for s in stopped) == 8  # its rows end where ASHA stopped it


def test_the_held_out_objective_ranks_the_rate_that_learns_first(swept):
    _sp, out, _summary = swept
    rec = json.loads((out / "recommendation.json").read_text())
    assert float(rec["config"]["lr"]) == GOOD


def test_resume_keeps_the_stopped_row(swept):
    from dpo_sweep.sweep.output_dir import finished_trial_ids, pending_rows

    _sp, out, _summary = swept
    stopped = {r["trial_id"] for r in read_csv(out / "results.csv") if r["status"] == "stopped"}
    assert stopped and stopped <= finished_trial_ids(out)  # --resume runs none of them again
    assert not stopped & {r.trial_id for r in pending_rows(out)}
