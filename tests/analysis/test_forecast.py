"""The whole run's forecast: steps, hours and GPU-hours from the winner's tokens/s and data.json's
token count, with its p10-p90 interval; estimates on other cards only as labelled estimates."""
from __future__ import annotations

import dataclasses
import json
import math

import pandas as pd
import pytest
from sweep_frames import trial, write_dir

from dpo_sweep import cards
from dpo_sweep.analysis import forecast
from dpo_sweep.cli import main

H200_ENV = {"gpu_name": "NVIDIA H200", "gpus": [{"name": "NVIDIA H200", "memory_gb": 150.755}]}


def _row(**changes) -> pd.Series:
    base = dataclasses.replace(trial("t1", mem=40.0, time_ms=2000.0, tps=10_000.0, mb=2, ga=8),
                               step_time_p10_ms=1800.0, step_time_p90_ms=2500.0)
    return pd.Series({**dataclasses.asdict(base), **changes})


DATA = [{"source": "pairs.jsonl", "model": "tiny-llama", "max_length": 128, "pairs": 1000, "tokens": 36_000_000}]


def test_hours_steps_and_interval_by_hand():
    fc, why = forecast.forecast(_row(), DATA, epochs=2, environment=H200_ENV)
    assert why == "" and fc.pairs == 1000 and fc.epochs == 2 and fc.tokens_per_epoch == 36_000_000
    assert fc.steps == math.ceil(2 * 1000 / 16) == 125  # effective batch 2 x 8
    assert fc.hours == pytest.approx(2 * 36e6 / 10_000 / 3600) == pytest.approx(2.0)
    # throughput over the p10-p90 step times: 10,000 x 2000/2500 .. 10,000 x 2000/1800
    assert fc.tokens_per_s_interval == pytest.approx((8_000.0, 10_000 * 2000 / 1800))
    assert fc.hours_interval == pytest.approx((2.0 * 1800 / 2000, 2.0 * 2500 / 2000))
    assert fc.gpu_hours == pytest.approx(2.0) and fc.measured_on == "NVIDIA H200"


def test_gpu_hours_count_every_worker():
    fc, _ = forecast.forecast(_row(workers_per_trial=4, effective_batch=64), DATA, environment=H200_ENV)
    assert fc.gpu_hours == pytest.approx(4 * fc.hours) and fc.steps == math.ceil(1000 / 64)


@pytest.mark.parametrize("row, data, reason", [
    (None, DATA, "nothing was recommended"),
    (_row(tokens_per_s=math.nan), DATA, "no measured tokens_per_s"),
    (_row(), [], "no data.json"),
    (_row(), [{k: v for k, v in DATA[0].items() if k != "tokens"}], "no token count"),
])
def test_what_is_missing_gives_no_forecast_and_says_why(row, data, reason):
    fc, why = forecast.forecast(row, data)
    assert fc is None and reason in why
    assert forecast.json_entry(fc, why) == {"forecast": None, "forecast_reason": why, "estimates_on_other_cards": []}


def test_another_card_is_an_estimate_scaled_by_bf16_rate_with_the_bandwidth_range():
    fc, _ = forecast.forecast(_row(), DATA, environment=H200_ENV)
    a100, l4 = forecast.card_estimates(_row(), fc, H200_ENV, cards.cards("A100-80GB,L4"))
    h200, a100_card = cards.card("H200"), cards.card("A100-80GB")
    assert a100.fits and a100.bf16_ratio == pytest.approx(h200.bf16_tflops / a100_card.bf16_tflops)
    assert a100.step_time_ms_estimate == pytest.approx(2000.0 * a100.bf16_ratio)
    assert a100.hours_estimate == pytest.approx(fc.hours * a100.bf16_ratio)
    bandwidth = h200.bandwidth_gb_s / a100_card.bandwidth_gb_s
    assert a100.hours_range == pytest.approx(tuple(sorted((fc.hours * a100.bf16_ratio, fc.hours * bandwidth))))
    assert a100.step_time_ms_range == pytest.approx(tuple(sorted((2000.0 * a100.bf16_ratio, 2000.0 * bandwidth))))
    assert "peak dense bf16 rate" in a100.scaled_by and "bandwidth" in a100.expected_error
    # the measured peak (40 GB) does not fit an L4: no time at all
    assert not l4.fits and l4.step_time_ms_estimate is None and "does not fit: measured peak 40.00 GB" in l4.note
    text = "\n".join(forecast.lines(fc, "", (a100, l4)))
    assert "estimate on A100-80GB (not measured)" in text and "estimate on L4: does not fit" in text
    # estimates are never inside the forecast's own (measured) numbers
    assert "other_cards" not in fc.to_json() and "estimate" not in " ".join(fc.to_json())


