"""``train.trainer: trl``: TRL's DPOTrainer as a measured trainer, on the CPU with the tiny preset.

A trl trial and its native twin train the same pairs in the same order from the same weights, so
their losses and gradient norms agree step by step (fp32; TRL's fused head and ours differ only in
rounding); points whose settings TRL cannot express are skipped at validation (a space of nothing
else is refused, exit 2); an OOM is a row.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from dpo_sweep import space as space_mod, trl_fields
from dpo_sweep.cli import main
from dpo_sweep.errors import SpaceError
from dpo_sweep.records import read_csv_rows
from dpo_sweep.train.faults import FAULTS_ENV

SPACE = {
    "name": "trl-cpu",
    "model": {"preset": "tiny-llama"},
    "data": {"synthetic": {"pairs": 16, "prompt_tokens": 16, "response_tokens": 16, "lengths": "lognormal"}},
    "train": {"steps": 3, "warmup_steps": 1, "lr": 1.0e-4, "max_length": 48, "precision": "fp32", "seed": 0,
              "device": "cpu", "evaluate": True},
    "resources": {"workers_per_trial": 1, "use_gpu": False},
    "search": {"micro_batch": [2], "checkpoint_level": ["none"], "grad_acc": [2], "beta": [0.1],
               "trainer": ["native", "trl"]},
}


def space(tmp_path: Path, train: dict | None = None, search: dict | None = None) -> Path:
    raw = yaml.safe_load(yaml.safe_dump(SPACE))
    raw["train"].update(train or {})
    raw["search"].update(search or {})
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


needs_trl = pytest.mark.skipif(not trl_fields.trl_installed(), reason="TRL is not installed (dpo-sweep[trl])")


@needs_trl
def test_a_trl_trial_and_its_native_twin_train_the_same_pairs(tmp_path):
    from dpo_sweep.train.loop import run_trial

    native, trl = space_mod.load(space(tmp_path)).trials
    assert (native.train.trainer, trl.train.trainer) == ("native", "trl")
    a, b = run_trial(native, log=None), run_trial(trl, log=None)
    assert (a.result.status, b.result.status) == ("ok", "ok")
    assert (a.result.trainer, b.result.trainer) == ("native", "trl")
    assert len(b.steps) == len(a.steps) == 4 and b.steps[-1].worst_case  # 3 steps, then the longest pairs
    for x, y in zip(a.steps, b.steps):
        assert math.isclose(x.loss, y.loss, rel_tol=1e-4), (x.step, x.loss, y.loss)
        assert math.isclose(x.grad_norm, y.grad_norm, rel_tol=1e-3), (x.step, x.grad_norm, y.grad_norm)
        assert math.isclose(x.reward_accuracy, y.reward_accuracy)
        # the same micro-batches: the same longest row and padding
        assert (x.max_seq_len, round(x.padding_frac, 9), x.measured) == (y.max_seq_len, round(y.padding_frac, 9),
                                                                        y.measured)
        assert y.peak_mem_gb > 0 and y.step_time_ms > 0
        # each micro-step timed, as the planner's extrapolation to a longer accumulation reads them
        assert len(y.micro_ms.split(",")) == 2 and y.micro_new == "00" and math.isfinite(y.micro_step_ms)
        assert math.isclose(x.tokens_per_s * x.step_time_ms, y.tokens_per_s * y.step_time_ms, rel_tol=1e-9)
    assert math.isclose(a.result.eval_loss, b.result.eval_loss, rel_tol=1e-4)
    assert b.result.trainable_params == a.result.trainable_params
    assert b.result.lean_ops is False and b.result.measured_steps == 2


@needs_trl
def test_the_trial_command_writes_the_trainer_column_and_an_oom_is_a_row(tmp_path, monkeypatch):
    path = space(tmp_path, train={"evaluate": False, "worst_case_step": False})
    out = tmp_path / "out"
    assert main(["trial", str(path), "--set", "trainer=trl", "--output", str(out)]) == 0
    row, = read_csv_rows(out / "results.csv")
    assert (row["status"], row["trainer"]) == ("ok", "trl")
    assert len(read_csv_rows(out / "steps.csv")) == 3

    oom = tmp_path / "oom"
    monkeypatch.setenv(FAULTS_ENV, '{"step": 2, "kind": "oom"}')  # tests' own channel (train/faults.py)
    assert main(["trial", str(path), "--set", "trainer=trl", "--output", str(oom)]) == 0
    row, = read_csv_rows(oom / "results.csv")
    assert (row["status"], row["trainer"], row["steps"]) == ("oom", "trl", "1")


@needs_trl
@pytest.mark.parametrize("setting, named", [
    ({"search": {"checkpoint_level": ["none", "L2"]}},
     "checkpoint_level L2, grad_acc 2, beta 0.1, trainer trl: trainer trl with checkpoint_level L2: TRL's "
     "DPOTrainer checkpoints whole decoder layers"),
    ({"train": {"adaptive_clip": True}}, "trainer trl: train.trainer trl cannot run it in TRL 1.16.0: adaptive_clip"),
    ({"train": {"beta_schedule": "seed"}}, "beta_schedule seed"),
    ({"train": {"group_by_length": True}}, "group_by_length=True: TRL 1.16.0's DPOConfig has no field"),
    ({"train": {"padding_free": True}}, "padding_free=True: TRL 1.16.0 has the field but ignores it"),
])
def test_settings_trl_cannot_express_skip_the_trl_points_at_validation(tmp_path, capsys, setting, named):
    path = space(tmp_path, **setting)
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "point(s) skipped" in out and named in out, out
    levels = {"checkpoint_level": ["L2"]} if "search" in setting else {}
    only_trl = space(tmp_path, **{**setting, "search": {**setting.get("search", {}), **levels, "trainer": ["trl"]}})
    assert main(["validate", str(only_trl)]) == 2  # nothing left to run: refused, with the reason
    assert "trl" in capsys.readouterr().err


def test_trl_missing_is_refused_with_the_install_line(tmp_path, monkeypatch):
    monkeypatch.setattr(trl_fields, "trl_installed", lambda: False)
    with pytest.raises(SpaceError, match=r"pip install 'dpo-sweep\[trl\]'"):
        space_mod.load(space(tmp_path))
    space_mod.load(space(tmp_path, search={"trainer": ["native"]}))  # native trials need no TRL


def test_liger_true_is_refused_where_trl_deprecates_use_liger_kernel():
    from dpo_sweep import trl_export
    from tests.testkit import make_cfg

    recorded = trl_fields.from_recorded()
    liger = make_cfg(trainer="trl", model={"preset": "tiny-llama", "liger_kernel": True})
    assert any("deprecates use_liger_kernel" in r for r in trl_export.refusals(liger, recorded))
    assert trl_export.refusals(make_cfg(trainer="trl"), recorded) == []  # auto: off in a trl trial
    older = trl_fields.TrlFields("0.19.0", False, recorded.fields, {})
    assert trl_export.refusals(liger, older) == []
