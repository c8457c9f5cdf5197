"""The recommendation's tie rule between learning set-ups: rows tied on
throughput go to less memory, then the stability verdict, then the trial id - never to the
loss std of single learning trials - and the reason says when one measurement stands for several
learning set-ups."""
from __future__ import annotations

import dataclasses

import pytest
from sweep_frames import frame, trial

from dpo_sweep.analysis.pareto import analyse_frontier, objectives_from_spec
from dpo_sweep.analysis.recommend import recommend

OBJS = objectives_from_spec(None)
BETAS = (0.05, 0.1, 0.3)
#: The H200 betas space's two runs: three betas' single 5-step learning trials' loss std, in
#: beta order; the old tie-break (lower loss std) named beta 0.05 after the first, 0.3 after the second.
H200_LOSS_STDS = ((0.00236, 0.00593, 0.00516), (0.00457, 0.00396, 0.00235))


def betas_sharing_one_measurement(stds, verdicts=("stable",) * 3, steps=16, precision="bf16-mixed"):
    """Three betas of one configuration: one memory/time measurement (t000's), one learning trial each."""
    rows = []
    for i, (beta, std, verdict) in enumerate(zip(BETAS, stds, verdicts)):
        row = trial(f"t{i:03d}_beta{beta}", 20.0, 100.0, std, mb=4, ga=2, beta=beta, seed=0)
        rows.append(dataclasses.replace(row, measured_by="t000_beta0.05", stability=verdict,
                                        step_time_p10_ms=99.0, step_time_p90_ms=101.0,
                                        stability_from=f"t{i:03d}_beta{beta}-learning",
                                        stability_steps=steps, stability_precision=precision))
    return rows


def recommended(tmp_path, rows, name="f"):
    return recommend(analyse_frontier(frame(tmp_path / name, rows), OBJS), memory_budget_gb=80.0)


def test_the_h200_flip_one_measurement_three_betas_gives_one_answer_in_either_loss_std_order(tmp_path):
    recs = [recommended(tmp_path, betas_sharing_one_measurement(stds), f"run{i}")
            for i, stds in enumerate(H200_LOSS_STDS)]
    assert [r.trial_id for r in recs] == ["t000_beta0.05", "t000_beta0.05"]  # the first in the space
    assert recs[0].runner_up["trial_id"] == recs[1].runner_up["trial_id"] == "t001_beta0.1"
    for stds in H200_LOSS_STDS:  # every order of the three: still the first in the space
        reversed_rows = betas_sharing_one_measurement(stds[::-1])
        assert recommended(tmp_path, reversed_rows, f"rev{stds[0]}").trial_id == "t000_beta0.05"


def test_the_reason_says_the_measurement_stands_for_every_beta_and_why_none_is_preferred(tmp_path):
    rec = recommended(tmp_path, betas_sharing_one_measurement(H200_LOSS_STDS[0]))
    assert ("beta 0.05, 0.1 and 0.3 share this measurement; their learning trials (16 steps, bf16-mixed) "
            "were all `stable` and are not ranked by loss std (one trial each), so the first in the space "
            "is named: choose beta by your own evaluation.") in rec.reason
    assert "of the 3 configurations on the frontier or sharing a frontier measurement" in rec.reason


def test_tied_rows_go_to_stable_before_noisy_before_no_verdict_whatever_their_loss_std(tmp_path):
    # t002 is the only `stable` one and has the highest loss std; t001 `noisy`, t000 no verdict.
    rows = betas_sharing_one_measurement((0.001, 0.002, 0.003), verdicts=("", "noisy", "stable"))
    rec = recommended(tmp_path, rows)
    assert rec.trial_id == "t002_beta0.3" and rec.runner_up["trial_id"] == "t001_beta0.1"
    assert ("were `no verdict` (beta 0.05), `noisy` (beta 0.1) and `stable` (beta 0.3) and are not ranked "
            "by loss std (one trial each), so the first with the best verdict (`stable`) in the space is named"
            ) in rec.reason


def test_a_diverging_learning_trial_still_never_qualifies(tmp_path):
    rows = betas_sharing_one_measurement((0.001, 0.002, 0.003), verdicts=("diverging", "noisy", "noisy"))
    rec = recommended(tmp_path, rows)
    assert rec.trial_id == "t001_beta0.1" and "beta 0.1 and 0.3 share this measurement" in rec.reason


def test_less_memory_still_decides_a_throughput_tie_before_the_verdict(tmp_path):
    lean = dataclasses.replace(trial("lean", 15.0, 100.0, 0.01, seed=0, mb=2, ga=4), stability="noisy",
                               step_time_p10_ms=99.0, step_time_p90_ms=101.0)
    rows = betas_sharing_one_measurement((0.001, 0.002, 0.003)) + [lean]
    assert recommended(tmp_path, rows).trial_id == "lean"


def test_a_loss_std_outside_the_normal_range_still_filters(tmp_path):
    # stability_limit: Q3 + 1.5 IQR, at least twice the median; with these slower, larger rows of
    # loss std 0.002-0.003 beside them, 0.5 is far out.
    others = [trial(f"x{i}", 30.0 + i, 200.0, 0.002 + 0.0002 * i, seed=i) for i in range(5)]
    rows = betas_sharing_one_measurement((0.5, 0.002, 0.003)) + others
    rec = recommended(tmp_path, rows)
    assert rec.trial_id == "t001_beta0.1" and "beta 0.1 and 0.3 share this measurement" in rec.reason


@pytest.mark.parametrize("columns", [True, False])
def test_one_learning_set_up_per_measurement_gets_no_such_sentence(tmp_path, columns):
    rows = betas_sharing_one_measurement((0.001, 0.002, 0.003))[:1]
    if not columns:  # a results file of an older version: no measured_by, no stability columns
        rows = [dataclasses.replace(r, measured_by="", stability="", stability_steps=None) for r in rows]
    assert "share this measurement" not in recommended(tmp_path, rows).reason
