"""``dpo-sweep run``'s start-up (dpo_sweep/sweep/startup.py): the file checks, then the rest of the
preflight beside Ray's start and the warm workers'; a refusal of the input still exits 2 with
nothing written and nothing left running.

The command runs for real up to Ray: the space file, the preflight (slowed down, or made to
refuse), the results folder. Ray's connection, the warm workers and the sweep itself are stood in
and record when they were called."""
from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from dpo_sweep import preflight
from dpo_sweep.cli import main
from dpo_sweep.errors import DataError
from dpo_sweep.records import TrialResult, write_results
from dpo_sweep import space as space_mod
from dpo_sweep.commands import run as command
from dpo_sweep.sweep import startup
from dpo_sweep.sweep.ray_cluster import InfrastructureError, RayConnection
from dpo_sweep.sweep.tuner import SweepSummary

SPACE = """name: startup
model: {preset: tiny-llama}
data: {synthetic: {pairs: 16, prompt_tokens: 12, response_tokens: 10}}
train: {steps: 2, warmup_steps: 0, max_length: 64, precision: fp32}
resources: {use_gpu: false}
search: {micro_batch: [1, 2]}
"""
REAL_CHECK = preflight.check_inputs


class Stand:
    """The stand-ins' record: (event, time.monotonic()) in the order they happened."""

    def __init__(self, monkeypatch, *, preflight_s: float = 0.0, ray_s: float = 0.0,
                 refusal: str | None = None, ray_error: str | None = None) -> None:
        self.events: list[tuple[str, float]] = []
        def slow_check(trials, out_dir=None, files=None):
            self.mark("preflight start")
            time.sleep(preflight_s)
            try:
                if refusal is not None:
                    raise DataError(refusal)
                return REAL_CHECK(trials, out_dir, files)
            finally:
                self.mark("preflight end")

        def connect(address, dashboard, train=True):
            self.mark("ray start")
            time.sleep(ray_s)
            if ray_error is not None:
                raise InfrastructureError(ray_error)
            self.mark("ray up")
            return RayConnection(None, False, started_here=True)

        def pool(trials, slots, trainer=None):
            self.mark("pool start")
            return SimpleNamespace(name="pool", close=lambda: self.mark("pool closed"))

        def sweep(sp, out_dir, **kw):
            self.mark("sweep")
            self.sweep_kw = kw
            return SweepSummary(out_dir, ran=len(sp.trials), skipped=0, finished=len(sp.trials), ray_trials=2)

        monkeypatch.setattr(startup.BackgroundPreflight, "in_process", True)  # the stand-in is this process's
        monkeypatch.setattr(preflight, "check_inputs", slow_check)
        monkeypatch.setattr(command, "connect_ray", connect)
        monkeypatch.setattr(command, "start_warm_workers", pool)
        monkeypatch.setattr(command, "run_sweep", sweep)
        monkeypatch.setattr(command, "_analyse", lambda *a, **k: 0)
        monkeypatch.setattr(command, "ray", SimpleNamespace(cluster_resources=lambda: {"CPU": 4.0},
                                                            shutdown=lambda: self.mark("ray shutdown")))

    def mark(self, event: str) -> None:
        self.events.append((event, time.monotonic()))

    def names(self) -> list[str]:
        return [e for e, _ in self.events]

    def at(self, event: str) -> float:
        return next(t for e, t in self.events if e == event)


def _run(tmp_path, *extra: str) -> tuple[int, object]:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    return main(["run", str(space), "--output", str(tmp_path / "out"), "--no-dashboard", *extra])


def test_ray_and_the_warm_workers_start_while_the_preflight_runs(tmp_path, monkeypatch, capsys):
    # The real checks' own imports and the memory model's first build are left out of the timing.
    warm = tmp_path / "warm.yaml"
    warm.write_text(SPACE)
    startup.check_inputs(space_mod.load(warm).trials, tmp_path / "unused", space_mod.load(warm).trials)
    stand = Stand(monkeypatch, preflight_s=1.0, ray_s=0.5)
    started = time.monotonic()
    assert _run(tmp_path) == 0
    # Ray's start and the workers' began before the preflight had its answer ...
    assert stand.at("ray start") < stand.at("preflight end")
    assert stand.at("pool start") < stand.at("preflight end")
    # ... so the start-up took the longer of the two, not their sum (1.5 s), to the sweep.
    assert stand.at("sweep") - started < 1.35, stand.events
    assert stand.sweep_kw["pool"].name == "pool"  # the sweep runs in the workers started early
    assert stand.names()[-3:] == ["sweep", "pool closed", "ray shutdown"]
    # What the user sees keeps its order: the data line, then Ray's.
    out = capsys.readouterr().out
    assert out.index("data synthetic: 16 pair(s)") < out.index("Ray dashboard: off")
    assert (tmp_path / "out" / "space.yaml").exists()


