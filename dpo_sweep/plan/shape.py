"""A causal LM's shape for the memory model (:class:`ModelShape`), read from its meta-device build
and its family (models/family.py): the widths, norms, MLP kind and experts that what autograd saves
depends on (plan/memory.py), and each linear layer's size (LoRA: plan/levers.py)."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Mapping

from dpo_sweep.config import ModelSpec


@dataclass(frozen=True)
class ModelShape:
    """What the memory model needs of a causal LM's config."""

    n_params: int          # every parameter once (a tied head and embedding count once)
    n_layers: int
    hidden: int            # H
    intermediate: int      # I, the MLP width
    n_heads: int
    q_dim: int             # n_heads x head_dim
    kv_dim: int            # n_kv_heads x head_dim
    vocab: int
    tied: bool             # lm_head shares the embedding's weight
    attn_proj_params: int  # q/k/v/o weights of all layers (what autocast caches under lean ops)
    mlp_params: int        # gate/up/down weights of all layers
    arch: str              # the transformers model_type (llama, qwen2, ...)
    lean_norm: bool = True          # its RMSNorms are Llama's: lean ops replace them (models/family.py)
    lean_mlp: bool = True           # its MLPs are Llama's SwiGLU: lean ops replace them
    gated_mlp: bool = True          # act(gate) * up (SwiGLU, GeGLU); False: act(fc) (GPT-2, GPT-NeoX)
    norms_per_layer: int = 2        # Gemma-2/3: 4 (pre and post norms); Cohere: 1 (parallel blocks)
    norm_kind: str = "rms"          # rms | layer (torch's LayerNorm) | centered (a LayerNorm in Python: Cohere)
    qk_norm: bool = False           # norms on q and k (Qwen3, OLMo-2, Gemma-3)
    fused_qkv: bool = False         # one projection makes q, k and v (Phi-3, GPT-NeoX, GPT-2)
    rope: bool = True               # rotary positions (GPT-2: learned positions instead)
    rope_cat: bool = False          # rotary positions applied with torch.cat (partial rotary)
    act_saved: int = 1              # I-wide tensors an ungated MLP's activation saves (GPT-2's tanh GELU: 4)
    sliding_window: int = 0         # tokens a sliding-window layer sees (0: none)
    sliding_share: float = 0.0      # the share of layers with a sliding window
    experts_per_token: int = 0      # an MoE's top-k (0: dense)
    expert_intermediate: int = 0    # one expert's MLP width, times the share of layers that are MoE
    n_experts: int = 0              # router logits per token
    shared_gate: bool = False       # a sigmoid gate on the shared expert (Qwen2-MoE)
    #: (name, in, out, how many) of each linear layer name in the attention and MLP: LoRA's sizes.
    linear_dims: tuple[tuple[str, int, int, int], ...] = ()
    attention_linears: tuple[str, ...] = ()  # the names of linear_dims that are the attention's
    auto_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def shape_key(spec: ModelSpec) -> ModelSpec:
    """What of ``spec`` its shape depends on (the config it is built from): the key of shapes built
    elsewhere. The storage dtype, attention, kernels and lean ops change no parameter count: a
    learning trial that drops ``model.dtype`` for bf16-mixed has its configuration's shape (keyed
    by the whole spec, the driver would build it again at the first trial's end, importing torch
    and transformers in a Tune callback that holds back the next trial)."""
    return ModelSpec(preset=spec.preset, name_or_path=spec.name_or_path, trust_remote_code=spec.trust_remote_code)


def model_shape(spec: ModelSpec, known: Mapping[ModelSpec, ModelShape] | None = None) -> ModelShape:
    """The shape of ``spec``'s model: the one ``known`` gives (shapes built in another process,
    keyed by :func:`shape_key`: ``dpo-sweep run``'s preflight builds them, so that the sweep's
    driver never imports torch or transformers), else built here."""
    key = shape_key(spec)
    shape = (known or {}).get(key)
    return shape if shape is not None else built_shape(key)


