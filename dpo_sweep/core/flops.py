"""Model FLOPs and MFU for a DPO step, counted from the model's shapes. Pure functions, no torch.

What is counted: the matmuls, per token, of each decoder layer (q, k, v - with grouped-query
attention k and v are ``n_kv_heads * head_dim`` wide -, o, gate, up, down), the attention
score and value matmuls, and the ``lm_head``. A multiply-add is 2 FLOPs. Norms, RoPE, softmax and
the optimizer are left out (well under 1 % at these shapes). The input embedding is a lookup.

* **Real tokens.** Layer matmuls run over the non-padding tokens; the attention matmuls over
  the causal (query, key) pairs of each sequence, ``L * (L + 1) / 2`` for a sequence of ``L``
  real tokens: the causal kernels (FlashAttention, SDPA ``is_causal``) skip the masked half, and
  counting it would credit the GPU with work it never did (PaLM and Megatron count the full
  square, so their MFU reads a little higher at long sequences). The lm_head runs over the rows
  the log-prob head computes: response tokens with the chunked head (``logp_chunk_tokens > 0``),
  every real position but each sequence's last with the plain head (``0``).
* **Backward** = 2 x forward for every matmul (gradients for the input and for the weight),
  except attention: the attention kernels' backward recomputes the scores first, 2.5 x forward
  (five matmuls of the forward's size against two; this is also what
  ``torch.utils.flop_counter`` counts). The chunked head recomputes its logits in backward: one
  more head forward.
* **Recompute** per checkpoint level: what its regions re-run in backward. Non-reentrant
  checkpointing stops recomputing a region once every tensor its backward needs is back (torch's
  default early stop), so a region's last matmul (``down`` for the MLP, ``o`` for the attention
  sub-block) is never re-run: only its input is needed. L2/L3 keep the attention kernel's
  outputs, so the scores are not re-run either; ``full`` re-runs them. L3's nested q/k/v regions
  re-run what L2 already re-runs, nothing more. With ``model.lean_ops`` the MLP is one autograd
  function, and a region re-runs it whole: ``down`` is then recomputed too.
* **Reference**: one forward over the same tokens, unless ``precomputed``.

Recompute is counted, so this is "hardware FLOPs" for checkpointing: MFU in the strict PaLM
sense would leave it out. We count it because the question the sweep answers is what each
checkpoint level costs, and leaving it out would hide it.
``tests/telemetry/test_flops_counter.py`` checks the count against
``torch.utils.flop_counter.FlopCounterMode`` on the tiny model for every level.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from dpo_sweep.core.levels import Level


@dataclass(frozen=True)
class DecoderShape:
    """The shapes of a Llama-style decoder that decide its matmul FLOPs."""

    hidden: int
    intermediate: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_layers: int
    vocab: int

    @classmethod
    def from_config(cls, config: Any) -> DecoderShape:
        """From a transformers model config (only its attributes are read)."""
        n_heads = config.num_attention_heads
        return cls(hidden=config.hidden_size, intermediate=_mlp_width(config), n_heads=n_heads,
                   n_kv_heads=getattr(config, "num_key_value_heads", None) or n_heads, head_dim=_head_dim(config),
                   n_layers=config.num_hidden_layers, vocab=config.vocab_size)


def _head_dim(config: Any) -> int:
    """The attention heads' width; a per-layer one (Gemma-4's, which transformers refuses to read
    globally) as the mean of its layers'."""
    try:
        return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    except RuntimeError:
        dims = [getattr(c, "head_dim", None) for c in getattr(config, "per_layer_config", None) or ()]
        dims = [d for d in dims if d]
        return round(sum(dims) / len(dims)) if dims else config.hidden_size // config.num_attention_heads


def _mlp_width(config: Any) -> int:
    """The MLP width a token runs through: an MoE's top-k experts (and its shared expert), else the
    dense width under whichever name the family gives it (GPT-2's ``n_inner``, 4 x hidden when unset)."""
    top_k = getattr(config, "num_experts_per_tok", None)
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    dense = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * config.hidden_size
    if top_k and experts:
        expert = getattr(config, "moe_intermediate_size", None) or dense
        return top_k * expert + (getattr(config, "shared_expert_intermediate_size", None) or 0)
    return dense


@dataclass(frozen=True)
class TokenCounts:
    """Exact token counts of one or more micro-batches (sum them with ``+``)."""

    tokens: int        # non-padding tokens of every sequence (chosen and rejected)
    causal_pairs: int  # sum over sequences of L * (L + 1) / 2, L its non-padding tokens
    head_rows: int     # rows the lm_head is computed for

    def __add__(self, other: TokenCounts) -> TokenCounts:
        return TokenCounts(self.tokens + other.tokens, self.causal_pairs + other.causal_pairs,
                           self.head_rows + other.head_rows)


NO_TOKENS = TokenCounts(0, 0, 0)


