"""The frontier's one dominance rule on random result tables: no trial the frontier excludes
beats a frontier trial on every median, and no trial beats the recommendation that way; and the
case where a noisier, 8 MB lighter trial knocked a better-in-every-respect trial off the frontier."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st
from sweep_frames import trial

from dpo_sweep.analysis import pareto
from dpo_sweep.analysis.pareto import analyse_frontier, objectives_from_spec
from dpo_sweep.analysis.recommend import recommend

DEFAULT = objectives_from_spec(None)


def measured(row, p10_ms: float, p90_ms: float, mem_source: str = "rss", steps: int = 4):
    return replace(row, step_time_p10_ms=p10_ms, step_time_p90_ms=p90_ms, measured_steps=steps,
                   mem_source=mem_source)


def issue_rows(mem_source: str):
    """The issue's three CPU trials: t8d43 beats t9f99 on every median (0.612 vs 0.618 GB, 6,575
    vs 6,472 tokens/s, loss std 0.0117 vs 0.0148); tf3cd, the same maths as t8d43 (effective
    batch 2), is 8 MB lighter and its throughput interval reaches t8d43's by about 20 tokens/s,
    but stays below t9f99's."""
    def row(tid, mem, tps, std, mb, ga, p10, p90, step_ms):
        return measured(trial(tid, mem, step_ms, std, tps=tps, mb=mb, ga=ga, seed=0), p10, p90, mem_source, steps=0)
    return [row("t8d43_mb2_none_ga1", 0.612, 6575.0, 0.0117, 2, 1, 60.0, 62.5, 60.0),  # 6,312-6,575
            row("t9f99_mb2_none_ga2", 0.618, 6472.0, 0.0148, 2, 2, 119.0, 121.0, 120.0),  # 6,419-6,526
            row("tf3cd_mb1_none_ga2", 0.604, 6200.0, 0.0117, 1, 2, 57.5, 60.0, 59.0)]  # 6,097-6,362


def frame_of(tmp_path, rows) -> pd.DataFrame:
    from sweep_frames import frame
    return frame(tmp_path, rows)


def test_issue_case_keeps_the_trial_that_beats_the_winner_on_every_median(tmp_path):
    # Without a memory floor (rows without mem_source) the lighter tf3cd still dominates t8d43
    # within the noise, but t8d43 beats the frontier's t9f99 on every median: it stays on.
    for source in ("", "rss"):
        out = analyse_frontier(frame_of(tmp_path / (source or "none"), issue_rows(source)), DEFAULT)
        on = dict(zip(out["trial_id"], out["on_frontier"]))
        assert on["t8d43_mb2_none_ga1"], source
        rec = recommend(out, None)
        assert rec.trial_id != "t9f99_mb2_none_ga2", source
    # With the RSS floor the 8 MB are a tie: t8d43 is the fastest, and tf3cd, as lean within the
    # floor, loses for its accumulation; the reason gives the figures that decided.
    assert rec.trial_id == "t8d43_mb2_none_ga1"
    assert ("tf3cd_mb1_none_ga2 measured 6,200 tokens/s, inside the noise of this one's and peaks 8.0 MB lower "
            "(0.604 vs 0.612 GB), inside the 0.020 GB memory floor, with grad_acc 2 where this one has no "
            "checkpointing or accumulation") in rec.reason
    assert "ties go to less peak memory" not in rec.reason


metric_gb = st.integers(0, 8).map(lambda v: 0.5 + v * 0.004)  # steps of 4 MB: many ties within 0.02 GB
tps_ = st.integers(0, 8).map(lambda v: 6000.0 + 100.0 * v)
spread = st.tuples(st.floats(0.85, 1.0), st.floats(1.0, 1.2))


@settings(max_examples=50, deadline=None)
@given(points=st.lists(st.tuples(metric_gb, tps_, st.integers(0, 3), spread, st.sampled_from(["rss", "nvml", ""]),
                                 st.sampled_from([1, 2]), st.sampled_from(["none", "L1", "full"])),
                       min_size=1, max_size=12),
       seed=st.integers(0, 1000))
def test_property_nothing_excluded_beats_a_frontier_trial_or_the_recommendation_on_every_median(points, seed):
    rows = pd.DataFrame({
        "trial_id": [f"p{i:02d}" for i in range(len(points))], "status": "ok", "model": "m", "seq_len": 128,
        "micro_batch": 2, "checkpoint_level": [p[6] for p in points], "grad_acc": [p[5] for p in points],
        "beta": 0.1, "num_workers": 1, "effective_batch": [2 * p[5] for p in points],
        "peak_mem_gb": [p[0] for p in points], "tokens_per_s": [p[1] for p in points],
        "step_time_ms": 100.0, "step_time_p10_ms": [100.0 * p[3][0] for p in points],
        "step_time_p90_ms": [100.0 * p[3][1] for p in points], "measured_steps": 4,
        "loss_std": [0.01 + 0.002 * p[2] for p in points], "mem_source": [p[4] for p in points],
        "seed": [str(i) for i in range(len(points))],
    })
    out = analyse_frontier(rows, DEFAULT)
    medians = pareto.as_minimisation(out, DEFAULT)
    on = out["on_frontier"].to_numpy()
    beats = np.all(medians[:, None, :] < medians[None, :, :], axis=2)  # [i, j]: i beats j on every median
    assert on.any()
    assert not beats[np.ix_(~on, on)].any()  # no excluded trial beats a frontier trial on every median
    low, high = pareto.intervals_as_minimisation(out, DEFAULT)
    dominates = np.all(low[:, None, :] <= high[None, :, :], axis=2) & np.any(high[:, None, :] < low[None, :, :], axis=2)
    assert dominates[np.ix_(on, ~on)].any(axis=0).all()  # and each excluded one is dominated by a frontier one
    rec = recommend(out, None)
    winner = int(np.flatnonzero(out["trial_id"].to_numpy() == rec.trial_id)[0])
    assert not beats[:, winner].any()  # nothing beats the recommendation on every median
    shuffled = rows.sample(frac=1.0, random_state=seed).reset_index(drop=True)
    again = analyse_frontier(shuffled, DEFAULT)
    assert sorted(again.loc[again["on_frontier"], "trial_id"]) == sorted(out.loc[on, "trial_id"])
    assert recommend(again, None).trial_id == rec.trial_id
