"""benchmarks/padding_free.py: its modes select the batching, its table and CSV carry the row."""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import padding_free  # noqa: E402


def test_modes_and_forwarded_arguments():
    args = argparse.Namespace(
        pairs=8, prompt_tokens=6, response_tokens=5, sigma=0.5, steps=2, warmup_steps=1, max_length=64,
        precision="fp32", preset="tiny-llama", attn="sdpa", micro_batch=2, checkpoint_level="none")
    cfg = padding_free.trial_config(args, "padding_free+group")
    assert cfg.train.padding_free and cfg.train.group_by_length and cfg.data.synthetic.lengths == "lognormal"
    assert not padding_free.trial_config(args, "padded").train.padding_free
    assert padding_free._without_modes_and_out(["--pairs", "8", "--modes", "a", "b", "--out", "x", "--steps", "2"]) \
        == ["--pairs", "8", "--steps", "2"]


def test_one_mode_writes_its_row(tmp_path, capsys):
    out = tmp_path / "pf"
    assert padding_free.main(["--pairs", "8", "--steps", "2", "--micro-batch", "2", "--max-length", "64",
                              "--prompt-tokens", "8", "--response-tokens", "6", "--modes", "padding_free",
                              "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "padding_free.csv").open()))
    assert [r["mode"] for r in rows] == ["padding_free"] and rows[0]["status"] == "ok"
    assert float(rows[0]["padding_frac"]) == 0 and float(rows[0]["peak_mem_gb"]) >= float(rows[0]["peak_mem_typical_gb"])
    assert "| padding_free | ok |" in capsys.readouterr().out