@functools.lru_cache(maxsize=16)  # a cache of a pure function: the meta build costs ~1 s the first time
def built_shape(spec: ModelSpec) -> ModelShape:
    """The shape of ``spec``'s model, read from its meta-device build (no weights are allocated)
    and its family (models/family.py): widths from the modules themselves, so a family whose config
    names them otherwise (GPT-2's ``n_inner``, a per-layer ``head_dim``) is read alike."""
    from dpo_sweep.models.family import family_of, meta_model

    model = meta_model(spec)
    cfg = model.config
    fam = family_of(model)
    layers = [layer for layer in _layers(model)]
    attns = [getattr(layer, fam.attention) for layer in layers] if fam.attention else []
    mlps = [getattr(layer, fam.mlp) for layer in layers] if fam.mlp else []
    n_heads = cfg.num_attention_heads
    # MLA (DeepSeek-V3) names its q/k head width qk_head_dim and has a v width of its own.
    head_dims = [getattr(a, "head_dim", None) or getattr(a, "qk_head_dim", None) or cfg.hidden_size // n_heads
                 for a in attns] or [cfg.hidden_size // n_heads]
    head_dim = round(sum(head_dims) / len(head_dims))  # per-layer head_dim (Gemma-4): their mean
    v_dims = [getattr(a, "v_head_dim", None) for a in attns]
    kv_head_dim = round((head_dim + sum(v_dims) / len(v_dims)) / 2) if attns and all(v_dims) else head_dim
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
    dims: dict[tuple[str, int, int], int] = {}  # (name, in, out): how many (GPT-2's two c_proj sizes)
    params = {"attn": 0, "mlp": 0}
    for part, subs in (("attn", attns), ("mlp", mlps)):
        for sub in subs:
            for name, fan_in, fan_out in _linear_widths(sub):
                dims[name, fan_in, fan_out] = dims.get((name, fan_in, fan_out), 0) + 1
                params[part] += fan_in * fan_out
    attn_params, mlp_params = params["attn"], params["mlp"]
    moe = _moe_shape(cfg, mlps)
    return ModelShape(
        n_params=sum(p.numel() for p in model.parameters()), n_layers=len(layers),
        hidden=cfg.hidden_size, intermediate=_intermediate(cfg, mlps), n_heads=n_heads,
        q_dim=n_heads * head_dim, kv_dim=n_kv * kv_head_dim,
        vocab=cfg.vocab_size, tied=bool(getattr(cfg, "tie_word_embeddings", False)),
        attn_proj_params=attn_params, mlp_params=mlp_params, arch=cfg.model_type,
        lean_norm=fam.lean_norm, lean_mlp=fam.lean_mlp, gated_mlp=_gated(mlps),
        norms_per_layer=_norms_per_layer(layers), norm_kind=_norm_kind(layers),
        qk_norm=any(hasattr(a, "q_norm") or hasattr(a, "q_layernorm") for a in attns),
        fused_qkv=len(fam.qkv) == 1, rope=any("rotary" in n for n, _ in model.named_modules()),
        rope_cat=bool(attns) and _rope_cat(attns[0]),
        act_saved=_act_saved(mlps), sliding_window=_sliding(cfg)[0], sliding_share=_sliding(cfg)[1],
        experts_per_token=moe[0], expert_intermediate=moe[1], n_experts=moe[2],
        shared_gate=any(hasattr(m, "shared_expert_gate") for m in mlps),
        linear_dims=tuple((n, i, o, c) for (n, i, o), c in sorted(dims.items())), auto_targets=fam.linears,
        attention_linears=tuple(sorted({n for a in attns for n, _, _ in _linear_widths(a)})),
    )


def _layers(model):
    from dpo_sweep.models.family import find_layers

    return find_layers(model)[1]


def _linear_widths(mlp) -> list[tuple[str, int, int]]:
    from dpo_sweep.models.family import linear_modules

    out = []
    for name, m in linear_modules(mlp):
        w = m.weight
        fan_in, fan_out = (w.shape[0], w.shape[1]) if type(m).__name__ == "Conv1D" else (w.shape[1], w.shape[0])
        out.append((name.rsplit(".", 1)[-1], fan_in, fan_out))
    return out


def _dense_width(mlp, hidden: int) -> int:
    """A dense MLP's width (an MoE block's shared expert's, 0 without one): its widest projection
    of the hidden state, halved where gate and up are one fused projection."""
    widths = [(n, o) for n, i, o in _linear_widths(mlp) if i == hidden and o > 1 and "router" not in n and n != "gate"]
    if not widths:
        return 0
    name, width = max(widths, key=lambda nw: nw[1])
    return width // 2 if "gate_up" in name else width


def _intermediate(cfg, mlps) -> int:
    if not mlps:
        return 0
    return round(sum(_dense_width(m, cfg.hidden_size) for m in mlps) / len(mlps))


def _moe_shape(cfg, mlps) -> tuple[int, int, int]:
    """(top-k, expert width x share of MoE layers, experts) of an MoE; zeros for a dense model."""
    moe = [m for m in mlps if any(p.ndim == 3 for p in m.parameters())]
    if not moe:
        return 0, 0, 0
    k = getattr(cfg, "num_experts_per_tok", None) or getattr(cfg, "top_k", None) or 1
    n = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None) or getattr(cfg, "n_routed_experts", 0)
    width = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    return int(k), round(width * len(moe) / len(mlps)), int(n or 0)


