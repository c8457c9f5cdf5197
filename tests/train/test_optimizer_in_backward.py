"""train.optimizer_in_backward: each parameter stepped in its gradient hook gives the updates of
stepping after backward, never holds more than one gradient, and is refused where it cannot be
the same update (accumulation, global clipping, loss scaling, several workers)."""
import pytest
import torch

from dpo_sweep import space as space_mod
from dpo_sweep.config import TrainSpec
from dpo_sweep.errors import SpaceError
from dpo_sweep.plan.memory import predict_peak_gb
from dpo_sweep.train.adapters import InBackwardOptimizer
from dpo_sweep.train.loop import run_trial
from testkit import make_cfg

CPU = torch.device("cpu")


@pytest.mark.parametrize("adapter", ["full", "lora"])
def test_in_backward_gives_the_updates_of_stepping_after_backward(adapter):
    kw = dict(micro_batch=2, steps=3, max_grad_norm=None, adapter=adapter, lr_schedule="linear", lora_r=4)
    after = run_trial(make_cfg(**kw), log=None)
    during = run_trial(make_cfg(optimizer_in_backward=True, **kw), log=None)
    assert during.result.status == "ok", during.result.error
    got = torch.tensor([[s.loss, s.logps_chosen, s.lr] for s in during.steps], dtype=torch.float64)
    want = torch.tensor([[s.loss, s.logps_chosen, s.lr] for s in after.steps], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    # the norm is summed in float32 in the hooks, clip_grad_norm_'s over the stacked norms
    torch.testing.assert_close(torch.tensor([s.grad_norm for s in during.steps]),
                               torch.tensor([s.grad_norm for s in after.steps]), rtol=1e-5, atol=0)


def test_at_most_one_gradient_is_alive_during_backward():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    params = tuple(model.parameters())
    before = [p.detach().clone() for p in params]
    opt = InBackwardOptimizer(params, TrainSpec(lr=0.1), CPU)
    alive = []
    for p in params:  # registered after the optimizer's hooks: they see each gradient before its step
        p.register_post_accumulate_grad_hook(lambda _p: alive.append(sum(q.grad is not None for q in params)))
    model(torch.randn(4, 8)).sum().backward()
    assert all(p.grad is None for p in params)  # each freed by its own step
    assert max(alive) == 0  # the optimizer's hook ran first and freed it: no gradient outlives its step
    assert all(not torch.equal(p, b) for p, b in zip(params, before))  # every parameter stepped
    assert float(opt.take_grad_norm()) > 0 and float(opt.take_grad_norm()) == 0


@pytest.mark.parametrize("train, grad_acc, refused", [
    ({"max_grad_norm": None}, 2, "grad_acc 2"),
    ({}, 1, "train.max_grad_norm 1.0"),
    ({"max_grad_norm": None, "adaptive_clip": True}, 1, "train.adaptive_clip"),
    ({"max_grad_norm": None, "precision": "fp16"}, 1, "train.precision: fp16"),
    ({"max_grad_norm": None, "grad_acc_schedule": "seed"}, 1, "train.grad_acc_schedule: seed"),
])
def test_in_backward_is_refused_where_it_would_change_the_update(train, grad_acc, refused):
    raw = {"name": "x", "model": {"preset": "tiny-llama"}, "data": {"synthetic": {"pairs": 16}},
           "train": {"optimizer_in_backward": True, **train}, "search": {"micro_batch": [2], "grad_acc": [grad_acc]}}
    with pytest.raises(SpaceError, match=f"train.optimizer_in_backward: true is refused with .*{refused}"):
        space_mod.parse(raw)


def test_in_backward_is_refused_with_several_workers():
    raw = {"name": "x", "model": {"preset": "tiny-llama"}, "data": {"synthetic": {"pairs": 16}},
           "train": {"optimizer_in_backward": True, "max_grad_norm": None}, "resources": {"workers_per_trial": 2},
           "search": {"micro_batch": [2]}}
    with pytest.raises(SpaceError, match="resources.workers_per_trial 2"):
        space_mod.parse(raw)


def test_memory_model_holds_one_gradient_at_a_time():
    base = dict(micro_batch=1, max_grad_norm=None, grad_acc=1, max_length=8)  # few activations: backward end wins
    after, during = predict_peak_gb(make_cfg(**base)), predict_peak_gb(make_cfg(optimizer_in_backward=True, **base))
    assert after.peak_at == "backward end" and after.grads_gb == after.weights_gb
    assert during.total_gb < after.total_gb
    vocab_x_hidden = 512 * 128 * 4  # the tiny shape's largest weight (embedding, lm_head), fp32
    assert during.grads_gb * 1e9 <= vocab_x_hidden
