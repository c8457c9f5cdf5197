"""The sentence that says where the stability columns come from: how many
learning trials, of how many steps, in which precision, and why not the space's own."""
from __future__ import annotations

import dataclasses

from sweep_frames import frame, trial, write_dir

from dpo_sweep.commands.report import analyse_dir
from dpo_sweep.analysis.tables import stability_source


def betas_space_rows(learned_precision="bf16-mixed", note=""):
    """The H200 betas space's shape: 5 steps of pure bf16, three betas, each learned once."""
    rows = []
    for i, beta in enumerate((0.05, 0.1, 0.3)):
        for mb in (2, 4):
            row = trial(f"t{i}{mb}", 10.0 * mb, 100.0, 0.004, mb=mb, ga=8 // mb, beta=beta, seed=0)
            rows.append(dataclasses.replace(row, precision="bf16", steps=5, stability="stable",
                                            stability_from=f"t{i}4-learning", stability_steps=16,
                                            stability_precision=learned_precision, stability_note=note,
                                            extra={"seed": 0, "lr": 5e-6}))
    return rows


def test_learning_trials_of_sixteen_steps_in_bf16_mixed_say_why(tmp_path):
    assert stability_source(frame(tmp_path, betas_space_rows())) == (
        "Stability columns (loss std, stability and its signals) from 3 learning trials of 16 steps in "
        "bf16-mixed: the space trains in pure bf16, where updates of lr 5e-06 round away (docs/trainer.md "
        "\"Precision\"); their length is train.learning_steps (a stability verdict needs 5 steps and the "
        "rollback trigger 5 in a row; on the H200 it fired at steps 9-13).")


def test_a_fallback_to_the_space_s_precision_is_said(tmp_path):
    note = "learning trial t04-learning runs in bf16, the space's precision: in bf16-mixed no configuration fits"
    text = stability_source(frame(tmp_path, betas_space_rows("bf16", note)))
    assert text.startswith("Stability columns (loss std, stability and its signals) from 3 learning trials "
                           "of 16 steps in bf16: their length is train.learning_steps")
    assert f"1 learning trial(s) ran in the space's precision instead: {note}." in text


def test_rows_that_are_their_own_learning_trials_and_rows_without_stability_steps(tmp_path):
    own = [dataclasses.replace(trial(t, 10.0, 100.0, 0.01), precision="bf16", steps=5, stability_from=t,
                               stability_steps=5, stability_precision="bf16") for t in ("a", "b")]
    assert stability_source(frame(tmp_path / "own", own)) == (
        "Stability columns (loss std, stability and its signals) from each trial's own run of 5 steps in bf16.")
    assert stability_source(frame(tmp_path / "old", [trial("a", 10.0, 100.0, 0.01)])) is None


def test_the_report_and_frontier_md_carry_it(tmp_path):
    out = write_dir(tmp_path / "run", betas_space_rows())
    outcome = analyse_dir(out, memory_budget_gb=80.0)
    sentence = stability_source(outcome.analysed)
    assert sentence in (out / "frontier.md").read_text()
    html = (out / "report.html").read_text()
    assert "from 3 learning trials of 16 steps in bf16-mixed" in html
