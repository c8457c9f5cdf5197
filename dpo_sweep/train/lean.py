"""Memory-lean autograd for RMSNorm and the SwiGLU MLP: the same maths, fewer saved tensors.

Autograd through the stock Hugging Face modules saves, per token and layer (bf16 model):

* RMSNorm: a float32 copy of its input and the bf16 normalised tensor (6H bytes), twice a layer;
* SwiGLU MLP: gate, silu(gate), up and their product (4 x intermediate_size values), plus the input.

:class:`LeanRMSNorm` saves the input and one float32 per token (rstd) and rebuilds the rest in
backward; :class:`LeanSwiGLU` saves the input, gate and up and recomputes silu(gate) and the
product, element-wise, in backward - no matmul is recomputed (that is what checkpoint level L1
does, at a higher price). On Llama-3.2-1B at 16 x 1024 tokens this frees about 4 + 8 GB.
The tests check values and gradients against the stock modules.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


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


class LeanSwiGLU(torch.autograd.Function):
    """``down(silu(gate(x)) * up(x))`` saving x, gate and up only (biases optional)."""

    @staticmethod
    def forward(ctx, x, wg, wu, wd, bg, bu, bd, cdt):  # type: ignore[override]
        xc, wgc, wuc, wdc = (t.to(cdt) for t in (x, wg, wu, wd))
        b = [t.to(cdt) if t is not None else None for t in (bg, bu, bd)]
        g = F.linear(xc, wgc, b[0])
        u = F.linear(xc, wuc, b[1])
        y = F.linear(F.silu(g) * u, wdc, b[2])
        ctx.save_for_backward(xc, g, u, wg, wu, wd)
        ctx.has_bias = tuple(t is not None for t in (bg, bu, bd))
        ctx.cdt, ctx.x_dtype = cdt, x.dtype
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, g, u, wg, wu, wd = ctx.saved_tensors
        cdt = ctx.cdt
        dy = dy.to(cdt)
        sg = torch.sigmoid(g)
        silu = g * sg
        h = silu * u                                 # recomputed: element-wise, no matmul
        dh = dy @ wd.to(cdt)
        du = dh * silu
        dg = dh * u * (sg * (1 + g * (1 - sg)))      # silu'(g) = s(g) (1 + g (1 - s(g)))
        del sg, silu
        flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
        dx = dg @ wg.to(cdt) + du @ wu.to(cdt)
        dwd = (flat(dy).t() @ flat(h)).to(wd.dtype)
        dwg = (flat(dg).t() @ flat(x)).to(wg.dtype)
        dwu = (flat(du).t() @ flat(x)).to(wu.dtype)
        bias = [flat(t).sum(0) if has else None for t, has in zip((dg, du, dy), ctx.has_bias)]
        return dx.to(ctx.x_dtype), dwg, dwu, dwd, *bias, None


def _norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    with torch.autocast(hidden_states.device.type, enabled=False):
        return LeanRMSNorm.apply(hidden_states, self.weight, self.variance_epsilon)


def _mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    cdt = _compute_dtype(x)
    with torch.autocast(x.device.type, enabled=False):
        return LeanSwiGLU.apply(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight,
                                self.gate_proj.bias, self.up_proj.bias, self.down_proj.bias, cdt)


def _is_hf_rmsnorm(m: nn.Module) -> bool:
    # Only the stock modules: a fused replacement (liger-kernel's) is lean already.
    return (type(m).__name__.endswith("RMSNorm") and type(m).__module__.startswith("transformers.")
            and hasattr(m, "variance_epsilon") and isinstance(getattr(m, "weight", None), torch.Tensor))


def _is_swiglu_mlp(m: nn.Module) -> bool:
    act = getattr(m, "act_fn", None)
    silu = isinstance(act, nn.SiLU) or type(act).__name__ in ("SiLUActivation", "SiLU")
    return silu and all(isinstance(getattr(m, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj"))


def apply_lean_ops(model: nn.Module) -> dict[str, int]:
    """Switch every stock RMSNorm and SwiGLU MLP of ``model`` to the lean autograd (in place).

    Returns how many modules of each kind were switched."""
    counts = {"rmsnorm": 0, "swiglu": 0}
    for m in model.modules():
        if _is_hf_rmsnorm(m):
            m.forward = types.MethodType(_norm_forward, m)
            counts["rmsnorm"] += 1
        elif _is_swiglu_mlp(m):
            m.forward = types.MethodType(_mlp_forward, m)
            counts["swiglu"] += 1
    return counts
