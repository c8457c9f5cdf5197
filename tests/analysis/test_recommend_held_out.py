"""A held-out objective (data.eval_pairs) ranks the recommendation's candidates first: between
learning set-ups that share one memory/time measurement - the same throughput and peak - the one
that ranks unseen pairs better is named, not the first in the space, and the reason says by how
many pairs and whether that lies inside the sampling noise. Without such an objective the
throughput rules decide as before."""
from __future__ import annotations

import dataclasses
import math

import pytest
from sweep_frames import frame
from test_recommend_learning_ties import betas_sharing_one_measurement

from dpo_sweep.analysis.pareto import analyse_frontier, objectives_from_spec
from dpo_sweep.analysis.quality import wilson
from dpo_sweep.analysis.recommend import recommend

QUALITY = objectives_from_spec({"memory": "min", "eval_reward_accuracy": "max"})


def scored(accuracies, pairs=64, margins=(1.0, 1.0, 1.0)):
    rows = betas_sharing_one_measurement((0.002, 0.003, 0.004))
    return [dataclasses.replace(r, eval_reward_accuracy=a, eval_reward_margin=m, eval_pairs=pairs)
            for r, a, m in zip(rows, accuracies, margins)]


def recommended(tmp_path, rows, objectives=QUALITY, name="f"):
    return recommend(analyse_frontier(frame(tmp_path / name, rows), objectives), memory_budget_gb=80.0,
                     objectives=objectives)


def test_the_best_held_out_accuracy_wins_over_the_first_in_the_space(tmp_path):
    rec = recommended(tmp_path, scored((0.75, 0.96875, 1.0)))
    assert rec.trial_id == "t002_beta0.3" and rec.runner_up["trial_id"] == "t001_beta0.1"
    assert "has the best held-out reward accuracy (1.000 on 64 held-out pairs) of the 3 configurations" in rec.reason
    assert ("t001_beta0.1 (beta 0.1) scored 0.969 held-out reward accuracy, 2 of 64 pairs fewer, inside this "
            "one's 95% interval 0.94-1.00: a larger data.eval_pairs would tell them apart") in rec.reason
    assert "t000_beta0.05 (beta 0.05) scored 0.750 held-out reward accuracy, 16 of 64 pairs fewer, outside" in rec.reason
    assert "would score 0.969 held-out reward accuracy instead of 1.000" in rec.reason
    # Held-out accuracy separated them: the reason no longer asks the reader to choose beta.
    assert "choose beta by your own evaluation" not in rec.reason


def test_without_a_held_out_objective_the_first_in_the_space_is_still_named(tmp_path):
    rec = recommended(tmp_path, scored((0.75, 0.96875, 1.0)), objectives_from_spec(None))
    assert rec.trial_id == "t000_beta0.05" and "held-out" not in rec.reason
    assert "choose beta by your own evaluation" in rec.reason


def test_equal_held_out_scores_fall_to_the_throughput_rules_and_say_so(tmp_path):
    rec = recommended(tmp_path, scored((1.0, 1.0, 0.5)))
    assert rec.trial_id == "t000_beta0.05" and rec.runner_up["trial_id"] == "t001_beta0.1"
    assert "beta 0.05 and 0.1 share this measurement" in rec.reason  # the two that score alike
    assert "t002_beta0.3 (beta 0.3) scored 0.500 held-out reward accuracy" in rec.reason


def test_a_minimised_held_out_loss_ranks_the_lowest_first(tmp_path):
    rows = [dataclasses.replace(r, eval_loss=loss) for r, loss in zip(scored((1.0,) * 3), (0.3, 0.1, 0.2))]
    objectives = objectives_from_spec({"memory": "min", "eval_loss": "min"})
    rec = recommended(tmp_path, rows, objectives)
    assert rec.trial_id == "t001_beta0.1" and rec.runner_up["trial_id"] == "t002_beta0.3"
    assert "has the lowest held-out DPO loss (0.1)" in rec.reason


def test_a_faster_configuration_that_ranks_worse_loses_to_the_better_held_out_one(tmp_path):
    slow, fast = scored((1.0, 0.5, 0.5))[:2]
    fast = dataclasses.replace(fast, trial_id="t009_fast", measured_by="t009_fast", step_time_ms=50.0,
                               step_time_p10_ms=49.0, step_time_p90_ms=51.0, tokens_per_s=2e4, peak_mem_gb=20.0)
    objectives = objectives_from_spec({"memory": "min", "throughput": "max", "eval_reward_accuracy": "max"})
    rec = recommended(tmp_path, [slow, fast], objectives)  # both on the frontier
    assert rec.trial_id == slow.trial_id
    assert "would score 0.500 held-out reward accuracy instead of 1.000, add" in rec.reason


@pytest.mark.parametrize("p, n, low, high", [(1.0, 64, 0.9434, 1.0), (0.5, 32, 0.3363, 0.6637), (0.0, 10, 0.0, 0.2775)])
def test_wilson_interval(p, n, low, high):
    lo, hi = wilson(p, n)
    assert lo == pytest.approx(low, abs=1e-4) and hi == pytest.approx(high, abs=1e-4)
    assert all(math.isnan(v) for v in wilson(0.5, 0))


def test_the_frontier_table_shows_the_held_out_scores_only_where_the_sweep_has_them(tmp_path):
    from dpo_sweep.analysis import tables
    rows = scored((0.75, 0.96875, 1.0))
    rows[0] = dataclasses.replace(rows[0], status="stopped", stopped_step=8, eval_loss=0.5)
    analysed = analyse_frontier(frame(tmp_path / "a", rows), QUALITY)
    header = tables.frontier_header(analysed)
    at = header.index("eval accuracy")
    assert header[at - 1] == "stability" and header[at:at + 3] == ("eval accuracy", "eval margin", "eval loss")
    body = {r[3]: r for r in tables.frontier_rows(analysed)}  # by beta
    assert body["0.05"][at:at + 3] == ["0.750", "1", "0.5"] and body["0.3"][at] == "1.000"
    assert all(len(r) == len(header) for r in body.values())
    plain = analyse_frontier(frame(tmp_path / "b", betas_sharing_one_measurement((0.002, 0.003, 0.004))), QUALITY)
    assert not any(h.startswith("eval") for h in tables.frontier_header(plain))


def test_the_card_says_held_out_quality_ranked_first(tmp_path):
    from dpo_sweep.report.headline import headline_bullets
    analysed = analyse_frontier(frame(tmp_path / "a", scored((0.75, 0.96875, 1.0))), QUALITY)
    rec = recommend(analysed, memory_budget_gb=80.0, objectives=QUALITY)
    bullets = headline_bullets(analysed, rec, QUALITY)
    assert any(b.startswith("Ranked by held-out quality first: best held-out reward accuracy (1.000 on 64 held-out "
                            "pairs); 10,000 tokens/s.") for b in bullets), bullets
