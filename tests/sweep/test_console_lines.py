"""The sweep's console: throughput on each line, one short line per error, a line while quiet
trials run, and a pruned row after the row whose memory it needed."""
from __future__ import annotations

from testkit import make_cfg

from dpo_sweep.records import TrialResult
from dpo_sweep.sweep import recorder

CUDA_OOM = ("rank 0: CUDA out of memory. Tried to allocate 502.00 MiB. GPU 0 has a total capacity of 139.80 GiB "
            "of which 64.74 GiB is free. Including non-PyTorch memory, this process has 75.03 GiB memory in use."
            "\nTraceback (most recent call last):\n  File ...")


def row(trial_id: str, status: str = "ok", **fields) -> TrialResult:
    return TrialResult(trial_id=trial_id, status=status, **make_cfg(trial_id=trial_id).knobs(), **fields)


def test_the_line_gives_the_throughput():
    line = recorder.progress_line(1, 3, row("t004", peak_mem_gb=1.234, step_time_ms=56.7, tokens_per_s=26196.6))
    assert "peak 1.23 GB  step 57 ms  26,197 tok/s" in line


def test_a_long_error_is_one_short_line():
    line = recorder.progress_line(2, 3, row("t000", "oom", error=CUDA_OOM))
    error = line.split(" | ", 1)[1]
    assert "\n" not in line and len(error) <= recorder.CONSOLE_ERROR_CHARS and error.endswith("...")
    assert error.startswith("rank 0: CUDA out of memory. Tried to allocate 502.00 MiB.")


class FakePlan:
    def __init__(self, rows):
        self.rows = rows

    def take_notes(self):
        return []

    def take_output(self):
        rows, self.rows = self.rows, []
        return [], rows

    def take_replaced(self):
        return []

    def trials_due(self):
        return []

    def running_due(self):
        return {}

    def unwritten(self):
        return []


def test_a_pruned_row_follows_the_row_whose_memory_it_needed(tmp_path, capsys):
    rows = [row("t002", "pruned", error="pruned: needs at least the memory of t000"), row("t000", "oom", error="OOM")]
    rec = recorder.SweepRecorder(tmp_path, FakePlan(rows), total=2, already_done=0)
    rec.flush()
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[1] for ln in lines if ln.startswith("[")] == ["t000", "t002"]
    assert (tmp_path / "results.csv").read_text().splitlines()[1].startswith("t002")  # the file keeps the plan's order


def test_a_quiet_sweep_says_what_is_running(tmp_path, capsys, monkeypatch):
    rec = recorder.SweepRecorder(tmp_path, FakePlan([]), total=2, already_done=0)
    monkeypatch.setattr(rec, "left_s", lambda: 100.0)  # the estimate is priced in test_sweep_stopping.py
    start = rec.started_at
    rec.trial_started = {"t000": start, "t001": start + 20}
    rec.heartbeat(start + 10)  # under HEARTBEAT_S since the start: quiet
    assert capsys.readouterr().out == ""
    rec.heartbeat(start + 65)
    assert capsys.readouterr().out.strip() == ("running: t000 (1 min 05 s), t001 (45 s) | 1 min 05 s elapsed, "
                                               "~1 min 40 s left")
    rec.heartbeat(start + 80)  # 15 s after that line
    assert capsys.readouterr().out == ""
