"""Memory levers on the trained model: LoRA and QLoRA adapters (peft) and the optimizer.

``train.adapter``:

* ``full`` - every weight is trained; the live reference is a frozen copy (train/setup.py).
* ``lora`` - peft's ``get_peft_model`` puts adapters on ``train.lora_targets`` and freezes every
  other weight; ``auto`` is the family's own linear layers of attention and MLP (models/family.py:
  Phi-3's fused ``qkv_proj``, GPT-2's ``Conv1D`` ``c_attn``, ...); an MoE's 3-D expert weights
  are no linear layer, so they stay frozen (and naming them is refused with that reason). The adapters are made in the weights' dtype (``autocast_adapter_dtype=False``:
  pure bf16 keeps bf16 adapters, as it keeps bf16 weights; fp32 master weights get fp32
  adapters), so an adapter never casts its input to another dtype and saves no second copy of it.
  peft injects the adapters into the model's own modules, so the checkpoint levels, lean ops and
  the chunked head see the same Hugging Face model as without adapters.
* ``qlora`` - ``lora`` on a base whose decoder linear weights are torchao NF4 (4-bit NormalFloat,
  blockwise scaled, as torchtune's QLoRA): ``F.linear`` on an NF4 weight dequantises it to the
  input's dtype in the forward and again in the backward, so compute is bf16/fp32 and only the
  4-bit copy is kept. The embedding, the norms and the lm_head stay in the weights' dtype.

The reference of a LoRA/QLoRA trial is the policy with its adapters disabled
(:class:`AdaptersOff`, peft's ``disable_adapter()``), never a second copy of the weights. Before
the first update lora_B is zero, so the policy equals its reference exactly and the step-1 loss
is ln 2. With QLoRA the reference is the *quantised* base: both log-probs of a log-ratio come
from the NF4 weights, not from the original model (docs/memory-levers.md).

``train.optimizer``: ``adamw`` (torch's, fused on CUDA), ``adamw_8bit`` / ``adamw_4bit``
(``torchao.optim.AdamW8bit`` / ``AdamW4bit``: both moments stored in 8 or 4 bits with a scale per
block of 256 / 128 values; each parameter's update is a torch.compile'd function, compiled in
the first steps). Both low-bit ones run on CUDA only (refusals.CUDA_LEVERS).
``train.optimizer_in_backward``: that optimizer per parameter, stepped in its gradient hook
(:class:`InBackwardOptimizer`).
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import torch
from torch import nn

from dpo_sweep.config import TrainSpec
from dpo_sweep.errors import UserError
from dpo_sweep.train.checkpointing import decoder_layers
from dpo_sweep.models.family import family_of, peft_target_modules, refused_lora_targets

#: torchao's NF4 blocks: one scale per 64 values, the scales quantised in blocks of 256.
NF4_BLOCK = 64
NF4_SCALER_BLOCK = 256
#: Where ``to_nf4`` lives: torchao 0.18 moved it out of ``torchao.dtypes.nf4tensor``.
_NF4_MODULES = ("torchao.quantization.quantize_.workflows.nf4.nf4_tensor", "torchao.dtypes.nf4tensor")


def require_package(name: str, why: str) -> Any:
    """Import ``name`` or raise a UserError that names the ``pip install`` that adds it."""
    if importlib.util.find_spec(name) is None:
        raise UserError(f"{why} needs the {name} package, which is not installed; pip install {name}")
    return importlib.import_module(name)


def apply_adapter(model: nn.Module, train: TrainSpec) -> Any | None:
    """Put ``train.adapter``'s adapters on ``model`` in place; the peft model that switches them
    (None for ``full``). ``model`` itself stays the module to run: peft injects into its layers."""
    if train.adapter == "full":
        return None
    peft = require_package("peft", f"train.adapter: {train.adapter}")
    fam = family_of(model)
    refused = refused_lora_targets(fam, train.lora_targets)
    if refused:
        raise UserError(refused)
    lora = peft.LoraConfig(r=train.lora_r, lora_alpha=train.lora_alpha, lora_dropout=train.lora_dropout,
                           target_modules=peft_target_modules(fam, train.lora_targets), bias="none")
    peft_model = peft.get_peft_model(model, lora, autocast_adapter_dtype=False)
    if train.adapter == "qlora":
        quantize_base_nf4(model)
    return peft_model


def _nf4_fits(weight: torch.Tensor) -> bool:
    n = weight.numel()
    return n % NF4_BLOCK == 0 and (n // NF4_BLOCK) % NF4_SCALER_BLOCK == 0


def _to_nf4() -> Any:
    require_package("torchao", "train.adapter: qlora")
    for name in _NF4_MODULES:
        try:
            return importlib.import_module(name).to_nf4
        except (ImportError, AttributeError):
            continue
    raise UserError(f"train.adapter: qlora: this torchao has no to_nf4 at {' or '.join(_NF4_MODULES)}; "
                    "pip install 'torchao>=0.12'")


def quantize_base_nf4(model: nn.Module) -> int:
    """Replace every frozen linear weight of the decoder layers with its NF4 form (bf16 before
    quantising, as torchtune does); returns how many were converted. A weight whose size does
    not divide into NF4's blocks (only tiny test shapes) stays as it is. Call after the adapters
    are made: they are the trainable linears, and stay as they are."""
    to_nf4 = _to_nf4()
    converted = 0
    for layer in decoder_layers(model):
        for m in layer.modules():
            if isinstance(m, nn.Linear) and not m.weight.requires_grad and _nf4_fits(m.weight):
                m.weight = nn.Parameter(to_nf4(m.weight.detach().to(torch.bfloat16), NF4_BLOCK, NF4_SCALER_BLOCK),
                                        requires_grad=False)
                converted += 1
    if converted and next(model.parameters()).is_cuda:
        # The bf16 weights were freed into the caching allocator: give them back to the driver,
        # or NVML's device-used peak keeps them for the whole trial.
        torch.cuda.empty_cache()
    return converted


class AdaptersOff(nn.Module):
    """A log-prob module run with the peft model's adapters disabled: the LoRA/QLoRA reference,
    sharing every weight with the policy. Call it under ``no_grad`` (the loop and the precompute
    do). The policy's modules may be in train mode: with its adapters off a peft layer is its base
    layer (no adapter dropout), and the decoder's own dropout is 0 in the supported models."""

    def __init__(self, logps: nn.Module, peft_model: Any):
        super().__init__()
        self.logps = logps
        self._peft = [peft_model]  # a list: not registered as a submodule (it holds the same weights)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self._peft[0].disable_adapter():
            return self.logps(*args, **kwargs)


