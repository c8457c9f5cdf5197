"""The runoff's finalists (dpo_sweep/plan/runoff.py): which rows get timed in full."""
from __future__ import annotations

import math

from dpo_sweep.plan.runoff import finalists, throughput_interval
from dpo_sweep.records import TrialResult


def row(tid, mb, tps, spread=0.01, peak=20.0, source="extrapolated", measured_by=None, grad_acc=None, status="ok"):
    """A row whose step time is 1000 ms, p10/p90 at -/+ spread: tokens/s interval tps / (1 +- spread)."""
    return TrialResult(trial_id=tid, status=status, model="m", seq_len=1024, micro_batch=mb, checkpoint_level="none",
                       grad_acc=grad_acc or 64 // mb, beta=0.1, num_workers=1, effective_batch=64,
                       peak_mem_gb=peak, step_time_ms=1000.0, step_time_p10_ms=1000.0 * (1 - spread),
                       step_time_p90_ms=1000.0 * (1 + spread), tokens_per_s=tps,
                       step_time_source=source, measured_by=measured_by or tid)


def test_interval_is_the_throughput_at_p90_and_p10():
    low, high = throughput_interval(row("a", 8, 1000.0, spread=0.25))
    assert low == 800.0 and math.isclose(high, 1000.0 / 0.75)


def test_the_h200_tie_is_timed_in_full():
    # The planned 1B sweep: mb 16 none 53,425 tokens/s (-0.31/+0.38%), mb 8 none 52,820 (-1.17/+0.40%)
    # overlap; mb 4 none 51,496 (-0.03/+0.86%) does not; mb 16 L1 46,523 is far behind.
    mb16 = row("t060", 16, 53425.0, spread=0.0035, peak=47.58)
    mb8 = row("t045", 8, 52820.0, spread=0.0117, peak=31.78)
    mb4 = row("t030", 4, 51496.0, spread=0.0086, peak=23.90)
    l1 = row("t063", 16, 46523.0, peak=30.55)
    assert [r.trial_id for r in finalists([mb4, l1, mb8, mb16], usable_gb=None)] == ["t060", "t045"]
    # On a 40 GB card mb 16 none does not fit: mb 8 none leads alone (mb 4 none's interval is apart)
    assert [r.trial_id for r in finalists([mb4, l1, mb8, mb16], usable_gb=38.0)] == ["t045"]


def test_measured_rows_and_shared_measurements_are_not_run_again():
    best = row("a", 16, 1000.0, source="measured", grad_acc=4)
    tied = row("b", 8, 995.0)
    twin = row("b-beta2", 8, 995.0, measured_by="b")  # another beta of b's configuration
    assert [r.trial_id for r in finalists([best, tied, twin], usable_gb=None)] == ["b"]
    assert finalists([best], usable_gb=None) == []  # the leader was measured in full: nothing to do


def test_failed_rows_do_not_count_and_the_number_is_capped():
    rows = [row(f"t{i}", 8, 1000.0 - i, spread=0.05) for i in range(6)]
    assert len(finalists(rows, usable_gb=None)) == 3 and len(finalists(rows, None, limit=5)) == 5
    oom = row("big", 16, 2000.0, status="oom")
    assert finalists([oom], usable_gb=None) == [] and finalists(rows + [oom], None)[0].trial_id == "t0"
