"""Memory-lean autograd for RMSNorm and the SwiGLU MLP: the same maths, fewer saved tensors.

Autograd through the stock Hugging Face modules saves, per token and layer (bf16 model):

* RMSNorm: a float32 copy of its input and the bf16 normalised tensor (6H bytes), twice a layer;
* SwiGLU MLP: gate, silu(gate), up and their product (4 x intermediate_size values), plus the input.

:class:`LeanRMSNorm` saves the input and one float32 per token (rstd) and rebuilds the rest in
backward; :class:`LeanSwiGLU` saves the input, gate and up and recomputes silu(gate) and the
product, element-wise, in backward - no matmul is recomputed (that is what checkpoint level L1
does, at a higher price). What that frees is measured in
benchmarks/results/trainer_h200/vs-trl-first-run/trainer_h200.md (the "lean ops off" row). The
tests check values and gradients against the stock modules.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn

from dpo_sweep.models.family import is_llama_rmsnorm, is_llama_swiglu
from dpo_sweep.train.logprobs import compute_dtype


class LeanRMSNorm(torch.autograd.Function):
    """``weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)``, computed in float32 as in HF."""

    @staticmethod
    def forward(ctx, x, weight, eps):  # type: ignore[override]
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return weight * (xf * rstd).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, weight, rstd = ctx.saved_tensors
        n = x.float() * rstd
        dw = None
        if ctx.needs_input_grad[1]:
            dw = (dy.float() * n.to(x.dtype).float()).reshape(-1, n.shape[-1]).sum(0).to(weight.dtype)
        dn = dy.float() * weight.float()
        dx = rstd * (dn - n * (dn * n).mean(-1, keepdim=True))
        return dx.to(x.dtype), dw, None


def _torch_silu_mul(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return F.silu(g) * u


def _torch_silu_mul_backward(g: torch.Tensor, u: torch.Tensor, dh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    sg = torch.sigmoid(g)
    silu = g * sg
    du = dh * silu
    dg = dh * u * (sg * (1 + g * (1 - sg)))  # silu'(g) = s(g) (1 + g (1 - s(g)))
    return dg, du


def _fused_elementwise():
    """liger-kernel's Triton SiLU-mul forward/backward (one kernel each instead of ~8), or None."""
    try:
        from liger_kernel.ops.swiglu import swiglu_backward, swiglu_forward
    except ImportError:
        return None

    def fwd(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        return swiglu_forward(g.contiguous(), u.contiguous())[2]

    def bwd(g: torch.Tensor, u: torch.Tensor, dh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # liger writes (d gate, d up) over g and u: they are this Function's own saved tensors,
        # needed for nothing else, so this saves two I-wide buffers.
        return swiglu_backward(g.contiguous(), u.contiguous(), dh.contiguous())

    return fwd, bwd


class LeanSwiGLU(torch.autograd.Function):
    """``down(silu(gate(x)) * up(x))`` saving x, gate and up only (biases optional).

    ``fused`` (on CUDA, with liger-kernel) computes ``silu(g) * u`` and its backward with
    liger's Triton kernels; otherwise plain torch element-wise ops. The backward overwrites the
    saved gate and up with their gradients when fused (they are not needed afterwards).
    """

    @staticmethod
    def forward(ctx, x, wg, wu, wd, bg, bu, bd, cdt, fused):  # type: ignore[override]
        xc, wgc, wuc, wdc = (t.to(cdt) for t in (x, wg, wu, wd))
        b = [t.to(cdt) if t is not None else None for t in (bg, bu, bd)]
        g = F.linear(xc, wgc, b[0])
        u = F.linear(xc, wuc, b[1])
        silu_mul = fused[0] if fused else _torch_silu_mul
        y = F.linear(silu_mul(g, u), wdc, b[2])
        ctx.save_for_backward(xc, g, u, wg, wu, wd)
        ctx.has_bias = tuple(t is not None for t in (bg, bu, bd))
        ctx.cdt, ctx.x_dtype, ctx.fused = cdt, x.dtype, fused
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, g, u, wg, wu, wd = ctx.saved_tensors
        cdt = ctx.cdt
        dy = dy.to(cdt)
        silu_mul, silu_mul_backward = ctx.fused or (_torch_silu_mul, _torch_silu_mul_backward)
        h = silu_mul(g, u)                           # recomputed: element-wise, no matmul
        flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
        # A frozen weight (LoRA's base on a layer without adapters) gets no gradient: no matmul for it.
        need_wg, need_wu, need_wd = ctx.needs_input_grad[1:4]
        dwd = (flat(dy).t() @ flat(h)).to(wd.dtype) if need_wd else None
        del h
        dh = dy @ wd.to(cdt)
        dg, du = silu_mul_backward(g, u, dh)
        del dh
        dx = dg @ wg.to(cdt) + du @ wu.to(cdt)
        dwg = (flat(dg).t() @ flat(x)).to(wg.dtype) if need_wg else None
        dwu = (flat(du).t() @ flat(x)).to(wu.dtype) if need_wu else None
        bias = [flat(t).sum(0) if has else None for t, has in zip((dg, du, dy), ctx.has_bias)]
        return dx.to(ctx.x_dtype), dwg, dwu, dwd, *bias, None, None


def _norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    with torch.autocast(hidden_states.device.type, enabled=False):
        return LeanRMSNorm.apply(hidden_states, self.weight, self.variance_epsilon)


def _mlp_forward(self: nn.Module, x: torch.Tensor, fused=None) -> torch.Tensor:
    cdt = compute_dtype(x)
    with torch.autocast(x.device.type, enabled=False):
        return LeanSwiGLU.apply(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight,
                                self.gate_proj.bias, self.up_proj.bias, self.down_proj.bias, cdt,
                                fused if x.is_cuda else None)


def _is_hf_rmsnorm(m: nn.Module) -> bool:
    # Only the stock modules whose forward is Llama's (models/family.py reads it from their code: not
    # Gemma's 1 + weight, OLMo-2's order, gated norms); a fused replacement (liger-kernel's) is lean already.
    return (type(m).__name__.endswith("RMSNorm") and is_llama_rmsnorm(m)
            and isinstance(getattr(m, "weight", None), torch.Tensor))


def _is_swiglu_mlp(m: nn.Module) -> bool:
    # Llama's MLP forward only (models/family.py): not Falcon-H1's multipliers, GELU or fused gate/up.
    # Plain nn.Linear with plain weights only: a peft LoRA layer is not one (the lean forward would
    # read its base weight and skip the adapter), nor is a linear with an NF4 weight (QLoRA).
    linears = [getattr(m, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    return is_llama_swiglu(m) and all(type(x) is nn.Linear and type(x.weight) in (torch.Tensor, nn.Parameter)
                                      for x in linears)


def apply_lean_ops(model: nn.Module, fused_kernels: bool = False) -> dict[str, int]:
    """Switch every stock RMSNorm and SwiGLU MLP of ``model`` to the lean autograd (in place).

    ``fused_kernels``: use liger-kernel's Triton SiLU-mul kernels inside the lean MLP on CUDA.
    Returns how many modules of each kind were switched."""
    import functools

    fused = _fused_elementwise() if fused_kernels else None
    counts = {"rmsnorm": 0, "swiglu": 0}
    for m in model.modules():
        if _is_hf_rmsnorm(m):
            m.forward = types.MethodType(_norm_forward, m)
            counts["rmsnorm"] += 1
        elif _is_swiglu_mlp(m):
            m.forward = types.MethodType(functools.partial(_mlp_forward, fused=fused), m)
            counts["swiglu"] += 1
    return counts
