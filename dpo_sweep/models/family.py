"""What a causal LM's family is made of, read from the model's own modules: where its decoder
layers, attention and MLP are, their projections, its experts, whether its norm and MLP are the
ones the lean ops model - and from that, which checkpoint levels, LoRA targets and lean ops it
can take exactly.

Nothing here is a table of model types: each fact is found in the module tree that
``AutoModelForCausalLM.from_config`` builds (on the meta device for ``validate`` and the memory
model, the real model in the trainer), so a family this code has never seen gets the same
reading. The checkpoint levels wrap the family's own ``forward`` of its attention and MLP
(train/checkpointing.py), so whatever maths a family does there (fused or partial-rotary
projections, NoPE layers, q/k norms, soft-capping, sinks, expert routing) runs unchanged; a level is
refused only where a region it needs does not exist (:meth:`Family.refused_level`).

A decoder layer whose token mixer is not attention (a state-space or linear-attention layer:
Falcon-H1's and Granite-4's Mamba mixers, Qwen3-Next's gated DeltaNet) makes the model a
hybrid, refused whole (:meth:`Family.refused`): the memory model and the levels know attention
layers only.
"""
from __future__ import annotations

import functools
import inspect
import re
import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from dpo_sweep.config import ModelSpec

if TYPE_CHECKING:
    from dpo_sweep.config import TrialConfig

#: Class-name parts of the token mixers that are not attention (state-space, linear attention).
_MIXER_PARTS = ("Mamba", "Mixer", "DeltaNet", "LinearAttention", "Ssm", "SSM", "Rwkv", "Recurrent")
#: A decoder layer's feed-forward sub-block, by attribute name, first found wins.
_MLP_NAMES = ("mlp", "feed_forward", "block_sparse_moe", "ffn")
#: Attention output projections: every other projection of the attention is an input one (L3).
_OUTPUT_PROJECTIONS = ("o_proj", "dense", "c_proj", "out_proj", "wo")
#: An MoE's routers and gates: linear layers of the MLP that are not its projections.
_ROUTERS = ("gate", "router", "shared_expert_gate")


def _is_linear(m: nn.Module | None) -> bool:
    # GPT-2's projections are transformers' Conv1D (a linear with a transposed weight); peft adapts
    # both, and a peft LoRA layer is the linear it wraps (its ``base_layer``).
    if m is None:
        return False
    return isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D" or _is_linear(getattr(m, "base_layer", None))