def _gated(mlps) -> bool:
    names = {n for m in mlps for n, _, _ in _linear_widths(m)}
    return not mlps or any("gate" in n for n in names) or any(p.ndim == 3 for m in mlps for p in m.parameters())


def _is_norm(m) -> bool:
    return type(m).__name__.endswith(("Norm", "LayerNorm"))


def _norms_per_layer(layers) -> int:
    return round(sum(sum(_is_norm(c) for c in layer.children()) for layer in layers) / max(len(layers), 1))


def _norm_kind(layers) -> str:
    import torch

    norm = next((c for c in layers[0].children() if _is_norm(c)), None) if len(layers) else None
    if isinstance(norm, torch.nn.LayerNorm):
        return "layer"
    return "centered" if norm is not None and type(norm).__name__.endswith("LayerNorm") else "rms"


#: Activations written as several torch ops, and the I-wide tensors they save (GPT-2's tanh GELU).
_COMPOSITE_ACTIVATIONS = {"NewGELUActivation": 4, "FastGELUActivation": 4, "QuickGELUActivation": 2}


def _act_saved(mlps) -> int:
    acts = [type(c).__name__ for m in mlps[:1] for c in m.children() if "Activation" in type(c).__name__
            or "GELU" in type(c).__name__]
    return max((_COMPOSITE_ACTIVATIONS.get(a, 1) for a in acts), default=1)


def _rope_cat(attn) -> bool:
    """Whether the family's ``apply_rotary_pos_emb`` joins a rotated and a passed part with torch.cat
    (read from its code, as models/family.py reads the lean ops' modules)."""
    import inspect
    import sys

    fn = getattr(sys.modules.get(type(attn).__module__), "apply_rotary_pos_emb", None)
    try:
        sources = [inspect.getsource(f) for f in (fn, type(attn).forward) if f is not None]
    except (OSError, TypeError):
        return False
    return any("torch.cat" in src and "rot" in src for src in sources)


def _sliding(cfg) -> tuple[int, float]:
    """(window, share of layers with it): from ``layer_types`` where the config has them."""
    window = getattr(cfg, "sliding_window", None) or 0
    if not window or not getattr(cfg, "use_sliding_window", True):
        return 0, 0.0
    types = getattr(cfg, "layer_types", None)
    share = sum(t == "sliding_attention" for t in types) / len(types) if types else 1.0
    return int(window), share
