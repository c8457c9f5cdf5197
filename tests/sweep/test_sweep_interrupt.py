"""Ctrl-C on `dpo-sweep run` (its own local Ray cluster): the sweep stops at once, ends the running
trial and every Ray process it started, keeps the finished rows and prints only our --resume line."""
from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from sweep_cluster import auth_env, read_csv, start_sweep, stop_process, write_space

pytestmark = pytest.mark.slow


def _session_processes(sid: int) -> list[str]:
    """Live (not zombie) processes of the session ``sid``: the sweep started in a new session, and
    its local cluster's processes (GCS, raylet, workers) inherit it."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
        state, session = fields[0], int(fields[3])
        if session == sid and state != "Z":
            found.append(text[: text.rindex(")") + 1])
    return found


def test_ctrl_c_stops_at_once_keeps_finished_rows_and_exits_130(tmp_path):
    # learning_steps 3 (the space's steps): each trial is its own learning trial and its row is
    # written when it ends (the default 16 holds every row for one learning trial)
    space = write_space(tmp_path / "stop.yaml", "stop", """\
        micro_batch: [2]
        checkpoint_level: [none, L1, L2]
        """, train_extra=", learning_steps: 3")
    out = tmp_path / "out"
    log = tmp_path / "run.log"
    # --report-every-s 0.5: the rows so far make a report while the sweep runs (a tab can be refreshed)
    proc = start_sweep([str(space), "--output", str(out), "--no-dashboard", "--report-every-s", "0.5"],
                       auth_env("interrupt-test"), log, start_new_session=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None and not (
                read_csv(out / "results.csv") and (out / "report.html").is_file()):
            time.sleep(0.2)
        assert proc.poll() is None, log.read_text()[-3000:]
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        rc = proc.wait(timeout=60)
        exit_s = time.monotonic() - sent
    finally:
        stop_process(proc)
    text = log.read_text()
    assert rc == 130, text[-3000:]
    rows = read_csv(out / "results.csv")
    assert 1 <= len(rows) < 3 and all(r["status"] == "ok" for r in rows), rows
    assert (f"interrupted: {len(rows)} of 3 trials finished; continue with: "
            f"dpo-sweep run {space} --output {out} --resume") in text
    for noise in ("Tuner.restore", "Traceback", "Trials did not complete", "Trial task failed"):
        assert noise not in text, text[-3000:]
    # Stopped at once: Tune used to start the next trial and let it run a step (8-12 s); what is
    # left is ending the local cluster (a few seconds on the 2-core test machine).
    assert exit_s < 20, exit_s
    # The live report, of the rows written before the stop: it says the sweep did not finish.
    assert f"  report so far: {out / 'report.html'} (rewritten at most every 0.5 s" in text
    report = (out / "report.html").read_text()
    assert "This sweep did not finish" in report and rows[0]["trial_id"][:5] in report
    steps = read_csv(out / "steps.csv")
    assert sorted({s["trial_id"] for s in steps}) == sorted(r["trial_id"] for r in rows)
    assert len(steps) == (3 + 1) * len(rows)  # only finished trials' steps (and worst-case step), each once
    deadline = time.time() + 30
    while _session_processes(proc.pid) and time.time() < deadline:
        time.sleep(0.5)
    assert _session_processes(proc.pid) == []
