"""The sampler's bounded, peak-preserving timeline."""

from __future__ import annotations

import pytest

from dpo_sweep.telemetry import BoundedTimeline


def test_short_timelines_are_kept_verbatim():
    timeline = BoundedTimeline(max_points=10)
    for i in range(9):
        timeline.add(float(i), float(i % 3))
    assert timeline.points() == [(float(i), float(i % 3)) for i in range(9)]


@pytest.mark.parametrize("n", [999, 1000, 1001, 25_000, 100_003])
def test_length_is_bounded_and_the_peak_survives(n):
    timeline = BoundedTimeline(max_points=1000)
    spike_at = n // 3
    for i in range(n):
        timeline.add(i * 0.02, 50.0 if i == spike_at else 1.0 + (i % 7) * 0.01)
    points = timeline.points()
    assert len(points) <= 1000 and len(points) == len(timeline)
    assert len(points) >= min(n, 400)  # decimation halves, never collapses
    assert max(points, key=lambda p: p[1]) == (spike_at * 0.02, 50.0)
    times = [t for t, _ in points]
    assert times == sorted(times)
    # the recent end is still there (a stored point is the max of its bucket, not its last reading)
    assert times[-1] >= 0.99 * (n - 1) * 0.02


def test_clear_and_bad_size():
    timeline = BoundedTimeline(max_points=4)
    for i in range(20):
        timeline.add(float(i), 1.0)
    timeline.clear()
    assert timeline.points() == []
    with pytest.raises(ValueError):
        BoundedTimeline(max_points=1)
