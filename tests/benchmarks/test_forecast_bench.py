"""benchmarks/forecast.py: a sweep folder's chosen configurations run long, beside their rows."""
from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import forecast  # noqa: E402


def test_the_smoke_sweep_s_configurations_run_long_and_are_written_with_the_contract_columns(tmp_path):
    sweep_dir = forecast.smoke_sweep(tmp_path, micro_batches=(1, 2), pairs=24)
    rec = json.loads((sweep_dir / "recommendation.json").read_text())
    assert rec["forecast"]["pairs"] == 24  # the sweep folder is a real one: data.json carries the tokens
    picks = forecast.chosen(sweep_dir, 3)
    assert picks[0] == rec["trial_id"] and len(picks) == 2 == len(set(picks))  # only two configurations
    cfg = forecast.long_config(sweep_dir, picks[0], 30)
    assert cfg.train.steps == 30 and cfg.trial_id == f"{picks[0]}-long" and cfg.effective_batch() == 4
    out_csv = tmp_path / "out" / "forecast.csv"
    rows = forecast.long_runs(sweep_dir, 4, 3, out_csv)
    with out_csv.open() as fh:
        written = list(csv.DictReader(fh))
    assert list(written[0])[:4] == ["config", "sweep_tokens_per_s", "long_run_tokens_per_s", "long_run_steps"]
    assert [r["config"] for r in written] == picks
    for r in rows:
        assert r["status"] == "ok" and r["long_run_steps"] == 3  # 4 steps, 1 warm-up
        assert r["ratio"] == r["long_run_tokens_per_s"] / r["sweep_tokens_per_s"] and math.isfinite(r["ratio"])
        assert r["sweep_low_tokens_per_s"] <= r["sweep_tokens_per_s"] <= r["sweep_high_tokens_per_s"]
        assert r["inside_interval"] == (r["sweep_low_tokens_per_s"] <= r["long_run_tokens_per_s"]
                                        <= r["sweep_high_tokens_per_s"])
