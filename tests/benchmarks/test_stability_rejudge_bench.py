"""benchmarks/stability_rejudge.py: a committed run's steps re-judged with today's verdict.

The committed H200 learning-knobs run is the case the verdict was changed for: its 12 trials were
written `noisy` (spread around a line, max / median grad norm) and are `stable` on the same steps.
"""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import stability_rejudge  # noqa: E402

KNOBS = REPO / "reports/examples/llama-3.2-1b-learning-knobs-h200"


def test_the_h200_knobs_run_is_rejudged_stable(tmp_path, capsys):
    assert stability_rejudge.main([str(KNOBS), "--out", str(tmp_path)]) == 0
    table = stability_rejudge.rejudge(KNOBS)
    assert len(table) == 12 and set(table["old_stability"]) == {"noisy"}
    assert set(table["stability"]) == {"stable"}
    assert (table["loss_spread_of_scale"] < 0.10).all() and (table["grad_norm_spike"] < 5).all()
    assert "| llama-3.2-1b-learning-knobs-h200 | noisy | stable | 12 |" in capsys.readouterr().out
    assert (tmp_path / "trials.csv").is_file() and (tmp_path / "summary.md").is_file()


def test_a_missing_directory_exits_2(tmp_path):
    assert stability_rejudge.main([str(tmp_path / "nope"), "--out", str(tmp_path)]) == 2
