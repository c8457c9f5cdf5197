"""What the memory levers (``train.adapter``, ``train.optimizer``) hold, for the memory model.

==============  =============================================================================
part            full                          lora                      qlora
==============  =============================================================================
weights         n_params x weight bytes       the same + the adapters   decoder linears in NF4
                                              (weight bytes)            (NF4_BYTES_PER_PARAM),
                                                                        the rest as lora
grads           every parameter               the adapters only (the base is frozen: no grads)
optimizer       per trained parameter: adamw 2 x weight bytes, adamw_8bit / adamw_4bit
                OPTIMIZER_STATE_BYTES (torchao: 8- / 4-bit moments and a float32 scale per
                block of 256 / 128 values)
live reference  a frozen copy                 none: the adapters-off policy (train/adapters.py)
head            lm_head gradient              frozen lm_head: no weight gradient
casts           autocast's cached bf16 copy   bf16-mixed: autograd keeps    one linear's weight
(bf16-mixed)    of each trained weight        the cast copy of each frozen  dequantised at a time
                                              linear for its input grad     (not saved)
activations     checkpointing.py's regions    + each adapter's saved tensors outside the
                                              checkpointed regions: its rank-r output, and with
                                              lora_dropout its dropped input and mask (CUDA's
                                              fused dropout: a bool mask); the lean
                                              MLP is not used on an adapted MLP (lean.py); a
                                              stock norm's frozen weight needs no normalised copy
==============  =============================================================================

With ``optimizer_in_backward`` each gradient is stepped on and freed as it is made: at most the
largest one is alive (``largest_grad``) instead of all of them at the end of backward.

LoRA on a target of ``in x out`` adds ``r x (in + out)`` parameters per layer. Pure functions of
the config and the model's shape; memory.py adds them up.
"""
from __future__ import annotations

from dataclasses import dataclass

from dpo_sweep.core.levels import Level
from dpo_sweep.config import LORA_AUTO, TrialConfig

#: torchao NF4: 4 bits per value, an int8 scale per 64 values, a float32 scale per 256 of those.
NF4_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)
#: torchao's low-bit AdamW, both moments with their blockwise float32 scales, per trained parameter.
OPTIMIZER_STATE_BYTES = {"adamw_8bit": 2 * (1 + 4 / 256), "adamw_4bit": 2 * (0.5 + 4 / 128)}
_ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")


def targets_of(s, names: tuple[str, ...]) -> tuple[str, ...]:
    """The linear layer names ``train.lora_targets`` adapts on the model of shape ``s`` (auto: the
    family's own, models/family.py)."""
    return s.auto_targets if names == LORA_AUTO else names


def _target_dims(s) -> dict[str, tuple[int, int]]:
    """(in, out) features of each decoder linear, by name (the family's own names, read from its
    modules; a shape without them has Llama's)."""
    if s.linear_dims:
        return {name: (i, o) for name, i, o, _ in s.linear_dims}
    return {"q_proj": (s.hidden, s.q_dim), "k_proj": (s.hidden, s.kv_dim), "v_proj": (s.hidden, s.kv_dim),
            "o_proj": (s.q_dim, s.hidden), "gate_proj": (s.hidden, s.intermediate),
            "up_proj": (s.hidden, s.intermediate), "down_proj": (s.intermediate, s.hidden)}


def lora_params(s, names: tuple[str, ...], r: int) -> int:
    """LoRA's A and B over ``targets`` in every layer (names the shape does not know add none)."""
    if s.linear_dims:  # each name's own count: an MoE's shared expert, a family's dense first layers
        return r * sum((i + o) * n for name, i, o, n in s.linear_dims if name in targets_of(s, names))
    dims = _target_dims(s)
    return s.n_layers * r * sum(sum(dims[t]) for t in targets_of(s, names) if t in dims)


def trainable_params(cfg: TrialConfig, s) -> int:
    """The parameters the optimizer steps: all of them, or the adapters."""
    t = cfg.train
    return s.n_params if t.adapter == "full" else lora_params(s, t.lora_targets, t.lora_r)


