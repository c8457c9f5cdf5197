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
    result = analyse_dir(out, memory_budget_gb=40.0)
    page = result.report_path.read_text()
    assert "Its step time is extrapolated from a shorter gradient accumulation" in result.recommendation["reason"]
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


def test_a_simulated_ranks_winner_says_its_time_is_modelled_and_its_peak_measured(tmp_path):
    """A row of simulated ranks (step_time_source modelled) is named as such in the banner, the
    watch bullet and the recommendation's reason; a measured winner beside it has none of it."""
    a, b = rows()
    a = replace(a, workers_per_trial=8)  # on as many GPUs: fewer would win first (analysis/ranking.py)
    b = replace(b, step_time_source="modelled", ranks_simulated=True, workers_per_trial=8, comm_ms=412.0)
    out = folder(tmp_path, [a, b])
    result = analyse_dir(out, memory_budget_gb=40.0)
    page = result.report_path.read_text()
    assert result.recommendation["trial_id"] == "t001_mb2_none_ga1_b0.1"
    assert "banner-modelled" in page and "The recommended trial and 0 other row(s) ran as rank 0" in page
    assert "Watch: its step time is modelled, not timed on 8 GPUs" in page
    assert ("Its peak is one GPU's of 8, measured on simulated ranks; its step time is modelled (one rank's "
            "compute plus the step's collectives at the card's GPU-to-GPU bandwidth, no overlap, 412 ms of it "
            "communication), not timed on 8 GPUs.") in result.recommendation["reason"]
    # The same rows with the modelled one slower: a measured winner, the banner still counts the row.
    b = replace(b, step_time_ms=200.0, tokens_per_s=5000.0)
    page = analyse_dir(folder(tmp_path / "slow", [a, b]), memory_budget_gb=40.0)
    assert "1 row(s) ran as rank 0" in page.report_path.read_text()
    assert "modelled" not in page.recommendation["reason"]


def test_the_console_ends_with_the_card_s_bullets_and_warnings_not_the_reason_paragraph(tmp_path, capsys):
    out = folder(tmp_path, rows(extrapolated=True))
    reason = analyse_dir(out, memory_budget_gb=40.0).recommendation["reason"]
    capsys.readouterr()
    assert main(["recommend", str(out), "--memory-budget-gb", "40"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("recommended: t001_mb2_none_ga1_b0.1")
    assert "\n  - Fits: peaks at 12.00 GB, 26.00 GB to spare" in printed
    assert "\n  - Watch: its step time is extrapolated" in printed
    assert "\nwarning: The recommended trial's step time and tokens/s are extrapolated" in printed
    assert "why, in full: recommendation.json's reason (and report.html)" in printed
    assert reason not in printed
    # An unfinished sweep's warning is said once, in its own line.
    pending = folder(tmp_path / "p", rows(pending=True))
    assert main(["recommend", str(pending), "--memory-budget-gb", "40"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("did not finish") == 1, printed
