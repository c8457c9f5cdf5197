"""`dpo-sweep report` / `recommend` end to end on a results dir, frontier.md's shape, bad input."""
from __future__ import annotations

import json
import math

import pytest
from sweep_frames import steps_for, sweep_trials, trial, write_dir

from dpo_sweep.analysis import tables
from dpo_sweep.analysis.results import load_results
from dpo_sweep.cli import main
from dpo_sweep.commands.report import analyse_dir

#: The hand-made frames sweep ``seed`` (sweep_frames.trial), a swept train field: its column follows beta.
HEADER = ("| micro_batch | checkpoint | grad_acc | beta | seed | peak memory (GB) | step time (ms) | tokens/s "
          "| loss std | on frontier |")


def table_lines(markdown: str) -> list[list[str]]:
    """The table's rows, without the swept seed column (so the indices are frontier.md's own)."""
    lines = [ln for ln in markdown.splitlines() if ln.startswith("|")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    seed = cells[0].index("seed") if "seed" in cells[0] else None
    return [[c for i, c in enumerate(row) if i != seed] for row in cells[2:]]


def test_report_on_a_dir_holding_only_results_csv(tmp_path, capsys):
    out_dir = write_dir(tmp_path / "r", sweep_trials())
    assert main(["report", str(out_dir), "--memory-budget-gb", "20"]) == 0
    for name in ("frontier.md", "recommendation.json", "report.html"):
        assert (out_dir / name).is_file()
    printed = capsys.readouterr().out
    assert HEADER in printed and "report.html" in printed
    rec = json.loads((out_dir / "recommendation.json").read_text())
    assert rec["memory_budget_gb"] == 20.0 and rec["trial_id"] is not None


def test_frontier_md_shape(tmp_path):
    outcome = analyse_dir(write_dir(tmp_path / "r", sweep_trials()), memory_budget_gb=20.0)
    text = (tmp_path / "r" / "frontier.md").read_text()
    assert HEADER in text and outcome.frontier_markdown in text and "GB = 1e9 bytes" in text
    rows = table_lines(outcome.frontier_markdown)
    assert len(rows) == len(sweep_trials())  # every trial, OOM/diverged/error included
    assert ["8", "none", "1", "0.1", "OOM", "-", "-", "-", "-"] in rows
    assert ["4", "L3", "1", "0.1", "error", "-", "-", "-", "-"] in rows
    diverged = next(r for r in rows if r[7] == "diverged")
    assert diverged[4] == "9.00" and diverged[8] == "-"
    assert {r[8] for r in rows} == {"yes", "no", "-"}
    measured = [float(r[4]) for r in rows if r[4] not in ("OOM", "error")]
    assert measured == sorted(measured)
    assert sorted(r[4] for r in rows[-3:]) == ["OOM", "OOM", "error"]  # no trusted peak: last
    assert outcome.report_path.name == "report.html"
    assert outcome.recommendation == json.loads((tmp_path / "r" / "recommendation.json").read_text())


def test_recommend_prints_the_configuration_and_writes_nothing(tmp_path, capsys):
    out_dir = write_dir(tmp_path / "r", sweep_trials())
    assert main(["recommend", str(out_dir), "--memory-budget-gb", "20"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("recommended: t")
    assert "micro_batch=" in printed and "checkpoint_level=" in printed and "GB = 1e9 bytes" in printed
    assert not (out_dir / "recommendation.json").exists()
    assert main(["recommend", str(out_dir), "--memory-budget-gb", "1"]) == 0
    assert "recommended: none (nothing fits)" in capsys.readouterr().out


def test_budget_defaults_to_the_gpu_memory_in_environment_json(tmp_path):
    trials = [trial("a", 10.0, 200.0, 0.02), trial("b", 30.0, 100.0, 0.02)]
    out_dir = write_dir(tmp_path / "r", trials, env={"gpu": {"name": "H200", "memory_gb": 24.0}})
    outcome = analyse_dir(out_dir)
    assert outcome.recommendation["trial_id"] == "a"
    assert outcome.recommendation["memory_budget_gb"] == 24.0
    assert outcome.recommendation["budget_source"].startswith("environment.json")
    assert analyse_dir(write_dir(tmp_path / "cpu", trials)).recommendation["trial_id"] == "b"
    # A sweep that capped memory to emulate a smaller card is judged against that card.
    (out_dir / "space.yaml").write_text("name: x\nresources: {gpu_memory_gb: 12}\n")
    outcome = analyse_dir(out_dir)
    assert outcome.recommendation["memory_budget_gb"] == 12.0
    assert outcome.recommendation["trial_id"] == "a"


def test_space_yaml_objectives_are_used(tmp_path):
    trials = [trial("a", 10.0, 100.0, 0.05), trial("b", 10.0, 100.0, 0.01)]
    out_dir = write_dir(tmp_path / "r", trials)
    both = analyse_dir(out_dir).analysed
    assert both["on_frontier"].tolist() == [False, True]  # loss std decides
    (out_dir / "space.yaml").write_text(
        "name: x\nobjectives: {memory: min, step_time: min, loss_std: null}\n")
    assert analyse_dir(out_dir).analysed["on_frontier"].tolist() == [True, True]  # exact tie
    explicit = analyse_dir(out_dir, objectives={"memory": "min", "loss_std": "min"})
    assert explicit.analysed["on_frontier"].tolist() == [False, True]


def test_nan_metrics_load_and_report(tmp_path):
    out_dir = write_dir(tmp_path / "r", [trial("a", 10.0, math.nan, 0.02), trial("b", 12.0, 90.0, math.nan),
                                         trial("c", 14.0, 80.0, 0.02)],
                        steps=steps_for("c", 4, 14.0))
    outcome = analyse_dir(out_dir, memory_budget_gb=20.0)
    assert outcome.analysed["eligible"].tolist() == [False, False, True]
    assert outcome.recommendation["trial_id"] == "c"
    assert table_lines(outcome.frontier_markdown)[0][5] == "-"


@pytest.mark.parametrize("setup, message", [
    (lambda d: None, "does not exist"),
    (lambda d: d.mkdir(), "results.csv not found"),
    (lambda d: (d.mkdir(), (d / "results.csv").write_text("")), "is empty"),
    (lambda d: (d.mkdir(), (d / "results.csv").write_text("trial_id,status,micro_batch\nt1,ok,1\n")),
     "lacks the column(s) checkpoint_level, grad_acc, beta, peak_mem_gb"),
])
def test_bad_input_exits_2_with_a_message(tmp_path, capsys, setup, message):
    out_dir = tmp_path / "r"
    setup(out_dir)
    assert main(["report", str(out_dir)]) == 2
    assert message in capsys.readouterr().err
    assert main(["recommend", str(out_dir), "--memory-budget-gb", "10"]) == 2


def test_bad_budget_exits_2(tmp_path, capsys):
    out_dir = write_dir(tmp_path / "r", sweep_trials())
    assert main(["report", str(out_dir), "--memory-budget-gb", "0"]) == 2
    assert "positive number" in capsys.readouterr().err


def test_results_loader_fills_optional_columns(tmp_path):
    (tmp_path / "results.csv").write_text(
        "trial_id,status,micro_batch,checkpoint_level,grad_acc,beta,peak_mem_gb,step_time_ms,"
        "tokens_per_s,loss_std\n"
        "t1,OK,2,L1,1,0.1,3.5,120,900,\n")
    df = load_results(tmp_path)
    assert df.loc[0, "status"] == "ok" and df.loc[0, "model"] == "" and math.isnan(df.loc[0, "mfu"])
    assert math.isnan(df.loc[0, "loss_std"])


def test_markdown_cells_escape_pipes():
    text = tables.to_markdown(("a", "b"), [["x|y", "line\nbreak"]])
    assert "x\\|y" in text and "line break" in text


def test_the_end_of_a_run_analyses_like_report_with_its_flags(tmp_path):
    """`dpo-sweep run` ends with the same analysis as `dpo-sweep report` on its directory: the
    objectives the space file gives (not the schema's defaults for the missing ones) and the
    run's own --memory-budget-gb / --safety-margin."""
    from dpo_sweep.cli import _parser
    from dpo_sweep.commands import run as command

    out_dir = write_dir(tmp_path / "r", sweep_trials())
    (out_dir / "space.yaml").write_text("name: r\nobjectives: {memory: min}\n")
    args = _parser().parse_args(["run", "x.yaml", "--memory-budget-gb", "20", "--safety-margin", "0.2"])
    printed: list[str] = []
    command._analyse(out_dir, args, printed.append)
    after_run = ((out_dir / "frontier.md").read_text(), json.loads((out_dir / "recommendation.json").read_text()))
    assert "Objectives: memory min." in after_run[0]
    assert after_run[1]["safety_margin"] == 0.2 and after_run[1]["memory_budget_gb"] == 20.0
    assert main(["report", str(out_dir), "--memory-budget-gb", "20", "--safety-margin", "0.2"]) == 0
    assert ((out_dir / "frontier.md").read_text(),
            json.loads((out_dir / "recommendation.json").read_text())) == after_run
