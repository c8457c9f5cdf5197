"""benchmarks/user_case.py: the user's sweep space is a valid 16-configuration space of the case's
own folder and file, and its ETA check reads the console's progress lines."""
from __future__ import annotations

import csv
import math
import statistics
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import user_case  # noqa: E402

from dpo_sweep import space as space_mod  # noqa: E402


def test_the_sweep_space_is_sixteen_configurations_of_the_case(tmp_path):
    raw = yaml.safe_load(user_case.sweep_space(tmp_path / "q", 2048, 48.0, 32))
    assert raw["model"]["name_or_path"] == str(tmp_path / "q" / "ckpt")
    assert raw["data"]["path"] == str(tmp_path / "q" / "pairs.jsonl")
    assert raw["resources"]["gpu_memory_gb"] == 48
    trials = space_mod.parse(raw).trials
    assert len(trials) == 16 and {t.grad_acc * t.micro_batch for t in trials} == {32}


def test_eta_rows_compare_each_estimate_with_what_was_left():
    lines = [(10.0, "[1/16] t000 ok  peak 30.1 GB  | 10 s elapsed, ~5 min 00 s left"),
             (70.0, "  running: t001 (30 s) | 1 min 10 s elapsed"),
             (130.0, "[2/16] t001 ok  | 2 min 10 s elapsed, ~1 h 02 min left"),
             (200.0, "[3/16] t002 ok  | 3 min 20 s elapsed, ~? left")]
    rows = user_case.eta_rows(lines, end_s=310.0)
    assert [(r["at_s"], r["elapsed_said_s"], r["eta_s"], r["true_left_s"]) for r in rows[:2]] == [
        (10.0, 10.0, 300.0, 300.0), (130.0, 130.0, 3720.0, 180.0)]
    assert rows[0]["error"] == 0.0 and math.isnan(rows[2]["eta_s"]) and math.isnan(rows[2]["error"])


def test_a_command_past_its_limit_gets_a_ctrl_c_first_as_a_user_would_stop_it():
    child = ("import sys, time\n"
             "print('started', flush=True)\n"
             "try:\n    time.sleep(60)\n"
             "except KeyboardInterrupt:\n    print('stopped by Ctrl-C', flush=True); sys.exit(130)\n")
    # Also from a background job, whose children inherit SIGINT ignored (run_timestamped restores it).
    rc, lines, wall, stopped = user_case.run_timestamped([sys.executable, "-c", child], timeout_s=2.0)
    assert (rc, stopped) == (130, True) and [text for _, text in lines] == ["started", "stopped by Ctrl-C"]
    assert wall < 30  # it did not sleep its minute out
    # one that ignores the Ctrl-C gets a SIGTERM after the grace period
    deaf = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(60)\n"
    rc, _, wall, stopped = user_case.run_timestamped([sys.executable, "-c", deaf], timeout_s=1.0, grace_s=1.0)
    assert stopped and rc == -15 and wall < 30
    # a command that ends in time is not stopped
    rc, lines, _, stopped = user_case.run_timestamped([sys.executable, "-c", "print('done')"], timeout_s=30)
    assert (rc, stopped, [t for _, t in lines]) == (0, False, ["done"])


def test_extrapolate_reports_the_planner_s_row_and_refit_reads_it_back_from_the_steps(tmp_path):
    # A tiny checkpoint folder and long-tailed chat pairs; one configuration extrapolated from its
    # measure trial (mb 2 at grad_acc 6 of a grad_acc 16 row: 24 timed micro-steps over 4 measured
    # steps) and timed in full, on the CPU.
    import csv

    user_case.make("tiny-qwen2", 80, tmp_path / "q", prompt_words=20, reply_words=15)
    out = tmp_path / "r"
    rows = user_case.extrapolate_rows(tmp_path / "q", 32, 128, 5, [(2, "full"), (2, "full")], out)
    row, rerun = rows  # a configuration given twice is named apart the second time
    assert (row["config"], rerun["config"]) == ("mb2_full_ga16", "mb2_full_ga16_run2")
    assert row["status"] == "ok/ok" and row["extrapolated_step_ms"] > 0 and row["full_step_ms"] > 0
    low, high = (float(x) for x in row["interval_ms"].split("-"))
    assert low < row["extrapolated_step_ms"] < high and math.isfinite(row["extrapolation_error"])
    assert row["error"] == row["extrapolated_step_ms"] / row["full_step_ms"] - 1
    steps_csv = out / "extrapolation_steps" / "steps.csv"
    again, again_rerun = user_case.refit(tmp_path / "q", steps_csv, 128)
    assert again_rerun["config"] == "mb2_full_ga16_run2"
    assert again["config"] == "mb2_full_ga16" and math.isclose(again["planner_ms"], row["extrapolated_step_ms"])
    assert math.isclose(again["extrapolation_error"], row["extrapolation_error"])
    # a sweep's steps: the measure trial <id> and the runoff that timed it in full, <id>-runoff
    text = steps_csv.read_text().replace("mb2_full_ga16-short", "t000_mb2_full_ga16_b0.1").replace(
        "mb2_full_ga16,", "t000_mb2_full_ga16_b0.1-runoff,")
    (tmp_path / "sweep_steps.csv").write_text(text)
    _, swept = user_case.refit(tmp_path / "q", tmp_path / "sweep_steps.csv", 128, out_csv=tmp_path / "refit.csv")
    assert swept["config"] == "t000_mb2_full_ga16_b0.1-runoff" and math.isclose(swept["planner_ms"], again["planner_ms"])
    assert [r["config"] for r in csv.DictReader((tmp_path / "refit.csv").open())] == [
        "mb2_full_ga16_run2", swept["config"]]


def test_cost_runs_each_data_set_in_a_process_of_its_own_in_alternating_order(tmp_path, monkeypatch):
    # Each `cost-process` command is run here in-process (main(argv)) instead of a fresh python.
    import subprocess

    calls = []

    def fake_run(cmd, check, cwd):
        calls.append(cmd[cmd.index("--data") + 1])
        assert cmd[1] == user_case.__file__ and cmd[2] == "cost-process"
        return user_case.main(cmd[2:])

    monkeypatch.setattr(subprocess, "run", fake_run)
    summary = user_case.cost(None, 8, tmp_path, 256, 3, preset="tiny-llama", pairs=48, repeats=2)
    assert calls == ["all", "small", "small", "all"]
    rows = list(csv.DictReader((tmp_path / "trial_cost.csv").open()))
    assert [(r["repeat"], r["data"], r["trial"]) for r in rows] == [
        ("0", "all", "first"), ("0", "all", "second"), ("0", "small", "first"), ("0", "small", "second"),
        ("1", "small", "first"), ("1", "small", "second"), ("1", "all", "first"), ("1", "all", "second")]
    assert {r["pairs"] for r in rows if r["data"] == "all"} == {"48"} and {r["status"] for r in rows} == {"ok"}
    for s in summary:  # medians of the two runs of each, and their ratio
        walls = {d: statistics.median(float(r["wall_s"]) for r in rows if r["data"] == d and r["trial"] == s["trial"])
                 for d in ("all", "small")}
        assert math.isclose(s["all_wall_s"], walls["all"]) and math.isclose(s["ratio"], walls["all"] / walls["small"])