@dataclass(frozen=True)
class LeverBytes:
    """One configuration's bytes that depend on its adapter and optimizer (one worker, unsharded)."""

    trainable: int            # parameters with gradients and optimizer state
    weights: float            # every weight held: the base (NF4 where quantised) and the adapters
    grads: float              # one gradient per trainable parameter
    optimizer: float
    reference_copy: bool      # a live reference is a second copy of the weights (full only)
    lm_head_grad: bool        # the head's backward makes the lm_head weight's gradient
    cast_params: int          # autocast / autograd keep a bf16 copy of these weights (bf16-mixed)
    transient: float          # alive while one linear runs (QLoRA's dequantised weight)
    saved_per_token: float    # the adapters' own saved tensors per token, all layers
    largest_grad: float = 0.0  # the largest single gradient (optimizer_in_backward: the most alive at once)


def _region_targets(level: str, s) -> tuple[str, ...]:
    """The targets whose adapters run outside a checkpointed region at ``level`` (their saved
    tensors stay alive until backward): the family's attention and MLP linears (Llama's names for
    a shape without them)."""
    regions = Level(level).regions
    if regions.layer:
        return ()
    attention = s.attention_linears or _ATTENTION_TARGETS
    mlp = tuple(n for n, *_ in s.linear_dims if n not in attention) or _MLP_TARGETS
    return (() if regions.attention else attention) + (() if regions.mlp else mlp)


def lever_bytes(cfg: TrialConfig, s, weight_bytes: int, activation_bytes: int, autocast: bool,
                lean: bool, liger: bool = False) -> LeverBytes:
    """The lever-dependent parts of ``cfg``'s memory (``s``: the model's ModelShape)."""
    t = cfg.train
    trainable = trainable_params(cfg, s)
    per_param_state = OPTIMIZER_STATE_BYTES.get(t.optimizer, 2 * weight_bytes)
    optimizer = trainable * per_param_state
    linears = s.attn_proj_params + s.mlp_params
    dims = _target_dims(s)
    if t.adapter == "full":
        largest = max(s.vocab * s.hidden, s.hidden * s.intermediate, s.hidden * s.q_dim)
        return LeverBytes(trainable=trainable, weights=s.n_params * weight_bytes, grads=trainable * weight_bytes,
                          optimizer=optimizer, reference_copy=True, lm_head_grad=True,
                          cast_params=s.attn_proj_params + (0 if lean else s.mlp_params), transient=0.0,
                          saved_per_token=0.0, largest_grad=largest * weight_bytes)
    adapters = trainable * weight_bytes
    if t.adapter == "qlora":
        base = (s.n_params - linears) * weight_bytes + linears * NF4_BYTES_PER_PARAM
        cast_params = 0
        transient = s.hidden * s.intermediate * (4 if autocast else 2)
    else:
        base = s.n_params * weight_bytes
        cast_params = linears
        transient = 0.0
    names = targets_of(s, t.lora_targets)
    widest = max((max(dims[x]) for x in names if x in dims), default=0)  # of one adapter's A or B
    kept = [x for x in names if x in _region_targets(cfg.checkpoint_level, s) and x in dims]
    saved = sum(t.lora_r * activation_bytes + (dims[x][0] * (activation_bytes + 1) if t.lora_dropout else 0)
                for x in kept)
    regions = Level(cfg.checkpoint_level).regions
    mlp_kept = not (regions.mlp or regions.layer)  # the MLP's tensors live until backward
    if lean and mlp_kept and set(_MLP_TARGETS) & set(names):
        saved += 2 * activation_bytes * s.intermediate  # the stock MLP's silu(gate) and product
    saved_total = s.n_layers * saved
    if not (lean or liger) and not regions.layer:
        # A stock RMSNorm with a frozen weight keeps no normalised tensor for the weight's gradient:
        # its float32 input and rstd only, as the lean one (2 norms a layer and the final one).
        saved_total -= (2 * s.n_layers + 1) * (weight_bytes * s.hidden - 4)
    return LeverBytes(trainable=trainable, weights=base + adapters, grads=adapters, optimizer=optimizer,
                      reference_copy=False, lm_head_grad=False, cast_params=cast_params, transient=transient,
                      saved_per_token=saved_total, largest_grad=t.lora_r * widest * weight_bytes)
