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
    subprocess.run([sys.executable, "-c", code, "run", str(space)], env=env, check=True, timeout=120)
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
    assert float(rows[0]["t_s"]) == 0.0 and len(rows) == len(events)
    assert len(list((tmp_path / "trace").glob("*.log"))) == 1  # one process traced; the untraced one wrote nothing
