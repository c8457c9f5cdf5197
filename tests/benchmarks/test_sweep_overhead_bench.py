"""benchmarks/sweep_overhead.py: its spaces are valid and its reading of the console is right.

The real run (a whole `dpo-sweep run`) is the benchmark itself; here the console lines are made by
the same functions that print them in a sweep, so a change of their format fails this test.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import sweep_overhead  # noqa: E402

from dpo_sweep import space as space_mod  # noqa: E402
from dpo_sweep.records import TrialResult  # noqa: E402
from dpo_sweep.sweep.trial_run import startup_line  # noqa: E402
from dpo_sweep.sweep.recorder import progress_line  # noqa: E402


@pytest.mark.parametrize("model", sorted(sweep_overhead.MODELS))
def test_spaces_hold_n_trials_of_equal_cost(tmp_path, model):
    path = tmp_path / "space.yaml"
    sweep_overhead.write_space(path, model, trials=5, steps=4)
    trials = space_mod.load(str(path)).trials
    assert len(trials) == 5 and len({t.trial_id for t in trials}) == 5
    assert {(t.micro_batch, t.checkpoint_level, t.grad_acc, t.train.steps) for t in trials} == {
        (trials[0].micro_batch, trials[0].checkpoint_level, 1, 4)}
    assert trials[0].model.preset == model


def _result(tid: str, startup_s: float, measure_s: float) -> TrialResult:
    fields = {f: float("nan") for f in TrialResult.__dataclass_fields__}
    fields.update(trial_id=tid, status="ok", error="", startup_s=startup_s, measure_s=measure_s)
    return TrialResult(**{k: v for k, v in fields.items() if k in TrialResult.__dataclass_fields__})


def test_timings_from_console_lines_and_results():
    ids = ["t000_a", "t001_b"]
    lines = [
        (1.0, "Ray dashboard: off"),
        (2.0, "2 trial(s) to run, 1 at a time, 1 worker(s) each on CPU; results go to x/"),
        (8.0, "\x1b[36m(RayTrainWorker pid=1)\x1b[0m " + startup_line(ids[0], 5.04, 0.96)),
        (8.1, "(RayTrainWorker pid=1) [t000_a] data: 32 pairs from synthetic (0 truncated) [0.1 s]"),
        (9.4, "(RayTrainWorker pid=1) [t000_a] model tiny-llama: 0.9M params, fp32 [1.4 s]"),
        (12.0, progress_line(1, 2, _result(ids[0], 8.0, 0.5))),
        (17.0, "(RayTrainWorker pid=2) " + startup_line(ids[1], 4.0, 1.0)),
        (21.5, progress_line(2, 2, _result(ids[1], 6.5, 0.5))),
    ]
    results = [{"trial_id": ids[0], "startup_s": "8.0", "measure_s": "0.5"},
               {"trial_id": ids[1], "startup_s": "6.5", "measure_s": "0.5"}]
    rows = sweep_overhead.timings(lines, results)
    assert [r.trial_id for r in rows] == ids
    first, second = rows
    assert (first.wall_s, first.ray_s, first.import_s, first.data_s, first.model_s) == (10.0, 5.0, 1.0, 0.1, 1.4)
    assert first.rest_s == pytest.approx(10.0 - 8.0 - 0.5)
    assert second.wall_s == pytest.approx(9.5) and math.isnan(second.model_s)
    assert sweep_overhead.summarise(rows)["wall_s"] == pytest.approx(9.5)  # the first is left out
    table = sweep_overhead.markdown(rows, "cmd", "desc", 30.0, "no GPU, 2 CPU cores")
    assert "| t001_b | ok | 9.5 | 4.0 | 1.0 |" in table and "median after the first" in table
    assert "Machine: no GPU, 2 CPU cores" in table


def test_worker_lines_come_from_the_sweeps_trial_logs(tmp_path):
    """Rank 0's lines are in DIR/logs/<trial>.log, not on the console; the progress lines carry the
    sweep's elapsed time and ETA after what the benchmark reads."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "t000_a.log").write_text(
        startup_line("t000_a", 5.0, 1.0) + "\n[t000_a] model tiny-llama: 0.9M params [1.4 s]\n")
    console = [(2.0, "1 trial(s) to run, 1 at a time, 1 worker(s) each on CPU; results go to x/"),
               (12.0, progress_line(1, 1, _result("t000_a", 8.0, 0.5), elapsed_s=10.0, left_s=0.0))]
    rows = sweep_overhead.timings(console + sweep_overhead.worker_lines(tmp_path),
                                  [{"trial_id": "t000_a", "startup_s": "8.0", "measure_s": "0.5"}])
    assert [(r.trial_id, r.wall_s, r.ray_s, r.import_s, r.model_s) for r in rows] == [("t000_a", 10.0, 5.0, 1.0, 1.4)]


