"""What a family's CausalLM forward does around its decoder, read from the model itself.

The trainer's log-prob head (:mod:`dpo_sweep.train.logprobs`) runs the decoder and then the
lm_head weight itself, chunk by chunk, instead of the model's own forward: so whatever that
forward does after the decoder has to be done here too, or the distribution trained is not the
model's. Three things, each found from the model rather than from a list of families:

* :func:`decoder`: the module whose first output is the final hidden states - ``base_model``, or
  where a CausalLM is its own base model (Llama-4 text), its one child that is a model;
* :func:`head_transform`: what the forward does to the logits - soft-capping (Gemma-2/3/4
  ``final_logit_softcapping``) and scales (Cohere ``logit_scale``, Granite ``logits_scaling``,
  Falcon-H1 ``lm_head_multiplier``) - each applied when the config holds the attribute *and* the
  family's forward reads it, the operator (multiply or divide) read from that source;
* :func:`router_aux`: an MoE's load-balancing loss, where the config asks for router logits.

A transform of a kind not listed here is not guessed at: the parity check
(:mod:`dpo_sweep.train.parity`) compares these log-probs with the model's own ``forward().logits``
and refuses the configuration when they differ.
"""
from __future__ import annotations

import inspect
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

#: Config attributes a CausalLM forward applies to its logits: ``softcap``, or the operator of a
#: scale (``*``, ``/``) used when the forward's source does not show one next to the name.
HEAD_ATTRIBUTES: dict[str, str] = {
    "final_logit_softcapping": "softcap",
    "logit_scale": "*",
    "logits_scaling": "/",
    "lm_head_multiplier": "*",
}


@dataclass(frozen=True)
class HeadTransform:
    """``logits -> softcap x tanh(scale x logits / softcap)`` (no tanh when ``softcap`` is None):
    what a family's forward does to ``hidden @ W.T + b``. The identity for most families."""

    scale: float = 1.0
    softcap: float | None = None

    @property
    def identity(self) -> bool:
        return self.scale == 1.0 and self.softcap is None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The transformed logits, out of place (autograd records it: the plain path)."""
        if self.scale != 1.0:
            logits = logits * self.scale
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def apply_(self, logits: torch.Tensor) -> torch.Tensor:
        """:meth:`apply` in place on a float32 buffer (the chunked head's)."""
        if self.scale != 1.0:
            logits.mul_(self.scale)
        if self.softcap is not None:
            logits.div_(self.softcap).tanh_().mul_(self.softcap)
        return logits

    def backward_(self, grad: torch.Tensor, transformed: torch.Tensor | None) -> torch.Tensor:
        """``d loss / d logits`` from ``d loss / d transformed`` (``grad``, changed in place), given
        the transformed logits (with a soft-cap; its buffer is used up): ``d tanh(x) = 1 - tanh(x)^2``,
        then the scale."""
        if self.softcap is not None:
            grad.mul_(transformed.div_(self.softcap).square_().neg_().add_(1))
        if self.scale != 1.0:
            grad.mul_(self.scale)
        return grad

    def describe(self) -> str:
        parts = ([f"logits x {self.scale:g}"] if self.scale != 1.0 else []) + (
            [f"soft-capped at {self.softcap:g}"] if self.softcap is not None else [])
        return ", ".join(parts) or "none"


def _forward_source(lm: nn.Module) -> str | None:
    """The source of ``lm``'s class forward, None where Python cannot show it (compiled code)."""
    try:
        return inspect.getsource(type(lm).forward)
    except (OSError, TypeError):
        return None


def text_config(lm: nn.Module) -> Any:
    """The config a text model's forward reads (a multimodal config's text part)."""
    cfg = lm.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def head_transform(lm: nn.Module) -> HeadTransform:
    """What ``lm``'s forward does to its logits (:data:`HEAD_ATTRIBUTES`): an attribute counts when
    its config holds a value and the forward's source names it (all of them when no source is
    readable). A scale's operator is the one before its name in that source."""
    cfg = text_config(lm)
    source = _forward_source(lm)
    scale, softcap = 1.0, None
    for name, kind in HEAD_ATTRIBUTES.items():
        value = getattr(cfg, name, None)
        if value is None or isinstance(value, bool) or (source is not None and name not in source):
            continue
        if kind == "softcap":
            softcap = float(value) if value else None
            continue
        op = kind
        if source is not None and (m := re.search(r"([*/])\s*(?:[A-Za-z_][\w.]*\.)?" + name + r"\b", source)):
            op = m.group(1)
        scale = scale * float(value) if op == "*" else scale / float(value)
    return HeadTransform(scale=scale, softcap=softcap)


def decoder(lm: nn.Module) -> nn.Module:
    """The module of ``lm`` whose first output is the final hidden states (after the last norm):
    ``base_model`` (``model``, GPT-2's ``transformer``, GPT-NeoX's ``gpt_neox``), or where a
    CausalLM is its own base model (Llama-4 text's ``base_model_prefix`` names no child), its one
    child that is a transformers model."""
    base = getattr(lm, "base_model", lm)
    if base is not lm:
        return base
    from transformers import PreTrainedModel

    children = [m for m in lm.children() if isinstance(m, PreTrainedModel)]
    if len(children) == 1:
        return children[0]
    raise ValueError(f"{type(lm).__name__}: cannot tell which module gives the final hidden states (base_model "
                     f"is the model itself and {len(children)} children are models); the log-prob head needs it")


@dataclass(frozen=True)
class RouterAux:
    """An MoE's load-balancing loss as the model's own forward adds it: ``coef x loss(router
    logits, experts, top-k, attention mask)``, with the family's own loss function."""

    coef: float
    num_experts: int
    top_k: int
    loss_fn: Callable[..., torch.Tensor]

    def __call__(self, router_logits: Any, attention_mask: torch.Tensor | None) -> torch.Tensor:
        return self.coef * self.loss_fn(router_logits, self.num_experts, self.top_k, attention_mask)


def router_aux(lm: nn.Module) -> RouterAux | None:
    """``lm``'s router auxiliary loss when its config asks for router logits
    (``output_router_logits: true``) with a non-zero ``router_aux_loss_coef``; None otherwise.
    ValueError where the config asks but the family's modelling code has no loss to add."""
    cfg = text_config(lm)
    coef = float(getattr(cfg, "router_aux_loss_coef", 0.0) or 0.0)
    if not getattr(cfg, "output_router_logits", False) or coef == 0.0:
        return None
    module = sys.modules.get(type(lm).__module__)
    loss_fn = getattr(module, "load_balancing_loss_func", None)
    experts = getattr(lm, "num_experts", None) or getattr(cfg, "num_experts", None) or getattr(
        cfg, "num_local_experts", None)
    top_k = getattr(lm, "num_experts_per_tok", None) or getattr(cfg, "num_experts_per_tok", None)
    if loss_fn is None or not experts or not top_k:
        raise ValueError(f"{cfg.model_type}: the config asks for router logits (output_router_logits: true, "
                         f"router_aux_loss_coef {coef:g}) but {type(lm).__name__}'s modelling code has no "
                         "load_balancing_loss_func with its expert counts to add them as its forward does; set "
                         "output_router_logits: false in config.json to train without the auxiliary loss")
    return RouterAux(coef, int(experts), int(top_k), loss_fn)

