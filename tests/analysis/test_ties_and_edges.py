"""Ties that must not chain, a peak exactly at the usable budget, rows without a loss std, and
reasons that name the cause a row was left out for."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from sweep_frames import trial, write_dir

from dpo_sweep.commands.report import analyse_dir
from dpo_sweep.cli import main


def ladder(rungs: int = 5):
    """Rows each 10% faster and 2 GB bigger than the last, p10-p90 intervals +-6% of the median."""
    return [replace(trial(f"t{i:03d}", 10.0 + 2 * i, 100.0, 0.02, tps=40_000.0 * 1.1**i, mb=2**i),
                    step_time_p10_ms=100.0 / 1.06, step_time_p90_ms=100.0 / 0.94)
            for i in range(rungs)]


def test_ties_do_not_chain_down_a_ladder(tmp_path):
    outcome = analyse_dir(write_dir(tmp_path / "r", ladder()), memory_budget_gb=40.0)
    out = outcome.analysed.set_index("trial_id")
    assert out.loc["t004", "throughput_low"] == pytest.approx(55_050, abs=1)  # wholly above t000's
    assert out.loc["t000", "throughput_high"] == pytest.approx(42_400)
    # t001 ties t000 and needs more memory: off. t002 ties only t001, which is off, and is beyond
    # t000's noise: on, and it removes t003 the same way; t004 is on.
    assert out["on_frontier"].to_dict() == {"t000": True, "t001": False, "t002": True, "t003": False,
                                            "t004": True}
    rec = outcome.recommendation
    assert rec["trial_id"] == "t004"
    assert "58,564 tokens/s" in rec["reason"] and "A tie decided" not in rec["reason"]
    assert rec["runner_up"]["trial_id"] == "t002"


def test_a_peak_at_exactly_the_usable_budget_fits(tmp_path):
    rows = [trial("t000", 22.80, 100.0, 0.02)]
    rec = analyse_dir(write_dir(tmp_path / "r", rows), memory_budget_gb=24.0).recommendation
    assert rec["trial_id"] == "t000"  # 24 x 0.95 = 22.799999999999997, printed 22.80
    assert "peaks under 22.80 GB (24.00 GB budget minus a 5% safety margin)" in rec["reason"]
    over = analyse_dir(write_dir(tmp_path / "o", [trial("t000", 22.81, 100.0, 0.02)]),
                       memory_budget_gb=24.0).recommendation
    assert over["trial_id"] is None
    assert "it needs a budget of at least 24.01 GB" in over["reason"]  # 24.01 x 0.95 = 22.8095


def test_the_budget_a_peak_needs_is_the_least_it_fits():
    from dpo_sweep.core import budget

    for peak in (0.004, 1.0, 22.80, 22.81, 22.8049, 79.99, 140.0):
        for margin in (0.0, 0.05, 0.2):
            need = budget.needed_gb(peak, margin)
            assert budget.fits(peak, budget.usable_gb(need, margin))
            assert need == 0.01 or not budget.fits(peak, budget.usable_gb(need - 0.01, margin))


def test_a_row_without_a_loss_std_is_not_called_unstable(tmp_path):
    rows = [trial("fast", 20.0, 100.0, math.nan), trial("slow", 10.0, 200.0, 0.02), trial("mid", 15.0, 150.0, 0.03)]
    out_dir = write_dir(tmp_path / "r", rows)
    (out_dir / "space.yaml").write_text("name: r\nobjectives: {memory: min, throughput: max, loss_std: null}\n")
    rec = analyse_dir(out_dir, memory_budget_gb=40.0).recommendation
    assert rec["trial_id"] == "fast"
    assert "Left out" not in rec["reason"]
    assert "no loss std was measured for it" in rec["reason"]


def beta_lr_rows():
    """The committed beta-lr example's grad_acc 4 rows at beta 0.5: t015 diverged (the rollback
    fired at step 9) with a loss std of 6.8e-08, far below the normal range."""
    stable = replace(trial("t014", 35.45, 575.8, 4.6e-05, tps=56_906.0, mb=32, ga=4, beta=0.5),
                     stability="stable")
    diverging = replace(trial("t015", 35.45, 557.8, 6.8e-08, tps=58_750.0, mb=32, ga=4, beta=0.5),
                        stability="diverging", rollback_step=9)
    return stable, diverging


def test_a_diverging_row_is_left_out_for_diverging(tmp_path):
    rec = analyse_dir(write_dir(tmp_path / "r", beta_lr_rows()), memory_budget_gb=150.0).recommendation
    assert rec["trial_id"] == "t014"
    assert "Left out as diverging: t015 (rollback at step 9)." in rec["reason"]
    assert "loss std above the normal range" not in rec["reason"]


def test_when_every_row_diverges_nothing_fits_says_so(tmp_path):
    _, diverging = beta_lr_rows()
    rows = [diverging, replace(diverging, trial_id="t016", peak_mem_gb=40.0, rollback_step=11)]
    rec = analyse_dir(write_dir(tmp_path / "r", rows), memory_budget_gb=150.0).recommendation
    assert rec["trial_id"] is None
    assert rec["reason"].startswith("Nothing to recommend: every completed configuration that peaks under "
                                    "142.50 GB (150.00 GB budget minus a 5% safety margin) diverged")
    assert "t015 (rollback at step 9), t016 (rollback at step 11)" in rec["reason"]
    assert "needs a budget" not in rec["reason"] and "A larger memory budget would not change this." in rec["reason"]
