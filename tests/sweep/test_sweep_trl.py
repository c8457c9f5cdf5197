"""`dpo-sweep run` with `trainer: [native, trl]` x `checkpoint_level: [none, L1, full]`: the trl x L1
point TRL cannot run is skipped with its reason (validate, run, frontier.md), the other points' trials
of both trainers run in the sweep's own workers, every row says its trainer, frontier.md sets them
side by side and the winner says what the other trainer measured."""
from __future__ import annotations

import json

import pytest

from dpo_sweep import trl_fields
from dpo_sweep.cli import main
from sweep_cluster import auth_env, read_csv, run_sweep, write_space

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not trl_fields.trl_installed(), reason="TRL is not installed (dpo-sweep[trl])")]


def test_a_native_and_trl_sweep_skips_what_trl_cannot_run_and_writes_both_rows_side_by_side(tmp_path, capsys):
    space = write_space(tmp_path / "pair.yaml", "trl-pair", """\
        micro_batch: [2]
        checkpoint_level: [none, L1, full]
        grad_acc: [2]
        beta: [0.1]
        trainer: [native, trl]
        """)
    assert main(["validate", str(space)]) == 0
    said = capsys.readouterr().out
    skipped = ("skipped micro_batch 2, checkpoint_level L1, grad_acc 2, beta 0.1, trainer trl: trainer trl with "
               "checkpoint_level L1: TRL's DPOTrainer checkpoints whole decoder layers or none")
    assert "valid, 5 trial(s), 1 point(s) skipped" in said and skipped in said, said
    out = tmp_path / "out"
    done = run_sweep([str(space), "--output", str(out), "--no-dashboard"], auth_env("trl-test-token"), timeout_s=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert skipped in done.stdout
    rows = read_csv(out / "results.csv")
    assert sorted((r["trainer"], r["checkpoint_level"]) for r in rows) == [
        ("native", "L1"), ("native", "full"), ("native", "none"), ("trl", "full"), ("trl", "none")]
    assert {r["status"] for r in rows} == {"ok"}
    same = {r["trainer"]: r for r in rows if r["checkpoint_level"] == "none"}
    # one learning set-up: the same pairs in the same order under either trainer
    assert abs(float(same["trl"]["loss_mean"]) - float(same["native"]["loss_mean"])) < 1e-4
    frontier = (out / "frontier.md").read_text()
    assert "## Native and TRL trainers" in frontier and "## Points skipped" in frontier
    assert skipped.removeprefix("skipped ") in frontier
    recommendation = json.loads((out / "recommendation.json").read_text())
    assert recommendation["sweep_complete"] is True  # the skipped point is no configuration still to run
    switch = recommendation["trl"]["switch"]
    assert switch["source"] == "measured" and switch["trial_id"] in {r["trial_id"] for r in rows}
