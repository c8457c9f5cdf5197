"""The frontier on hand-made points, the edge cases, and a property test of dominance."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpo_sweep.analysis import pareto
from dpo_sweep.analysis.pareto import Objective, analyse_frontier, frontier_mask, objectives_from_spec
from dpo_sweep.errors import UserError

MEM_TIME = objectives_from_spec({"memory": "min", "throughput": "max", "loss_std": None})
DEFAULT = objectives_from_spec(None)


def rows(*points, statuses=None) -> pd.DataFrame:
    """A frame of (peak_mem_gb, step_time_ms, loss_std) points, trial ids p0, p1, ...; every
    step moves 1e6 tokens (equal effective batches), so a shorter step is more tokens/s."""
    statuses = statuses or ["ok"] * len(points)
    times_ms = [float(p[1]) for p in points]
    return pd.DataFrame({
        "trial_id": [f"p{i}" for i in range(len(points))],
        "status": statuses,
        "peak_mem_gb": [float(p[0]) for p in points],
        "step_time_ms": times_ms,
        "tokens_per_s": [1e6 / t if t > 0 else math.nan for t in times_ms],
        "loss_std": [float(p[2]) if len(p) > 2 else 0.01 for p in points],
    })


def on(df: pd.DataFrame, objectives=MEM_TIME) -> list[str]:
    out = analyse_frontier(df, objectives)
    return sorted(out.loc[out["on_frontier"], "trial_id"])


def test_two_objectives_hand_made():
    # p0 (10, 300), p1 (20, 200), p2 (30, 100) trade off; p3 (25, 250) is beaten by p1; p4 by p2.
    df = rows((10, 300), (20, 200), (30, 100), (25, 250), (35, 100))
    assert on(df) == ["p0", "p1", "p2"]


def test_three_objectives_keep_a_point_that_only_wins_on_stability():
    # p2 is dominated on memory and time by p0 but has the lowest loss std.
    df = rows((10, 100, 0.05), (20, 50, 0.05), (15, 150, 0.01), (25, 200, 0.06))
    assert on(df, DEFAULT) == ["p0", "p1", "p2"]


def test_max_direction_flips_the_axis():
    objs = objectives_from_spec({"memory": "max", "throughput": "max", "loss_std": None})
    df = rows((10, 100), (20, 100), (30, 300))
    assert on(df, objs) == ["p1", "p2"]


def test_exact_ties_are_all_on_the_frontier():
    df = rows((10, 100), (10, 100), (20, 200), (20, 200))
    assert on(df) == ["p0", "p1"]  # the tied pair shares the frontier; the dominated pair both off
    out = analyse_frontier(df, MEM_TIME)
    assert out.loc[2, "frontier_distance"] == out.loc[3, "frontier_distance"] > 0
    assert list(out["frontier_rank"]) == [1, 1, 2, 2]


def test_tie_on_one_objective_is_broken_by_the_other():
    df = rows((10, 100), (10, 90))
    assert on(df) == ["p1"]


def test_single_trial_is_the_frontier():
    out = analyse_frontier(rows((10, 100)), DEFAULT)
    assert out["on_frontier"].tolist() == [True]
    assert out["frontier_distance"].tolist() == [0.0]
    assert out["frontier_rank"].tolist() == [1]


def test_all_oom_keeps_every_row_and_has_no_frontier():
    df = rows((math.nan, math.nan), (math.nan, math.nan), statuses=["oom", "oom"])
    out = analyse_frontier(df, DEFAULT)
    assert len(out) == 2
    assert not out["on_frontier"].any()
    assert out["frontier_distance"].isna().all()
    assert out["frontier_rank"].isna().all()


def test_empty_frame():
    out = analyse_frontier(rows(), DEFAULT)
    assert out.empty and "on_frontier" in out.columns


def test_non_ok_rows_are_kept_but_never_on_the_frontier():
    # The diverged and pruned trials would dominate everything; they must not count.
    df = rows((1, 1), (2, 2), (10, 100), (20, 50), statuses=["diverged", "pruned", "ok", "ok"])
    out = analyse_frontier(df, MEM_TIME)
    assert len(out) == 4
    assert on(df) == ["p2", "p3"]
    assert out.loc[:1, "frontier_distance"].isna().all()


def test_nan_metric_is_not_comparable_and_not_dropped():
    df = rows((5, 50, math.nan), (10, 100, 0.02), (20, 200, 0.03))
    out = analyse_frontier(df, DEFAULT)
    assert out["eligible"].tolist() == [False, True, True]
    assert on(df, DEFAULT) == ["p1"]
    # Without loss std among the objectives the same row is comparable again, and wins.
    assert on(df, MEM_TIME) == ["p0"]


def test_distance_grows_with_how_far_a_point_is_behind():
    df = rows((10, 100), (20, 50), (12, 110), (30, 300))
    out = analyse_frontier(df, MEM_TIME).set_index("trial_id")
    assert out.loc["p0", "frontier_distance"] == out.loc["p1", "frontier_distance"] == 0
    assert 0 < out.loc["p2", "frontier_distance"] < out.loc["p3", "frontier_distance"]
    assert out["frontier_rank"].tolist() == [1, 1, 2, 3]


def test_objectives_from_spec():
    assert objectives_from_spec(None) == (
        Objective("memory", "peak_mem_gb", "min"), Objective("throughput", "tokens_per_s", "max"),
        Objective("loss_std", "loss_std_pooled", "min"))  # pooled over same maths: noise_floor.py
    assert [o.name for o in objectives_from_spec({"memory": "min", "throughput": None})] == ["memory"]
    from dpo_sweep.config import ObjectivesSpec
    assert objectives_from_spec(ObjectivesSpec(loss_std=None)) == objectives_from_spec(
        {"memory": "min", "throughput": "max"})
    # A results dir's old space.yaml: step time read as throughput, the other way round, saying so.
    legacy = objectives_from_spec({"memory": "min", "step_time": "min"})
    assert legacy[1] == Objective("throughput", "tokens_per_s", "max", "read from the old step_time: min")
    with pytest.raises(UserError, match="objectives.step_time is unknown"):
        objectives_from_spec({"throughput": "max", "step_time": "min"})
    with pytest.raises(UserError, match="objectives.speed is unknown"):
        objectives_from_spec({"speed": "max"})
    with pytest.raises(UserError, match="allowed: min, max"):
        objectives_from_spec({"memory": "smallest"})
    with pytest.raises(UserError, match="every objective is null"):
        objectives_from_spec({"memory": None})


def brute_force_frontier(points: np.ndarray) -> list[bool]:
    return [not any(pareto.dominates(q, p) for q in points) for p in points]


metric = st.one_of(st.integers(0, 4).map(float), st.just(math.nan))  # small range: many ties


@settings(max_examples=150, deadline=None)
@given(
    points=st.lists(st.tuples(metric, metric, metric), min_size=0, max_size=25),
    statuses=st.lists(st.sampled_from(["ok", "ok", "ok", "oom", "diverged", "error", "pruned"]),
                      min_size=25, max_size=25),
    directions=st.tuples(*[st.sampled_from(["min", "max", None])] * 3).filter(lambda d: any(d)),
)
def test_property_frontier_is_exactly_the_non_dominated_ok_points(points, statuses, directions):
    objs = objectives_from_spec(dict(zip(("memory", "throughput", "loss_std"), directions)))
    df = rows(*points, statuses=statuses[: len(points)]).assign(tokens_per_s=[p[1] for p in points])
    out = analyse_frontier(df, objs)
    assert len(out) == len(df)  # nothing dropped
    values = pareto.as_minimisation(out, objs)
    eligible = out["eligible"].to_numpy()
    assert not (out["on_frontier"].to_numpy() & ~eligible).any()  # only ok, finite points
    assert (eligible == ((df["status"] == "ok") & np.isfinite(values).all(axis=1))).all()
    front = values[out["on_frontier"].to_numpy()]
    competitors = values[eligible]
    for p in front:  # no frontier point is dominated by any comparable point
        assert not any(pareto.dominates(q, p) for q in competitors)
    for p in values[eligible & ~out["on_frontier"].to_numpy()]:  # every other ok point is
        assert any(pareto.dominates(f, p) for f in front)
        assert out.loc[(values == p).all(axis=1) & eligible, "frontier_distance"].gt(0).all()
    assert list(frontier_mask(competitors)) == brute_force_frontier(competitors)


def noisy(*points) -> pd.DataFrame:
    """(peak_mem_gb, tokens_per_s, p10_ms, p90_ms) points around a 100 ms median step."""
    return pd.DataFrame({
        "trial_id": [f"p{i}" for i in range(len(points))], "status": "ok",
        "peak_mem_gb": [float(p[0]) for p in points], "tokens_per_s": [float(p[1]) for p in points],
        "step_time_ms": 100.0, "step_time_p10_ms": [float(p[2]) for p in points],
        "step_time_p90_ms": [float(p[3]) for p in points], "loss_std": 0.01,
    })


def test_a_throughput_inside_the_noise_does_not_buy_a_place_on_the_frontier():
    # p1's median is 1% higher, inside both +-10% spreads, and it needs more memory: dominated.
    # p2 is 50% faster, outside the noise: it trades memory for throughput and stays.
    df = noisy((10, 1000, 90, 110), (12, 1010, 90, 110), (20, 1500, 90, 110))
    assert on(df) == ["p0", "p2"]
    # The same rows with the medians swapped inside the noise: the same frontier.
    assert on(noisy((10, 1010, 90, 110), (12, 1000, 90, 110), (20, 1500, 90, 110))) == ["p0", "p2"]
    # Without a spread the same medians compare exactly: p1 is a trade-off again.
    assert on(noisy((10, 1000, 100, 100), (12, 1010, 100, 100), (20, 1500, 100, 100))) == ["p0", "p1", "p2"]
    out = analyse_frontier(df, MEM_TIME)
    assert out["throughput_low"].tolist() == pytest.approx([1000 / 1.1, 1010 / 1.1, 1500 / 1.1])
    assert out.loc[1, "frontier_distance"] > 0


spread_ms = st.tuples(st.floats(50, 100), st.floats(100, 150))


@settings(max_examples=150, deadline=None)
@given(points=st.lists(st.tuples(st.integers(1, 4), st.integers(900, 1100), spread_ms), min_size=1,
                       max_size=15),
       seed=st.integers(0, 1000))
def test_property_noisy_frontier_is_never_empty_and_ignores_row_order(points, seed):
    df = noisy(*[(m, t, s[0], s[1]) for m, t, s in points])
    front = on(df)
    assert front  # dominance within the noise has no cycles
    shuffled = df.sample(frac=1.0, random_state=seed).reset_index(drop=True)
    assert on(shuffled) == front


def test_a_frontier_row_beaten_on_every_median_by_another_leaves_it():
    # p1 and p2 are twins of one throughput, p2 1 GB bigger: p1 beats p2 on every median. p0 ties p1
    # within the noise with half its memory, yet only p1 dominates p2 (p2's interval clears p0's):
    # the kernel drops p1 and keeps p2, and the median pass used to bring p1 back beside p2.
    df = noisy((1, 700, 64, 100), (2, 1095, 50, 101), (3, 1094, 50, 100))
    assert on(df) == ["p0", "p1"]


@settings(max_examples=150, deadline=None)
@given(points=st.lists(st.tuples(st.integers(1, 6), st.integers(700, 1300), spread_ms), min_size=1,
                       max_size=15))
def test_property_only_frontier_rows_remove_others(points):
    df = noisy(*[(m, t, s[0], s[1]) for m, t, s in points])
    low, high = pareto.intervals_as_minimisation(df, MEM_TIME)
    medians = pareto.as_minimisation(df, MEM_TIME)
    on_ = frontier_mask(low, high, medians)
    dominates = (np.all(low[:, None, :] <= high[None, :, :], axis=2)
                 & np.any(high[:, None, :] < low[None, :, :], axis=2))
    beats = pareto.beats_on_every_median(medians)
    assert on_.any()
    assert not beats[np.ix_(~on_, on_)].any()  # no excluded row beats a frontier row on every median
    assert not beats[np.ix_(on_, on_)].any()  # nor does a frontier row
    # every other row is dominated within the noise or beaten on every median by a frontier row
    assert (dominates | beats)[np.ix_(on_, ~on_)].any(axis=0).all()
