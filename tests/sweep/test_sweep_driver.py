"""The sweep's pure parts, without a Ray cluster: failure classification, report collection,
timing, the results directory on resume, and the resource arithmetic."""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
from pathlib import Path

import pytest
import torch
from ray.train import WorkerGroupError

from dpo_sweep.plan.schedule import SweepPlan
from dpo_sweep.records import StepRecord, TrialResult, write_results, write_steps
from dpo_sweep.errors import UserError
from dpo_sweep.sweep import output_dir, protocol, recorder, slots, trainable
from dpo_sweep.sweep.collector import TrialCollector
from dpo_sweep.sweep.protocol import OutcomeReport, StepReport, TrialEnding, TrialFailure
from dpo_sweep.sweep.planner import PlanSearcher
from dpo_sweep.sweep.task import TrialTask, trial_id_of
from testkit import end_trial, make_cfg

SPACES = Path(__file__).resolve().parents[2] / "search_spaces"


def _step(trial_id: str, step: int, loss: float = 0.69, peak: float = 1.5) -> StepRecord:
    return StepRecord(trial_id=trial_id, step=step, loss=loss, grad_norm=1.0, step_time_ms=100.0,
                      peak_mem_gb=peak, reward_accuracy=0.5, reward_margin=0.0, logps_chosen=-10.0,
                      logps_rejected=-10.0, kl=0.0)


def test_worker_oom_is_status_oom_with_the_allocation_message():
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.3 GiB total)")
    err = WorkerGroupError("rank 1 failed", {0: RuntimeError("peer gone"), 1: oom})
    status, msg = protocol.classify_failure(err)
    assert status == "oom"
    assert "Tried to allocate 2.00 GiB" in msg and msg.startswith("rank 1")


def test_other_worker_failure_is_status_error_with_the_message():
    status, msg = protocol.classify_failure(WorkerGroupError("x", {0: ValueError("bad shape (3, 4)")}))
    assert status == "error" and "ValueError: bad shape (3, 4)" in msg


def test_failure_outside_the_workers_is_error():
    status, msg = protocol.classify_failure(RuntimeError("placement group timed out"))
    assert (status, msg) == ("error", "RuntimeError: placement group timed out")


def test_wrapped_oom_cause_is_found():
    class Wrapped(Exception):
        def __init__(self, cause):
            super().__init__("wrapped")
            self.cause = cause

    status, msg = protocol.classify_failure(
        WorkerGroupError("x", {0: Wrapped(torch.OutOfMemoryError("Tried to allocate 1 GiB"))}))
    assert status == "oom" and "Tried to allocate 1 GiB" in msg


def _report_step(rec: StepRecord, startup: float, measure: float) -> dict:
    # With the keys Tune adds to every report.
    return {**StepReport(rec, startup, measure).to_report(), "trial_id": "tune-id", "training_iteration": rec.step}


def test_collector_success_uses_rank0_outcome():
    cfg = make_cfg(trial_id="t000", steps=2)
    steps = [_step("t000", 1), _step("t000", 2)]
    result = TrialResult(trial_id="t000", status="ok", **cfg.knobs(), peak_mem_gb=1.5, startup_s=9.0,
                         measure_s=0.2)
    c = TrialCollector()
    assert c.add("a", cfg, _report_step(steps[0], 9.0, 0.1)) is None
    assert c.add("a", cfg, _report_step(steps[1], 9.0, 0.2)) is None
    assert c.add("a", cfg, OutcomeReport(result, {"hostname": "gpu-node-3"}).to_report()) is None
    done = c.add("a", cfg, TrialEnding(wall_s=12.0).to_report())
    r = done.result
    assert (r.trial_id, r.status, r.peak_mem_gb, r.startup_s, r.measure_s) == ("t000", "ok", 1.5, 9.0, 0.2)
    assert [(s.step, s.loss) for s in done.steps] == [(1, 0.69), (2, 0.69)]
    assert done.environment == {"hostname": "gpu-node-3"}


