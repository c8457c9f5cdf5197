"""Every swept dimension is visible where rows are told apart: trial ids, frontier.md and the
recommendation name a swept model (and swept train fields), and --resume renames the rows of a
results dir written under the ids that did not name the model."""
from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "analysis"))

from sweep_frames import trial, write_dir  # noqa: E402

from dpo_sweep import space as space_mod  # noqa: E402
from dpo_sweep.commands.report import analyse_dir, format_recommendation  # noqa: E402
from dpo_sweep.analysis.recommend import Recommendation  # noqa: E402
from dpo_sweep.records import StepRecord, read_csv_rows, write_steps  # noqa: E402
from dpo_sweep.sweep.output_dir import prepare_output  # noqa: E402

TWO_MODELS = {"name": "two", "model": {"preset": "tiny-llama"},
              "data": {"synthetic": {"pairs": 8, "prompt_tokens": 8, "response_tokens": 8}},
              "search": {"model": ["tiny-llama", "llama-3.2-1b"], "micro_batch": [2]}}


def test_a_swept_model_is_in_the_trial_id():
    sp = space_mod.parse(TWO_MODELS)
    tiny, llama = (t.trial_id for t in sp.trials)
    assert re.fullmatch(r"t[0-9a-f]{4}_tiny-llama_mb2_none_ga1_b0\.1", tiny), tiny
    assert re.fullmatch(r"t[0-9a-f]{4}_llama-3\.2-1b_mb2_none_ga1_b0\.1", llama), llama
    # The ids an earlier version gave them (numbered by place; before that, no model named).
    assert sp.renamed == {"t000_tiny-llama_mb2_none_ga1_b0.1": tiny, "t000_mb2_none_ga1_b0.1": tiny,
                          "t001_llama-3.2-1b_mb2_none_ga1_b0.1": llama, "t001_mb2_none_ga1_b0.1": llama}
    one = space_mod.parse({**TWO_MODELS, "search": {"micro_batch": [2]}})
    assert [t.trial_id.split("_", 1)[1] for t in one.trials] == ["mb2_none_ga1_b0.1"]
    same_label = space_mod.parse({**TWO_MODELS, "search": {"model": ["tiny-llama", {"preset": "tiny-llama",
                                                                                   "dtype": "float32"}]}})
    a, b = (t.trial_id for t in same_label.trials)
    assert re.fullmatch(r"t[0-9a-f]{4}_tiny-llama-[0-9a-f]{4}_mb1_none_ga1_b0\.1", a) and a != b
    # Told apart by content: listed the other way round, each model keeps its id.
    swapped = space_mod.parse({**TWO_MODELS, "search": {"model": [{"preset": "tiny-llama", "dtype": "float32"},
                                                                  "tiny-llama"]}})
    assert [t.trial_id for t in swapped.trials] == [b, a]


def test_ids_do_not_depend_on_list_order():
    def ids(search):
        return {t.trial_id for t in space_mod.parse({**TWO_MODELS, "search": search}).trials}

    base = ids({"micro_batch": [2, 4], "checkpoint_level": ["none", "L2"], "lr": [1e-4, 1e-3]})
    assert base == ids({"micro_batch": [4, 2], "checkpoint_level": ["L2", "none"], "lr": [1e-3, 1e-4]})
    assert base < ids({"micro_batch": [1, 2, 4], "checkpoint_level": ["none", "L2"], "lr": [1e-4, 1e-3]})
    assert len({i.split("_", 1)[0] for i in base}) == len(base)  # the hash heads tell them apart here


def test_resume_renames_rows_written_under_the_old_ids(tmp_path):
    sp = space_mod.parse(TWO_MODELS)
    tiny = sp.trials[0].trial_id
    space_file = tmp_path / "two.yaml"
    space_file.write_text("name: two\n")
    old = [replace(trial("t000_mb2_none_ga1_b0.1", 5.0, 100.0, 0.02, mb=2), measured_by="t000_mb2_none_ga1_b0.1",
                   stability_from="t000_mb2_none_ga1_b0.1-learning")]
    out = write_dir(tmp_path / "r", old)
    write_steps(out, [StepRecord("t000_mb2_none_ga1_b0.1-learning", 1, 0.69, 1.0, 100.0, 5.0, 0.5, 0.0,
                                 -10.0, -11.0, 0.0)])
    done = prepare_output(space_file, out, resume=True, renamed=sp.renamed)
    assert done == {tiny}  # the first trial is not run again
    row = read_csv_rows(out / "results.csv")[0]
    assert (row["measured_by"], row["stability_from"]) == (tiny, tiny + "-learning")
    assert row["seed"] == "t000_mb2_none_ga1_b0.1"  # only id columns are renamed
    assert read_csv_rows(out / "steps.csv")[0]["trial_id"] == tiny + "-learning"


