"""Search-space expansion: train fields under search: reach the trials (and results.csv), the
sampler's options have their own section, and a value listed twice is refused."""
from __future__ import annotations

import collections
import copy
import re

import pytest

from dpo_sweep import space as space_mod
from dpo_sweep.records import RESULTS_COLUMNS, read_csv_rows, write_results
from dpo_sweep.cli import main
from dpo_sweep.config import TrainSpec
from dpo_sweep.core.dimensions import TRAIN_COLUMNS
from dpo_sweep.errors import SpaceError
from dpo_sweep.sweep.collector import TrialCollector

QUICKSTART = "search_spaces/quickstart.yaml"  # 2 micro_batch x 3 levels x 2 grad_acc x 1 beta = 12


def quickstart(**sections) -> dict:
    raw = copy.deepcopy(space_mod.load_raw(QUICKSTART))
    for name, value in sections.items():
        raw[name] = value
    return raw


def with_search(**dims) -> dict:
    raw = quickstart()
    raw["search"] = {**raw["search"], **dims}
    return raw


def test_set_seed_reaches_every_trial():
    sp = space_mod.load(QUICKSTART, ["seed=5"])
    assert len(sp.trials) == 12
    assert {t.train.seed for t in sp.trials} == {5}


def test_set_with_a_list_sweeps_those_values_and_an_empty_one_is_refused():
    sp = space_mod.load(QUICKSTART, ["micro_batch=[2,4]", "search.checkpoint_level=[none]", "lr=[1e-4, 3e-4]"])
    assert sorted({(t.micro_batch, t.checkpoint_level, t.train.lr) for t in sp.trials}) == \
        [(2, "none", 1e-4), (2, "none", 3e-4), (4, "none", 1e-4), (4, "none", 3e-4)]
    assert sp.raw["search"]["micro_batch"] == [2, 4]  # what DIR/space.yaml records
    with pytest.raises(SpaceError, match=r"search.micro_batch: empty list"):
        space_mod.load(QUICKSTART, ["micro_batch=[]"])


def test_seed_under_search_is_a_dimension_with_readable_unique_ids():
    trials = space_mod.parse(with_search(seed=[0, 1, 2])).trials
    assert len(trials) == 36
    assert collections.Counter(t.train.seed for t in trials) == {0: 12, 1: 12, 2: 12}
    ids = [t.trial_id for t in trials]
    assert len(set(ids)) == len(ids)
    assert all(t.trial_id.endswith(f"_seed-{t.train.seed}") for t in trials)


def test_swept_train_values_are_named_as_the_trial_sees_them():
    trials = space_mod.parse(with_search(lr=["1e-4"], loss=["ipo"])).trials
    assert {t.train.lr for t in trials} == {1e-4}
    assert trials[0].trial_id.endswith("_lr-0.0001_loss-ipo")


def test_sampler_section_draws_a_reproducible_random_sample():
    def draw(seed: int) -> list[tuple]:
        raw = quickstart(sampler={"mode": "random", "num_samples": 5, "seed": seed})
        return [(t.micro_batch, t.checkpoint_level, t.grad_acc) for t in space_mod.parse(raw).trials]

    grid = {(t.micro_batch, t.checkpoint_level, t.grad_acc) for t in space_mod.parse(quickstart()).trials}
    first = draw(3)
    assert len(first) == 5 and len(set(first)) == 5 and set(first) <= grid
    assert draw(3) == first
    assert {tuple(draw(s)) for s in range(4)} != {tuple(first)}  # the seed picks the sample
    # More samples than points: every point, once.
    raw = quickstart(sampler={"mode": "random", "num_samples": 50})
    assert len(space_mod.parse(raw).trials) == 12


@pytest.mark.parametrize("key", ["mode", "num_samples"])
def test_sampler_keys_under_search_name_their_new_section(key):
    with pytest.raises(SpaceError, match=rf"search\.{key}: .*sampler: \{{mode"):
        space_mod.parse(with_search(**{key: "random" if key == "mode" else 4}))
    with pytest.raises(SpaceError, match=rf"--set {key}: .*sampler\.{key}"):
        space_mod.load(QUICKSTART, [f"{key}=4"])


@pytest.mark.parametrize(("sampler", "message"), [
    ({"mode": "bayes"}, "sampler.mode"),
    ({"mode": "random"}, "sampler.num_samples"),
    ({"mode": "random", "num_samples": 0}, "sampler.num_samples"),
    ({"num_samples": 3}, "only used with mode: random"),
    ({"sed": 3}, "sampler.sed"),
])
def test_bad_sampler_is_refused_naming_the_key(sampler, message):
    with pytest.raises(SpaceError, match=message.replace(".", r"\.")):
        space_mod.parse(quickstart(sampler=sampler))


@pytest.mark.parametrize(("key", "values", "shown"), [
    ("micro_batch", [2, 4, 2], "2"),
    ("checkpoint_level", ["none", "none"], "'none'"),
    ("grad_acc", [1, 1], "1"),
    ("effective_batch", [8, 8], "8"),
    ("beta", [0.1, 0.5, 0.1], "0.1"),
    ("model", ["tiny-llama", {"preset": "tiny-llama"}], "{'preset': 'tiny-llama'} (the same as 'tiny-llama')"),
    ("lr", [1.0e-4, "1e-4"], "'1e-4' (the same as 0.0001)"),
    ("seed", [1, 1], "1"),
])
def test_a_value_listed_twice_is_refused(key, values, shown):
    raw = with_search(**{key: values})
    if key == "effective_batch":
        del raw["search"]["grad_acc"]
    with pytest.raises(SpaceError) as err:
        space_mod.parse(raw)
    assert f"search.{key}: {shown} is listed twice" in str(err.value)