def test_collector_oom_keeps_steps_that_ran_and_their_timing():
    cfg = make_cfg(trial_id="t001", steps=3)
    c = TrialCollector()
    c.add("b", cfg, _report_step(_step("t001", 1, peak=2.5), 7.0, 0.3))
    done = c.add("b", cfg, TrialEnding(TrialFailure("oom", "rank 0: OOM")).to_report())
    r = done.result
    assert (r.status, r.error, r.micro_batch, r.steps) == ("oom", "rank 0: OOM", cfg.micro_batch, 1)
    assert r.peak_mem_gb == 2.5 and r.startup_s == 7.0 and r.measure_s == 0.3
    assert math.isnan(r.step_time_ms)
    assert [s.step for s in done.steps] == [1]


def _oom_with_peak(peak_gb: float) -> torch.OutOfMemoryError:
    from dpo_sweep.telemetry.sampler import MemorySampler

    class Reader:  # the reading the failing worker's sampler last saw
        source = "nvml"
        used_bytes = staticmethod(lambda: int(peak_gb * 1e9))
        process_used_bytes = high_water_mark_bytes = staticmethod(lambda: None)
        reset_high_water_mark = close = staticmethod(lambda: None)

    with pytest.raises(torch.OutOfMemoryError) as info, MemorySampler(Reader(), torch.device("cpu")):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    return info.value


def test_failure_peak_is_what_the_failed_workers_carried_through_pickling():
    import pickle

    # Ray pickles each worker's exception back to the trial process.
    err = WorkerGroupError("x", {0: pickle.loads(pickle.dumps(_oom_with_peak(61.5))),
                                 1: pickle.loads(pickle.dumps(_oom_with_peak(79.0))), 2: RuntimeError("peer")})
    assert protocol.failure_peak(err) == pytest.approx(79.0)
    assert math.isnan(protocol.failure_peak(WorkerGroupError("x", {0: ValueError("bad")})))
    assert math.isnan(protocol.failure_peak(RuntimeError("placement group timed out")))


def test_collector_oom_row_has_the_peak_up_to_the_failure():
    cfg = make_cfg(trial_id="t004", steps=3)
    c = TrialCollector()
    c.add("d", cfg, _report_step(_step("t004", 1, peak=2.5), 7.0, 0.3))
    failure = TrialFailure("oom", "rank 0: OOM", peak_mem_gb=79.0)  # the failing step's
    done = c.add("d", cfg, TrialEnding(failure).to_report())
    assert done.result.peak_mem_gb == 79.0 and [s.step for s in done.steps] == [1]


def test_collector_abandoned_trial_is_error():
    cfg = make_cfg(trial_id="t002")
    done = TrialCollector().abandon("c", cfg, "actor died")
    assert done.result.status == "error" and done.result.error == "actor died" and done.steps == ()


def test_outcome_json_round_trip_keeps_nan():
    cfg = make_cfg(trial_id="t003")
    result = TrialResult(trial_id="t003", status="diverged", **cfg.knobs(), error="non-finite loss")
    back = OutcomeReport.from_report(OutcomeReport(result, {"gpu_name": None}).to_report())
    step = StepReport.from_report(StepReport(_step("t003", 1, loss=math.nan)).to_report())
    assert back.environment == {"gpu_name": None}
    assert back.result.status == "diverged" and math.isnan(back.result.peak_mem_gb) and math.isnan(step.record.loss)


def test_scaling_config_fractional_cpus_and_gpu():
    cfg = make_cfg(resources={"workers_per_trial": 2, "cpus_per_worker": 0.25, "use_gpu": "auto"})
    sc = trainable.scaling_config(cfg, use_gpu=False)
    assert sc.num_workers == 2 and sc.resources_per_worker == {"CPU": 0.25}
    assert trainable.scaling_config(cfg, use_gpu=True).resources_per_worker == {"CPU": 0.25, "GPU": 1}


