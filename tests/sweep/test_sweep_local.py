"""`dpo-sweep run` with no --address: it starts (and stops) its own local Ray cluster."""
from __future__ import annotations

import pytest

from sweep_cluster import auth_env, read_csv, run_sweep, write_space

pytestmark = pytest.mark.slow


def test_local_cluster_without_dashboard_then_resume_with_nothing_left(tmp_path):
    space = write_space(tmp_path / "local.yaml", "local", """\
        micro_batch: [2]
        checkpoint_level: [full]
        """)
    out = tmp_path / "out"
    env = auth_env("local-test-token")  # RAY_ADDRESS removed: a new local cluster
    done = run_sweep([str(space), "--output", str(out), "--no-dashboard"], env, timeout_s=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Ray dashboard: off" in done.stdout
    assert "[1/1]" in done.stdout
    # No dashboard, no state API: Ray Train's placement-group cleaner would say so every second.
    assert "Failed to query Ray Train Controller actor state" not in done.stdout + done.stderr
    rows = read_csv(out / "results.csv")
    assert [(r["checkpoint_level"], r["status"]) for r in rows] == [("full", "ok")]

    again = run_sweep([str(space), "--output", str(out), "--resume"], env, timeout_s=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing to run" in again.stdout
    assert len(read_csv(out / "results.csv")) == 1
