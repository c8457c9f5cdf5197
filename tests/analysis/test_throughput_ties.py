"""The time objective is throughput (tokens/s, max), and throughputs inside the measured
step-time noise are ties that go to less memory."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pandas as pd
import pytest
from sweep_frames import trial, write_dir

from dpo_sweep.commands.report import analyse_dir
from dpo_sweep.cli import main


def spread(row, p10_ms: float, p90_ms: float):
    """The row with a measured step-time spread (p10, p90 around its median step_time_ms)."""
    return replace(row, step_time_p10_ms=p10_ms, step_time_p90_ms=p90_ms)


def test_issue_example_recommends_the_configuration_that_moves_the_most_tokens(tmp_path, capsys):
    # The issue's two rows: mb 8 takes longer per step but does 4x the work of mb 2.
    rows = [trial("t_mb8", 20.0, 200.0, 0.02, tps=81_920.0, mb=8, level="none"),
            trial("t_mb2", 10.0, 60.0, 0.02, tps=68_267.0, mb=2, level="full")]
    out_dir = write_dir(tmp_path / "r", rows)
    assert main(["report", str(out_dir), "--memory-budget-gb", "40"]) == 0
    rec = json.loads((out_dir / "recommendation.json").read_text())
    assert rec["trial_id"] == "t_mb8"
    assert rec["config"]["micro_batch"] == 8 and rec["config"]["checkpoint_level"] == "none"
    assert rec["runner_up"]["trial_id"] == "t_mb2"
    assert "81,920 tokens/s" in rec["reason"] and "68,267 vs 81,920 tokens/s" in rec["reason"]
    assert "No other configuration qualifies" not in rec["reason"]
    # No spread in these rows: the reason says they were compared exactly.
    assert "compared exactly" in rec["reason"]
    frontier = (out_dir / "frontier.md").read_text()
    assert "Objectives: memory min, throughput max, loss_std min." in frontier
    # Both trade memory for throughput: both on the frontier; the seed's table shape is kept.
    assert "| 2 | full | 1 | 0.1 | t_mb2 | 10.00 | 60.0 | 68,267 | 0.02 | yes |" in frontier  # seed: sweep_frames.trial
    assert "| 8 | none | 1 | 0.1 | t_mb8 | 20.00 | 200.0 | 81,920 | 0.02 | yes |" in frontier
    capsys.readouterr()
    assert main(["recommend", str(out_dir), "--memory-budget-gb", "40"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("recommended: t_mb8") and "81,920 tokens/s" in printed and "e+0" not in printed


def quickstart_pair(tps_l1: float, tps_none: float):
    """Two quickstart configurations of the same effective batch (4 pairs), each with a +-10%
    step-time spread: far wider than the difference between their median throughputs."""
    return [spread(trial("t008_mb4_L1_ga1", 7.0, 100.0, 0.02, tps=tps_l1, mb=4, level="L1"), 90.0, 110.0),
            spread(trial("t001_mb2_none_ga2", 6.0, 100.0, 0.02, tps=tps_none, mb=2, level="none", ga=2),
                   90.0, 110.0)]


def test_the_same_answer_twice_when_throughputs_differ_inside_the_noise(tmp_path):
    # Two runs of the same sweep whose medians swapped order inside the noise.
    first = analyse_dir(write_dir(tmp_path / "run1", quickstart_pair(1010.0, 1000.0)), memory_budget_gb=40.0)
    second = analyse_dir(write_dir(tmp_path / "run2", quickstart_pair(1000.0, 1010.0)), memory_budget_gb=40.0)
    for outcome in (first, second):
        assert outcome.recommendation["trial_id"] == "t001_mb2_none_ga2"  # the tie goes to less memory
    assert first.analysed["on_frontier"].tolist() == second.analysed["on_frontier"].tolist() == [False, True]
    reason = first.recommendation["reason"]
    assert "Tied with it on throughput" in reason
    assert ("t008_mb4_L1_ga1 is off the frontier: t001_mb2_none_ga2 is no worse within the noise on every "
            "objective and better on memory (6.000 vs 7.000)") in reason
    assert "No other frontier configuration qualifies" in reason  # t008 is off it: the tie dominated it
    assert "measured more tokens/s" not in second.recommendation["reason"]


def test_throughputs_apart_by_more_than_the_noise_are_not_tied(tmp_path):
    # +-2% spreads, 10% apart: the faster one wins although it uses more memory.
    rows = [spread(trial("fast", 7.0, 100.0, 0.02, tps=1100.0, mb=4, level="L1"), 98.0, 102.0),
            spread(trial("lean", 6.0, 100.0, 0.02, tps=1000.0, mb=2, ga=2), 98.0, 102.0)]
    outcome = analyse_dir(write_dir(tmp_path / "r", rows), memory_budget_gb=40.0)
    assert outcome.recommendation["trial_id"] == "fast"
    assert outcome.analysed["on_frontier"].tolist() == [True, True]
    assert "Tied with it" not in outcome.recommendation["reason"]
    assert "inside the step-time noise" not in outcome.recommendation["reason"]


def test_without_a_spread_throughputs_are_compared_exactly_and_the_reason_says_so(tmp_path):
    rows = [trial("t008_mb4_L1_ga1", 7.0, 100.0, 0.02, tps=1010.0, mb=4, level="L1"),
            trial("t001_mb2_none_ga2", 6.0, 100.0, 0.02, tps=1000.0, mb=2, ga=2)]
    outcome = analyse_dir(write_dir(tmp_path / "r", rows), memory_budget_gb=40.0)
    assert outcome.recommendation["trial_id"] == "t008_mb4_L1_ga1"
    assert ("Throughputs were compared exactly: no step-time spread (step_time_p10_ms, step_time_p90_ms) "
            "was measured" in outcome.recommendation["reason"])


def test_throughput_interval_from_the_step_time_percentiles(tmp_path):
    from dpo_sweep.core import noise

    df = pd.DataFrame({"tokens_per_s": [1000.0, 500.0, 800.0, 700.0],
                       "step_time_ms": [100.0, 100.0, 100.0, 100.0],
                       "step_time_p10_ms": [80.0, math.nan, 100.0, 90.0],
                       "step_time_p90_ms": [125.0, 120.0, 100.0, 110.0]})
    low, high = noise.throughput_interval(df)
    # The median's tokens moved in the p90 step time (slowest) and the p10 step time (fastest).
    assert low.tolist() == pytest.approx([800.0, 500.0, 800.0, 700 * 100 / 110])
    assert high.tolist() == pytest.approx([1250.0, 500.0, 800.0, 700 * 100 / 90])
    assert noise.has_spread(df).tolist() == [True, False, False, True]  # no p10; one step: p10 == p90


def test_old_step_time_objective_in_a_results_dir_is_read_as_throughput(tmp_path, capsys):
    rows = [trial("t_mb8", 20.0, 200.0, 0.02, tps=81_920.0, mb=8), trial("t_mb2", 10.0, 60.0, 0.02,
                                                                          tps=68_267.0, mb=2, level="full")]
    out_dir = write_dir(tmp_path / "r", rows)
    (out_dir / "space.yaml").write_text("name: old\nobjectives: {memory: min, step_time: min, loss_std: min}\n")
    assert main(["report", str(out_dir), "--memory-budget-gb", "40"]) == 0
    printed = capsys.readouterr().out
    assert "note: objectives.step_time: min of DIR/space.yaml read as throughput: max" in printed
    assert "throughput max (read from the old step_time: min)" in (out_dir / "frontier.md").read_text()
    assert json.loads((out_dir / "recommendation.json").read_text())["trial_id"] == "t_mb8"


def test_old_step_time_objective_in_a_space_file_is_refused_with_the_fix(tmp_path, capsys):
    space = tmp_path / "old.yaml"
    space.write_text("name: old\nmodel: {preset: tiny-llama}\n"
                     "data: {synthetic: {pairs: 8, prompt_tokens: 8, response_tokens: 8}}\n"
                     "search: {micro_batch: [1]}\nobjectives: {memory: min, step_time: min, loss_std: min}\n")
    assert main(["validate", str(space)]) == 2
    err = capsys.readouterr().err
    assert "objectives.step_time" in err and "'min'" in err and "throughput: max" in err