def test_resources_arithmetic():
    assert slots.resolve_use_gpu("auto", 0) is False
    assert slots.resolve_use_gpu("auto", 8) is True
    with pytest.raises(UserError, match="resources.use_gpu"):
        slots.resolve_use_gpu(True, 0)
    assert slots.default_max_concurrent(False, 0, 1) == 1
    assert slots.default_max_concurrent(True, 8, 2) == 4
    assert slots.default_max_concurrent(True, 1, 2) == 1
    with pytest.raises(UserError, match="resources.cpus_per_worker"):
        slots.check_fits(make_cfg(resources={"workers_per_trial": 4, "cpus_per_worker": 1.0}), 2.0)


def _space_and_one_finished_trial(tmp_path):
    """A space file and an output dir whose results.csv holds trial t000."""
    space = tmp_path / "s.yaml"
    space.write_text("name: s\n")
    out = tmp_path / "out"
    cfg = make_cfg(trial_id="t000")
    write_results(out, [TrialResult(trial_id="t000", status="ok", **cfg.knobs())])
    return space, out


def test_resume_skips_finished_and_drops_orphan_steps(tmp_path):
    space, out = _space_and_one_finished_trial(tmp_path)
    write_steps(out, [_step("t000", 1), _step("t001", 1)])  # t001 was killed before its row
    done = output_dir.prepare_output(space, out, resume=True)
    assert done == {"t000"}
    with (out / "steps.csv").open() as fh:
        assert [r["trial_id"] for r in csv.DictReader(fh)] == ["t000"]
    assert (out / "space.yaml").read_text() == "name: s\n"


def test_fresh_run_sets_earlier_results_aside(tmp_path):
    space, out = _space_and_one_finished_trial(tmp_path)
    assert output_dir.prepare_output(space, out, resume=False) == set()
    assert not (out / "results.csv").exists()
    assert len(list(out.glob("previous-*/results.csv"))) == 1


def test_progress_line():
    cfg = make_cfg(trial_id="t004", micro_batch=2)
    ok = TrialResult(trial_id="t004", status="ok", **cfg.knobs(), peak_mem_gb=1.234, step_time_ms=56.7,
                     startup_s=8.0)
    assert recorder.progress_line(1, 3, ok) == (
        "[1/3] t004                             ok       peak 1.23 GB  step 57 ms  startup 8.0 s")
    oom = TrialResult(trial_id="t004", status="oom", **cfg.knobs(), error="rank 0: Tried to allocate 2 GiB")
    assert recorder.progress_line(2, 3, oom).endswith("step - ms  startup - s  | rank 0: Tried to allocate 2 GiB")


def test_bad_max_concurrent_is_exit_2(tmp_path, capsys):
    from dpo_sweep.cli import main

    assert main(["run", str(SPACES / "quickstart.yaml"), "--max-concurrent", "0",
                 "--output", str(tmp_path / "o")]) == 2
    assert "--max-concurrent" in capsys.readouterr().err


def test_shipped_sweep_spaces_validate():
    from dpo_sweep import space

    assert len(space.load(SPACES / "llama-3.2-1b-h200.yaml").trials) == 25
    seed = space.load(SPACES / "seed-table-llama-3-8b-80gb.yaml")
    assert len(seed.trials) == 6
    assert {t.effective_batch() for t in seed.trials} == {256}
    assert seed.spec.resources.gpu_memory_gb == 80


def test_cmd_run_namespace_fields_match_the_cli():
    from dpo_sweep.cli import _parser

    args = _parser().parse_args(["run", "x.yaml"])
    assert isinstance(args, argparse.Namespace)
    for name in ("space", "output", "address", "resume", "max_concurrent", "no_dashboard", "memory_budget_gb",
                 "safety_margin"):
        assert hasattr(args, name)


def test_lazy_torch_config_keeps_torch_out_of_the_controller_process():
    """The controller unpickles the backend config: with ours it never imports torch."""
    import pickle
    import subprocess
    import sys

    from dpo_sweep.sweep.torch_backend import LazyTorchConfig

    blob = pickle.dumps(LazyTorchConfig(backend="gloo", timeout_s=60)).hex()
    code = ("import pickle, sys; cfg = pickle.loads(bytes.fromhex(%r)); "
            "print(cfg.backend, cfg.timeout_s, cfg.backend_cls.__name__, cfg.framework.value, "
            "'torch' in sys.modules)" % blob)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["gloo", "60", "_LazyTorchBackend", "torch", "False"]