def test_a_folder_without_token_counts_still_gets_the_step_time_estimate():
    (a100,) = forecast.card_estimates(_row(), None, H200_ENV, cards.cards("A100-80GB"))
    assert a100.step_time_ms_estimate == pytest.approx(2000.0 * a100.bf16_ratio) and a100.hours_estimate is None
    line = forecast.lines(None, "no data.json", (a100,))[1]
    assert line.startswith("  estimate on A100-80GB (not measured): ") and " ms/step" in line and " h " not in line


def test_no_estimate_from_a_cpu_measurement():
    fc, _ = forecast.forecast(_row(), DATA, environment=None)
    (h100,) = forecast.card_estimates(_row(), fc, None, cards.cards("H100"))
    assert h100.hours_estimate is None and "measured on the CPU" in h100.note


def test_report_writes_the_forecast_and_re_forecasts_for_other_epochs(tmp_path, capsys):
    row = dataclasses.replace(trial("t1", mem=40.0, time_ms=2000.0, tps=10_000.0, mb=2, ga=8),
                              step_time_p10_ms=1800.0, step_time_p90_ms=2500.0)
    out_dir = write_dir(tmp_path / "r", [row], env=H200_ENV)
    (out_dir / "data.json").write_text(json.dumps({"datasets": DATA}))
    assert main(["report", str(out_dir), "--memory-budget-gb", "H200"]) == 0
    rec = json.loads((out_dir / "recommendation.json").read_text())
    fc = rec["forecast"]
    assert rec["forecast_reason"] == "" and fc["epochs"] == 1 and fc["pairs"] == 1000 and fc["steps"] == 63
    assert fc["hours"] == pytest.approx(1.0) and fc["gpu_hours"] == pytest.approx(1.0)
    assert rec["memory_budget_gb"] == pytest.approx(cards.card("H200").memory_gb)
    printed = capsys.readouterr().out
    assert "forecast for the whole run (t1, 1 epoch(s) of 1,000 pairs): 63 optimizer steps" in printed
    html = (out_dir / "report.html").read_text()
    assert 'id="forecast"' in html and "63 optimizer steps" in html
    assert main(["report", str(out_dir), "--epochs", "3", "--gpu", "H100"]) == 0
    rec = json.loads((out_dir / "recommendation.json").read_text())
    fc, (h100,) = rec["forecast"], rec["estimates_on_other_cards"]
    assert fc["epochs"] == 3 and fc["steps"] == math.ceil(3000 / 16) and fc["hours"] == pytest.approx(3.0)
    assert h100["card"] == "H100" and h100["hours_estimate"] == pytest.approx(3.0)  # the same dense bf16 rate


def test_an_old_folder_has_a_null_forecast_with_its_reason(tmp_path, capsys):
    out_dir = write_dir(tmp_path / "r", [trial("t1", mem=4.0, time_ms=100.0)])
    assert main(["report", str(out_dir)]) == 0
    rec = json.loads((out_dir / "recommendation.json").read_text())
    assert rec["forecast"] is None and "data.json" in rec["forecast_reason"]
    assert "forecast: none (no data.json" in capsys.readouterr().out


@pytest.mark.parametrize("epochs", ["0", "-1", "nan", "inf", "two"])
def test_a_bad_epochs_exits_2(tmp_path, epochs, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(tmp_path), "--epochs", epochs])
    assert exit_.value.code == 2 and "positive number of passes" in capsys.readouterr().err


def test_data_json_tokens_are_what_the_trainers_tokens_per_s_counts():
    """data.json's ``tokens`` (the preflight's count, which the forecast divides by tokens/s) is the
    sum of the trainer's micro-batch token counts over one pass of every pair, padded or packed."""
    from dpo_sweep.config import DataSpec
    from dpo_sweep.train.batching import make_batch
    from dpo_sweep.train.data import load_pairs
    from dpo_sweep.core.lengths import LengthProfile, data_shape
    from dpo_sweep.train.tokenizer import byte_level_tokenizer

    spec = DataSpec(synthetic={"pairs": 40, "prompt_tokens": 30, "response_tokens": 20,
                               "lengths": "lognormal", "sigma": 0.9}, min_prompt_tokens=4)
    ds = load_pairs(spec, byte_level_tokenizer(), 96)
    shape = data_shape(ds, LengthProfile.of(ds), model="tiny-llama", max_length=96)
    for padding_free in (False, True):
        counted = sum(make_batch(ds, list(range(i, min(i + 4, len(ds)))), 0, "right", padding_free, 64).tokens()
                      for i in range(0, len(ds), 4))
        assert shape["tokens"] == counted
