"""Faults of round 4 done for real on `dpo-sweep run` (its own local cluster) and `dpo-sweep trial`:
- a results folder has one writer: `trial --output DIR` into a running sweep's folder is refused
  by the folder's lock (exit 2, naming the sweep), and into a finished sweep's folder for the rows
  there (exit 2, naming the folder): results.csv and steps.csv keep every byte;
- a final analysis that fails exits 1 with its cause in one line, and removes the analysis files
  that described earlier rows;
- a sweep whose trial timed out says so in its last line and exits 1."""
from __future__ import annotations

import json
import subprocess
import time

import pytest
from sweep_cluster import DPO_SWEEP, REPO, auth_env, read_csv, run_sweep, start_sweep, stop_process, write_space

from dpo_sweep.results_dir import ResultsDir
from dpo_sweep.train.faults import FAULTS_ENV

pytestmark = pytest.mark.slow


def _trial(space, out) -> subprocess.CompletedProcess:
    return subprocess.run([*DPO_SWEEP, "trial", str(space), "--output", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_trial_into_a_sweeps_folder_leaves_its_rows_and_a_failed_analysis_exits_1(tmp_path):
    space = write_space(tmp_path / "w.yaml", "w", "micro_batch: [1, 2]\ncheckpoint_level: [none]\n")
    out = tmp_path / "out"
    log = tmp_path / "sweep.log"
    args = [str(space), "--output", str(out), "--no-dashboard", "--max-concurrent", "1"]
    sweep = start_sweep(args, auth_env("one-writer"), log)
    try:
        lock = ResultsDir(out).lock
        deadline = time.time() + 60
        while time.time() < deadline and str(sweep.pid) not in (lock.read_text() if lock.is_file() else ""):
            time.sleep(0.1)
        during = _trial(space, out)
        assert sweep.poll() is None, log.read_text()[-3000:]  # refused while the sweep ran
        rc = sweep.wait(timeout=240)
    finally:
        stop_process(sweep)
    assert during.returncode == 2, during.stdout + during.stderr
    assert f"--output {out} is in use by another sweep or trial: pid {sweep.pid}" in during.stderr
    assert "Traceback" not in during.stderr
    assert rc == 0, log.read_text()[-3000:]
    files = ResultsDir(out)
    before = files.results.read_bytes(), files.steps.read_bytes()
    assert len(read_csv(files.results)) == 2
    after = _trial(space, out)
    assert after.returncode == 2, after.stdout + after.stderr
    assert f"--output {out} holds a sweep's rows (2 in {files.results})" in after.stderr
    assert len(after.stderr.strip().splitlines()) == 1 and "Traceback" not in after.stderr
    assert (files.results.read_bytes(), files.steps.read_bytes()) == before  # every row kept
    assert not files.lock.exists()

    # A cell the analysis refuses: the resume has nothing to run, and its analysis fails.
    assert all(p.is_file() for p in files.analysis_files)
    text = files.results.read_text()
    row = read_csv(files.results)[0]
    files.results.write_text(text.replace(row["peak_mem_gb"], "lots", 1))
    again = run_sweep([*args, "--resume"], auth_env("one-writer"), timeout_s=120)
    assert again.returncode == 1, again.stdout[-3000:] + again.stderr[-3000:]
    last = again.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the analysis failed (UserError: ") and "peak_mem_gb" in last, again.stderr
    assert "frontier.md, recommendation.json, recommended.yaml, report.html removed" in last
    assert f"Once fixed: dpo-sweep report {out}" in last and "Traceback" not in again.stderr
    assert not any(p.exists() for p in files.analysis_files)  # nothing stale is left to read


def test_a_sweep_whose_trial_timed_out_says_so_last_and_exits_1(tmp_path):
    space = write_space(tmp_path / "t.yaml", "t", "micro_batch: [1, 2]\ncheckpoint_level: [none]\n")
    out = tmp_path / "out"
    hang = json.dumps({"step": 2, "kind": "hang", "when": {"micro_batch": 2}})
    done = run_sweep([str(space), "--output", str(out), "--no-dashboard", "--max-concurrent", "1",
                      "--full-grid", "--trial-timeout-s", "10"], {**auth_env("timeout"), FAULTS_ENV: hang})
    # 10 s: under a loaded CI the healthy trial took more than 3 (its import and model build included).
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    # The trial it killed is said in its own lines, not in Ray's traceback of the kill.
    assert "Traceback" not in done.stderr and "ActorDiedError" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the sweep finished without a result for 1 of its 2 trial(s): 1 timed out"), done.stderr
    assert "--resume runs them again: dpo-sweep run" in last
    assert sorted(r["status"] for r in read_csv(ResultsDir(out).results)) == ["ok", "timeout"]
