"""The stability knobs (dpo_sweep/train/knobs.py): each piece against hand-worked values, then
wired into a CPU trial."""
from __future__ import annotations

import math
import weakref

import pytest
import torch

from dpo_sweep.train import knobs
from dpo_sweep.train.loop import run_trial


def test_seed_beta_is_the_articles_schedule():
    total = 100
    assert knobs.seed_beta(1, total) == pytest.approx(0.1)  # warm-up starts at 0.1 ...
    assert knobs.seed_beta(6, total) == pytest.approx(0.2)  # ... linear: p = 0.05 -> 0.2
    assert knobs.seed_beta(10, total) == pytest.approx(0.1 + 0.2 * 0.09 / 0.1)  # ... towards 0.3
    assert knobs.seed_beta(11, total) == pytest.approx(0.2 + 0.1 * math.cos(2 * math.pi * 0.1))
    assert knobs.seed_beta(51, total) == pytest.approx(0.1)  # cos(pi) = -1
    assert knobs.seed_beta(95, total) == pytest.approx(0.2 + 0.1 * math.cos(2 * math.pi * 0.94))
    assert knobs.seed_beta(96, total) == knobs.seed_beta(100, total) == pytest.approx(0.15)  # last 5%
    assert knobs.seed_beta(51, total, beta=0.2) == pytest.approx(0.2)  # scaled by beta / 0.1


def _param_with_grads(norms: list[float]) -> tuple[torch.nn.Parameter, list[torch.Tensor]]:
    p = torch.nn.Parameter(torch.zeros(4))
    grads = [torch.full((4,), n / 2.0) for n in norms]  # |(n/2, n/2, n/2, n/2)| = n
    return p, grads


def test_adaptive_clip_clips_each_parameter_at_the_p90_of_its_recent_norms():
    p, grads = _param_with_grads([1.0, 2.0, 3.0, 4.0, 5.0, 100.0, 0.5])
    q, q_grads = _param_with_grads([10.0] * 7)  # a second parameter keeps its own history
    clip = knobs.AdaptiveClip([p, q], window=5, min_history=5)
    seen = []
    for g, h in zip(grads, q_grads):
        p.grad, q.grad = g.clone(), h.clone()
        clip.clip_()
        seen.append((float(p.grad.norm()), float(q.grad.norm())))
    assert [s[0] for s in seen[:5]] == pytest.approx([1.0, 2.0, 3.0, 4.0, 5.0])  # 5 norms before clipping
    assert seen[5][0] == pytest.approx(float(torch.quantile(torch.tensor([1.0, 2, 3, 4, 5]), 0.9)))  # 4.6
    # The window now holds the unclipped 2, 3, 4, 5, 100: P90 = 61.8 does not touch 0.5.
    assert seen[6][0] == pytest.approx(0.5)
    assert all(s[1] == pytest.approx(10.0) for s in seen)


def test_weight_ema_averages_with_its_decay():
    p = torch.nn.Parameter(torch.tensor([0.0]))
    ema = knobs.WeightEma([p], decay=0.9)
    expected = 0.0
    for w in (1.0, 2.0, 3.0):
        with torch.no_grad():
            p.fill_(w)
        ema.update()
        expected = 0.9 * expected + 0.1 * w
    ema.copy_to_params()
    assert float(p.detach()) == pytest.approx(expected)  # 0.561


def test_kl_is_stable_needs_three_small_relative_changes():
    assert not knobs.kl_is_stable([0.0, 0.01, 0.02])  # too few steps
    assert not knobs.kl_is_stable([0.0, 0.01, 0.02, 0.03])  # grows 50-100% a step
    assert knobs.kl_is_stable([0.0, 0.100, 0.105, 0.110, 0.115])
    assert not knobs.kl_is_stable([0.100, 0.105, 0.110, 0.150])


def test_grad_acc_schedule_32_16_4():
    sched = knobs.GradAccSchedule("seed", grad_acc=32, total_steps=20)
    got = []
    kls = [0.0, 0.05, 0.08, 0.1, 0.101, 0.102, 0.103] + [0.103] * 13
    for step, kl in enumerate(kls, start=1):
        got.append(sched.for_step(step))
        sched.observe(kl)
    # stable once the 3 changes into step 7 are within 10%: step 8 on runs 16; the last 10% (19, 20) 4
    assert got == [32] * 7 + [16] * 11 + [4] * 2
    assert knobs.GradAccSchedule("constant", 8, 20).for_step(20) == 8


def test_knobs_run_in_a_trial(cfg_factory):
    data = {"synthetic": {"pairs": 32, "prompt_tokens": 12, "response_tokens": 10}}
    plain = run_trial(cfg_factory(micro_batch=2, grad_acc=8, worst_case_step=False, steps=10, data=data), log=None)
    tuned = run_trial(cfg_factory(micro_batch=2, grad_acc=8, worst_case_step=False, steps=10, data=data, beta_schedule="seed",
                                  adaptive_clip=True, adaptive_clip_window=4, ema_decay=0.5,
                                  grad_acc_schedule="seed"), log=None)
    assert tuned.result.status == "ok"
    assert [s.beta for s in tuned.steps] == pytest.approx([knobs.seed_beta(k, 10) for k in range(1, 11)])
    assert [s.beta for s in plain.steps] == [0.1] * 10 and [s.grad_acc for s in plain.steps] == [8] * 10
    acc = [s.grad_acc for s in tuned.steps]
    assert acc[0] == 8 and acc[-1] == 1 and set(acc) <= {8, 4, 1}  # 8 until KL is stable, 4, then 1
    assert math.isfinite(plain.result.eval_loss) and math.isfinite(tuned.result.eval_loss)


def test_ema_weights_are_the_final_weights(cfg_factory):
    # decay -> 1 keeps the EMA at the initial weights: the held-batch loss is then the untrained
    # policy's against itself, ln 2 exactly, while the trained weights score below it.
    trained = run_trial(cfg_factory(micro_batch=4, worst_case_step=False, steps=4), log=None).result
    frozen = run_trial(cfg_factory(micro_batch=4, worst_case_step=False, steps=4, ema_decay=1 - 1e-12), log=None).result
    assert frozen.eval_loss == pytest.approx(math.log(2), abs=1e-6)
    assert trained.eval_loss < math.log(2) - 1e-3


def test_weight_ema_update_holds_one_float32_copy_at_a_time(monkeypatch):
    """The update converts one bf16 parameter at a time: never a float32 copy of them all at once."""
    params = [torch.nn.Parameter(torch.randn(64, 64).bfloat16()) for _ in range(8)]
    ema = knobs.WeightEma(params, decay=0.5)
    alive, peak = [0], [0]
    real_float = torch.Tensor.float

    def tracked_float(self):
        out = real_float(self)
        if self.dtype == torch.bfloat16:
            alive[0] += 1
            peak[0] = max(peak[0], alive[0])
            weakref.finalize(out, lambda: alive.__setitem__(0, alive[0] - 1))
        return out

    monkeypatch.setattr(torch.Tensor, "float", tracked_float)
    ema.update()
    assert peak[0] == 1
