"""`dpo-sweep run` with `trainer: [native, trl]`: both trainers' trials run in the sweep's own
workers, every row says its trainer, frontier.md sets them side by side and the winner says what
the other trainer measured."""
from __future__ import annotations

import json

import pytest

from dpo_sweep import trl_fields
from sweep_cluster import auth_env, read_csv, run_sweep, write_space

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not trl_fields.trl_installed(), reason="TRL is not installed (dpo-sweep[trl])")]


def test_a_native_and_trl_sweep_writes_both_rows_side_by_side(tmp_path):
    space = write_space(tmp_path / "pair.yaml", "trl-pair", """\
        micro_batch: [2]
        checkpoint_level: [none]
        grad_acc: [2]
        beta: [0.1]
        trainer: [native, trl]
        """)
    out = tmp_path / "out"
    done = run_sweep([str(space), "--output", str(out), "--no-dashboard"], auth_env("trl-test-token"), timeout_s=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {r["trainer"]: r for r in read_csv(out / "results.csv")}
    assert set(rows) == {"native", "trl"} and {r["status"] for r in rows.values()} == {"ok"}
    # one learning set-up: the same pairs in the same order under either trainer
    assert abs(float(rows["trl"]["loss_mean"]) - float(rows["native"]["loss_mean"])) < 1e-4
    assert "## Native and TRL trainers" in (out / "frontier.md").read_text()
    switch = json.loads((out / "recommendation.json").read_text())["trl"]["switch"]
    assert switch["source"] == "measured" and switch["trial_id"] in {r["trial_id"] for r in rows.values()}
