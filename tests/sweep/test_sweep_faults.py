"""Faults done for real on `dpo-sweep run` (its own local cluster): a second sweep into the folder
of a running one, a SIGKILL of the driver, a cut-off last line of results.csv, then `--resume`.
Nothing is lost, nothing doubled: every configuration ends up once in results.csv and each of its
steps once in steps.csv. The killed sweep's Ray listened on 127.0.0.1 only, and its processes end
within seconds of the kill."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from sweep_cluster import DPO_SWEEP, auth_env, read_csv, run_sweep, start_sweep, stop_process, write_space

from dpo_sweep.results_dir import ResultsDir

pytestmark = pytest.mark.slow


def _session(pid: int) -> int:
    text = Path(f"/proc/{pid}/stat").read_text()
    return int(text[text.rindex(")") + 2:].split()[3])


def _session_pids(sid: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


def _listening(pids: set[int]) -> list[str]:
    """The local addresses these processes listen on (TCP)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3] for line in out.splitlines()
            if pids & {int(p) for p in re.findall(r"pid=(\d+)", line)}]


def test_a_second_sweep_a_kill_and_a_cut_line_lose_and_double_nothing(tmp_path):
    # Six configurations: five still to run after the first row, so the first sweep still holds
    # the folder when the second one (a fresh Python, ~5 s to its lock check) asks for it.
    space = write_space(tmp_path / "faults.yaml", "faults", """\
        micro_batch: [2, 1]
        checkpoint_level: [none, L1, L2]
        """, train_extra=", learning_steps: 3")
    out = tmp_path / "out"
    env = auth_env("faults-test")
    log = tmp_path / "first.log"
    first = start_sweep([str(space), "--output", str(out)], env, log, start_new_session=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and first.poll() is None and not read_csv(out / "results.csv"):
            time.sleep(0.2)
        assert first.poll() is None, log.read_text()[-3000:]
        # 1. A second sweep into the folder in use: refused, the holder named, nothing written.
        before = (out / "results.csv").read_bytes()
        second = run_sweep([str(space), "--output", str(out), "--no-dashboard"], env, timeout_s=60)
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"is in use by another sweep or trial: pid {first.pid} on host {socket.gethostname()}" in second.stderr
        assert f"dpo-sweep run {space} --output {out}" in second.stderr
        # 4. Its cluster listens on the loopback interface only (the dashboard included).
        pids = _session_pids(first.pid)
        addresses = _listening(pids)
        assert addresses and all(re.match(r"(\[::ffff:)?127\.0\.0\.1\]?:\d+$", a) for a in addresses), addresses
        # The kill, then its processes (the dashboard and runtime-env agents too) end within seconds.
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        killed = time.monotonic()
        while _session_pids(first.pid) and time.monotonic() - killed < 60:
            time.sleep(0.5)
        gone_s = time.monotonic() - killed
    finally:
        stop_process(first)
    assert _session_pids(first.pid) == set()
    assert gone_s < 10, gone_s
    assert ResultsDir(out).lock.exists()  # left by the kill: it must not block --resume
    # 2. The last line cut inside a cell, as a kill during the append leaves it.
    rows = read_csv(out / "results.csv")
    assert rows and len(before) <= (out / "results.csv").stat().st_size
    data = (out / "results.csv").read_bytes()
    (out / "results.csv").write_bytes(data[:data.rindex(b"\r\n", 0, len(data) - 2) + 2 + 40])
    cut_trial = rows[-1]["trial_id"]
    report = subprocess.run([*DPO_SWEEP, "report", str(out)], env=env,
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 2 and f"(trial {cut_trial})" in report.stderr, report.stderr
    # --resume: the lock is free, the cut trial runs again, every configuration once.
    resumed = run_sweep([str(space), "--output", str(out), "--resume", "--no-dashboard"], env)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"(trial {cut_trial})" in resumed.stdout and "run again" in resumed.stdout
    final = read_csv(out / "results.csv")
    assert sorted(r["trial_id"] for r in final) == sorted({r["trial_id"] for r in final}) and len(final) == 6
    steps = [(s["trial_id"], s["step"], s["worst_case"]) for s in read_csv(out / "steps.csv")]
    assert len(steps) == len(set(steps)) and {t for t, _, _ in steps} == {r["trial_id"] for r in final}
    assert not ResultsDir(out).lock.exists()  # a sweep that ends leaves no lock behind