def test_duplicates_exit_2_from_the_cli(tmp_path, capsys):
    path = tmp_path / "dup.yaml"
    path.write_text(open(QUICKSTART).read().replace("micro_batch: [2, 4]", "micro_batch: [2, 2]"))
    assert main(["validate", str(path)]) == 2
    assert "search.micro_batch: 2 is listed twice" in capsys.readouterr().err


def test_every_train_field_has_a_results_column_of_its_own():
    carried = {"loss": "loss_type", "max_length": "seq_len", "precision": "precision", "reference": "reference",
               "adapter": "adapter", "optimizer": "optimizer", "trainer": "trainer"}
    for name in TrainSpec.model_fields:
        column = TRAIN_COLUMNS.get(name, name)
        if name in carried:
            assert column == carried[name] and column in RESULTS_COLUMNS
        else:
            assert column not in RESULTS_COLUMNS, f"train.{name} would overwrite results column {column}"


def test_swept_adapter_and_optimizer_are_the_rows_own_columns_not_extra_ones():
    trials = space_mod.parse(with_search(adapter=["full", "lora"], lora_r=[4, 8])).trials
    assert len(trials) == 4 * 12
    assert collections.Counter((t.train.adapter, t.train.lora_r) for t in trials) == {
        ("full", 4): 12, ("full", 8): 12, ("lora", 4): 12, ("lora", 8): 12}
    assert all(set(t.swept_columns()) == {"lora_r"} for t in trials)  # adapter: the row's own column
    assert any(t.trial_id.endswith("_adapter-lora_lora_r-4") for t in trials)


def test_cuda_levers_on_a_cpu_space_are_skipped_and_refused_when_nothing_else_is_left():
    cpu_only = r"is refused with (train.device: cpu|resources.use_gpu: false): torchao's NF4 weights and low-bit " \
               r"AdamW run on a CUDA GPU only"
    for where in ({"train": {"device": "cpu"}}, {"resources": {"use_gpu": False}}):
        qlora, mixed = with_search(adapter=["qlora"]), with_search(optimizer=["adamw", "adamw_8bit"])
        for raw in (qlora, mixed):
            for section, values in where.items():
                raw[section] = {**raw[section], **values}
        with pytest.raises(SpaceError, match=cpu_only):  # every point impossible: refused
            space_mod.parse(qlora)
        sp = space_mod.parse(mixed)  # the adamw points run, the adamw_8bit ones are skipped with the reason
        assert {t.train.optimizer for t in sp.trials} == {"adamw"} and len(sp.trials) == len(sp.skipped) == 12
        assert {s.values["optimizer"] for s in sp.skipped} == {"adamw_8bit"}
        assert all(re.search(cpu_only, s.reason) for s in sp.skipped)
    space_mod.parse(with_search(adapter=["qlora"]))  # use_gpu auto: the preflight decides


def test_trial_writes_swept_train_fields_as_columns(tmp_path, capsys):
    out = tmp_path / "t"
    rc = main(["trial", QUICKSTART, "--set", "seed=3", "--set", "lr=0.001", "--set", "steps=2",
               "--set", "train.warmup_steps=1", "--output", str(out)])
    assert rc == 0, capsys.readouterr().err
    rows = read_csv_rows(out / "results.csv")
    assert list(rows[0]) == RESULTS_COLUMNS + ["seed", "lr", "train_steps"]
    # steps: the steps that ran, the worst-case step after train.steps included
    assert (rows[0]["seed"], rows[0]["lr"], rows[0]["train_steps"], rows[0]["steps"]) == ("3", "0.001", "2", "3")
    assert rows[0]["trial_id"].split("_", 1)[1] == "mb2_none_ga1_b0.1_seed-3_lr-0.001_steps-2"


def test_sweep_rows_carry_swept_train_fields_as_columns(tmp_path):
    """The run path: the collector's rows (here a trial that died) get the same columns."""
    trials = space_mod.parse(with_search(seed=[0, 1], loss=["sigmoid", "hinge"])).trials
    collector = TrialCollector()
    rows = [collector.abandon(t.trial_id, t, "the trial process died").result for t in trials[:3]]
    for i, row in enumerate(rows):
        write_results(tmp_path, [row], append=i > 0)
    written = read_csv_rows(tmp_path / "results.csv")
    assert list(written[0]) == RESULTS_COLUMNS + ["seed"]  # loss is already the loss_type column
    assert [(r["seed"], r["loss_type"]) for r in written] == [
        (str(t.train.seed), t.train.loss) for t in trials[:3]]


def test_adaptive_clip_with_fsdp_is_refused_naming_both_fields(tmp_path, capsys):
    import yaml

    raw = quickstart(resources={"workers_per_trial": 2, "parallelism": "fsdp", "use_gpu": False})
    raw["train"] = {**raw["train"], "adaptive_clip": True}
    path = tmp_path / "clip.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "train.adaptive_clip" in err and "parallelism: fsdp" in err


def test_distinct_models_are_the_trials_different_models_in_first_appearance_order():
    from dpo_sweep.config import distinct_models
    from tests.testkit import make_cfg

    tiny, no_liger = {"preset": "tiny-llama"}, {"preset": "tiny-llama", "liger_kernel": False}
    trials = [make_cfg(model=tiny, micro_batch=1), make_cfg(model=no_liger), make_cfg(model=tiny, micro_batch=2)]
    assert distinct_models(trials) == [trials[0].model, trials[1].model]
    assert distinct_models(iter(trials)) == [trials[0].model, trials[1].model]  # any iterable, read once