@dataclass(frozen=True)
class ForwardFlops:
    """One forward's matmul FLOPs over all layers, by sub-block."""

    qkv: float       # q, k, v projections
    o_proj: float
    mlp_in: float    # gate and up projections
    mlp_down: float
    attention: float  # scores (q k^T) and values (p v)
    head: float      # lm_head

    def total(self) -> float:
        return self.qkv + self.o_proj + self.mlp_in + self.mlp_down + self.attention + self.head


#: Attention backward over forward: the kernels recompute the scores, then four matmuls.
ATTENTION_BACKWARD_FACTOR = 2.5


def forward_flops(shape: DecoderShape, counts: TokenCounts) -> ForwardFlops:
    """Matmul FLOPs of one forward of the model over ``counts``."""
    for name, value in dataclasses.asdict(counts).items():
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    q_width, kv_width = shape.n_heads * shape.head_dim, shape.n_kv_heads * shape.head_dim
    per_layer_token = counts.tokens * shape.n_layers * 2.0  # 2 FLOPs per multiply-add
    return ForwardFlops(
        qkv=per_layer_token * shape.hidden * (q_width + 2 * kv_width),
        o_proj=per_layer_token * q_width * shape.hidden,
        mlp_in=per_layer_token * 2 * shape.hidden * shape.intermediate,
        mlp_down=per_layer_token * shape.intermediate * shape.hidden,
        # per (query, key) pair and head: q.k and p*v, head_dim multiply-adds each
        attention=counts.causal_pairs * shape.n_layers * 2.0 * 2 * q_width,
        head=counts.head_rows * 2.0 * shape.hidden * shape.vocab,
    )


def recompute_flops(fwd: ForwardFlops, level: str, lean_mlp: bool) -> float:
    """FLOPs the checkpoint ``level`` re-runs in backward.

    ``lean_mlp``: the MLP is lean ops' single autograd function (``model.lean_ops``), which
    re-runs whole, ``down`` included: early stop cannot cut inside one function's forward.
    """
    known = Level.of(level)
    if known is None:
        raise ValueError(f"checkpoint level {level!r}; allowed: {', '.join(Level)}")
    parts = known.recomputed  # the parts of ForwardFlops it re-runs (module doc)
    if lean_mlp and "mlp_in" in parts:
        parts = (*parts, "mlp_down")
    return sum(getattr(fwd, part) for part in parts)


def policy_training_flops(fwd: ForwardFlops, level: str, *, chunked_head: bool, lean_mlp: bool,
                          frozen_base: bool = False) -> float:
    """Forward + backward (+ recompute) of the policy over the tokens of ``fwd``. ``frozen_base``
    (LoRA/QLoRA): the weights get no gradient, so a linear's backward is its input gradient only
    (one forward's matmuls, not two); the adapters' rank-r matmuls are left out (< 1 % at r 16)."""
    weight_grads = 0.0 if frozen_base else 1.0
    backward = (1.0 + weight_grads) * (fwd.total() - fwd.attention) + ATTENTION_BACKWARD_FACTOR * fwd.attention
    head_recompute = fwd.head if chunked_head else 0.0
    return fwd.total() + backward + recompute_flops(fwd, level, lean_mlp) + head_recompute


def dpo_step_flops(*, shape: DecoderShape, counts: TokenCounts, level: str, reference: str,
                   chunked_head: bool, lean_mlp: bool, frozen_base: bool = False) -> float:
    """Model FLOPs of the DPO micro-steps over ``counts``: the policy's forward, backward and
    recompute, and the reference forward unless ``reference == "precomputed"``.

    ``counts``: every micro-batch of the steps counted, every worker if MFU is over several GPUs.
    ``chunked_head``: ``logp_chunk_tokens > 0``; ``lean_mlp``: ``model.lean_ops``; ``frozen_base``:
    ``train.adapter`` is lora or qlora.
    """
    fwd = forward_flops(shape, counts)
    reference_forward = 0.0 if reference == "precomputed" else fwd.total()
    return policy_training_flops(fwd, level, chunked_head=chunked_head, lean_mlp=lean_mlp,
                                 frozen_base=frozen_base) + reference_forward


def mfu(step_flops: float, step_time_s: float, peak_flops: float | None, n_gpus: int = 1) -> float:
    """Model FLOPs utilisation: ``step_flops / (step_time_s * peak_flops * n_gpus)``.

    ``step_flops`` is the whole step's work over all ``n_gpus``; ``peak_flops`` one GPU's rate
    (dpo_sweep/cards.py: ``mfu_peak_flops``, the catalog's one home for GPU rates). nan when the
    rate is unknown (None: the CPU, a device the catalog lacks) or the time is not a positive number.
    """
    if n_gpus < 1:
        raise ValueError(f"n_gpus must be >= 1, got {n_gpus}")
    if peak_flops is None or not (step_time_s > 0 and math.isfinite(step_time_s)):
        return math.nan
    return step_flops / (step_time_s * peak_flops * n_gpus)
