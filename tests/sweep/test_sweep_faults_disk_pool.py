"""Two more faults done for real on `dpo-sweep run`: the results folder's disk fills up mid-sweep
(a real tmpfs), and the warm-worker pool is killed with SIGKILL. Either ends the sweep with exit 1
and one line, every row on disk whole; `--resume` then measures what was lost, each configuration
once."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from sweep_cluster import auth_env, read_csv, run_sweep, session_pids, start_sweep, stop_process, write_space

from dpo_sweep.csv_table import read_csv_table

pytestmark = pytest.mark.slow

SEARCH = "micro_batch: [2]\ncheckpoint_level: [none, L1, L2]\n"


def _fault_after_first_row(args: list[str], env: dict[str, str], log: Path, fault) -> tuple[int, str]:
    """Start the sweep, call ``fault(proc)`` once its first row is written, wait for its end: its
    exit code and output."""
    out = Path(args[args.index("--output") + 1])
    proc = start_sweep(args, env, log, start_new_session=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None and not read_csv(out / "results.csv"):
            time.sleep(0.2)
        assert proc.poll() is None, log.read_text()[-3000:]
        fault(proc)
        rc = proc.wait(timeout=240)
    finally:
        stop_process(proc)
    return rc, log.read_text()


def _whole(out: Path) -> None:
    for name in ("results.csv", "steps.csv"):
        assert read_csv_table(out / name).damaged == [], name


def test_a_disk_that_fills_mid_sweep_stops_it_with_one_line_and_whole_files(tmp_path):
    mount = tmp_path / "fs"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        space = write_space(tmp_path / "d.yaml", "disk", SEARCH, train_extra=", learning_steps: 3")
        out = mount / "out"
        args = [str(space), "--output", str(out), "--no-dashboard", "--max-concurrent", "1"]
        def fill(proc: subprocess.Popen) -> None:  # the disk fills up
            with (mount / "filler").open("wb") as fh:
                try:
                    fh.write(b"\0" * (64 << 20))
                except OSError:
                    pass

        rc, text = _fault_after_first_row(args, auth_env("disk-test"), tmp_path / "full.log", fill)
        assert rc == 1, text[-3000:]
        assert "the disk is full" in text and f"--output {out} --resume" in text, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
        _whole(out)
        (mount / "filler").unlink()
        done = run_sweep([*args, "--resume"], auth_env("disk-test"))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        ids = [r["trial_id"] for r in read_csv(out / "results.csv")]
        assert len(ids) == 3 == len(set(ids))
        _whole(out)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_killed_worker_pool_marks_its_trials_lost_and_resume_runs_them(tmp_path):
    space = write_space(tmp_path / "p.yaml", "pool", SEARCH, train_extra=", learning_steps: 3")
    out = tmp_path / "out"
    args = [str(space), "--output", str(out), "--no-dashboard", "--max-concurrent", "1"]
    def kill_pool(proc: subprocess.Popen) -> None:
        pools = session_pids(proc.pid, "ray::WorkerPool")
        workers = session_pids(proc.pid, "ray::TrialWorker", "ray::trial ")
        assert pools and workers
        for pid in pools | workers:
            os.kill(pid, signal.SIGKILL)

    rc, text = _fault_after_first_row(args, auth_env("pool-test"), tmp_path / "pool.log", kill_pool)
    assert rc == 1, text[-3000:]
    rows = read_csv(out / "results.csv")
    lost = [r for r in rows if r["status"] != "ok"]
    assert lost and all(r["infrastructure_failure"] == "True" for r in lost), rows
    done = run_sweep([*args, "--resume"], auth_env("pool-test"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"resume: {len(lost)} trial(s) lost to an infrastructure failure" in done.stdout
    final = read_csv(out / "results.csv")
    assert sorted(r["status"] for r in final) == ["ok"] * 3 and len({r["trial_id"] for r in final}) == 3
    _whole(out)
