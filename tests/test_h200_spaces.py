"""The H200 example spaces: each is the variant it says it is of the space it comes from,
the planner plans it as its header says, and ``benchmarks/h200_examples.sh`` reads the run flags
from its header. (``tests/test_docs.py`` validates every shipped space; this checks what these
spaces are for.)"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dpo_sweep import cli
from dpo_sweep import space as space_mod
from dpo_sweep.plan.labels import plan_labels

ROOT = Path(__file__).resolve().parents[1]
SPACES = ROOT / "search_spaces"
SCRIPT = ROOT / "benchmarks/h200_examples.sh"
#: The spaces the script runs on the H200, and the flags each header gives `run`.
EXAMPLES = {
    "seed-table-llama-3-8b-80gb": [],
    "seed-table-llama-3-8b-80gb-live-ref": ["--full-grid"],  # every row a measured OOM
    "llama-3.2-1b-h200-betas": [],
    "llama-3.2-1b-h200-betas-40gb": [],
    "llama-3.2-1b-learning-beta-lr": ["--full-grid"],
    "llama-3.2-1b-learning-knobs": ["--full-grid"],
    "llama-3.2-1b-learning-beta-schedule-ema": ["--full-grid"],
}


def _raw(name: str) -> dict:
    return space_mod.load_raw(SPACES / f"{name}.yaml")


def _without(raw: dict, *paths: tuple[str, ...]) -> dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for path in paths:
        node = out
        for key in path[:-1]:
            node = node[key]
        node.pop(path[-1])
    return out


def _plans(name: str) -> list[str]:
    trials = space_mod.load(SPACES / f"{name}.yaml").trials
    labels = plan_labels(trials)
    return [labels[t.trial_id] for t in trials]


def test_live_ref_variant_is_the_seed_table_with_the_other_reference():
    table, live = _raw("seed-table-llama-3-8b-80gb"), _raw("seed-table-llama-3-8b-80gb-live-ref")
    assert (table["train"]["reference"], live["train"]["reference"]) == ("precomputed", "live")
    assert _without(table, ("name",), ("train", "reference")) == _without(live, ("name",), ("train", "reference"))


def test_seed_tables_plans():
    # Precomputed: mb 4 L1 and L2 run (2 micro-steps each), the rest is over 80 GB + 5%; live: the
    # floor of weights, reference, gradients and AdamW state (80.3 GB) is over the cap: all pruned.
    plans = _plans("seed-table-llama-3-8b-80gb")
    assert plans.count("run at grad_acc 2, time extrapolated") == 2
    assert all(p.startswith("pruned: predicted peak") for p in _plans("seed-table-llama-3-8b-80gb-live-ref"))


def test_beta_spaces_are_the_1b_grid_times_three_betas():
    base, betas, small = _raw("llama-3.2-1b-h200"), _raw("llama-3.2-1b-h200-betas"), _raw("llama-3.2-1b-h200-betas-40gb")
    assert betas["search"] == {**base["search"], "beta": [0.05, 0.1, 0.3]}
    assert base["resources"]["gpu_memory_gb"] is None and small["resources"]["gpu_memory_gb"] == 40
    assert _without(betas, ("name",), ("resources", "gpu_memory_gb")) == _without(small, ("name",), ("resources", "gpu_memory_gb"))
    assert len(space_mod.load(SPACES / "llama-3.2-1b-h200-betas.yaml").trials) == 75
    # One measurement per micro_batch x level, shared by its three betas.
    plans = _plans("llama-3.2-1b-h200-betas")
    assert plans.count("run at grad_acc 2, time extrapolated") == 25
    assert sum(p.startswith("shares measurement with") for p in plans) == 50


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_header_gives_the_run_command_and_the_script_reads_its_flags(name):
    text = (SPACES / f"{name}.yaml").read_text()
    assert f"bash benchmarks/h200_examples.sh {name}\n" in text
    # The script's own run_flags function, on this space.
    define = subprocess.run(["sed", "-n", "/^run_flags() {/,/^}/p", str(SCRIPT)], capture_output=True, text=True, check=True)
    assert "run_flags()" in define.stdout
    got = subprocess.run(["bash", "-c", f"{define.stdout}\nrun_flags {name}"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    assert got == EXAMPLES[name]
    args = cli._parser().parse_args(["run", f"search_spaces/{name}.yaml", *got])  # flags `run` knows
    assert args.full_grid == ("--full-grid" in got)


def test_levers_space_is_the_seed_table_times_adapter_and_optimizer():
    table, levers = _raw("seed-table-llama-3-8b-80gb"), _raw("seed-table-llama-3-8b-80gb-levers")
    assert levers["search"] == {**table["search"], "adapter": ["full", "lora", "qlora"],
                                "optimizer": ["adamw", "adamw_8bit"]}
    lora = ("lora_r", "lora_alpha", "lora_dropout")
    assert _without(levers, ("name",), ("search",), *(("train", k) for k in lora)) == _without(table, ("name",), ("search",))
    trials = space_mod.load(SPACES / "seed-table-llama-3-8b-80gb-levers.yaml").trials
    assert len(trials) == 36
    # Full fine-tuning with AdamW: the seed table's plan; with the levers more configurations fit.
    plans = dict(zip((t.trial_id for t in trials), _plans("seed-table-llama-3-8b-80gb-levers")))
    full = [plans[t.trial_id] for t in trials if (t.train.adapter, t.train.optimizer) == ("full", "adamw")]
    assert full.count("run at grad_acc 2, time extrapolated") == 2
    lora = [plans[t.trial_id] for t in trials if t.train.adapter == "lora"]
    assert not any(p.startswith("pruned") for p in lora)  # lora mb 16 L1 77.5 GB is the largest


def test_levers_space_cpu_smoke_runs_a_lora_trial(tmp_path, capsys):
    """The header's CPU smoke command, as written there, with an output folder added."""
    import shlex

    from dpo_sweep.records import read_csv_rows

    text = (SPACES / "seed-table-llama-3-8b-80gb-levers.yaml").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("#   dpo-sweep trial "))
    args = shlex.split(line.removeprefix("#   dpo-sweep "))
    assert cli.main(args + ["--output", str(tmp_path)]) == 0, capsys.readouterr().err
    row = read_csv_rows(tmp_path / "results.csv")[0]
    assert (row["status"], row["adapter"], row["optimizer"]) == ("ok", "lora", "adamw")
    assert int(row["trainable_params"]) == 4 * 16 * 2336  # r 16 on the tiny model's 7 linears x 4 layers, not its 0.9M weights