def test_lazy_torch_backend_calls_functions_that_ray_still_has():
    """The worker side runs Ray's own torch set-up functions by name: a Ray upgrade that renames
    one must fail here, not in the middle of a sweep."""
    from ray.train.torch import config as ray_torch_config

    from dpo_sweep.sweep import torch_backend

    source = __import__("inspect").getsource(torch_backend)
    names = {"_set_torch_distributed_env_vars", "_setup_torch_process_group", "_shutdown_torch"}
    assert all(f'"{n}"' in source for n in names)
    assert all(callable(getattr(ray_torch_config, n)) for n in names)
    with torch_backend._TorchFuncContext():  # CPU: no device to set, must not fail
        pass


def test_tune_keeps_its_trial_process_between_trials():
    from dpo_sweep.sweep.tuner import tune_config

    cfg = tune_config(3)
    assert cfg.reuse_actors is True and cfg.max_concurrent_trials == 3
    trial = type("T", (), {"config": {"trial_id": "t007_mb2_L1_ga1_b0.1"}})()
    assert cfg.trial_dirname_creator(trial) == "t007_mb2_L1_ga1_b0.1"


def test_worker_setup_quiets_a_logger_that_ray_still_has():
    import importlib.util
    import logging

    from dpo_sweep.sweep import worker_setup

    for name in worker_setup.NOISY_LOGGERS:
        assert importlib.util.find_spec(name) is not None, name  # renamed in a Ray upgrade?
    worker_setup.quiet_ray_train_logs()
    assert all(logging.getLogger(n).getEffectiveLevel() == logging.ERROR for n in worker_setup.NOISY_LOGGERS)


def test_steps_travel_once_in_their_own_reports():
    """The outcome report carries the summary row and the machine, not the steps again."""
    cfg = make_cfg(trial_id="t005")
    result = TrialResult(trial_id="t005", status="ok", **cfg.knobs())
    report = OutcomeReport(result, {"hostname": "h"}).to_report()
    assert list(report) == [protocol.OUTCOME_KEY]
    assert set(json.loads(report[protocol.OUTCOME_KEY])) == {"result", "environment"}


def test_recorder_looks_configs_up_instead_of_validating_them(tmp_path, capsys):
    """Tune hands the callback each trial's config; the recorder looks up by its trial id the config
    the sweep validated (here the config holds only the id, which no TrialConfig would accept)."""
    cfg = make_cfg(trial_id="t006", steps=3)
    plan = SweepPlan([cfg])
    rec = recorder.SweepRecorder(tmp_path, plan, total=1, already_done=0)
    searcher = PlanSearcher(plan, rec, TrialTask(cfg))
    assert trial_id_of(searcher.suggest("tune-6")) == "t006"
    trial = type("T", (), {"trial_id": "tune-6", "config": {"trial_id": "t006"}})()
    end_trial(rec, searcher, trial, [TrialEnding(TrialFailure("oom", "OOM")).to_report()])
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert [(r["trial_id"], r["status"], r["micro_batch"]) for r in rows] == [("t006", "oom", str(cfg.micro_batch))]
    assert "[1/1] t006" in capsys.readouterr().out


def test_the_jobs_runtime_env_holds_only_what_its_workers_lack(monkeypatch):
    from dpo_sweep.sweep.ray_cluster import RAY_TRAIN_ENV, SETUP_HOOK, job_runtime_env

    for name in RAY_TRAIN_ENV:
        monkeypatch.delenv(name, raising=False)
    # A local cluster of warm workers: nothing (its processes inherit the exported variables).
    assert job_runtime_env(joined=False, train=False) is None
    assert all(os.environ[k] == v for k, v in RAY_TRAIN_ENV.items())
    assert job_runtime_env(joined=False, train=True) == {"worker_process_setup_hook": SETUP_HOOK}
    for name in RAY_TRAIN_ENV:
        monkeypatch.delenv(name, raising=False)
    assert job_runtime_env(joined=True, train=False) == {"env_vars": RAY_TRAIN_ENV}