def test_a_refusal_after_ray_started_exits_2_and_ends_what_started(tmp_path, monkeypatch, capsys):
    stand = Stand(monkeypatch, preflight_s=0.6, ray_s=0.1, refusal="d.jsonl: line 2: 'chosen' is int (3)")
    assert _run(tmp_path) == 2
    err = capsys.readouterr().err
    assert "d.jsonl: line 2: 'chosen' is int (3)" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # nothing written
    assert "ray start" in stand.names() and "sweep" not in stand.names()
    assert stand.names()[-2:] == ["pool closed", "ray shutdown"]


def test_a_missing_data_file_is_refused_before_ray_starts(tmp_path, monkeypatch, capsys):
    stand = Stand(monkeypatch)
    space = tmp_path / "space.yaml"
    space.write_text(SPACE.replace("data: {synthetic: {pairs: 16, prompt_tokens: 12, response_tokens: 10}}",
                                   f"data: {{path: {tmp_path / 'missing.jsonl'}}}"))
    assert main(["run", str(space), "--output", str(tmp_path / "out"), "--no-dashboard"]) == 2
    assert "missing.jsonl: no such file" in capsys.readouterr().err
    assert stand.names() == []  # neither Ray nor the tokenizer's preflight started
    assert not (tmp_path / "out").exists()


def test_the_inputs_refusal_comes_before_a_ray_failure(tmp_path, monkeypatch, capsys):
    """Ray failing while the preflight runs: the input's refusal (exit 2) is what the user gets,
    as when the preflight ran before Ray; without one, the Ray failure (exit 1)."""
    Stand(monkeypatch, preflight_s=0.5, ray_error="no raylet", refusal="data.path: missing.jsonl: no such file")
    assert _run(tmp_path) == 2
    assert "missing.jsonl: no such file" in capsys.readouterr().err
    Stand(monkeypatch, preflight_s=0.5, ray_error="no raylet")
    assert _run(tmp_path) == 1
    assert "no raylet" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_resumed_sweep_with_every_row_starts_no_ray(tmp_path, monkeypatch, capsys):
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    trials = space_mod.load(space).trials
    write_results(tmp_path / "out", [TrialResult(trial_id=t.trial_id, status="ok", **t.knobs()) for t in trials])
    (tmp_path / "out" / "space.yaml").write_text(SPACE)  # the space its rows ran, as a sweep leaves it
    stand = Stand(monkeypatch, preflight_s=0.5)
    assert main(["run", str(space), "--output", str(tmp_path / "out"), "--resume"]) == 0
    assert "nothing to run" in capsys.readouterr().out
    assert "ray start" not in stand.names()


def test_the_memory_model_is_built_with_the_preflight_and_the_driver_takes_it(monkeypatch):
    """The planner's first suggestion, inside Tune's start, finds the model's shape built, in the
    driver that never built one (the preflight's process did): the plan is given the shapes."""
    from dpo_sweep.plan import memory, shape
    from dpo_sweep.plan.schedule import SweepPlan
    from testkit import make_cfg

    cfg = make_cfg()
    shape.built_shape.cache_clear()
    shapes = startup.model_shapes([cfg, make_cfg(micro_batch=2)])  # one model: built once
    assert list(shapes) == [cfg.model] and shape.built_shape.cache_info().currsize == 1
    shape.built_shape.cache_clear()
    plan = SweepPlan([cfg], budget_gb=80.0, shapes=shapes)
    assert plan.next_job().cfg.trial_id == cfg.trial_id  # ordered and sized by the memory model
    assert shape.built_shape.cache_info().currsize == 0  # nothing built here
    memory.predict_peak_gb(cfg, device="cpu")  # without the shapes: built here
    assert shape.built_shape.cache_info().currsize == 1

    def broken(spec):
        raise OSError("no config.json")

    monkeypatch.setattr(startup, "model_shape", broken)
    assert startup.model_shapes([cfg]) == {}  # left to the planner, where it is handled


def _real_preflight(tmp_path, space_text: str):
    space = tmp_path / "space.yaml"
    space.write_text(space_text)
    trials = space_mod.load(space).trials
    return startup.BackgroundPreflight(trials, tmp_path / "out", trials, preflight.check_files(trials, tmp_path / "out"))


def test_the_preflight_s_own_process_answers_with_the_inputs_shapes_and_environment(tmp_path):
    background = _real_preflight(tmp_path, SPACE)
    assert background.in_process is False  # what dpo-sweep run uses
    with background as pending:
        checked = pending.result()
        assert pending.result() is checked  # asked twice, answered once
    assert [s.pairs for s in checked.data] == [16]
    assert {t.split("_", 1)[1] for t in checked.lengths} == {"mb1_none_ga1_b0.1", "mb2_none_ga1_b0.1"}
    assert [spec.preset for spec in checked.shapes] == ["tiny-llama"] and checked.environment["cpu_count"]
    assert not background._process.is_alive() and background._process.exitcode == 0


