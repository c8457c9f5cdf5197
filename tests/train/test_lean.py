"""The lean RMSNorm / SwiGLU autograd computes what the stock modules compute."""
import copy

import pytest
import torch

from dpo_sweep.config import ModelSpec
from dpo_sweep.train.lean import apply_lean_ops
from dpo_sweep.train.loop import run_trial
from dpo_sweep.train.model import build_model
from testkit import AtenOps


@pytest.fixture(scope="module")
def layer():
    m = build_model(ModelSpec(preset="tiny-llama"), "fp32", torch.device("cpu"), seed=0).model
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # norm weights away from 1
    return m.model.layers[0]


def grads_of(module, x):
    x = x.clone().requires_grad_(True)
    y = module(x)
    (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("part", ["input_layernorm", "mlp"])
def test_lean_matches_stock_fp32(layer, part):
    stock = copy.deepcopy(getattr(layer, part))
    lean = copy.deepcopy(stock)
    assert sum(apply_lean_ops(lean).values()) == 1
    x = torch.randn(3, 5, 128, dtype=torch.float32)
    ys, gs, ws = grads_of(stock, x)
    yl, gl, wl = grads_of(lean, x)
    torch.testing.assert_close(yl, ys, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gl, gs, rtol=1e-5, atol=1e-6)
    for n in ws:
        torch.testing.assert_close(wl[n], ws[n], rtol=1e-5, atol=1e-5, msg=n)


@pytest.mark.parametrize("part", ["input_layernorm", "mlp"])
@pytest.mark.parametrize("dtype, autocast", [(torch.bfloat16, False), (torch.float32, True)], ids=["bf16", "autocast"])
def test_lean_as_accurate_as_stock_in_low_precision(layer, part, dtype, autocast):
    """In bf16 (pure, or autocast) both paths round; measured against float64, the lean one may
    not be more than 1.5x further off than the stock one (and keeps the stock dtypes)."""
    exact = grads_of(copy.deepcopy(getattr(layer, part)).double(), torch.randn(2, 7, 128, dtype=torch.float64,
                                                                                 generator=torch.Generator().manual_seed(1)))
    x = torch.randn(2, 7, 128, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).to(dtype)
    stock = copy.deepcopy(getattr(layer, part)).to(dtype)
    lean = copy.deepcopy(stock)
    apply_lean_ops(lean)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        ys, gs, ws = grads_of(stock, x)
        yl, gl, wl = grads_of(lean, x)
    assert yl.dtype == ys.dtype and gl.dtype == gs.dtype

    def err(a, b):
        return (a.double() - b).abs().max().item()

    for got, want, ref in [(yl, ys, exact[0]), (gl, gs, exact[1])] + [(wl[n], ws[n], exact[2][n]) for n in ws]:
        assert got.dtype == want.dtype
        assert err(got, ref) <= 1.5 * err(want, ref) + 1e-3 * ref.abs().max().item()


def test_apply_counts_every_norm_and_mlp():
    m = build_model(ModelSpec(preset="tiny-llama"), "fp32", torch.device("cpu"), seed=0).model
    assert apply_lean_ops(m) == {"rmsnorm": 2 * 4 + 1, "swiglu": 4}


def test_trial_with_and_without_lean_ops_agree(cfg_factory):
    runs = [run_trial(cfg_factory(micro_batch=2, steps=3, model={"preset": "tiny-llama", "lean_ops": lean}), log=None)
            for lean in (True, False)]
    a, b = ([(s.loss, s.grad_norm) for s in r.steps] for r in runs)
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=1e-6)


def test_liger_auto_is_off_on_cpu_and_true_is_refused_there():
    from dpo_sweep.errors import UserError
    from dpo_sweep.train.model import resolve_liger

    cpu = torch.device("cpu")
    assert resolve_liger(ModelSpec(preset="tiny-llama"), cpu) is False
    assert resolve_liger(ModelSpec(preset="tiny-llama", liger_kernel=False), cpu) is False
    with pytest.raises(UserError, match="liger_kernel: true needs a CUDA GPU"):
        resolve_liger(ModelSpec(preset="tiny-llama", liger_kernel=True), cpu)


def test_lean_mlp_with_frozen_weights_matches_stock_and_makes_no_weight_grads(layer):
    """A frozen MLP (LoRA's base where the MLP has no adapters): the same input gradient, no
    gradient for the weights, and no matmul spent on them."""
    stock = copy.deepcopy(layer.mlp).requires_grad_(False)
    lean = copy.deepcopy(stock)
    apply_lean_ops(lean)
    x = torch.randn(3, 5, 128, dtype=torch.float32)
    ys, gs, ws = grads_of(stock, x)
    ops = AtenOps()
    with ops:
        yl, gl, wl = grads_of(lean, x)
    torch.testing.assert_close(yl, ys, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gl, gs, rtol=1e-5, atol=1e-6)
    assert ws == wl == {}
    # forward: gate, up, down; backward: d down-input and d x (two): no weight-gradient matmul
    assert sum(n.startswith(("aten.mm", "aten.addmm", "aten.bmm")) for n in ops.names) == 6


def test_lean_mlp_skips_peft_lora_layers_and_tensor_subclass_weights(layer):
    from dpo_sweep.config import TrainSpec
    from dpo_sweep.train.adapters import apply_adapter

    m = build_model(ModelSpec(preset="tiny-llama"), "fp32", torch.device("cpu"), seed=0).model
    apply_adapter(m, TrainSpec(adapter="lora", lora_targets=("q_proj", "down_proj")))
    counts = apply_lean_ops(m)
    assert counts["swiglu"] == 0 and counts["rmsnorm"] == 9  # every MLP has an adapted down_proj

    class Subclass(torch.Tensor):  # stands for an NF4 weight
        pass

    mlp = copy.deepcopy(layer.mlp)
    mlp.gate_proj.weight = torch.nn.Parameter(mlp.gate_proj.weight.detach().as_subclass(Subclass),
                                              requires_grad=False)
    assert apply_lean_ops(mlp)["swiglu"] == 0
