"""``dpo-sweep run`` plans with the data's lengths that its preflight measured: the planner's
predicted peak in results.csv is what ``validate`` prints, not every sequence at max_length, and
a configuration that fits with its real lengths is not pruned over budget.

The whole command runs (preflight, the results folder, the planner, the recorder) with Ray's
connection and Tune's ``Tuner`` stood in: the stand-in Tuner asks the planner's Searcher for
trials, as Tune would, and ends each with the reports a worker would send."""
from __future__ import annotations

from types import SimpleNamespace

import ray
from ray.tune.search import Searcher

from dpo_sweep import preflight
from dpo_sweep import space as space_mod
from dpo_sweep.cli import main
from dpo_sweep.plan.memory import predict_peak_gb
from dpo_sweep.core.trial_facts import planned_device
from dpo_sweep.plan.rules import BUDGET_MARGIN
from dpo_sweep.records import StepRecord, TrialResult, read_csv_rows
from dpo_sweep.commands import run as command
from dpo_sweep.sweep import tuner
from dpo_sweep.sweep.protocol import OutcomeReport, StepReport, TrialEnding
from dpo_sweep.sweep.ray_cluster import RayConnection
from dpo_sweep.sweep.task import task_of
from testkit import end_trial

#: A 1B model's shapes (nothing is trained: the stand-in Tuner runs no worker) on long-tailed
#: synthetic data far below max_length: the worst micro-batch is a fraction of 2 x 8 x 4096 tokens.
SPACE = """name: tailed
model: {preset: llama-3.2-1b}
data: {synthetic: {pairs: 64, prompt_tokens: 48, response_tokens: 32, lengths: lognormal, sigma: 0.8}}
train: {steps: 2, warmup_steps: 0, max_length: 4096, precision: bf16-mixed, learning_steps: 2}  # no learning trials
resources: {use_gpu: auto%s}
search: {micro_batch: [8], checkpoint_level: [L1], padding_free: [false, true]}
"""


class FakeTuner:
    """``tune.Tuner`` without Ray: runs every trial the Searcher suggests, each ``ok`` at 1 GB."""

    started: list[dict] = []

    def __init__(self, trainable, *, tune_config, run_config) -> None:
        self.searcher, self.recorder = tune_config.search_alg, run_config.callbacks[0]

    def fit(self) -> None:
        while (config := self.searcher.suggest(f"tune-{len(self.started)}")) not in (None, Searcher.FINISHED):
            trial = SimpleNamespace(trial_id=f"tune-{len(self.started)}", config=config)
            FakeTuner.started.append(task_of(config).cfg)
            cfg = self.recorder._cfg(trial)
            step = StepRecord(trial_id=cfg.trial_id, step=1, loss=0.7, grad_norm=1.0, step_time_ms=200.0,
                              peak_mem_gb=1.0, reward_accuracy=0.5, reward_margin=0.0, logps_chosen=-1.0,
                              logps_rejected=-1.0, kl=0.0, micro_step_ms=90.0, optimizer_ms=20.0)
            row = TrialResult(trial_id=cfg.trial_id, status="ok", **cfg.knobs(), peak_mem_gb=1.0, step_time_ms=200.0)
            end_trial(self.recorder, self.searcher, trial,
                      (StepReport(step).to_report(), OutcomeReport(row).to_report(), TrialEnding().to_report()))


def _run(monkeypatch, path, out) -> dict[str, dict[str, str]]:
    FakeTuner.started = []
    monkeypatch.setattr(command, "connect_ray", lambda address, dashboard, train=True: RayConnection(None, False, False))
    monkeypatch.setattr(command, "print_dashboard", lambda conn, out: None)
    monkeypatch.setattr(command, "ray", SimpleNamespace(cluster_resources=lambda: {"CPU": 4.0}, shutdown=lambda: None))
    monkeypatch.setattr(command, "_analyse", lambda *a, **k: 0)  # the analysis is not under test
    monkeypatch.setattr(tuner.tune, "Tuner", FakeTuner)
    assert main(["run", str(path), "--output", str(out), "--no-dashboard"]) == 0
    return {r["trial_id"]: r for r in read_csv_rows(out / "results.csv")}


def _validate_column(capsys, path, column: str) -> dict[str, str]:
    assert main(["validate", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("trial_id"))
    names = ["predicted peak (GB)", "plan"]
    at = lines[head].index(column)
    end = lines[head].index(names[names.index(column) + 1]) if column != names[-1] else None
    return {line.split()[0]: line[at:end].strip() for line in lines[head + 1:]}


def _estimates(path):
    """Each trial's estimate with the data's lengths (as preflight measured them) and without."""
    trials = space_mod.load(path).trials
    lengths = {s.key: s.lengths for s in preflight.check_inputs(trials)}
    return {t.trial_id: (t, predict_peak_gb(t, device=planned_device(t), lengths=lengths[preflight.data_key(t)]),
                         predict_peak_gb(t, device=planned_device(t))) for t in trials}


def test_the_run_predicts_what_validate_prints_from_the_data_lengths(tmp_path, monkeypatch, capsys):
    path = tmp_path / "tailed.yaml"
    path.write_text(SPACE % "")
    shown = _validate_column(capsys, path, "predicted peak (GB)")
    rows = _run(monkeypatch, path, tmp_path / "out")
    assert set(rows) == set(shown) and {r["status"] for r in rows.values()} == {"ok"}
    # Without a connected cluster the sweep starts no Ray of its own (no warm-worker pool either):
    # one would stay up in this test session and break every later ray.init.
    assert not ray.is_initialized()
    for trial_id, (cfg, real, at_max) in _estimates(path).items():
        # Two memory families (padding_free): neither is calibrated by the other's measurement.
        assert float(rows[trial_id]["predicted_peak_gb"]) == real.total_gb
        assert f"{float(rows[trial_id]['predicted_peak_gb']):.1f}" == shown[trial_id]
        assert at_max.total_gb > real.total_gb + 5  # the max_length assumption: every row at 4096 tokens


def test_a_configuration_that_fits_with_its_real_lengths_is_not_pruned(tmp_path, monkeypatch, capsys):
    plain = tmp_path / "plain.yaml"
    plain.write_text(SPACE % "")
    est = _estimates(plain)
    # A card between the real worst micro-batches and the max_length assumption (margin included);
    # against resources.gpu_memory_gb the CUDA context is left out (rules.budgeted_gb).
    fits = max(real.total_gb - real.context_gb for _, real, _ in est.values())
    over = min(at_max.total_gb - at_max.context_gb for _, _, at_max in est.values()) / (1 + BUDGET_MARGIN)
    assert fits < over
    card_gb = (fits + over) / 2
    path = tmp_path / "card.yaml"
    path.write_text(SPACE % f", gpu_memory_gb: {card_gb:.3f}")
    plans = _validate_column(capsys, path, "plan")
    assert not any(p.startswith("pruned") for p in plans.values())
    rows = _run(monkeypatch, path, tmp_path / "out")
    assert {r["status"] for r in rows.values()} == {"ok"}, [r["error"] for r in rows.values()]
    assert {t.trial_id for t in FakeTuner.started} == set(est)
