"""`dpo-sweep run` end to end on a real local Ray cluster (Tune + Train V2, CPU, tiny-llama).

The test run's one shared cluster (``ray_head``: 2 CPUs, dashboard on, token authentication on);
each test drives the CLI as a subprocess with ``--address``, as a user would.
"""
from __future__ import annotations

import json
import time

import pytest
import torch

from dpo_sweep import space as space_mod
from dpo_sweep.train.faults import FAULTS_ENV
from sweep_cluster import http_get, read_csv, run_sweep, start_sweep, stop_process, write_space

pytestmark = pytest.mark.slow

CONTRACT_RESULT_COLUMNS = (
    "trial_id, status, model, seq_len, micro_batch, checkpoint_level, grad_acc, beta, workers_per_trial, "
    "effective_batch, parallelism, peak_mem_gb, torch_peak_alloc_gb, torch_peak_reserved_gb, step_time_ms, "
    "step_time_p90_ms, tokens_per_s, mfu, loss_mean, loss_std, grad_norm_mean, reward_accuracy, "
    "reward_margin, error").split(", ")
CONTRACT_STEP_COLUMNS = ("trial_id, step, loss, grad_norm, step_time_ms, peak_mem_gb, reward_accuracy, "
                         "reward_margin, logps_chosen, logps_rejected, kl").split(", ")


@pytest.fixture
def cluster(ray_head):
    return ray_head


def _poll_dashboard(cluster, proc, seen: dict) -> None:
    """While the sweep runs: the REST API answers with the token and refuses without it."""
    deadline = time.time() + 120
    while proc.poll() is None and time.time() < deadline and "running_driver" not in seen:
        code, body = http_get(f"{cluster.dashboard_url}/api/jobs/", cluster.token)
        seen.setdefault("jobs_code", code)
        if code == 200 and any(j.get("status") == "RUNNING" for j in json.loads(body)):
            seen["running_driver"] = True
        time.sleep(1)
    seen["nodes_code"], nodes_body = http_get(f"{cluster.dashboard_url}/nodes?view=summary", cluster.token)
    seen["nodes_body"] = nodes_body
    seen["no_token_code"], _ = http_get(f"{cluster.dashboard_url}/api/jobs/")


def _assert_console_budget(log: str, out, trials: int) -> None:
    """What the terminal shows: the data line, the dashboard (2 lines), the header, the planner's
    summary line, one line per
    trial (and Ray's own cluster warnings, if any), the end line, then the frontier table and the recommendation; the workers' output
    (model build, per-step lines, warnings, an OOM's traceback) is in DIR/logs/<trial>.log."""
    for noise in ("Traceback", "Loading weights", "Tuner.restore", "TensorBoard", "RayTrainWorker",
                  "TrainController", "Configuration for experiment", "View detailed results"):
        assert noise not in log, (noise, log[-4000:])
    # Ray's cluster-level warnings stay (its memory monitor killing a worker matters); on the 2-core
    # test machine the raylet may warn that worker processes start faster than it expects.
    lines = [line for line in log.splitlines() if "(raylet)" not in line]
    end = next(i for i, line in enumerate(lines) if line.startswith("sweep finished:"))
    assert len(lines[:end]) == 5 + trials, "\n".join(lines[:end])
    assert sum(line.startswith(f"[{i}/{trials}] ") and " elapsed, ~" in line
               for i in range(1, trials + 1) for line in lines) == trials
    assert f"worker output in {out / 'logs'}/" in lines[end]
    tail = "\n".join(lines[end:])
    assert "| micro_batch | checkpoint |" in tail and "\nrecommended: " in tail
    # The winner as recommended.yaml and TRL DPOConfig arguments: its own block before the report's path.
    winner = next(i for i, line in enumerate(lines) if line.startswith("recommended.yaml: "))
    report = next(i for i, line in enumerate(lines) if line.startswith("report: "))
    assert lines[winner + 1] == "as TRL DPOConfig arguments:"
    assert lines[winner + 2].startswith("# Measured with the native trainer; with the trl trainer it is predicted")
    assert lines[winner + 3].startswith("# TRL ") and lines[winner + 4].startswith("DPOConfig(")
    block_end = next((i for i in range(winner, report) if lines[i].startswith("forecast ")), report)  # then the forecast
    assert all(line.startswith(("          ", "# not in TRL: ", "# yours to set: ")) or not line
               for line in lines[winner + 5:block_end]), "\n".join(lines[winner:report])
    # the end line, a blank, the table (2 + trials), a blank, the recommendation (2 lines, at most 4 of the
    # report's headline bullets, its warnings one line each, where the full reason is), the forecast
    # (2 lines and a blank) and the report's path
    warnings = sum(line.startswith("warning: ") for line in lines[end:winner])
    assert len(lines) - end - (report - winner) <= 1 + 1 + 2 + trials + 1 + 2 + 4 + warnings + 1 + 3 + 1, tail
    ids = [r["trial_id"] for r in read_csv(out / "results.csv")]
    assert sorted(p.name for p in (out / "logs").iterdir()) == sorted(f"{t}.log" for t in ids)
    for tid in ids:
        assert f"[{tid}] step 1/4" in (out / "logs" / f"{tid}.log").read_text()  # 3 steps and the worst case