def linear_modules(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of the outermost linear layers in ``module`` (a LoRA layer, not the base
    layer and adapters inside it)."""
    found: list[tuple[str, nn.Module]] = []
    for name, m in module.named_modules():
        if name and _is_linear(m) and not any(name.startswith(f + ".") for f, _ in found):
            found.append((name, m))
    return found


def _is_attention(m: nn.Module) -> bool:
    return type(m).__name__.endswith("Attention") and not any(p in type(m).__name__ for p in _MIXER_PARTS)


def _is_mixer(m: nn.Module) -> bool:
    return any(p in type(m).__name__ for p in _MIXER_PARTS)


def find_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """(path, layers): the decoder layers of a causal LM: the ModuleList of its base model
    (``model.layers``, GPT-2's ``transformer.h``, ``gpt_neox.layers``)."""
    base = model.base_model
    lists = [(n, c) for n, c in base.named_children() if isinstance(c, nn.ModuleList) and len(c)]
    if not lists:
        raise ValueError(f"{type(model).__name__}: no decoder layers (a ModuleList) in {type(base).__name__}")
    name, layers = max(lists, key=lambda nc: len(nc[1]))
    prefix = next((n for n, c in model.named_children() if c is base), "")
    return f"{prefix}.{name}" if prefix else name, layers


def _child_name(layer: nn.Module, test) -> str | None:
    return next((n for n, c in layer.named_children() if test(c)), None)


def attention_of(layer: nn.Module) -> tuple[str, nn.Module] | tuple[None, None]:
    """(attribute, module) of a decoder layer's attention (``self_attn``, ``attention``, ``attn``)."""
    name = _child_name(layer, _is_attention)
    return (name, getattr(layer, name)) if name else (None, None)


def mlp_of(layer: nn.Module) -> tuple[str, nn.Module] | tuple[None, None]:
    """(attribute, module) of a decoder layer's MLP (dense or mixture of experts)."""
    name = next((n for n in _MLP_NAMES if isinstance(getattr(layer, n, None), nn.Module)), None)
    return (name, getattr(layer, name)) if name else (None, None)


def input_projections(attn: nn.Module) -> list[tuple[str, nn.Module]]:
    """The attention's projections of its input (q/k/v, fused qkv, MLA's down and up projections):
    every linear of it but the output projection."""
    return [(n, m) for n, m in linear_modules(attn) if n.rsplit(".", 1)[-1] not in _OUTPUT_PROJECTIONS]


@functools.lru_cache(maxsize=256)  # reading and tokenising a source file per module is slow
def _body(fn: Any) -> str:
    """A function's source without its signature line and whitespace (None when unreadable)."""
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return ""
    src = re.sub(r'"""(.|\n)*?"""', "", src)
    return re.sub(r"\s+", "", src.split(":", 1)[1] if "def " in src.splitlines()[0] else src)


@functools.lru_cache(maxsize=1)
def _llama_bodies() -> tuple[str, str]:
    from transformers.models.llama import modeling_llama as llama

    return _body(llama.LlamaRMSNorm.forward), _body(llama.LlamaMLP.forward)


def is_llama_rmsnorm(m: nn.Module) -> bool:
    """Whether ``m`` computes Llama's RMSNorm (``weight * (x / rms(x)).to(dtype)``), read from its
    forward's code: what the lean RMSNorm computes. Gemma's ``1 + weight``, OLMo-2's weight before
    the cast and gated norms differ."""
    return (type(m).__module__.startswith("transformers.") and hasattr(m, "variance_epsilon")
            and _body(type(m).forward) == _llama_bodies()[0])


def is_llama_swiglu(m: nn.Module) -> bool:
    """Whether ``m`` is Llama's MLP, ``down(silu(gate(x)) * up(x))``, read from its forward's code
    and its activation: what the lean SwiGLU computes. Falcon-H1's multipliers, GELU MLPs and fused
    gate/up projections differ."""
    act = getattr(m, "act_fn", None)
    silu = isinstance(act, nn.SiLU) or type(act).__name__ in ("SiLUActivation", "SiLU")
    return silu and _body(type(m).forward) == _llama_bodies()[1]


@dataclass(frozen=True)
class Family:
    """What one model's decoder is made of (:func:`family_of`)."""

    model_type: str
    layers_path: str                    # e.g. model.layers, transformer.h
    attention: str | None               # a layer's attention attribute (None: some layer has none)
    mlp: str | None                     # a layer's MLP attribute
    qkv: tuple[str, ...]                # the attention's input projections (L3's regions)
    linears: tuple[str, ...]            # the attention's and MLP's linear layers: LoRA's default targets
    decoder_linears: tuple[str, ...]    # every linear layer name in the decoder layers
    linear_paths: tuple[str, ...]       # every linear layer's path in its decoder layer (mlp.shared_expert.down_proj)
    expert_weights: tuple[str, ...]     # 3-D expert parameters (``experts.gate_up_proj``)
    mixers: tuple[str, ...]             # token mixers that are not attention (class names)
    lean_norm: bool                     # its RMSNorms are Llama's (lean ops replace them)
    lean_mlp: bool                      # its dense MLPs (an MoE's shared experts) are Llama's SwiGLU
    moe: bool                           # its MLP routes tokens to experts
    gradient_checkpointing: bool        # the model supports transformers' own (``full``)

    def refused(self) -> str | None:
        """Why this model is refused whole; None when it is not."""
        if self.mixers:
            return (f"model_type {self.model_type} is a hybrid whose layers mix tokens with "
                    f"{', '.join(self.mixers)} (state-space or linear attention), which the checkpoint levels, "
                    "the memory model and the log-prob head's checks do not model; train it with another tool, "
                    "or pick a model whose every layer is attention")
        if self.attention is None:
            return (f"model_type {self.model_type}: its decoder layers at {self.layers_path} hold no attention "
                    "module (a class named *Attention), which the trainer needs to find")
        return None

    def refused_level(self, level: str) -> str | None:
        """Why checkpoint ``level`` is refused for this family; None when it runs exactly."""
        from dpo_sweep.core.levels import Level

        r = Level(level).regions
        if r.layer and not self.gradient_checkpointing:
            return (f"checkpoint_level full: {self.model_type} models do not support transformers' gradient "
                    "checkpointing; use L1 or none")
        if r.mlp and self.mlp is None:
            return (f"checkpoint_level {level}: {self.model_type}'s decoder layers have no MLP sub-block "
                    f"({' / '.join(_MLP_NAMES)}) to recompute; use full or none")
        if r.qkv and not self.qkv:
            return (f"checkpoint_level L3: {self.model_type}'s attention has no input projection of its own to "
                    "recompute as a region; use L2 (the same recompute without the nested regions)")
        return None

    def lean_ops(self) -> str:
        """What the lean ops replace in this family, for the docs' table."""
        parts = [n for n, on in (("RMSNorm", self.lean_norm), ("SwiGLU MLP", self.lean_mlp)) if on]
        return " + ".join(parts) if parts else "-"


def _dense_mlps(mlp: nn.Module) -> list[nn.Module]:
    """The dense MLPs of a layer's MLP: itself, or an MoE block's shared experts (none: Mixtral)."""
    if not (hasattr(mlp, "experts") or any(p.ndim == 3 for p in mlp.parameters())):
        return [mlp]
    return [c for n, c in mlp.named_children() if n.startswith("shared") and any(True for _ in c.children())]


def family_of(model: nn.Module) -> Family:
    """Read a causal LM's :class:`Family` from its modules (a meta-device model will do)."""
    path, layers = find_layers(model)
    attentions = [attention_of(layer) for layer in layers]
    mlps = [mlp_of(layer) for layer in layers]
    mixers = sorted({type(m).__name__ for layer in layers for m in layer.children() if _is_mixer(m)})
    attn_name = attentions[0][0] if all(a[0] == attentions[0][0] for a in attentions) else None
    mlp_name = mlps[0][0] if all(m[0] == mlps[0][0] for m in mlps) else None

    def leaf(n: str) -> str:
        return n.rsplit(".", 1)[-1]

    qkv = sorted({leaf(n) for _, a in attentions if a is not None for n, _ in input_projections(a)})
    linears: set[str] = set()
    for _, sub in [*attentions, *mlps]:
        if sub is not None:
            linears |= {leaf(n) for n, _ in linear_modules(sub) if leaf(n) not in _ROUTERS}
    linear_paths = sorted({n for layer in layers for n, _ in linear_modules(layer)})
    decoder_linears = sorted({leaf(n) for n in linear_paths})
    experts = sorted({n.split(".", 1)[1] if "." in n else n for _, mlp in mlps if mlp is not None
                      for n, p in mlp.named_parameters() if p.ndim == 3})
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    mlp_modules = [m for _, m in mlps if m is not None]
    dense = [d for m in mlp_modules for d in _dense_mlps(m)]
    return Family(
        model_type=getattr(model.config, "model_type", type(model).__name__),
        layers_path=path, attention=attn_name, mlp=mlp_name, qkv=tuple(qkv),
        linears=tuple(n for n in decoder_linears if n in linears), decoder_linears=tuple(decoder_linears),
        linear_paths=tuple(linear_paths), expert_weights=tuple(experts), mixers=tuple(mixers),
        lean_norm=bool(norms) and all(is_llama_rmsnorm(m) for m in norms),
        lean_mlp=bool(dense) and all(is_llama_swiglu(m) for m in dense),
        moe=bool(experts) or any(hasattr(m, "experts") for m in mlp_modules),
        gradient_checkpointing=bool(getattr(model, "supports_gradient_checkpointing", False)),
    )


def hf_config(spec: ModelSpec) -> Any:
    """The transformers config ``spec`` builds its model from (a preset's, or the checkpoint's)."""
    if spec.preset is not None:
        from dpo_sweep.models.presets import preset_config

        return preset_config(spec.preset)
    from dpo_sweep.models import pretrained

    return pretrained.load_config(spec)


@functools.lru_cache(maxsize=8)  # a cache of a pure function: the meta build costs ~1 s for a large config
def meta_model(spec: ModelSpec) -> nn.Module:
    """``spec``'s causal LM built on the meta device: its modules and shapes, no weights."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = hf_config(spec)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg, trust_remote_code=spec.trust_remote_code)


@functools.lru_cache(maxsize=8)  # a pure function of the spec: a space's trials share a few models
def spec_family(spec: ModelSpec) -> Family:
    """The :class:`Family` of ``spec``'s model, read from its meta build."""
    return family_of(meta_model(spec))


def refused_trial(cfg: TrialConfig) -> str | None:
    """Why ``cfg`` cannot train exactly on its model's family (the model whole, its checkpoint level,
    its LoRA targets); None when it can. ``validate``, ``run`` and ``trial`` ask before any trial."""
    fam = spec_family(cfg.model)
    refused = fam.refused() or fam.refused_level(cfg.checkpoint_level)
    if refused:
        return refused
    if cfg.train.adapter != "full":
        return refused_lora_targets(fam, cfg.train.lora_targets)
    return None


def lora_targets(fam: Family, targets: tuple[str, ...]) -> tuple[str, ...]:
    """The module names ``train.lora_targets`` adapts on ``fam``: ``auto`` is its attention's and MLP's
    linear layers (:attr:`Family.linears`)."""
    return fam.linears if targets == ("auto",) else targets


def peft_target_modules(fam: Family, targets: tuple[str, ...]) -> list[str]:
    """peft's ``target_modules`` for ``train.lora_targets`` on ``fam``: the names of :func:`lora_targets`,
    each qualified by its path in the decoder layer (``mlp.shared_expert.down_proj``) where the family has
    routed experts. peft 0.22 reads a bare ``down_proj``, ``gate_proj`` or ``up_proj`` on a transformers-5
    MoE as the routed experts' fused 3-D weights too (its v4-to-v5 conversion) and adapts them, which
    neither the experts-stay-frozen rule nor the planner's adapter count allows; a qualified path matches
    the linear layer alone, in every peft version."""
    names = lora_targets(fam, targets)
    if not fam.expert_weights:
        return list(names)
    return [p for p in fam.linear_paths if p.rsplit(".", 1)[-1] in names]


def refused_lora_targets(fam: Family, targets: tuple[str, ...]) -> str | None:
    """Why ``train.lora_targets`` cannot be adapted on ``fam``; None when every name is a linear layer."""
    if targets == ("auto",):
        return None if fam.linears else (f"train.lora_targets: auto: {fam.model_type}'s attention and MLP have no "
                                         "linear layer to adapt; list decoder linear layers")
    experts = [t for t in targets if any(w.rsplit(".", 1)[-1] == t for w in fam.expert_weights)]
    if experts:
        return (f"train.lora_targets: {', '.join(experts)} of {fam.model_type} is a 3-D expert weight "
                f"({', '.join(fam.expert_weights)}), a parameter holding every expert, not a linear layer: LoRA "
                "adapts linear layers only, so the experts stay frozen under adapter: lora; target "
                f"{', '.join(fam.linears) or 'the attention'} (auto), or train the experts with adapter: full")
    missing = [t for t in targets if t not in fam.decoder_linears]
    if missing:
        return (f"train.lora_targets: {', '.join(missing)} is no linear layer of the decoder of {fam.model_type}; "
                f"allowed: {', '.join(fam.decoder_linears)} (auto: {', '.join(fam.linears)})")
    return None