def two_models(tmp_path):
    rows = [trial("t000_tiny-llama_mb2_none_ga1_b0.1", 5.0, 100.0, 0.02, mb=2, model="tiny-llama", seed=0),
            trial("t001_llama-3.2-1b_mb2_none_ga1_b0.1", 9.0, 50.0, 0.02, mb=2, model="llama-3.2-1b", seed=0)]
    return analyse_dir(write_dir(tmp_path / "r", rows), memory_budget_gb=40.0)


def test_frontier_md_names_the_model_when_models_differ(tmp_path):
    table = two_models(tmp_path).frontier_markdown
    # the swept dimensions after beta (the hand-made rows' seeds vary too)
    assert "| micro_batch | checkpoint | grad_acc | beta | model | seed | peak memory (GB) |" in table
    assert "| 2 | none | 1 | 0.1 | tiny-llama |" in table
    assert "| 2 | none | 1 | 0.1 | llama-3.2-1b |" in table


def test_the_recommendation_names_the_model(tmp_path):
    rec = two_models(tmp_path).recommendation
    assert rec["config"]["model"] == "llama-3.2-1b" and rec["varying"] == ["model"]
    assert rec["reason"].startswith("t001_llama-3.2-1b_mb2_none_ga1_b0.1 (micro_batch 2, checkpoint none, "
                                    "grad_acc 1, beta 0.1, model llama-3.2-1b) has the highest throughput")
    assert "runner-up, t000_tiny-llama_mb2_none_ga1_b0.1 (micro_batch 2, checkpoint none, grad_acc 1, beta 0.1, " \
           "model tiny-llama)" in rec["reason"]
    printed = format_recommendation(Recommendation(**{k: (tuple(v) if k == "varying" else v) for k, v in rec.items()
                                                       if k in Recommendation.__dataclass_fields__}))
    assert printed.startswith("recommended: t001_llama-3.2-1b_mb2_none_ga1_b0.1  micro_batch=2 "
                              "checkpoint_level=none grad_acc=1 beta=0.1 model=llama-3.2-1b")


def test_a_swept_learning_rate_is_a_frontier_column(tmp_path):
    rows = [trial("t000_mb2_none_ga1_b0.1_lr-5e-06", 5.0, 100.0, 0.02, mb=2, seed=0),
            trial("t001_mb2_none_ga1_b0.1_lr-2e-05", 5.0, 100.0, 0.03, mb=2, seed=0)]
    rows = [replace(r, extra={"lr": lr}) for r, lr in zip(rows, (5e-06, 2e-05))]
    outcome = analyse_dir(write_dir(tmp_path / "r", rows), memory_budget_gb=40.0)
    assert "| beta | lr | peak memory (GB) |" in outcome.frontier_markdown
    assert "| 2 | none | 1 | 0.1 | 5e-06 | 5.00 |" in outcome.frontier_markdown
    assert "beta 0.1, lr 5e-06)" in outcome.recommendation["reason"]


def test_the_levers_are_frontier_columns_when_they_differ(tmp_path):
    rows = [trial("t000_mb2_none_ga1_b0.1_adapter-full", 60.0, 100.0, 0.02, mb=2, seed=0),
            trial("t001_mb2_none_ga1_b0.1_adapter-lora", 30.0, 110.0, 0.02, mb=2, seed=0)]
    rows = [replace(r, adapter=a, optimizer="adamw_8bit") for r, a in zip(rows, ("full", "lora"))]
    outcome = analyse_dir(write_dir(tmp_path / "r", rows), memory_budget_gb=80.0)
    assert "| beta | adapter | seed | peak memory (GB) |" in outcome.frontier_markdown  # optimizer is one value
    assert "| 2 | none | 1 | 0.1 | lora |" in outcome.frontier_markdown
