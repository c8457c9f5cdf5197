"""The recommendation across adapter x optimizer families: the winner is a configuration of its
family, and the reason says what each other family needs or gives here."""
from __future__ import annotations

import dataclasses
import math

from sweep_frames import frame, trial

from dpo_sweep.analysis.pareto import analyse_frontier, objectives_from_spec
from dpo_sweep.analysis.recommend import recommend

OBJS = objectives_from_spec(None)


def lever(row, adapter: str, optimizer: str = "adamw", **kw):
    return dataclasses.replace(row, adapter=adapter, optimizer=optimizer, **kw)


def seed_table_like():
    return [
        lever(trial("full-l1", status="oom", mb=4, level="L1", mem=81.2, error="CUDA out of memory"), "full"),
        lever(trial("full-l2", status="pruned", mb=8, level="L2", error="pruned: predicted peak 92.0 GB"), "full",
              predicted_peak_gb=92.0),
        lever(trial("lora-l2", 31.2, 200.0, 0.02, mb=4, level="L2"), "lora"),
        lever(trial("lora-l1", 34.0, 180.0, 0.02, mb=4, level="L1"), "lora"),
        lever(trial("qlora-l2", 20.1, 260.0, 0.02, mb=4, level="L2"), "qlora"),
    ]


def test_the_winner_names_its_levers_and_the_reason_compares_the_families(tmp_path):
    rec = recommend(analyse_frontier(frame(tmp_path, seed_table_like()), OBJS), memory_budget_gb=80.0)
    assert rec.trial_id == "lora-l1" and rec.config["adapter"] == "lora" and rec.config["optimizer"] == "adamw"
    # sweep_frames.trial gives each row its own seed: a varying column, named
    assert rec.reason.startswith("lora-l1 (micro_batch 4, checkpoint L1, grad_acc 1, beta 0.1, adapter lora, seed lora-l1)")
    assert (" Across the levers: full fine-tuning + adamw needs at least 81.2 GB here (full-l1, ran out of "
            "memory); QLoRA + adamw peaks at 20.1 GB at 3,846 tokens/s at best (qlora-l2).") in rec.reason


def test_nothing_fits_still_says_what_each_family_needs(tmp_path):
    rows = seed_table_like()
    rec = recommend(analyse_frontier(frame(tmp_path, rows), OBJS), memory_budget_gb=10.0)
    assert rec.trial_id is None
    assert "Across the levers: full fine-tuning + adamw needs at least 81.2 GB here" in rec.reason
    assert "LoRA + adamw peaks at 34.0 GB at 5,556 tokens/s at best (lora-l1)" in rec.reason


def test_one_family_adds_no_sentence_and_old_files_read_as_full_adamw(tmp_path):
    rows = [trial("a", 10.0, 100.0, 0.02), trial("b", 20.0, 50.0, 0.02, mb=2)]
    df = analyse_frontier(frame(tmp_path, rows), OBJS)
    rec = recommend(df, memory_budget_gb=30.0)
    assert "Across the levers" not in rec.reason
    assert not math.isnan(rec.metrics["peak_mem_gb"])


def test_a_results_csv_without_the_lever_columns_loads_as_full_adamw(tmp_path):
    from dpo_sweep.analysis.results import load_results
    from sweep_frames import write_dir

    out = write_dir(tmp_path / "old", [trial("a", 10.0, 100.0, 0.02)])
    path = out / "results.csv"
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    keep = [i for i, c in enumerate(header) if c not in ("adapter", "optimizer", "trainable_params")]
    path.write_text("\n".join(",".join(line.split(",")[i] for i in keep) for line in lines) + "\n")
    df = load_results(out)
    assert (df.loc[0, "adapter"], df.loc[0, "optimizer"]) == ("full", "adamw")
    assert math.isnan(df.loc[0, "trainable_params"])


def test_the_trials_table_shows_each_rows_levers(tmp_path):
    from dpo_sweep.analysis import tables

    df = analyse_frontier(frame(tmp_path, seed_table_like()), OBJS)
    header = tables.trials_header(df)
    adapter, optimizer = header.index("adapter"), header.index("optimizer")
    got = {row[0]: (row[adapter], row[optimizer]) for row in tables.trial_rows(df)}
    assert got == {"full-l1": ("full", "adamw"), "full-l2": ("full", "adamw"), "lora-l2": ("lora", "adamw"),
                   "lora-l1": ("lora", "adamw"), "qlora-l2": ("qlora", "adamw")}
