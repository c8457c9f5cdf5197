"""Faults of a user's bad day done for real on `dpo-sweep run` (its own local cluster, one trial at
a time): a stopped warm worker (SIGSTOP) ends its trial as ``timeout`` instead of stalling the
sweep; a spreadsheet's BOM in results.csv and a value inserted at the front of a list, then
``--resume``: only the new configuration and the timed-out one run; SIGTERM ends that resume as
Ctrl-C does (exit 143, the resume line); a changed ``train.steps`` is refused before Ray starts.
Every configuration ends up once in results.csv, each step once in steps.csv."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from sweep_cluster import auth_env, read_csv, run_sweep, session_pids, start_sweep, stop_process, write_space

pytestmark = pytest.mark.slow


def _wait_rows(out: Path, n: int, proc, log: Path, timeout_s: float = 240) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None and len(read_csv(out / "results.csv")) < n:
        time.sleep(0.2)
    assert proc.poll() is None, log.read_text()[-3000:]


def test_a_stopped_worker_a_bom_an_inserted_value_sigterm_and_a_changed_setting(tmp_path):
    levels = "checkpoint_level: [none, L1, L2]\n"
    space = write_space(tmp_path / "r3.yaml", "r3", "micro_batch: [2]\n" + levels, train_extra=", learning_steps: 3")
    out = tmp_path / "out"
    env = auth_env("round3-test")
    args = ["--output", str(out), "--no-dashboard", "--max-concurrent", "1"]
    # 1. After the first row, every warm worker is stopped: the next trial would wait for ever.
    log = tmp_path / "first.log"
    first = start_sweep([str(space), *args, "--trial-timeout-s", "12"], env, log, start_new_session=True)
    try:
        _wait_rows(out, 1, first, log)
        # The warm worker: "ray::TrialWorker" when idle, "ray::trial <id>" while it runs one.
        stopped = session_pids(first.pid, "ray::TrialWorker", "ray::trial ")
        assert stopped, "no warm worker process found"
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        rc = first.wait(timeout=240)
    finally:
        stop_process(first)
    text = log.read_text()
    assert rc == 1, text[-3000:]  # a trial without a result: the last line says so
    assert "error: the sweep finished without a result for 1 of its" in text.strip().splitlines()[-1]
    rows = read_csv(out / "results.csv")
    assert sorted(r["status"] for r in rows) == ["ok", "ok", "timeout"], text[-3000:]
    lost = next(r for r in rows if r["status"] == "timeout")
    assert lost["infrastructure_failure"] == "True" and "past its limit" in lost["error"]
    assert "--resume runs it again" in text
    kept = {r["trial_id"] for r in rows if r["status"] == "ok"}

    # 2. A spreadsheet saved results.csv with a BOM; a level is inserted at the front of the list.
    data = (out / "results.csv").read_bytes()
    (out / "results.csv").write_bytes(b"\xef\xbb\xbf" + data)
    write_space(space, "r3", "micro_batch: [2]\ncheckpoint_level: [full, none, L1, L2]\n",
                train_extra=", learning_steps: 3")
    # 3. SIGTERM during that resume: rows kept, the resume line, exit 143 (128 + SIGTERM).
    log = tmp_path / "second.log"
    second = start_sweep([str(space), *args, "--resume"], env, log, start_new_session=True)
    try:
        deadline = time.time() + 120  # the timeout row is dropped, then the first new row arrives
        while time.time() < deadline and "lost to an infrastructure failure" not in log.read_text():
            time.sleep(0.2)
        _wait_rows(out, 3, second, log)
        second.send_signal(signal.SIGTERM)
        rc = second.wait(timeout=60)
    finally:
        stop_process(second)
    text = log.read_text()
    assert rc == 143, text[-3000:]
    assert f"continue with: dpo-sweep run {space} --output {out} --resume" in text
    assert "Traceback" not in text and "resume: 1 trial(s) lost to an infrastructure failure" in text
    # 4. The same resume to the end: the ids of the first run's rows are kept, every configuration once.
    done = run_sweep([str(space), *args, "--resume"], env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    final = read_csv(out / "results.csv")
    ids = [r["trial_id"] for r in final]
    assert len(ids) == 4 == len(set(ids)) and kept <= set(ids) and {r["status"] for r in final} == {"ok"}
    steps = [(s["trial_id"], s["step"], s["worst_case"]) for s in read_csv(out / "steps.csv")]
    assert len(steps) == len(set(steps)) and {t for t, _, _ in steps} == set(ids)
    # 5. Another train.steps: refused (exit 2) before Ray starts, the setting named, nothing changed.
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    changed = run_sweep([str(space), *args, "--resume", "--set", "train.steps=4"], env, timeout_s=60)
    assert changed.returncode == 2, changed.stdout[-2000:] + changed.stderr[-2000:]
    assert "train.steps: the rows ran 3, the space now says 4" in changed.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
