"""benchmarks/process_trace: a traced process logs its imports and calls with their durations, and
merge.py puts every process's events on one timeline from the command's start."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "benchmarks" / "process_trace"


def test_a_traced_command_s_imports_and_calls_come_out_in_order(tmp_path):
    space = tmp_path / "s.yaml"
    space.write_text("name: s\nmodel: {preset: tiny-llama}\ndata: {synthetic: {pairs: 4}}\n"
                     "train: {steps: 2, warmup_steps: 0, precision: fp32}\nresources: {use_gpu: false}\n")
    env = {**os.environ, "DPO_TRACE_DIR": str(tmp_path / "trace"),
           "PYTHONPATH": os.pathsep.join([str(TRACE), str(REPO), os.environ.get("PYTHONPATH", "")])}
    code = "import sys; from dpo_sweep import space; space.load(sys.argv[-1])"
    # ... and once more in a thread whose name has spaces, as Python's own do ("Thread-1 (f)")
    threaded = code + "; import threading; t = threading.Thread(target=space.load, args=(sys.argv[-1],), name='Thread-9 (load)'); t.start(); t.join()"
    subprocess.run([sys.executable, "-c", threaded, "run", str(space)], env=env, check=True, timeout=120)
    untraced = subprocess.run([sys.executable, "-c", code, str(space)], check=True, timeout=120,
                              env={**env, "DPO_TRACE_DIR": ""})
    assert untraced.returncode == 0
    out = subprocess.run([sys.executable, str(TRACE / "merge.py"), str(tmp_path / "trace"), "--csv",
                          str(tmp_path / "t.csv")], capture_output=True, text=True, check=True, timeout=60)
    events = [line.split(None, 3)[3] for line in out.stdout.splitlines()]
    assert events[0].startswith("start -c run")
    imported = next(i for i, e in enumerate(events) if e.startswith("import< dpo_sweep.space "))
    begin = events.index("> dpo_sweep.space.load")
    end = next(i for i, e in enumerate(events) if e.startswith("< dpo_sweep.space.load "))
    assert events.index("import> dpo_sweep.space") < imported < begin < end
    assert float(events[end].split()[-1]) >= 0  # the call's duration
    rows = list(csv.DictReader((tmp_path / "t.csv").open()))
    threads = [r["thread"] for r in rows if "dpo_sweep.space.load" in r["event"]]
    assert threads == ["MainThread", "MainThread", "Thread-9_(load)", "Thread-9_(load)"]
    assert float(rows[0]["t_s"]) == 0.0 and len(rows) == len(events)
    assert len(list((tmp_path / "trace").glob("*.log"))) == 1  # one process traced; the untraced one wrote nothing


def test_the_start_up_milestones_are_the_first_of_their_events():
    sys.path.insert(0, str(REPO / "benchmarks"))
    from process_trace.merge import startup_marks

    events = [(100.0, "1", "MainThread", "start -m dpo_sweep run s.yaml"),
              (104.5, "1", "MainThread", "< ray._private.worker.init 4.000"),
              (105.0, "2", "MainThread", "> dpo_sweep.sweep.warm_worker.TrialWorker.__init__"),
              (110.0, "3", "MainThread", "< dpo_sweep.sweep.startup.check_inputs 9.000"),
              (113.0, "4", "Thread-1_(<lambda>)", "> dpo_sweep.sweep.trainable.tune_trainable"),
              (117.0, "2", "MainThread", "< dpo_sweep.sweep.warm_worker.TrialWorker.__init__ 12.000"),
              (118.0, "2", "trial-t0", "> dpo_sweep.train.loop.train_step"),
              (119.0, "2", "trial-t0", "> dpo_sweep.train.loop.train_step"),
              (150.0, "1", "ray-release", "< ray._private.worker.shutdown 0.400")]
    assert startup_marks(events) == {
        "ray_up_s": 4.5, "preflight_done_s": 10.0, "worker_imports_start_s": 5.0, "worker_imports_end_s": 17.0,
        "first_trial_s": 13.0, "first_step_s": 18.0, "ray_shutdown_s": 0.4}
    import math
    assert math.isnan(startup_marks(events[:2])["first_step_s"])
