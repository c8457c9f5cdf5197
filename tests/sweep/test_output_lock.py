"""One sweep at a time in a results directory: a second `dpo-sweep run` into a folder another
process holds refuses it (exit 2, naming the holder), and the lock of a process killed with
SIGKILL holds nothing. Real processes, a real kill."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from sweep_cluster import DPO_SWEEP, REPO, auth_env, write_space

from dpo_sweep.results_dir import ResultsDir

HOLD = ("import sys, time; from pathlib import Path; from dpo_sweep.sweep.folder_lock import FolderLock\n"
        "with FolderLock(Path(sys.argv[1])):\n"
        "    print('held', flush=True); time.sleep(120)\n")


def _holder(out) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _run(space, out, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([*DPO_SWEEP, "run", str(space), "--output", str(out), "--no-dashboard", *extra],
                          cwd=REPO, env=auth_env("lock-test"), capture_output=True, text=True, timeout=120)


def test_a_second_sweep_into_a_held_folder_exits_2_naming_the_holder(tmp_path):
    space = write_space(tmp_path / "s.yaml", "lock", "micro_batch: [2]\ncheckpoint_level: [none]\n")
    out = tmp_path / "out"
    holder = _holder(out)
    try:
        done = _run(space, out)
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"--output {out} is in use by another sweep or trial: pid {holder.pid} on host {socket.gethostname()}" \
        in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (out / "results.csv").exists() and not (out / "space.yaml").exists()  # nothing written


def test_the_lock_of_a_killed_process_holds_nothing(tmp_path):
    out = tmp_path / "out"
    holder = _holder(out)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert str(holder.pid) in ResultsDir(out).lock.read_text()  # the file is left behind, with its details
    again = _holder(out)  # and is taken at once
    again.kill()
    again.wait()