def test_training_share_sums_every_step_of_every_trial_against_the_wall():
    steps = [{"trial_id": "a", "step_time_ms": "1000"}, {"trial_id": "a", "step_time_ms": "500"},
             {"trial_id": "a-learning", "step_time_ms": "2500"}, {"trial_id": "b", "step_time_ms": ""}]
    share = sweep_overhead.training_share(steps, wall_s=8.0)
    assert share["train_s"] == pytest.approx(4.0) and share["share"] == pytest.approx(0.5)
    assert share["ray_trials_with_steps"] == 3 and share["steps"] == 4


def test_first_row_is_the_first_progress_line():
    console = [(1.0, "Ray dashboard: off"), (2.0, "planner: 2 configuration(s) share 2 measurement(s)"),
               (11.5, progress_line(1, 2, _result("t000_a", 8.0, 0.5), elapsed_s=9.0, left_s=9.0)),
               (20.0, progress_line(2, 2, _result("t001_b", 0.1, 0.5), elapsed_s=18.0, left_s=0.0))]
    assert sweep_overhead.first_row_s(console) == 11.5
    assert math.isnan(sweep_overhead.first_row_s(console[:2]))
    assert sweep_overhead.training_share([], wall_s=30.0, first_row=11.5)["first_row_s"] == 11.5


def test_trial_spans_come_from_tunes_experiment_state_in_start_order(tmp_path):
    # Tune's experiment state as Ray 2.60 writes it: trial_data holds [trial JSON, run_metadata JSON].
    def trial(tid, start, total):
        return [json.dumps({"config": {"trial_id": tid}}),
                json.dumps({"start_time": start, "last_result": {"time_total_s": total}})]

    state = tmp_path / "ray" / "exp-1" / "experiment_state-2026-12-01_16-00-00.json"
    state.parent.mkdir(parents=True)
    pending = [json.dumps({"config": {"trial_id": "never"}}), json.dumps({"start_time": None})]
    state.write_text(json.dumps({"trial_data": [trial("b", 1012.0, 3.0), trial("a", 1005.0, 6.5), pending]}))
    spans = sweep_overhead.trial_spans(tmp_path, started_at=1000.0)
    assert [(s.trial_id, s.start_s, s.end_s, s.gap_s) for s in spans] == [("a", 5.0, 11.5, 5.0), ("b", 12.0, 15.0, 0.5)]
    split = sweep_overhead.timeline_summary(spans, wall_s=17.0)
    assert split == {"before_first_trial_s": 5.0, "in_trials_s": 9.5, "between_trials_s": 0.5, "after_last_trial_s": 2.0}


def test_trace_puts_the_tracer_first_on_the_path_and_needs_a_space(monkeypatch, tmp_path):
    import os

    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = sweep_overhead.trace_env(tmp_path / "trace")
    assert env["DPO_TRACE_DIR"] == str(tmp_path / "trace")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(REPO / "benchmarks" / "process_trace"), "/elsewhere"]
    assert (REPO / "benchmarks" / "process_trace" / "sitecustomize.py").is_file()
    with pytest.raises(SystemExit):
        sweep_overhead.main(["--trace"])
    assert sweep_overhead.startup_table({"ray_up_s": 4.54, "first_step_s": math.nan}).splitlines()[-1] == "| 4.5 | - |"
