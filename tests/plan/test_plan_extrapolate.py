"""Step times extrapolated on the pairs of the real steps (plan/extrapolate.py)."""
import dataclasses
import math
import random

import pytest

from dpo_sweep.plan.extrapolate import MIN_REPEATED, computed_counts, extrapolate, fit_micro_steps, step_layout
from dpo_sweep.plan.shape import ModelShape
from dpo_sweep.plan.rows import fitted_step_ms
from dpo_sweep.records import StepRecord
from dpo_sweep.core.lengths import LengthProfile
from tests.testkit import make_cfg

SHAPE = ModelShape(n_params=10**9, n_layers=16, hidden=2048, intermediate=8192, n_heads=32, q_dim=2048,
                   kv_dim=512, vocab=128256, tied=True, attn_proj_params=0, mlp_params=0, arch="llama")
T_OPT, A_MS, B_MS_PER_TFLOP, FIRST = 40.0, 3.0, 2.5, -4.0


def long_tailed(n=400, seed=0):
    rng = random.Random(seed)
    p, c, r = ([min(2000, int(rng.lognormvariate(m, 0.9))) + 1 for _ in range(n)] for m in (5.0, 4.5, 4.5))
    return LengthProfile(tuple(p), tuple(c), tuple(r), tuple(a + max(b, d) for a, b, d in zip(p, c, r)))


def true_micro_ms(work, first):
    return A_MS + B_MS_PER_TFLOP * work / 1e12 + (FIRST if first else 0.0)


def measured_steps(cfg, lengths):
    """A trial of ``cfg`` on a machine whose micro-steps take exactly ``true_micro_ms``."""
    layout = step_layout(cfg, lengths, SHAPE)
    steps = []
    for s, step in enumerate(layout.works, start=1):
        micro = [true_micro_ms(w, j == 0) for j, w in enumerate(step[0])]
        steps.append(StepRecord(trial_id=cfg.trial_id, step=s, loss=0.6, grad_norm=1.0,
                                step_time_ms=T_OPT + sum(micro), peak_mem_gb=1.0, reward_accuracy=0.5,
                                reward_margin=0.0, logps_chosen=-1.0, logps_rejected=-1.0, kl=0.0,
                                measured=s > cfg.train.warmup_steps, micro_ms=",".join(f"{m:.6f}" for m in micro),
                                micro_step_ms=micro[-1], optimizer_ms=T_OPT))
    return steps


def test_on_long_tailed_lengths_the_real_steps_are_predicted_where_a_micro_step_average_is_not():
    lengths = long_tailed()
    full = make_cfg(micro_batch=2, grad_acc=16, steps=6, warmup_steps=2, max_length=4096)
    short = full.model_copy(update={"grad_acc": 2})
    fit = fit_micro_steps(measured_steps(short, lengths), step_layout(short, lengths, SHAPE).works, world=1, how="line")
    assert fit.intercept_ms == pytest.approx(A_MS, rel=1e-6) and fit.first_offset_ms == pytest.approx(FIRST)
    predicted = extrapolate(fit, full, step_layout(full, lengths, SHAPE))
    truth = sorted(s.step_time_ms for s in measured_steps(full, lengths) if s.measured)
    true_median = (truth[1] + truth[2]) / 2
    assert predicted.step_ms == pytest.approx(true_median, rel=1e-6)
    assert predicted.p10_ms <= true_median <= predicted.p90_ms
    # the old extrapolation: t_opt + grad_acc x the median micro-step of other pairs
    old = fitted_step_ms(measured_steps(short, lengths), 2, 16)
    assert abs(old / true_median - 1) > 0.05, (old, true_median)


def test_micro_steps_of_a_new_shape_are_left_out_of_the_fit_once_enough_others_remain():
    lengths = long_tailed(seed=4)
    short = make_cfg(micro_batch=2, grad_acc=4, steps=6, warmup_steps=1, max_length=4096)
    clean = measured_steps(short, lengths)
    works = step_layout(short, lengths, SHAPE).works
    stalled = []  # the second micro-step of every step pays 100 ms of plan building, flagged as new
    for s in clean:
        ms = [float(x) for x in s.micro_ms.split(",")]
        ms[1] += 100.0
        stalled.append(dataclasses.replace(s, micro_ms=",".join(map(str, ms)), micro_new="0100"))
    want = fit_micro_steps(clean, works, world=1, how="line")
    got = fit_micro_steps(stalled, works, world=1, how="line")
    assert got.intercept_ms == pytest.approx(want.intercept_ms, rel=1e-6)
    assert got.per_flop_ms == pytest.approx(want.per_flop_ms, rel=1e-6)
    # with fewer than MIN_REPEATED repeated micro-steps the flags are not trusted: all are fitted
    few = [dataclasses.replace(s, micro_new="1110") for s in stalled[:3]]
    assert sum(f == "0" for s in few for f in s.micro_new if s.measured) < MIN_REPEATED
    unflagged = [dataclasses.replace(s, micro_new="") for s in few]
    assert fit_micro_steps(few, works, world=1, how="line") == fit_micro_steps(unflagged, works, world=1, how="line")


