"""The noise floor (analysis/noise_floor.py): same-maths trials are never ranked by loss std, their
drift is stated in frontier.md, and a ``diverging`` verdict keeps a trial out of the recommendation."""
from __future__ import annotations

import dataclasses

import pytest
from sweep_frames import frame, trial, write_dir

from dpo_sweep.analysis import noise_floor, results
from dpo_sweep.commands.report import analyse_dir
from dpo_sweep.analysis.pareto import analyse_frontier, objectives_from_spec
from dpo_sweep.analysis.recommend import recommend
from dpo_sweep.records import StepRecord

OBJS = objectives_from_spec(None)


def _splits():
    """Four splits of effective batch 4 (one seed: the same maths), loss stds as the H200's bf16
    rounding spread them; the fastest has the largest."""
    return [trial("s1", 10.0, 100.0, 0.0028, mb=1, level="full", ga=4, seed=0),
            trial("s2", 12.0, 90.0, 0.0030, mb=2, level="L1", ga=2, seed=0),
            trial("s3", 14.0, 80.0, 0.0030, mb=2, level="none", ga=2, seed=0),
            trial("s4", 16.0, 50.0, 0.023, mb=4, level="none", ga=1, seed=0)]


def test_same_maths_split_is_not_left_out_for_its_loss_std(tmp_path):
    rec = recommend(analyse_frontier(frame(tmp_path, _splits()), OBJS), memory_budget_gb=40.0)
    assert rec.trial_id == "s4"  # the fastest; its 0.023 is rounding, as are the others' 0.003
    assert "Left out" not in rec.reason


def test_same_maths_splits_tie_on_loss_std_other_set_ups_do_not(tmp_path):
    trials = [trial("a", 10.0, 100.0, 0.01, mb=1, ga=2, seed=0), trial("b", 10.0, 100.0, 0.02, mb=2, ga=1, seed=0),
              trial("c", 10.0, 100.0, 0.01, mb=1, ga=2, seed=1), trial("d", 10.0, 100.0, 0.02, mb=2, ga=1, seed=1),
              trial("e", 10.0, 100.0, 0.03, mb=2, ga=1, beta=0.5, seed=1)]
    out = analyse_frontier(frame(tmp_path, trials), OBJS).set_index("trial_id")
    assert out["loss_std_pooled"].to_dict() == pytest.approx({"a": 0.02, "b": 0.02, "c": 0.02, "d": 0.02,
                                                              "e": 0.03})
    assert out["on_frontier"].to_dict() == {"a": True, "b": True, "c": True, "d": True, "e": False}


def test_diverging_verdict_is_never_recommended(tmp_path):
    trials = _splits()
    trials[3] = dataclasses.replace(trials[3], stability="diverging", loss_std=0.003)  # a normal loss std
    rec = recommend(analyse_frontier(frame(tmp_path, trials), OBJS), memory_budget_gb=40.0)
    assert rec.trial_id == "s3"


def _steps(trial_id: str, losses: list[float]) -> list[StepRecord]:
    return [StepRecord(trial_id, s, loss, 1.0, 100.0, 1.0, 0.5, 0.1, -10.0, -11.0, 0.01)
            for s, loss in enumerate(losses, start=1)]


def test_frontier_md_states_the_drift_of_same_maths_trials(tmp_path):
    steps = (_steps("s1", [0.693, 0.680, 0.670]) + _steps("s2", [0.693, 0.675, 0.672])
             + _steps("s3", [0.693, 0.681, 0.669]) + _steps("s4", [0.693, 0.679]))
    out_dir = write_dir(tmp_path / "r", _splits(), steps)
    groups = noise_floor.noise_floor(frame(tmp_path, _splits()), results.load_steps(out_dir))
    assert len(groups) == 1 and groups[0].trial_ids == ("s1", "s2", "s3", "s4")
    assert groups[0].steps_compared == 2  # s4 ran 2 steps
    assert groups[0].max_abs_delta_loss == pytest.approx(0.681 - 0.675)
    text = analyse_dir(out_dir, memory_budget_gb=40.0).frontier_path.read_text()
    assert "## Noise floor" in text and "s4 (4 x none x 1)" in text and "0.006" in text


def test_report_notes_state_the_noise_floor(tmp_path):
    from dpo_sweep.report.data import build_report_data

    steps = _steps("s1", [0.693, 0.680]) + _steps("s2", [0.693, 0.683])
    out_dir = write_dir(tmp_path / "r", _splits()[:2], steps)
    outcome = analyse_dir(out_dir, memory_budget_gb=40.0)
    data = build_report_data(outcome.analysed, recommend(outcome.analysed, 40.0), OBJS,
                             results.load_steps(out_dir))
    assert any(n.startswith("Noise floor: s1, s2 are the same maths") and "0.003 over 2 steps" in n
               for n in data.notes)


def test_adapter_and_optimizer_split_the_same_maths(tmp_path):
    """A LoRA row and a full fine-tuning row of one split are not the same maths: their loss
    stds are not pooled."""
    trials = [trial("full", 10.0, 100.0, 0.01, mb=1, ga=2, seed=0),
              dataclasses.replace(trial("lora", 10.0, 100.0, 0.02, mb=2, ga=1, seed=0), adapter="lora"),
              dataclasses.replace(trial("8bit", 10.0, 100.0, 0.03, mb=2, ga=1, seed=0), optimizer="adamw_8bit")]
    out = analyse_frontier(frame(tmp_path, trials), OBJS).set_index("trial_id")
    assert out["loss_std_pooled"].to_dict() == pytest.approx({"full": 0.01, "lora": 0.02, "8bit": 0.03})
