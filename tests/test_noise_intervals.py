"""A row's p10-p90 throughput interval is honest about the steps behind it: widened for few
measured steps so that it holds the next step 80% of the time, as its name says."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dpo_sweep.core import noise


def test_the_expected_half_spread_of_two_draws_by_hand():
    # n = 2: p10 and p90 are 0.1 and 0.9 of the way from the smaller draw to the larger one, so
    # p90 - p10 = 0.8 |x1 - x2|, and E|x1 - x2| = 2 / sqrt(pi) for standard normals.
    assert noise.sample_half_spread(2) == pytest.approx(0.4 * 2 / math.sqrt(math.pi), rel=1e-4)
    # many draws: the sample's p10-p90 is the population's, +-1.2816
    assert noise.sample_half_spread(2000) == pytest.approx(noise.Z_90, rel=5e-3)


def test_the_factor_shrinks_to_one_and_is_one_without_a_sample():
    ks = [noise.small_sample_factor(n) for n in (2, 3, 4, 8, 30, 1000)]
    assert ks == sorted(ks, reverse=True) and ks[-1] == pytest.approx(1.0, abs=0.01)
    assert noise.small_sample_factor(4) == pytest.approx(1.638 * math.sqrt(1.25) / noise.sample_half_spread(4))
    for n in (0, 1, math.nan):
        assert noise.small_sample_factor(n) == 1.0
    assert noise.t_90(30) == pytest.approx(1.310, abs=1e-3) and noise.t_90(31) == pytest.approx(1.309, abs=1e-3)


@pytest.mark.parametrize("n", [3, 4, 8])
def test_the_widened_interval_holds_the_next_step_eighty_percent_of_the_time(n):
    rng = np.random.default_rng(n)
    steps = np.exp(rng.normal(0.0, 0.05, (40_000, n)))  # step times of n measured steps, lognormal
    following = np.exp(rng.normal(0.0, 0.05, 40_000))  # the run's next step
    median, p10, p90 = (np.percentile(steps, q, axis=1) for q in (50, 10, 90))
    raw = np.mean((following >= p10) & (following <= p90))
    k = noise.small_sample_factor(n)
    widened = np.mean((following >= median * (p10 / median) ** k) & (following <= median * (p90 / median) ** k))
    assert raw < 0.7  # the sample's own p10-p90 claims 80% and holds far less
    assert 0.77 < widened < 0.83


def _rows(measured_steps):
    return pd.DataFrame({"trial_id": ["fast", "slow"], "tokens_per_s": [50_159.0, 49_136.0],
                         "step_time_ms": [653.28, 666.89], "step_time_p10_ms": [643.52, 656.07],
                         "step_time_p90_ms": [653.84, 668.09], "measured_steps": measured_steps})


def test_throughput_interval_widens_by_the_rows_own_sample_size():
    df = _rows([3, 30])
    low, high = noise.throughput_interval(df)
    k3, k30 = noise.small_sample_factor(3), noise.small_sample_factor(30)
    assert low[0] == pytest.approx(50_159.0 * (653.28 / 653.84) ** k3)
    assert high[0] == pytest.approx(50_159.0 * (653.28 / 643.52) ** k3)
    assert low[1] == pytest.approx(49_136.0 * (666.89 / 668.09) ** k30)
    unknown_low, unknown_high = noise.throughput_interval(_rows([math.nan, math.nan]))  # an older results.csv
    assert unknown_low[0] == pytest.approx(50_159.0 * 653.28 / 653.84)
    assert unknown_high[0] == pytest.approx(50_159.0 * 653.28 / 643.52)


def test_two_rows_of_three_steps_two_percent_apart_are_a_tie():
    # reports/examples/llama-3.2-1b-40gb-quick-h200's two fastest rows: apart on their raw intervals,
    # inside each other's noise once 3 steps are read as 3 steps.
    raw = noise.throughput_interval(_rows([math.nan, math.nan]))
    widened = noise.throughput_interval(_rows([3, 3]))
    assert not noise.overlaps(raw[0][0], raw[1][0], raw[0][1], raw[1][1])
    assert noise.overlaps(widened[0][0], widened[1][0], widened[0][1], widened[1][1])
