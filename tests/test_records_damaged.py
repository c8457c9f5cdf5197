"""A results.csv whose last line was cut (what a kill or a full disk during an append leaves):
the readers name the line, `report` and `recommend` show no number from it (exit 2), and
``--resume`` drops it, so that its trial runs again. The files are written by the sweep's own
writers, then truncated."""
from __future__ import annotations

import math

import pytest

from dpo_sweep.cli import main
from dpo_sweep.csv_table import read_csv_table
from dpo_sweep.records import StepRecord, TrialResult, read_csv_rows, write_results, write_steps
from dpo_sweep.sweep.output_dir import prepare_output
from testkit import make_cfg


def _row(trial_id: str, tokens_per_s: float) -> TrialResult:
    cfg = make_cfg(trial_id=trial_id)
    return TrialResult(trial_id=trial_id, status="ok", **cfg.knobs(), peak_mem_gb=1.5, step_time_ms=40.0,
                       tokens_per_s=tokens_per_s, loss_std=0.01, measured_by=trial_id, stability="stable")


def _step(trial_id: str, step: int) -> StepRecord:
    return StepRecord(trial_id, step, 0.69, 1.0, 40.0, 1.5, 0.5, 0.0, -10.0, -10.0, 0.0)


def _sweep_dir(tmp_path):
    """Three trials written one append at a time, as the recorder writes them; the last row's
    line cut inside its tokens_per_s (4061.5 left as 40)."""
    for trial_id, tps in (("a", 1000.0), ("b", 2000.0), ("c", 4061.5)):
        write_steps(tmp_path, [_step(trial_id, 1), _step(trial_id, 2)], append=True)
        write_results(tmp_path, [_row(trial_id, tps)], append=True)
    path = tmp_path / "results.csv"
    data = path.read_bytes()
    cut = data.rindex(b"4061.5") + 2
    path.write_bytes(data[:cut])
    return path


def test_a_line_cut_inside_a_number_is_named_by_its_line(tmp_path):
    path = _sweep_dir(tmp_path)
    table = read_csv_table(path)
    assert [r["trial_id"] for r in table.rows] == ["a", "b"]
    (bad,) = table.damaged
    assert (bad.line, bad.trial_id) == (4, "c")
    assert f"of the header's {len(table.header)} cells" in bad.reason and "the file ends inside it" in bad.reason
    assert [r["trial_id"] for r in read_csv_rows(path)] == ["a", "b"]  # a cut row is not a finished one


def test_a_line_cut_just_before_its_line_break_is_damaged_too(tmp_path):
    write_results(tmp_path, [_row("a", 1000.0), _row("b", 2000.0)])
    path = tmp_path / "results.csv"
    path.write_bytes(path.read_bytes()[:-2])  # every cell there, the last one maybe cut short
    (bad,) = read_csv_table(path).damaged
    assert (bad.line, bad.trial_id, bad.reason) == (3, "b", "the file ends inside it (no line break after it)")


@pytest.mark.parametrize("command", [["report"], ["recommend", "--memory-budget-gb", "80"]])
def test_report_and_recommend_refuse_the_cut_line_naming_it(tmp_path, capsys, command):
    path = _sweep_dir(tmp_path)
    assert main([command[0], str(tmp_path), *command[1:]]) == 2
    err = capsys.readouterr().err
    assert f"{path}: line 4 (trial c): it has" in err and "--resume" in err
    assert not (tmp_path / "report.html").exists() and not (tmp_path / "recommendation.json").exists()


def test_resume_drops_the_cut_line_and_runs_its_trial_again(tmp_path, capsys):
    path = _sweep_dir(tmp_path)
    space = tmp_path / "space.yaml"
    space.write_text("name: x\n")
    assert prepare_output(space, tmp_path, resume=True) == {"a", "b"}
    assert f"resume: {path}: line 4 (trial c)" in capsys.readouterr().out
    assert read_csv_table(path).damaged == [] and path.read_bytes().endswith(b"\r\n")
    steps = read_csv_rows(tmp_path / "steps.csv")
    assert sorted({s["trial_id"] for s in steps}) == ["a", "b"]  # c's steps go: it runs again
    # Its new row appends cleanly and the folder reads whole again.
    write_steps(tmp_path, [_step("c", 1), _step("c", 2)], append=True)
    write_results(tmp_path, [_row("c", 4061.5)], append=True)
    assert main(["report", str(tmp_path)]) == 0
    rows = {r["trial_id"]: r for r in read_csv_rows(path)}
    assert sorted(rows) == ["a", "b", "c"] and math.isclose(float(rows["c"]["tokens_per_s"]), 4061.5)


def test_a_cut_steps_line_is_refused_by_report_and_dropped_by_resume(tmp_path, capsys):
    write_steps(tmp_path, [_step("a", 1), _step("a", 2)])
    write_results(tmp_path, [_row("a", 1000.0)])
    steps = tmp_path / "steps.csv"
    write_steps(tmp_path, [_step("b", 1)], append=True)  # b was killed while its steps were written
    steps.write_bytes(steps.read_bytes()[:-9])
    assert main(["report", str(tmp_path)]) == 2
    assert f"{steps}: line 4 (trial b)" in capsys.readouterr().err
    space = tmp_path / "space.yaml"
    space.write_text("name: x\n")
    assert prepare_output(space, tmp_path, resume=True) == {"a"}
    assert read_csv_table(steps).damaged == [] and [s["trial_id"] for s in read_csv_rows(steps)] == ["a", "a"]
