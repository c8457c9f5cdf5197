"""What the Ray dashboard shows of a healthy sweep. On the Ray Train path (`warm_workers: false`):
each trial's Train run under its trial id (/api/train/v2/runs/v1, the Train V2 runs the Train page
reads, answers), a reports actor named after it, and not one FAILED task, polled while the sweep
runs (its cluster ends with it). With warm workers: each trial's task named after its trial."""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

import pytest
from sweep_cluster import auth_env, http_get, read_csv, run_sweep, start_head, start_sweep, stop_process, write_space

import urllib.error

pytestmark = pytest.mark.slow

TOKEN = "dashboard-test"


def _get(url: str) -> tuple[int, str]:
    """``http_get``; (0, "") once the sweep's cluster (and its dashboard) is going down."""
    try:
        return http_get(url, TOKEN)
    except (urllib.error.URLError, OSError):
        return 0, ""


@dataclass
class Seen:
    """What the dashboard showed while the sweep ran."""

    rc: int = -1
    runs_status: int | None = None
    runs_text: str = ""
    actors_text: str = ""
    failed: set[tuple[str, str]] = field(default_factory=set)


def _watch_train_path(tmp_path) -> tuple[Seen, list[dict[str, str]]]:
    space = write_space(tmp_path / "dash.yaml", "dash", """\
        micro_batch: [2]
        checkpoint_level: [none, L1]
        """, train_extra=", learning_steps: 3")
    space.write_text(space.read_text().replace("cpus_per_worker: 0.5}", "cpus_per_worker: 0.5, warm_workers: false}"))
    out = tmp_path / "out"
    log = tmp_path / "run.log"
    proc = start_sweep([str(space), "--output", str(out)], auth_env(TOKEN), log)
    seen = Seen()
    try:
        deadline = time.time() + 300
        url = None
        while time.time() < deadline and proc.poll() is None:
            if url is None:
                found = re.search(r"Ray dashboard: (http://\S+)", log.read_text())
                url = found.group(1) if found else None
            if url is not None:
                status, body = _get(f"{url}/api/train/v2/runs/v1")
                if status == 200:
                    seen.runs_status, seen.runs_text = status, body if "train-" in body else seen.runs_text
                elif seen.runs_status is None and status:
                    seen.runs_status = status
                status, body = _get(f"{url}/api/v0/tasks?limit=2000&detail=false")
                if status == 200:
                    tasks = json.loads(body)["data"]["result"]["result"]
                    seen.failed |= {(t["name"], t["task_id"]) for t in tasks if t["state"] == "FAILED"}
                status, body = _get(f"{url}/api/v0/actors?limit=2000")
                if status == 200 and "reports-train-" in body:
                    seen.actors_text = body
            time.sleep(0.5)
        seen.rc = proc.wait(timeout=120)
    finally:
        stop_process(proc)
    assert seen.rc == 0, log.read_text()[-3000:]
    rows = read_csv(out / "results.csv")
    assert sorted(r["status"] for r in rows) == ["ok", "ok"], rows
    return seen, rows


def test_a_train_path_sweep_shows_its_trials_by_id_and_no_failed_task(tmp_path):
    seen, rows = _watch_train_path(tmp_path)
    assert seen.runs_status == 200, (seen.runs_status, seen.runs_text[:500])
    for row in rows:
        assert f"train-{row['trial_id']}-" in seen.runs_text, seen.runs_text[:2000]
    assert seen.failed == set(), (len(seen.failed), sorted(seen.failed)[:5])
    assert "reports-train-" in seen.actors_text


def test_a_warm_worker_sweep_names_each_trial_s_task_by_its_id(tmp_path):
    """On a cluster the test owns, read after the sweep: a worker reports its task events about
    once a second, and a sweep's own cluster goes down within a second of its last trial, so
    polling that one missed the last trial's task in CI (its event had not reached the GCS)."""
    cluster = start_head(tmp_path / "cluster", num_cpus=2)
    try:
        space = write_space(tmp_path / "dash.yaml", "dash", """\
            micro_batch: [2]
            checkpoint_level: [none, L1]
            """)
        out = tmp_path / "out"
        done = run_sweep([str(space), "--output", str(out), "--address", cluster.address], cluster.env)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        rows = read_csv(out / "results.csv")
        assert sorted(r["status"] for r in rows) == ["ok", "ok"], rows
        wanted = {f"trial {r['trial_id']}" for r in rows}
        names: set[str] = set()
        failed: set[tuple[str, str]] = set()
        deadline = time.time() + 30
        while time.time() < deadline and not wanted <= names:
            status, body = http_get(f"{cluster.dashboard_url}/api/v0/tasks?limit=2000&detail=false", cluster.token)
            if status == 200:
                tasks = json.loads(body)["data"]["result"]["result"]
                names = {t["name"] for t in tasks}
                failed = {(t["name"], t["task_id"]) for t in tasks if t["state"] == "FAILED"}
            time.sleep(0.5)
    finally:
        cluster.stop()
    assert wanted <= names, sorted(names)
    assert failed == set(), (len(failed), sorted(failed)[:5])
