"""`dpo-sweep run --address` on a 2-node Ray cluster on this machine (one CPU per node).

Each trial has two DDP workers of 0.6 CPU: no node can hold both, so every trial's process group
spans both nodes (with 0.5 CPU each, Ray packs both workers on one node whenever it can). One trial runs out of memory on
rank 1 only (the other rank is then stopped by Ray Train): it must still be recorded as ``oom``.
"""
from __future__ import annotations

import json

import pytest

from dpo_sweep import space as space_mod
from dpo_sweep.train.faults import FAULTS_ENV
from sweep_cluster import read_csv, run_sweep, start_head, write_space

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    c = start_head(tmp_path_factory.mktemp("ray-2node"), num_cpus=1)  # the dashboard serves the state API
    try:
        c.add_worker(num_cpus=1)
        c.wait_for_nodes(2, timeout_s=90)
        yield c
    finally:
        c.stop()


def test_ddp_trials_span_two_nodes_and_an_oom_on_rank_1_is_a_result(two_nodes, tmp_path):
    # L1 runs out of memory on rank 1 at step 2 (an injected fault: train/faults.py); L2, which the
    # plan runs first (cheaper), and which no OOM of L1 prunes, does not.
    space = write_space(tmp_path / "two.yaml", "two-node", """\
        micro_batch: [2]
        checkpoint_level: [L1, L2]
        """)
    fault = {"step": 2, "kind": "oom", "rank": 1, "when": {"checkpoint_level": "L1"}}
    space.write_text(space.read_text().replace("workers_per_trial: 1", "workers_per_trial: 2")
                     .replace("cpus_per_worker: 0.5", "cpus_per_worker: 0.6"))
    out = tmp_path / "out"
    done = run_sweep([str(space), "--address", two_nodes.address, "--output", str(out)],
                     {**two_nodes.env, FAULTS_ENV: json.dumps(fault)}, timeout_s=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    expected = {t.trial_id: t for t in space_mod.load(space).trials}
    rows = {r["trial_id"]: r for r in read_csv(out / "results.csv")}
    assert sorted(rows) == sorted(expected)
    for tid, cfg in expected.items():
        r = rows[tid]
        assert r["workers_per_trial"] == "2" and int(r["effective_batch"]) == 4
        if cfg.checkpoint_level == "L2":
            assert r["status"] == "ok" and float(r["peak_mem_gb"]) > 0, r
        else:
            assert r["status"] == "oom" and r["error"].startswith("rank 1:") and "OOM" in r["error"], r
    assert len(two_nodes.train_worker_nodes()) == 2