def test_sweep_records_every_trial_oom_included_and_checkpointing_keeps_losses(cluster, tmp_path):
    # none/L1 x (seed 0: no failure, seed 1: an OOM raised inside the worker at step 2, an injected
    # fault: train/faults.py): 4 trials, 2 at a time. --full-grid: every one runs (the planner would
    # prune `none` after L1's OOM; see test_sweep_planned.py), which is what this test checks the
    # recording of.
    space = write_space(tmp_path / "e2e.yaml", "e2e", """\
        micro_batch: [2]
        checkpoint_level: [none, L1]
        seed: [0, 1]
        """)
    out = tmp_path / "out"
    fault = json.dumps({"step": 2, "kind": "oom", "when": {"train.seed": 1}})
    proc = start_sweep([str(space), "--address", cluster.address, "--output", str(out),
                        "--max-concurrent", "2", "--full-grid"], {**cluster.env, FAULTS_ENV: fault}, tmp_path / "run.log")
    seen: dict = {}
    try:
        _poll_dashboard(cluster, proc, seen)
        rc = proc.wait(timeout=300)
    finally:
        stop_process(proc)
    log = (tmp_path / "run.log").read_text()
    assert rc == 0, log[-4000:]

    # The dashboard during the run: REST API with the bearer token; 401 without it.
    assert seen.get("running_driver"), seen
    assert seen["nodes_code"] == 200 and json.loads(seen["nodes_body"])["result"] is True
    assert seen["no_token_code"] == 401
    assert f"Ray dashboard: {cluster.dashboard_url}" in log
    assert "token authentication is on" in log and "Authorization: Bearer" in log
    assert "[4/4]" in log and "(--full-grid: each in full)" in log and "in 4 Ray trial(s)" in log
    _assert_console_budget(log, out, trials=4)

    expected = {t.trial_id: t for t in space_mod.load(space).trials}
    results = read_csv(out / "results.csv")
    assert set(CONTRACT_RESULT_COLUMNS) <= set(results[0])
    assert sorted(r["trial_id"] for r in results) == sorted(expected)
    for r in results:
        cfg = expected[r["trial_id"]]
        want = "oom" if cfg.train.seed == 1 else "ok"
        assert r["status"] == want, r
        assert r["checkpoint_level"] == cfg.checkpoint_level and int(r["micro_batch"]) == 2
        assert float(r["startup_s"]) > 0, r
        if want == "ok":
            assert float(r["peak_mem_gb"]) > 0 and float(r["step_time_ms"]) > 0 and float(r["measure_s"]) > 0
            assert r["error"] == ""
        else:
            assert "OOM" in r["error"] and r["error"].startswith("rank 0"), r
            assert float(r["peak_mem_gb"]) > 0, r  # the peak up to the failure

    steps = read_csv(out / "steps.csv")
    assert set(CONTRACT_STEP_COLUMNS) <= set(steps[0])
    by_trial: dict[str, list[dict]] = {}
    for s in steps:
        by_trial.setdefault(s["trial_id"], []).append(s)
    for tid, cfg in expected.items():
        assert [int(s["step"]) for s in by_trial[tid]] == ([1] if cfg.train.seed == 1 else [1, 2, 3, 4])  # 4: worst case

    # Checkpointing recomputes, it must not change the maths: fp32, same seed -> same losses.
    ok = {expected[t].checkpoint_level: t for t in expected if expected[t].train.seed == 0}
    losses = {lv: torch.tensor([float(s["loss"]) for s in by_trial[t]]) for lv, t in ok.items()}
    torch.testing.assert_close(losses["L1"], losses["none"], rtol=1e-5, atol=1e-6)

    assert (out / "space.yaml").read_text() == space.read_text()
    [shape] = json.loads((out / "data.json").read_text())["datasets"]  # preflight's one read of the data
    assert shape["pairs"] > 0 and sum(shape["lengths"]["chosen"]["histogram"]["counts"]) == shape["pairs"]
    env = json.loads((out / "environment.json").read_text())  # written from rank 0's host
    assert env["torch"] == torch.__version__ and env["gpu_count"] == 0


