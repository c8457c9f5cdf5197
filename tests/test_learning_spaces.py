"""The learning-set-up spaces for the H200 (claims 7, 8 and 14), scaled down to the CPU: the same
space file with the tiny model in fp32, shorter sequences and fewer pairs must learn (the loss
falls) and fill the stability columns in the steps the space gives. The GPU run itself is
``bash benchmarks/h200_examples.sh llama-3.2-1b-learning-beta-lr llama-3.2-1b-learning-knobs``
(and ``llama-3.2-1b-learning-beta-schedule-ema``).

The learning rate is scaled by the width (Adam's per-weight step moves a wide layer's output more:
hidden 2048 / 128 = 16x for tiny-llama), so the tiny model at 16x the space's lr stands for the 1B
at the space's lr."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from dpo_sweep import space as space_mod
from dpo_sweep.core import stability
from dpo_sweep.train.loop import run_trial

ROOT = Path(__file__).resolve().parents[1]
BETA_LR = ROOT / "search_spaces/llama-3.2-1b-learning-beta-lr.yaml"
KNOBS = ROOT / "search_spaces/llama-3.2-1b-learning-knobs.yaml"
SCHEDULE_EMA = ROOT / "search_spaces/llama-3.2-1b-learning-beta-schedule-ema.yaml"
WIDTH_RATIO = 2048 // 128  # llama-3.2-1b hidden size over tiny-llama's
#: The CPU scale: tiny model, fp32, BOS + 16 + 14 + EOS = 32-token sequences, 32 pairs.
CPU_SCALE = ["model.preset=tiny-llama", "train.precision=fp32", "train.max_length=32",
             "data.synthetic.prompt_tokens=16", "data.synthetic.response_tokens=14", "data.synthetic.pairs=32"]


def _one_trial(path: Path, *pins: str):
    trials = space_mod.load(path, CPU_SCALE + list(pins)).trials
    assert len(trials) == 1, [t.trial_id for t in trials]
    return trials[0]


def _learned(out, cfg) -> None:
    r, steps = out.result, out.steps
    assert r.status == "ok", r.error
    assert len(steps) == cfg.train.steps >= stability.MIN_VERDICT_STEPS
    assert r.stability in stability.VERDICTS  # a verdict, not "" (too few steps)
    losses = [s.loss for s in steps]
    assert r.loss_slope < 0 and sum(losses[-3:]) / 3 < 0.8 * losses[0], losses  # 0.693 -> ~0.25-0.32 measured
    assert r.eval_loss < losses[0] and r.reward_accuracy_slope > 0
    assert all(math.isfinite(v) for v in (r.loss_spread, r.grad_norm_spike, r.logratio_std_max, r.reward_margin_slope))


def test_beta_lr_space_learns_on_the_cpu_at_the_width_scaled_lr():
    sp = space_mod.load(BETA_LR)
    lr = max(t.train.lr for t in sp.trials)
    cfg = _one_trial(BETA_LR, f"lr={lr * WIDTH_RATIO}", "beta=0.1", "micro_batch=4", "effective_batch=8")
    assert cfg.train.steps == sp.spec.train.steps and cfg.grad_acc == 2
    out = run_trial(cfg, log=None)
    _learned(out, cfg)


def test_knobs_space_learns_with_adaptive_clip_and_the_grad_acc_schedule_on_the_cpu():
    sp = space_mod.load(KNOBS)
    grad_acc = sp.trials[0].grad_acc
    cfg = _one_trial(KNOBS, f"lr={sp.spec.train.lr * WIDTH_RATIO}", "seed=1", "adaptive_clip=true",
                     "grad_acc_schedule=seed", "micro_batch=1", f"effective_batch={grad_acc}")
    out = run_trial(cfg, log=None)
    _learned(out, cfg)
    per_step = [s.grad_acc for s in out.steps]
    assert per_step[0] == grad_acc and per_step[-1] == grad_acc // 8  # the last 10%: G / 8


def test_beta_schedule_and_ema_space_learns_on_the_cpu():
    sp = space_mod.load(SCHEDULE_EMA)
    decay = max(t.train.ema_decay or 0.0 for t in sp.trials)
    cfg = _one_trial(SCHEDULE_EMA, f"lr={sp.spec.train.lr * WIDTH_RATIO}", "seed=2", "beta_schedule=seed",
                     f"ema_decay={decay}", "micro_batch=8", "effective_batch=8")
    out = run_trial(cfg, log=None)
    _learned(out, cfg)  # eval_loss is the EMA weights' loss here
    betas = [s.beta for s in out.steps]
    assert betas[0] == pytest.approx(cfg.beta) and max(betas) > 2.5 * cfg.beta and betas[-1] == pytest.approx(1.5 * cfg.beta)


def test_learning_spaces_hold_the_claims_set_ups():
    beta_lr, knobs = space_mod.load(BETA_LR).trials, space_mod.load(KNOBS).trials
    schedule_ema = space_mod.load(SCHEDULE_EMA).trials
    for t in (*beta_lr, *knobs, *schedule_ema):
        assert t.train.precision != "bf16", "pure bf16 rounds these updates away"
        assert t.train.steps >= max(stability.MIN_VERDICT_STEPS, stability.ROLLBACK_STEPS)
    # Claim 7: its betas, and lr = 5e-6 x effective_batch / 128 among the lr x batch cells.
    assert {t.beta for t in beta_lr} == {0.01, 0.1, 0.3, 0.5}
    assert any(math.isclose(t.train.lr, 5e-6 * t.effective_batch() / 128) for t in beta_lr)
    assert len({t.effective_batch() for t in beta_lr}) >= 2 and len({t.train.lr for t in beta_lr}) >= 2
    # Claims 8 and 14: seeds x adaptive clip x the grad-acc schedule, which needs G / 8 >= 1.
    assert {(t.train.adaptive_clip, t.train.grad_acc_schedule) for t in knobs} == {
        (False, "constant"), (False, "seed"), (True, "constant"), (True, "seed")}
    assert len({t.train.seed for t in knobs}) >= 3 and all(t.grad_acc >= 8 for t in knobs)
    assert {(t.train.beta_schedule, t.train.ema_decay is None) for t in schedule_ema} == {
        ("constant", True), ("constant", False), ("seed", True), ("seed", False)}
    assert len({t.train.seed for t in schedule_ema}) >= 3
