"""``dpo-sweep validate`` prints the memory model's predicted peak per configuration."""
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
    assert lines[head].rstrip().endswith("predicted peak (GB)")
    trials = space_mod.load(path).trials
    shown = [line.split()[-1] for line in lines[head + 1:]]
    assert shown == [f"{predict_peak_gb(t).total_gb:.1f}" for t in trials]
    assert len(set(shown)) == len(trials)  # micro_batch and level change it
