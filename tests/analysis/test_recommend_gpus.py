"""GPUs per trial as an objective: where the ok rows ran on different GPU counts, a configuration
on fewer GPUs stays on the frontier beside a faster, leaner-per-GPU one on more, and the
recommendation names the fewest GPUs that fit, pricing the faster option on more cards."""
from __future__ import annotations

import dataclasses

from sweep_frames import frame, trial

from dpo_sweep.analysis import pareto
from dpo_sweep.analysis.pareto import analyse_frontier, objectives_from_spec
from dpo_sweep.analysis.recommend import recommend

OBJS = objectives_from_spec(None)


def on(gpus: int, trial_id: str, mem: float, time_ms: float, parallelism: str = "fsdp"):
    row = trial(trial_id, mem, time_ms, 0.01, mb=1, ga=16 // gpus)
    return dataclasses.replace(row, workers_per_trial=gpus, parallelism=parallelism, tokens_per_s=1e6 * gpus / time_ms)


def rows():
    return [on(2, "t2", 90.0, 100.0),  # does not fit 76 GB
            on(4, "t4a", 69.0, 100.0), on(4, "t4b", 59.0, 120.0),
            on(8, "t8", 38.0, 80.0)]


def test_gpus_is_an_objective_only_where_the_rows_differ_in_it(tmp_path):
    df = frame(tmp_path / "a", rows())
    assert pareto.with_gpus(df, OBJS) == (*OBJS, pareto.GPUS)
    same = frame(tmp_path / "b", [on(4, "t4a", 69.0, 100.0), on(4, "t4b", 59.0, 120.0)])
    assert pareto.with_gpus(same, OBJS) == OBJS


def test_the_fewest_gpus_that_fit_are_recommended_and_the_faster_option_on_more_is_priced(tmp_path):
    df = frame(tmp_path / "a", rows())
    objs = pareto.with_gpus(df, OBJS)
    analysed = analyse_frontier(df, objs)
    assert set(analysed.loc[analysed["on_frontier"], "trial_id"]) >= {"t4a", "t4b", "t8"}
    rec = recommend(analysed, memory_budget_gb=80.0, objectives=objs)
    assert rec.trial_id == "t4a" and rec.config["workers_per_trial"] == 4
    assert "runs on the fewest GPUs per trial (4, fsdp)" in rec.reason
    assert "On more GPUs the fastest is t8, on 8: 100,000 tokens/s (12,500 per GPU) against this one's 40,000 tokens/s (10,000 per GPU)" in rec.reason
    # Without the objective the 8-GPU row dominates both 4-GPU rows and is named.
    assert recommend(analyse_frontier(df, OBJS), memory_budget_gb=80.0, objectives=OBJS).trial_id == "t8"


def test_the_runner_up_on_more_gpus_says_so(tmp_path):
    df = frame(tmp_path / "a", [on(4, "t4a", 69.0, 100.0), on(8, "t8", 38.0, 80.0)])
    objs = pareto.with_gpus(df, OBJS)
    rec = recommend(analyse_frontier(df, objs), memory_budget_gb=80.0, objectives=objs)
    assert rec.trial_id == "t4a" and rec.runner_up["trial_id"] == "t8"
    assert rec.runner_up["cost"].startswith("run on 8 GPUs per trial instead of 4, add 150.0% throughput")


def test_the_card_says_the_fewest_gpus_decided(tmp_path):
    from dpo_sweep.report.headline import headline_bullets
    df = frame(tmp_path / "a", rows())
    objs = pareto.with_gpus(df, OBJS)
    analysed = analyse_frontier(df, objs)
    rec = recommend(analysed, memory_budget_gb=80.0, objectives=objs)
    bullets = headline_bullets(analysed, rec, objs)
    assert "Fewest GPUs that fit: 4 per trial (fsdp); the fastest of the 2 configurations on 4: 40,000 tokens/s." in bullets
    assert not any(b.startswith("Fastest of the") for b in bullets)
