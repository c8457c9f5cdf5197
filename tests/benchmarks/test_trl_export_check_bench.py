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


def test_the_proof_space_validates_as_both_trainers_of_each_configuration(tmp_path, monkeypatch):
    import yaml

    from dpo_sweep import space as space_mod, trl_fields

    monkeypatch.setattr(trl_fields, "trainer_refusal", lambda: None)  # validated as where TRL is installed
    monkeypatch.setattr(trl_fields, "from_installed", trl_fields.from_recorded)
    case = tmp_path / "case"
    (case / "ckpt").mkdir(parents=True)
    raw = yaml.safe_load(trl_export_check.proof_space(case, 48.0))
    assert raw["resources"]["gpu_memory_gb"] == 48 and raw["search"]["trainer"] == ["native", "trl"]
    trials = space_mod.parse(raw).trials
    assert len(trials) == 24 and {t.train.trainer for t in trials} == {"native", "trl"}


def test_prediction_rows_are_the_ok_trl_rows():
    rows = trl_export_check.prediction_rows([
        {"trial_id": "a", "trainer": "trl", "status": "ok", "peak_mem_gb": "20", "predicted_peak_gb": "20.5",
         "micro_batch": "2", "checkpoint_level": "none", "adapter": "lora"},
        {"trial_id": "b", "trainer": "trl", "status": "oom", "peak_mem_gb": "48", "predicted_peak_gb": "50"},
        {"trial_id": "c", "trainer": "native", "status": "ok", "peak_mem_gb": "18", "predicted_peak_gb": "18"}])
    assert [(r["trial_id"], r["ratio"], r["within_5pct"]) for r in rows] == [("a", 1.025, True)]