def kill_when(args, env, log, out, ready) -> list[dict]:
    """Start the sweep of ``args``, SIGKILL it once ``ready(results.csv's rows)`` (no cleanup in
    the driver, as a crashed or killed machine would do); the rows at the kill."""
    proc = start_sweep(args, env, log)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None and not ready(read_csv(out / "results.csv")):
            time.sleep(0.05)
        at_kill = read_csv(out / "results.csv")
        proc.kill()
        proc.wait(timeout=30)
    finally:
        stop_process(proc)
    return at_kill


def test_killed_sweep_resumes_without_repeating_a_trial(cluster, tmp_path):
    # learning_steps 3: each trial is its own learning trial, so its row is final when it ends
    space = write_space(tmp_path / "resume.yaml", "resume", """\
        micro_batch: [2]
        checkpoint_level: [none, L1, L2]
        """, train_extra=", learning_steps: 3")
    out = tmp_path / "out"
    args = [str(space), "--address", cluster.address, "--output", str(out), "--max-concurrent", "1"]
    rows_at_kill = len(kill_when(args, cluster.env, tmp_path / "first.log", out, bool))
    assert 1 <= rows_at_kill < 3, (tmp_path / "first.log").read_text()[-3000:]

    done = run_sweep([*args, "--resume"], cluster.env, timeout_s=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"resume: {rows_at_kill} of 3 trial(s) already in" in done.stdout

    ids = [r["trial_id"] for r in read_csv(out / "results.csv")]
    assert sorted(ids) == sorted(t.trial_id for t in space_mod.load(space).trials)  # each exactly once
    step_keys = [(s["trial_id"], s["step"]) for s in read_csv(out / "steps.csv")]
    assert len(step_keys) == len(set(step_keys)) == 3 * 4  # 3 steps and the worst-case step


def test_rows_are_on_disk_when_measured_and_a_kill_during_the_learning_trial_resumes_only_it(cluster, tmp_path):
    # the default learning_steps (16): the three rows take their stability from one learning trial
    space = write_space(tmp_path / "learn.yaml", "learn", """\
        micro_batch: [2]
        checkpoint_level: [none, L1, L2]
        """)
    out = tmp_path / "out"
    args = [str(space), "--address", cluster.address, "--output", str(out), "--max-concurrent", "1"]
    # every row measured: the learning trial (16 steps) has just started
    at_kill = kill_when(args, cluster.env, tmp_path / "first.log", out,
                        lambda rows: len(rows) == 3 and all(r["stability"] == "pending" for r in rows))
    assert len(at_kill) == 3 and {r["stability"] for r in at_kill} == {"pending"}, at_kill
    assert all(float(r["peak_mem_gb"]) > 0 and float(r["step_time_ms"]) > 0 for r in at_kill)

    done = run_sweep([*args, "--resume"], cluster.env, timeout_s=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "resume: 3 row(s) already measured wait only for their learning trial" in done.stdout
    rows = read_csv(out / "results.csv")
    assert sorted(r["trial_id"] for r in rows) == sorted(r["trial_id"] for r in at_kill)
    assert all(r["stability_from"].endswith("-learning") and r["stability"] != "pending" for r in rows), rows
    assert [r["peak_mem_gb"] for r in rows] == [r["peak_mem_gb"] for r in at_kill]  # not measured again
    step_keys = [(s["trial_id"], s["step"]) for s in read_csv(out / "steps.csv")]
    assert len(step_keys) == len(set(step_keys))
    learned = {t for t, _ in step_keys if t.endswith("-learning")}
    assert len(learned) == 1 and len({t for t, _ in step_keys} - learned) == 3


def test_same_failure_before_the_first_step_stops_the_sweep_with_exit_1(cluster, tmp_path):
    # A failure no preflight can see (the validate-time checks refuse what they can know, such as
    # liger-kernel on a CPU): every worker raises in its first step.
    space = write_space(tmp_path / "broken.yaml", "broken", """\
        micro_batch: [2]
        checkpoint_level: [none, L1, L2, full]
        """)
    out = tmp_path / "out"
    done = run_sweep([str(space), "--address", cluster.address, "--output", str(out), "--max-concurrent", "1"],
                     {**cluster.env, FAULTS_ENV: '{"step": 1, "kind": "error"}'}, timeout_s=300)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    rows = read_csv(out / "results.csv")
    assert [r["status"] for r in rows] == ["error", "error"], rows
    assert all("injected failure at step 1" in r["error"] for r in rows)
    assert read_csv(out / "steps.csv") == []
    assert ("error: the first 2 trial(s) all failed before their first step with the same cause; the "
            "sweep stopped, 2 trial(s) not run.") in done.stderr
    assert "The cause: rank 0: InjectedFailure: injected failure at step 1" in done.stderr
    assert "[3/4]" not in done.stdout and "Traceback" not in done.stdout + done.stderr
    assert not (out / "frontier.md").exists()  # nothing ran to analyse
