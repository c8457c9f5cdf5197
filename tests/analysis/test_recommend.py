"""Recommendation cases: a budget between points, the safety margin, nothing fits, ties, stability."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from sweep_frames import frame, trial

from dpo_sweep.analysis.pareto import analyse_frontier, objectives_from_spec
from dpo_sweep.analysis.recommend import recommend, stability_limit
from dpo_sweep.errors import UserError

OBJS = objectives_from_spec(None)


def analysed(tmp_path, trials):
    return analyse_frontier(frame(tmp_path, trials), OBJS)


# Three frontier points: more memory buys more throughput.
LADDER = [
    trial("small", 10.0, 400.0, 0.02, mb=1, level="full"),
    trial("mid", 20.0, 200.0, 0.02, mb=2, level="L2"),
    trial("big", 40.0, 100.0, 0.02, mb=4, level="none"),
    trial("worse", 30.0, 300.0, 0.03, mb=2, level="none"),  # dominated by mid
]


def test_budget_between_points_picks_the_fastest_that_fits(tmp_path):
    rec = recommend(analysed(tmp_path, LADDER), memory_budget_gb=30.0)
    assert rec.trial_id == "mid"
    assert rec.config["micro_batch"] == 2 and rec.config["checkpoint_level"] == "L2"
    assert rec.usable_memory_gb == pytest.approx(28.5)
    assert rec.runner_up["trial_id"] == "small"
    assert rec.reason.startswith("mid (micro_batch 2, checkpoint L2, grad_acc 1, beta 0.1, seed mid) has the highest "
                                 "throughput, 5,000 tokens/s at 200 ms per step, of the 2 frontier "
                                 "configurations that peak under 28.50 GB")
    assert "runner-up, small" in rec.reason
    assert "cost 50.0% of the throughput" in rec.reason and "save 10.00 GB" in rec.reason
    assert rec.metrics["peak_mem_gb"] == 20.0


def test_safety_margin_excludes_a_peak_just_under_the_budget(tmp_path):
    df = analysed(tmp_path, LADDER)
    assert recommend(df, memory_budget_gb=41.0).trial_id == "mid"  # 40 > 41 * 0.95
    assert recommend(df, memory_budget_gb=41.0, safety_margin=0.0).trial_id == "big"
    assert recommend(df, memory_budget_gb=40.0, safety_margin=0.0).trial_id == "big"  # at the limit fits


def test_nothing_fits_names_the_cheapest_configuration(tmp_path):
    rec = recommend(analysed(tmp_path, LADDER), memory_budget_gb=8.0)
    assert rec.trial_id is None and rec.config == {} and rec.runner_up is None
    assert rec.reason.startswith("Nothing fits")
    assert "cheapest configuration measured is small" in rec.reason
    assert "10.53 GB" in rec.reason  # 10 GB / (1 - 0.05)
    assert rec.cheapest["trial_id"] == "small" and rec.cheapest["measured"] is True


def test_all_oom_names_the_smallest_configuration_tried(tmp_path):
    trials = [trial("a", status="oom", mb=4, level="L1"), trial("b", status="oom", mb=2, level="none"),
              trial("c", status="oom", mb=2, level="full"), trial("d", status="error", mb=8)]
    rec = recommend(analysed(tmp_path, trials), memory_budget_gb=80.0)
    assert rec.trial_id is None
    assert "No trial completed" in rec.reason and "3 oom, 1 error" in rec.reason
    assert rec.cheapest["trial_id"] == "c" and rec.cheapest["measured"] is False


def test_single_trial(tmp_path):
    rec = recommend(analysed(tmp_path, [trial("only", 5.0, 100.0, 0.01)]), memory_budget_gb=10.0)
    assert rec.trial_id == "only" and rec.runner_up is None
    assert "is the only frontier configuration that peaks under 9.50 GB" in rec.reason
    assert "no runner-up" in rec.reason


def test_throughput_tie_goes_to_less_memory_then_trial_id(tmp_path):
    # Same tokens/s; "lean" uses less memory. "a"/"b" are full ties, so the trial id decides,
    # whatever the row order.
    trials = [trial("fat", 20.0, 100.0, 0.01, tps=1000.0), trial("lean", 15.0, 120.0, 0.02, tps=1000.0)]
    rec = recommend(analysed(tmp_path, trials), memory_budget_gb=100.0)
    assert rec.trial_id == "lean"
    assert "match its throughput" in rec.reason
    for order in (["a", "b"], ["b", "a"]):
        ties = [trial(t, 10.0, 100.0, 0.01) for t in order]
        assert recommend(analysed(tmp_path, ties), memory_budget_gb=100.0).trial_id == "a"


def test_unstable_frontier_point_is_left_out_and_named(tmp_path):
    # "wild" is fastest and on the frontier (nothing beats its time), but its loss std is far
    # outside the others'.
    trials = [trial(f"s{i}", 10.0 + i, 300.0 - 10 * i, 0.02 + 0.001 * i) for i in range(6)]
    trials.append(trial("wild", 30.0, 50.0, 0.5))
    rec = recommend(analysed(tmp_path, trials), memory_budget_gb=100.0)
    assert rec.trial_id == "s5"
    assert "Left out for a loss std above the normal range (<= 0.046): wild (0.5)." in rec.reason
    assert rec.loss_std_limit < 0.5


def test_no_budget_recommends_the_fastest_stable_point(tmp_path):
    rec = recommend(analysed(tmp_path, LADDER), memory_budget_gb=None)
    assert rec.trial_id == "big" and rec.memory_budget_gb is None and rec.budget_source == "none"
    assert "No memory budget was given" in rec.reason


def test_off_frontier_fallback_when_memory_is_not_an_objective(tmp_path):
    objs = objectives_from_spec({"memory": None, "step_time": "min", "loss_std": None})
    df = analyse_frontier(frame(tmp_path, LADDER), objs)  # frontier: big only
    rec = recommend(df, memory_budget_gb=30.0)
    assert rec.trial_id == "mid"
    assert "No frontier configuration qualifies" in rec.reason


def test_bad_budget_and_margin_are_user_errors(tmp_path):
    df = analysed(tmp_path, LADDER)
    with pytest.raises(UserError, match="memory-budget-gb"):
        recommend(df, memory_budget_gb=-1.0)
    with pytest.raises(UserError, match="safety margin"):
        recommend(df, memory_budget_gb=10.0, safety_margin=1.5)


def test_json_has_the_contract_keys_and_no_nan(tmp_path):
    trials = LADDER + [trial("nan", 12.0, math.nan, math.nan)]
    for budget in (30.0, 1.0):
        data = recommend(analysed(tmp_path, trials), memory_budget_gb=budget).to_json_dict()
        assert {"trial_id", "config", "memory_budget_gb", "reason", "runner_up"} <= set(data)
        json.dumps(data, allow_nan=False)


def test_stability_limit():
    assert stability_limit(np.array([math.nan])) is None
    assert stability_limit(np.array([0.02])) == pytest.approx(0.04)  # twice the median
    values = np.array([0.01, 0.02, 0.03, 0.04, math.nan])
    q1, q3 = np.percentile(values[:4], [25, 75])
    assert stability_limit(values) == pytest.approx(q3 + 1.5 * (q3 - q1))


def test_throughput_and_step_time_are_written_with_thousands_separators(tmp_path):
    trials = [trial("big", 30.0, 12_345.0, 0.02, tps=51_640.0, mb=8),
              trial("small", 10.0, 4_000.0, 0.02, tps=20_480.0, mb=2, level="full")]
    rec = recommend(analysed(tmp_path, trials), memory_budget_gb=40.0)
    assert "51,640 tokens/s at 12,345 ms per step" in rec.reason
    assert "(20,480 vs 51,640 tokens/s)" in rec.reason and "take 4,000 ms per step instead of 12,345" in rec.reason
    assert "e+0" not in rec.reason


def test_advice_fits_the_failure_when_no_trial_completed(tmp_path):
    data_error = [trial("a", status="error", mb=2, level="full", error="data.path: row 3 has no 'chosen'"),
                  trial("b", status="error", mb=4, error="data.path: row 3 has no 'chosen'")]
    rec = recommend(analysed(tmp_path, data_error), memory_budget_gb=80.0)
    assert "2 failed with an error (a, b): data.path: row 3 has no 'chosen'" in rec.reason
    assert "micro_batch" not in rec.reason.split("(status error).")[-1]  # no memory advice
    assert "more memory" not in rec.reason
    diverged = [trial("d", status="diverged", mb=2, error="non-finite loss at step 3")]
    rec = recommend(analysed(tmp_path, diverged), memory_budget_gb=80.0)
    assert "1 diverged (d): non-finite loss at step 3" in rec.reason and "more memory" not in rec.reason
    mixed = data_error + [trial("o", status="oom", mb=8, error="CUDA out of memory")]
    rec = recommend(analysed(tmp_path, mixed), memory_budget_gb=80.0)
    assert ("1 ran out of memory (o): try a smaller micro_batch, a stronger checkpoint level (L2, L3, full) "
            "or a GPU with more memory") in rec.reason
    assert "2 failed with an error (a, b)" in rec.reason


def test_nothing_fits_without_any_loss_std_does_not_speak_of_a_normal_loss_std(tmp_path):
    # The seed table's case: loss std unmeasured (a short learning trial), nothing under the budget.
    rows = [trial("a", 79.6, 50_000.0), trial("b", 81.2, math.nan, status="oom")]
    rec = recommend(analysed(tmp_path, rows), memory_budget_gb=80.0)
    assert rec.reason.startswith("Nothing fits: no configuration peaks under 76.00 GB")
    assert "loss std" not in rec.reason
    with_std = recommend(analysed(tmp_path, [trial("a", 79.6, 50_000.0, 0.02)]), memory_budget_gb=80.0)
    assert with_std.reason.startswith("Nothing fits: no configuration with a normal loss std peaks under")
