"""Learning on the CPU: the tiny model learns the synthetic pairs in the steps given and
is judged ``stable``; a huge learning rate is judged ``diverging`` (the rollback trigger fires)."""
from __future__ import annotations

import math

import pytest

from dpo_sweep.analysis.results import load_results
from dpo_sweep.records import STEPS_COLUMNS, write_results, write_steps
from dpo_sweep.train.loop import run_trial

DATA = {"synthetic": {"pairs": 32, "prompt_tokens": 12, "response_tokens": 10}}


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_learnable_pairs_are_learned_and_stable(cfg_factory, precision):
    out = run_trial(cfg_factory(micro_batch=16, worst_case_step=False, steps=12, lr=1e-3, data=DATA, precision=precision), log=None)
    r, steps = out.result, out.steps
    assert r.status == "ok" and r.stability == "stable", r
    assert steps[-1].loss < 0.5 * steps[0].loss and r.loss_slope < 0  # 0.693 -> 0.14 measured
    assert steps[0].reward_accuracy == 0.0 and steps[-1].reward_accuracy == 1.0 and r.reward_accuracy_slope > 0
    assert r.reward_margin_slope > 0 and r.rollback_step is None
    assert steps[0].logratio_std == 0.0 and steps[0].logratio_mean == 0.0  # the policy is the reference
    assert all(s.logratio_mean == pytest.approx(s.kl) for s in steps)
    assert r.logratio_std_max == pytest.approx(max(s.logratio_std for s in steps))
    assert r.eval_loss < steps[0].loss


def test_huge_lr_is_diverging_with_the_rollback_step(cfg_factory, tmp_path):
    out = run_trial(cfg_factory(micro_batch=16, worst_case_step=False, steps=12, lr=0.05, data=DATA), log=None)
    r = out.result
    assert r.status == "ok" and r.stability == "diverging"
    first = next(s.step for i, s in enumerate(out.steps)
                 if all(x.logratio_std > 1.5 for x in out.steps[i:i + 5]) and i + 5 <= len(out.steps))
    assert r.rollback_step == first + 4  # the fifth step in a row above 1.5
    write_results(tmp_path, [r])
    write_steps(tmp_path, out.steps)
    row = load_results(tmp_path).iloc[0]
    assert row["stability"] == "diverging" and row["rollback_step"] == r.rollback_step
    assert {"logratio_mean", "logratio_std", "beta", "grad_acc"} <= set(STEPS_COLUMNS)
    assert math.isfinite(row["loss_spread"])
