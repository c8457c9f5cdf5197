"""The data's shape in the report: data.json's histograms and counts, results.csv's padding_frac."""
from __future__ import annotations

import dataclasses
import json

from sweep_frames import sweep_trials, write_dir

from dpo_sweep.commands.report import analyse_dir
from dpo_sweep.config import DataSpec
from dpo_sweep.report.data_shape import load_data_json
from dpo_sweep.train.data import load_pairs
from dpo_sweep.core.lengths import LengthProfile, data_shape, histogram, write_data_json
from dpo_sweep.train.tokenizer import byte_level_tokenizer


def long_tailed_shape(max_length=128):
    spec = DataSpec(synthetic={"pairs": 200, "prompt_tokens": 30, "response_tokens": 20,
                               "lengths": "lognormal", "sigma": 0.9}, min_prompt_tokens=4)
    ds = load_pairs(spec, byte_level_tokenizer(), max_length)
    return ds, data_shape(ds, LengthProfile.of(ds), model="tiny-llama", max_length=max_length)


def test_histogram_counts_every_value_in_whole_token_bins():
    h = histogram([1, 2, 2, 3, 50, 100], bins=4)
    assert sum(h["counts"]) == 6 and h["edges"][0] == 1 and h["edges"][-1] == 100
    assert h["counts"][0] == 4 and h["counts"][-1] == 1  # 1-25: four values; the top bin holds 100
    assert histogram([7, 7, 7]) == {"edges": [7, 7], "counts": [3]}


def test_data_shape_counts_truncation_and_lengths():
    ds, shape = long_tailed_shape()
    assert (shape["pairs"], shape["truncated"], shape["dropped"]) == (len(ds), ds.truncated, ds.dropped)
    assert ds.truncated > 0
    chosen = shape["lengths"]["chosen"]
    assert sum(chosen["histogram"]["counts"]) == len(ds)
    assert chosen["max"] == max(len(p.chosen_ids) for p in ds.pairs) and chosen["median"] < chosen["max"]


def test_report_shows_lengths_truncation_and_padding(tmp_path):
    ds, shape = long_tailed_shape()
    trials = [dataclasses.replace(t, padding_frac=0.3 + 0.1 * i) for i, t in enumerate(sweep_trials())]
    write_dir(tmp_path, trials)
    write_data_json(tmp_path, [shape])
    assert load_data_json(tmp_path) == json.loads(json.dumps([shape]))
    out = analyse_dir(tmp_path, 20.0)
    html = out.report_path.read_text()
    assert '<h2 id="data">Data</h2>' in html
    assert f"{len(ds)} pairs, {ds.truncated} truncated, {ds.dropped} dropped" in html
    ok = [t.padding_frac for t in trials if t.status == "ok"]
    assert f"padding: {min(ok):.1%} - {max(ok):.1%} of the token positions" in html
    assert "plot-lengths-0" in html


def test_report_without_data_json_has_no_data_section(tmp_path):
    write_dir(tmp_path, sweep_trials())
    assert load_data_json(tmp_path) == []
    (tmp_path / "data.json").write_text("{not json")
    assert load_data_json(tmp_path) == []
    html = analyse_dir(tmp_path, 20.0).report_path.read_text()
    assert 'id="data"' not in html


def test_length_histograms_are_no_trial_curves_when_nothing_completed(tmp_path):
    from report_frames import all_oom_sweep

    write_dir(tmp_path, all_oom_sweep())
    write_data_json(tmp_path, [long_tailed_shape()[1]])
    html = analyse_dir(tmp_path, 20.0).report_path.read_text()
    assert "plot-lengths-0" in html and "nothing to plot" in html and "per-step curves show" not in html


def test_a_one_length_histogram_has_whole_token_ticks_around_its_bar():
    from dpo_sweep.report.data_shape import length_histogram

    fixed = {"source": "synthetic", "lengths": {n: {"histogram": histogram([512] * 8)}
                                                for n in ("prompt", "chosen", "rejected")}}
    xaxis = length_histogram(fixed)["layout"]["xaxis"]
    assert xaxis["tickformat"] == "d" and xaxis["dtick"] == 1 and xaxis["range"] == [510, 515]
    _, shape = long_tailed_shape()
    wide = length_histogram({"source": "s", "lengths": shape["lengths"]})["layout"]["xaxis"]
    assert wide["tickformat"] == "d" and "dtick" not in wide  # plotly's own spacing over a wide range