def test_padding_is_computed_and_packing_is_not():
    lengths = LengthProfile((10, 2), (5, 30), (3, 1), (15, 32))
    padded = computed_counts(lengths, [0, 1], padding_free=False, chunked_head=True)
    assert padded.tokens == 4 * 32 and padded.head_rows == 5 + 3 + 30 + 1
    assert padded.causal_pairs == 4 * 32 * 32  # sdpa with a padding mask: the whole square of each row
    packed = computed_counts(lengths, [0, 1], padding_free=True, chunked_head=True, attn="flash_attention_2")
    assert packed.tokens == 15 + 13 + 32 + 3 and packed.causal_pairs == sum(n * (n + 1) // 2 for n in (15, 13, 32, 3))


def test_rows_rounded_up_to_the_pad_multiple_are_computed_at_that_width():
    lengths = LengthProfile((10, 2), (5, 30), (3, 1), (15, 32))
    rounded = computed_counts(lengths, [0, 1], padding_free=False, chunked_head=True, multiple=64)
    assert rounded.tokens == 4 * 64 and rounded.causal_pairs == 4 * 64 * 64
    assert rounded.head_rows == 5 + 3 + 30 + 1  # the real response tokens only
    # a GPU configuration's layout pads to 64 (auto); the same on the CPU does not
    long = long_tailed(seed=2)
    gpu = make_cfg(micro_batch=1, grad_acc=4, steps=2, max_length=4096, device="auto", resources={"use_gpu": "auto"})
    cpu = make_cfg(micro_batch=1, grad_acc=4, steps=2, max_length=4096)
    assert sum(map(sum, (w[0] for w in step_layout(gpu, long, SHAPE).works))) > \
        sum(map(sum, (w[0] for w in step_layout(cpu, long, SHAPE).works)))
    assert step_layout(gpu, long, SHAPE).tokens == step_layout(cpu, long, SHAPE).tokens  # real tokens: the same


def test_with_several_workers_the_synchronising_micro_step_counts_once_per_step():
    lengths = long_tailed(seed=3)
    full = make_cfg(micro_batch=2, grad_acc=32, steps=5, warmup_steps=1, max_length=4096,
                    resources={"use_gpu": False, "workers_per_trial": 2})
    short = full.model_copy(update={"grad_acc": 2})
    sync_ms = 30.0
    layout = step_layout(short, lengths, SHAPE)
    steps = []
    for s, step in enumerate(layout.works, start=1):
        micro = [true_micro_ms(w, j == 0) + (sync_ms if j == 1 else 0.0) for j, w in enumerate(step[0])]
        steps.append(StepRecord(trial_id="t", step=s, loss=0.6, grad_norm=1.0, step_time_ms=T_OPT + sum(micro),
                                peak_mem_gb=1.0, reward_accuracy=0.5, reward_margin=0.0, logps_chosen=-1.0,
                                logps_rejected=-1.0, kl=0.0, measured=s > 1,
                                micro_ms=",".join(f"{m:.6f}" for m in micro)))
    fit = fit_micro_steps(steps, layout.works, world=2, how="ratio")
    predicted = extrapolate(fit, full, step_layout(full, lengths, SHAPE))
    # at most one sync per step: well under 31 syncs (G - 1) of 30 ms each on top
    per_step_micro = [max(sum(true_micro_ms(w, j == 0) for j, w in enumerate(rank)) for rank in step)
                      for step in step_layout(full, lengths, SHAPE).works[1:]]
    assert predicted.step_ms < sorted(per_step_micro)[len(per_step_micro) // 2] + T_OPT + 2 * sync_ms
    assert math.isfinite(predicted.tokens_per_s) and predicted.tokens_per_s > 0


def test_a_stalled_micro_step_of_the_short_run_is_left_out_of_the_price():
    lengths = long_tailed(seed=5)
    full = make_cfg(micro_batch=2, grad_acc=16, steps=6, warmup_steps=2, max_length=4096)
    short = full.model_copy(update={"grad_acc": 4})
    layout = step_layout(short, lengths, SHAPE)
    steps = []
    for s, step in enumerate(layout.works, start=1):
        micro = [B_MS_PER_TFLOP * w / 1e12 for w in step[0]]
        if s == 4:
            micro[2] *= 10  # a one-off stall
        steps.append(StepRecord(trial_id="t", step=s, loss=0.6, grad_norm=1.0, step_time_ms=T_OPT + sum(micro),
                                peak_mem_gb=1.0, reward_accuracy=0.5, reward_margin=0.0, logps_chosen=-1.0,
                                logps_rejected=-1.0, kl=0.0, measured=s > 2, micro_ms=",".join(map(str, micro))))
    fit = fit_micro_steps(steps, layout.works, world=1, how="ratio")
    assert fit.per_flop_ms * 1e12 == pytest.approx(B_MS_PER_TFLOP, rel=1e-9)