def test_a_refusal_in_the_preflight_s_process_is_the_user_error_here(tmp_path):
    # Only the tokenised read finds it: every pair is cut below min_response_tokens.
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "p" * 50, "chosen": "c" * 50, "rejected": "r" * 50}) + "\n")
    text = SPACE.replace("data: {synthetic: {pairs: 16, prompt_tokens: 12, response_tokens: 10}}",
                         f"data: {{path: {long}}}").replace("max_length: 64", "max_length: 20")
    with _real_preflight(tmp_path, text) as pending:
        with pytest.raises(DataError, match="no pair left after truncation to max_length=20"):
            pending.result()


def test_leaving_early_ends_the_preflight_s_process(tmp_path):
    background = _real_preflight(tmp_path, SPACE)
    with pytest.raises(InfrastructureError):
        with background:
            raise InfrastructureError("no raylet")  # Ray failed while the preflight ran
    assert not background._process.is_alive()


def test_the_analysis_runs_beside_rays_shutdown_and_the_command_waits_for_it(tmp_path, monkeypatch):
    stand = Stand(monkeypatch)

    def slow_shutdown():
        stand.mark("ray shutdown")
        time.sleep(0.5)
        stand.mark("ray down")

    monkeypatch.setattr(command, "ray", SimpleNamespace(cluster_resources=lambda: {"CPU": 4.0}, shutdown=slow_shutdown))
    monkeypatch.setattr(command, "_analyse", lambda *a, **k: stand.mark("analysis") or 0)
    assert _run(tmp_path) == 0
    stand.mark("returned")
    # the analysis did not wait for Ray to go down; the command did
    assert stand.at("analysis") < stand.at("ray down"), stand.events
    assert stand.names()[-2:] == ["ray down", "returned"]


def test_a_preflight_process_that_dies_is_an_infrastructure_failure(tmp_path):
    with _real_preflight(tmp_path, SPACE) as pending:
        pending._process.kill()  # killed by the OOM killer, say, before its answer
        with pytest.raises(InfrastructureError, match=r"the preflight's process ended without an answer \(exit code -9\)"):
            pending.result()


@pytest.mark.parametrize("uncached, noted", [({}, False), ({"torch": (3000, "/site/torch")}, True)])
def test_imports_without_bytecode_are_noted_after_the_data_line(tmp_path, monkeypatch, capsys, uncached, noted):
    from dpo_sweep.telemetry import bytecode

    Stand(monkeypatch)
    # what the preflight's imports (the workers' own: torch, transformers, the model's classes) found
    monkeypatch.setattr(bytecode, "uncached_imports", lambda: uncached)
    assert _run(tmp_path) == 0
    out = capsys.readouterr().out
    note = "note: 3,000 modules of torch have no bytecode"
    assert (note in out) is noted
    if noted:
        assert out.index("data synthetic: 16 pair(s)") < out.index(note) < out.index("Ray dashboard: off")
        assert "python -m compileall -q -j 0 /site/torch" in out


def test_a_learning_trial_that_drops_the_models_dtype_finds_its_shape_built():
    """bf16 rows learn in bf16-mixed, which drops ``model.dtype: bfloat16``: that spec is not the
    one the preflight built, yet its shape is (on the H200 user case the driver built it again on
    the first trial's end, importing torch and transformers: a 10.4 s Tune callback)."""
    from dpo_sweep.plan import shape
    from dpo_sweep.plan.rules import learning_config
    from testkit import make_cfg

    cfg = make_cfg(precision="bf16", model={"preset": "tiny-llama", "dtype": "bfloat16"})
    learning = learning_config(cfg, "bf16-mixed")
    assert learning.model != cfg.model  # the case: another spec of one model
    shapes = startup.model_shapes([cfg])
    shape.built_shape.cache_clear()
    assert shape.model_shape(learning.model, shapes) == shape.model_shape(cfg.model, shapes)
    assert shape.built_shape.cache_info().currsize == 0  # nothing built in the driver


def test_no_ray_handle_is_freed_while_ray_shuts_down_beside_the_analysis(monkeypatch):
    """A handle freed mid-shutdown ends the process with exit 1 after a finished sweep ("The core
    worker has already been shutdown"; a CPU checkpoint-folder sweep, 3 runs of 3): the release
    keeps the pool and the connection, and the cyclic collector waits, until Ray is down."""
    import gc
    import threading
    import weakref

    from dpo_sweep.commands import run as command

    shutting_down, go_on, seen = threading.Event(), threading.Event(), {}

    def shutdown():
        shutting_down.set()
        go_on.wait(10)
        seen["collector on"] = gc.isenabled()

    monkeypatch.setattr(command.ray, "shutdown", shutdown)
    monkeypatch.setattr(command, "stop_local_autoscaler", lambda: None)
    monkeypatch.setattr(command, "stop_guard", lambda guard: None)
    class Pool:
        def close(self):
            pass

    pool, conn = Pool(), SimpleNamespace(started_here=True, guard=None)
    held = weakref.ref(pool)
    assert gc.isenabled()
    with command.RayRelease() as release:
        release.start(pool, conn)
        del pool
        assert shutting_down.wait(10)
        assert held() is not None and not gc.isenabled()  # what the analysis beside it runs under
        go_on.set()
    assert seen == {"collector on": False} and gc.isenabled() and held() is None
