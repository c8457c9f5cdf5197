"""`dpo-sweep run` with no --address: it starts (and stops) its own local Ray cluster."""
from __future__ import annotations

import subprocess
import sys

import pytest

from sweep_cluster import REPO, auth_env, read_csv, run_sweep, write_space

pytestmark = pytest.mark.slow


def test_local_cluster_without_dashboard_then_resume_with_nothing_left(tmp_path):
    space = write_space(tmp_path / "local.yaml", "local", """\
        micro_batch: [2]
        checkpoint_level: [full]
        """)
    out = tmp_path / "out"
    env = auth_env("local-test-token")  # RAY_ADDRESS removed: a new local cluster
    # The command as `dpo-sweep run` runs it, saying at its end what its own process imported.
    driver = ("import sys\nfrom dpo_sweep.cli import main\nrc = main(sys.argv[1:])\n"
              "print('driver imported:', [m for m in ('torch', 'transformers') if m in sys.modules])\n"
              "sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", driver, "run", str(space), "--output", str(out), "--no-dashboard"],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # torch and transformers are the preflight's process's and the workers' (sweep/startup.py):
    # the driver's Ray start and Tune never wait for them.
    assert done.stdout.splitlines()[-1] == "driver imported: []"
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


def test_the_local_autoscaler_is_stopped_at_once_and_ray_then_shuts_down(tmp_path):
    # ray.shutdown() sends the monitor SIGTERM and waits 1 s for it (it reports a failure to the
    # GCS going down instead of exiting): 1.0 s of the 1.4 s shutdown on the 2-core machine.
    script = (
        "import ray\nfrom ray._private import ray_constants\n"
        "from dpo_sweep.sweep.ray_cluster import connect_ray, stop_local_autoscaler\n"
        "connect_ray(None, dashboard=False, train=False)\n"
        "node = ray._private.worker._global_node\n"
        "[monitor] = [i.process for i in node.all_processes[ray_constants.PROCESS_TYPE_MONITOR]]\n"
        "alive = monitor.poll() is None\n"
        "stop_local_autoscaler()\n"
        "print('monitor', alive, monitor.returncode)\n"
        "ray.shutdown()\n"
        "stop_local_autoscaler()  # no cluster any more: nothing to do\n"
        "print('left', [p.pid for ps in node.all_processes.values() for p in (i.process for i in ps) if p.poll() is None])\n")
    done = subprocess.run([sys.executable, "-c", script], env=auth_env("local-test-token"), cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "monitor True -9" in lines  # it ran, and was killed, not asked
    assert "left []" in lines
    assert "autoscaler failed" not in done.stdout + done.stderr