def reference_view(logps: nn.Module, peft_model: Any | None) -> nn.Module:
    """The reference's log-prob module: ``logps`` itself for full fine-tuning, else ``logps``
    with the adapters disabled."""
    return logps if peft_model is None else AdaptersOff(logps, peft_model)


def build_optimizer(params: tuple[nn.Parameter, ...], train: TrainSpec, device: torch.device) -> torch.optim.Optimizer:
    """``train.optimizer`` over ``params``, with train's lr, betas, eps and weight decay."""
    kw = dict(lr=train.lr, betas=train.adam_betas, eps=train.adam_eps, weight_decay=train.weight_decay)
    if train.optimizer == "adamw":
        return torch.optim.AdamW(params, fused=device.type == "cuda", **kw)
    if device.type != "cuda":
        raise UserError(f"train.optimizer: {train.optimizer} runs on a CUDA GPU only (torchao's low-bit "
                        f"AdamW); this trial runs on {device}: use optimizer: adamw")
    require_package("torchao", f"train.optimizer: {train.optimizer}")
    low_bit = importlib.import_module("torchao.optim")
    cls = low_bit.AdamW8bit if train.optimizer == "adamw_8bit" else low_bit.AdamW4bit
    # torchao keeps each group's lr as a tensor; LambdaLR fills it in place (it does so for tensors).
    return cls(params, **kw)


def refuse_cpu_levers(train: TrainSpec, device: torch.device) -> None:
    """UserError when ``train`` asks for a CUDA-only lever and the trial runs on ``device``."""
    from dpo_sweep.refusals import cuda_levers

    levers = cuda_levers(train)
    if levers and device.type != "cuda":
        raise UserError(f"train.{', train.'.join(levers)} runs on a CUDA GPU only (torchao); this trial "
                        f"runs on {device}: use adapter: lora or full and optimizer: adamw")


class InBackwardOptimizer(torch.optim.Optimizer):
    """``train.optimizer_in_backward``: one optimizer per parameter, stepped in that parameter's
    post-accumulate-grad hook, so each gradient is freed as soon as it is made and all of them are
    never alive at once. The trial's scheduler and scaler see this object: its ``param_groups``
    are the per-parameter optimizers' own groups (a schedule's lr reaches them), and ``step`` /
    ``zero_grad`` have nothing left to do. The gradient norm is summed in the hooks, before each
    step (:meth:`take_grad_norm`). Valid with one micro-step per optimizer step, no global
    clipping and no loss scaling only (refusals.refused_optimizer_in_backward)."""

    def __init__(self, params: tuple[nn.Parameter, ...], train: TrainSpec, device: torch.device):
        self._inner = [build_optimizer((p,), train, device) for p in params]
        # Optimizer.__init__ is not called: the groups are the inner optimizers' (the same dicts).
        self.param_groups = [g for opt in self._inner for g in opt.param_groups]
        self.defaults = dict(self._inner[0].defaults) if self._inner else {}
        self.state = {}
        self._sq_norm = torch.zeros((), dtype=torch.float32, device=device)
        self._handles = [p.register_post_accumulate_grad_hook(self._hook(opt)) for p, opt in zip(params, self._inner)]

    def _hook(self, opt: torch.optim.Optimizer):
        def step_now(p: torch.Tensor) -> None:
            self._sq_norm += p.grad.detach().float().pow(2).sum()
            opt.step()
            opt.zero_grad(set_to_none=True)  # this gradient's memory is free for the rest of backward
        return step_now

    def take_grad_norm(self) -> torch.Tensor:
        """The total gradient norm of the step just taken (and reset for the next)."""
        norm = self._sq_norm.sqrt()
        self._sq_norm = torch.zeros_like(self._sq_norm)
        return norm

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # every parameter stepped in backward already
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:  # the hooks freed every gradient
        return None
