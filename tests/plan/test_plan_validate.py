"""``dpo-sweep validate`` prints the memory model's predicted peak and the plan per configuration."""
from __future__ import annotations

from pathlib import Path

from dpo_sweep import space as space_mod
from dpo_sweep.cli import main
from dpo_sweep.plan.memory import predict_peak_gb

ROOT = Path(__file__).resolve().parents[2]


def test_validate_prints_the_predicted_peak(capsys):
    path = ROOT / "search_spaces/seed-table-llama-3-8b-80gb.yaml"
    assert main(["validate", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("trial_id"))
    assert lines[head].rstrip().endswith("predicted peak (GB)  plan")
    at, plan_at = lines[head].index("predicted peak (GB)"), lines[head].index("plan")
    trials = space_mod.load(path).trials
    shown = [line[at:plan_at].strip() for line in lines[head + 1:]]
    assert shown == [f"{predict_peak_gb(t).total_gb:.1f}" for t in trials]
    assert len(set(shown)) == len(trials)  # micro_batch and level change it
    # Effective batch 256: a configuration runs a few micro-steps, its time extrapolated, unless the
    # 80 GB cap (torch's allocator: the CUDA context left out) is exceeded by more than 5 %.
    plans = [line[plan_at:].strip() for line in lines[head + 1:]]
    over = [predict_peak_gb(t).total_gb - predict_peak_gb(t).context_gb > 80 * 1.05 for t in trials]
    assert [p.startswith("pruned: predicted peak") for p in plans] == over and 0 < sum(over) < len(trials)
    # fixed-length synthetic pairs: every micro-step takes one time, 2 of them measure it
    assert {p for p, o in zip(plans, over) if not o} == {"run at grad_acc 2, time extrapolated"}


def test_validate_says_which_configurations_share_a_measurement(tmp_path, capsys):
    path = tmp_path / "betas.yaml"
    path.write_text(
        "name: betas\nmodel: {preset: tiny-llama}\n"
        "data: {synthetic: {pairs: 16, prompt_tokens: 12, response_tokens: 10}}\n"
        "train: {steps: 2, warmup_steps: 0, max_length: 64, precision: fp32}\n"
        "resources: {use_gpu: false, gpu_memory_gb: 0.001}\n"
        "search: {micro_batch: [1], beta: [0.1, 0.2]}\n")
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    first, second = space_mod.load(path).trials
    assert f"{second.trial_id}" in out and "pruned: predicted peak" in out  # the 1 MB card
    path.write_text(path.read_text().replace(", gpu_memory_gb: 0.001", ""))
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"shares measurement with {first.trial_id}" in out and out.count("  run") == 1
