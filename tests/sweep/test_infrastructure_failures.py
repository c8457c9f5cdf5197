"""A trial lost to the machine (its process or worker died, a node went away, it ran past its time
limit) is marked as such on its row, and --resume runs it again instead of calling the sweep done."""
from __future__ import annotations

import math

import pytest
import ray.exceptions

from dpo_sweep import space as space_mod
from dpo_sweep.records import read_csv_rows, write_results
from dpo_sweep.sweep.collector import TrialCollector
from dpo_sweep.sweep.output_dir import finished_trial_ids, prepare_output
from dpo_sweep.sweep.protocol import TrialEnding, TrialFailure, is_infrastructure
from dpo_sweep.sweep.stopping import TIMEOUT_FACTOR, trial_timeout_s

SPACE = {"name": "lost", "model": {"preset": "tiny-llama"},
         "data": {"synthetic": {"pairs": 8, "prompt_tokens": 8, "response_tokens": 8}},
         "train": {"steps": 2, "warmup_steps": 1}, "search": {"micro_batch": [1, 2]}}


class WorkerGroupError(Exception):
    def __init__(self, failures):
        super().__init__("workers failed")
        self.worker_failures = failures


def test_ray_system_errors_are_infrastructure_and_a_trainer_s_error_is_not():
    assert is_infrastructure(ray.exceptions.ActorDiedError())
    assert is_infrastructure(WorkerGroupError({0: ValueError("x"), 1: ray.exceptions.WorkerCrashedError()}))
    assert is_infrastructure(ray.exceptions.NodeDiedError("node gone"))
    assert not is_infrastructure(ValueError("bad batch"))
    assert not is_infrastructure(WorkerGroupError({0: RuntimeError("CUDA error: device-side assert")}))


def test_the_mark_crosses_the_trial_s_report():
    ending = TrialEnding.from_report(TrialEnding(TrialFailure("error", "died", infrastructure=True)).to_report())
    assert ending.failure.infrastructure


def test_a_lost_trial_s_row_is_marked_and_resume_runs_it_again(tmp_path):
    trials = space_mod.parse(SPACE).trials
    collector = TrialCollector()
    lost = collector.abandon("k0", trials[0], "the Tune trial process failed: ActorDiedError")
    timed = collector.abandon("k1", trials[1], "no end after 20 s", status="timeout")
    assert lost.result.infrastructure_failure and timed.result.infrastructure_failure
    assert timed.result.status == "timeout"
    ok = collector._finish  # noqa: SLF001 - a trainer's own error stays a result
    collector._get("k2", trials[0])  # noqa: SLF001
    own = ok("k2", TrialFailure("error", "ValueError: bad batch"))
    assert not own.result.infrastructure_failure
    out = tmp_path / "out"
    write_results(out, [lost.result, timed.result])
    assert finished_trial_ids(out) == set()
    space = tmp_path / "s.yaml"
    space.write_text("name: lost\n")
    assert prepare_output(space, out, resume=True) == set()
    assert read_csv_rows(out / "results.csv") == []  # dropped: each runs again, once


@pytest.mark.parametrize("estimate_s, floor_s, limit_s", [
    (math.nan, 900.0, 900.0),       # nothing has ended yet: the floor
    (10.0, 900.0, 900.0),           # a short trial: the floor
    (600.0, 900.0, 600.0 * TIMEOUT_FACTOR),
    (600.0, 0.0, math.inf),         # 0: no limit
])
def test_a_trial_s_time_limit(estimate_s, floor_s, limit_s):
    assert trial_timeout_s(estimate_s, floor_s) == limit_s
