"""benchmarks/trl_export_check.py: the winner's TRL export pasted into TRL against the sweep's TRL
row; its CPU smoke mode runs the whole path (a tiny bf16 folder, a two-trainer result, the export)."""
from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import trl_export_check  # noqa: E402


def test_the_sweeps_trl_row_is_the_winner_or_its_switch():
    results = [{"trial_id": "a", "trainer": "native", "peak_mem_gb": "10.0"},
               {"trial_id": "b", "trainer": "trl", "peak_mem_gb": "12.5"}]
    native_won = {"trial_id": "a", "trl": {"switch": {"trial_id": "b", "source": "measured", "peak_mem_gb": 12.5}}}
    assert trl_export_check.sweep_trl_row(native_won, results) == ("b", "measured", 12.5)
    assert trl_export_check.sweep_trl_row({"trial_id": "b", "trl": {}}, results) == ("b", "measured", 12.5)
    predicted = {"trial_id": "a", "trl": {"switch": {"trial_id": None, "source": "predicted", "peak_mem_gb": 11.0}}}
    assert trl_export_check.sweep_trl_row(predicted, results) == ("-", "predicted", 11.0)
    trial, source, peak = trl_export_check.sweep_trl_row({"trial_id": "a", "trl": None}, results)
    assert (trial, source) == ("-", "none") and math.isnan(peak)


def test_smoke_pastes_the_export_and_writes_its_row(tmp_path):
    pytest.importorskip("trl")
    assert trl_export_check.main(["--smoke", "--out-dir", str(tmp_path)]) == 0
    row, = csv.DictReader((tmp_path / trl_export_check.CSV_NAME).open())
    assert row["sweep_source"] == "measured" and row["device"] == "cpu" and row["steps"] == "2"
    assert float(row["export_peak_gb"]) > 0 and float(row["sweep_trl_peak_gb"]) > 0
    assert math.isclose(float(row["ratio"]), float(row["export_peak_gb"]) / float(row["sweep_trl_peak_gb"]))
