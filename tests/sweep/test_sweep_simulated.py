"""`dpo-sweep run --simulate-ranks true` on the CPU: a trial of 2 FSDP2 workers runs as rank 0 alone
(the fake process group) in one warm worker and writes its row: simulated, its time modelled."""
from __future__ import annotations

import pytest

from sweep_cluster import auth_env, read_csv, run_sweep, write_space

pytestmark = pytest.mark.slow


def test_a_simulated_rank_trial_writes_its_row(tmp_path):
    out, space = tmp_path / "out", write_space(tmp_path / "sim.yaml", "sim", "micro_batch: [2]\ncheckpoint_level: [none]\n")
    done = run_sweep([str(space), "--output", str(out), "--no-dashboard", "--simulate-ranks", "true",
                      "--set", "resources.workers_per_trial=2", "--set", "resources.parallelism=fsdp"],
                     auth_env("sim-test-token"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [row] = read_csv(out / "results.csv")
    assert row["status"] == "ok", row["error"]
    assert (row["workers_per_trial"], row["ranks_simulated"], row["step_time_source"]) == ("2", "True", "modelled")
    assert 0 < float(row["comm_ms"]) < float(row["step_time_ms"])
    assert float(row["peak_mem_gb"]) > 0
    log = (out / "logs" / f"{row['trial_id']}.log").read_text()
    assert "2 worker(s) (simulated: rank 0 alone, fake process group), fsdp" in log
