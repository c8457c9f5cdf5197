"""`dpo-sweep run`'s live report (commands/run.py LiveReport): the analysis files rewritten from the
rows so far at most every --report-every-s seconds while the sweep runs, one note and no more tries
when that fails; a bad --report-every-s is refused before anything starts. The sweep itself:
tests/sweep/test_sweep_interrupt.py (a report of the rows written before Ctrl-C)."""
from __future__ import annotations

import argparse

import pytest

from dpo_sweep.cli import main
from dpo_sweep.commands import run as run_mod
from dpo_sweep.records import TrialResult, write_results
from testkit import make_cfg


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _args() -> argparse.Namespace:
    return argparse.Namespace(memory_budget_gb=None, safety_margin=None, epochs=None, gpu=None)


def _row(i: int) -> TrialResult:
    cfg = make_cfg(trial_id=f"t{i}", micro_batch=i + 1)
    return TrialResult(trial_id=f"t{i}", status="ok", **cfg.knobs(), peak_mem_gb=1.0 + i, step_time_ms=40.0,
                       tokens_per_s=1000.0 * (i + 1), loss_std=0.01, steps=6, measured_steps=5,
                       measured_by=f"t{i}", stability_from=f"t{i}", stability_steps=6)


def test_the_report_is_rewritten_at_most_every_so_many_seconds(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(run_mod, "say", print)
    clock = Clock()
    live = run_mod.LiveReport(tmp_path, _args(), None, None, every_s=30, clock=clock)
    write_results(tmp_path, [_row(0)])
    live()  # too soon after the sweep's start
    assert not (tmp_path / "report.html").exists() and live.written == 0
    clock.now += 30
    live()
    assert (tmp_path / "report.html").is_file() and live.written == 1
    assert f"  report so far: {tmp_path / 'report.html'} (rewritten at most every 30 s" in capsys.readouterr().out
    write_results(tmp_path, [_row(1)], append=True)
    clock.now += 10
    live()  # 10 s after the last: not yet
    assert "t1" not in (tmp_path / "recommendation.json").read_text()
    clock.now += 20
    live()
    assert live.written == 2 and '"t1"' in (tmp_path / "recommendation.json").read_text()
    assert "report so far" not in capsys.readouterr().out  # said once


def test_zero_never_rewrites_and_a_failure_is_one_note(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(run_mod, "say", print)
    clock = Clock()
    write_results(tmp_path, [_row(0)])
    off = run_mod.LiveReport(tmp_path, _args(), None, None, every_s=0, clock=clock)
    clock.now += 1e6
    off()
    assert not (tmp_path / "report.html").exists()

    def broken(*_a, **_k):
        raise ValueError("no such column: tokens_per_s")

    monkeypatch.setattr("dpo_sweep.commands.report.analyse_dir", broken)
    live = run_mod.LiveReport(tmp_path, _args(), None, None, every_s=5, clock=clock)
    for _ in range(3):
        clock.now += 5
        live()
    out = capsys.readouterr().out
    assert out.count("note: report.html could not be rewritten mid-sweep (ValueError: no such column: "
                     "tokens_per_s); it is written when the sweep ends") == 1 and live.failed


@pytest.mark.parametrize("value", ["-1", "nan"])
def test_a_bad_report_interval_is_refused_by_name(tmp_path, capsys, value):
    space = tmp_path / "s.yaml"
    space.write_text("name: live\nmodel: {preset: tiny-llama}\ndata: {synthetic: {pairs: 8}}\n"
                     "resources: {use_gpu: false}\nsearch: {micro_batch: [1]}\n")
    assert main(["run", str(space), "--report-every-s", value, "--output", str(tmp_path / "out")]) == 2
    assert f"--report-every-s: {value} is not allowed; give seconds" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
