"""The report's headline card and banners, and recommendation.json's sweep_complete: an
interrupted sweep, extrapolated headline figures, pending stability and a noisy machine are said
above everything."""
from __future__ import annotations

import json
from dataclasses import replace

from sweep_frames import trial, write_dir

import yaml

from dpo_sweep import space as space_mod
from dpo_sweep.commands.report import analyse_dir
from dpo_sweep.cli import main

SPACE = """name: h
model: {preset: tiny-llama}
data: {synthetic: {pairs: 16, prompt_tokens: 60, response_tokens: 60}}
train: {steps: 2, warmup_steps: 1, max_length: 128}
search: {micro_batch: [1, 2, 4], checkpoint_level: [none], grad_acc: [1], beta: [0.1]}
"""


def rows(*, pending=False, extrapolated=False):
    """Trials t000 (mb 1) and t001 (mb 2) of SPACE; t002 (mb 4) never ran."""
    a = replace(trial("t000_mb1_none_ga1_b0.1", 10.0, 100.0, 0.02, mb=1, seed=0), stability="stable")
    b = replace(trial("t001_mb2_none_ga1_b0.1", 12.0, 90.0, 0.03, mb=2, seed=0), stability="pending" if pending else "stable",
                step_time_source="extrapolated" if extrapolated else "measured")
    return [a, b]


def folder(tmp_path, trials, space=SPACE):
    out = write_dir(tmp_path / "r", trials)
    (out / "space.yaml").write_text(space)
    return out


def test_an_interrupted_sweep_says_so_in_the_json_and_a_banner(tmp_path):
    out = folder(tmp_path, rows(pending=True))
    result = analyse_dir(out, memory_budget_gb=40.0)
    rec = json.loads((out / "recommendation.json").read_text())
    assert rec["sweep_complete"] is False
    mb4 = next(t.trial_id for t in space_mod.parse(yaml.safe_load(SPACE)).trials if t.micro_batch == 4)
    assert rec["still_to_run"] == [{"trial_id": mb4, "missing": "measurement"},
                                   {"trial_id": "t001_mb2_none_ga1_b0.1", "missing": "stability"}]
    page = result.report_path.read_text()
    assert "This sweep did not finish: 1 configuration(s) of space.yaml have no row" in page
    assert "Stability pending for 1 row(s)" in page
    assert main(["recommend", str(out), "--memory-budget-gb", "40"]) == 0  # the console says it too


def test_a_finished_sweep_has_no_banner(tmp_path):
    trials = rows() + [replace(trial("t002_mb4_none_ga1_b0.1", 14.0, 95.0, 0.02, mb=4), stability="stable")]
    out = folder(tmp_path, trials)
    result = analyse_dir(out, memory_budget_gb=40.0)
    assert result.recommendation["sweep_complete"] is True and result.recommendation["still_to_run"] == []
    assert 'class="banner' not in result.report_path.read_text()


def test_without_a_space_completeness_is_unknown(tmp_path):
    out = write_dir(tmp_path / "r", rows())
    assert analyse_dir(out, memory_budget_gb=40.0).recommendation["sweep_complete"] is None


def test_the_headline_card_has_its_bullets_and_the_extrapolated_banner(tmp_path):
    out = folder(tmp_path, rows(extrapolated=True))
    page = analyse_dir(out, memory_budget_gb=40.0).report_path.read_text()
    assert "Fits: peaks at 12.00 GB, 26.00 GB to spare under the 38.00 GB usable (40.00 GB budget minus 5%)." in page
    assert "Fastest of the 2 configurations that qualify: 11,111 tokens/s." in page
    assert "Runner-up t000 (mb 1, none, ga 1) would cost 10.0% of the throughput" in page
    assert "Watch: its step time is extrapolated" in page
    assert "banner-extrapolated" in page and "not measured at grad_acc 1" in page
    assert '<details id="reason"><summary>Why, in full</summary>' in page


def test_a_noisy_machine_banner_when_the_top_rows_tie(tmp_path):
    noisy = [replace(trial(f"t00{i}_mb{mb}_none_ga1_b0.1", 10.0 + i, 100.0 + i, 0.02, mb=mb, seed=0),
                     step_time_p10_ms=80.0, step_time_p90_ms=130.0, stability="stable")
             for i, mb in enumerate((1, 2, 4))]
    page = analyse_dir(folder(tmp_path, noisy), memory_budget_gb=40.0).report_path.read_text()
    assert "too noisy to separate the top 3 configurations" in page
