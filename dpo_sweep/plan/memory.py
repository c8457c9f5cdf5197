"""Predicted peak memory of one trial, from the model's shapes (no weights, nothing run).

The peak is the largest of three moments of an optimizer step, each a sum of parts (GB = 1e9 B):

* **backward start** - the policy's forward is done: every saved activation is alive and the
  chunked head's backward runs first. At ``grad_acc >= 2`` the gradients of the previous
  micro-step are alive too; at ``grad_acc == 1`` they are not (``zero_grad(set_to_none=True)``),
  which is why grad_acc 1 peaks lower (benchmarks/README.md#memory-model).
* **last layer backward** - the head's backward is over and the last decoder layer's runs:
  every saved activation is still alive, plus what the layer's level recomputes of it and the
  gradients its MLP's backward holds (:func:`first_backward_bytes_per_token`). It wins where
  little is saved per layer and the micro-batch is long (``full`` and L2 at 16k tokens: 2.8 and
  1.4 GB on a 3B Mistral shape, benchmarks/results/user_case_h200/).
* **backward end** (grad_acc 1) - the activations are freed layer by layer while the gradients
  grow: at the end all gradients exist, plus the first layer's tensors, kept under ``none`` and
  rebuilt by the recompute under every checkpointed level: the same at every level
  (:func:`last_layer_bytes_per_token`). It wins for small micro-batches (8B mb 1: 80.4 GB
  allocated ~ 64.2 static + 16.1 gradients + 0.2 for the first layer).
* **reference forward** - a live reference runs a no-grad forward first; only its head's
  logits are transient.

Parts and where they come from (``dpo_sweep/train``):

===========  ===============================================================================
weights      ``n_params x`` weight bytes (``model.weight_dtype``: bf16 for ``bf16``, else fp32);
             LoRA / QLoRA: plus the adapters, QLoRA's decoder linears in NF4 (plan/levers.py)
grads        gradients in the weights' dtype, of the trained parameters only (LoRA: the adapters);
             DDP adds its buckets (a copy of them, always alive); ``optimizer_in_backward``: the
             largest one only, each freed by its own step in backward
optimizer    fused AdamW: two states per trained parameter in the weights' dtype; low-bit AdamW
             (``train.optimizer``) its 8- or 4-bit states (plan/levers.py)
reference    a live reference is a second copy of the weights (none with adapters: the
             adapters-off policy is the reference); a precomputed table is on the CPU
ema          ``train.ema_decay``: a float32 copy of the trained weights (``knobs.WeightEma``)
casts        bf16-mixed / fp16: autocast caches a bf16 copy of each trained weight it casts (the
             attention projections; the MLP too without lean ops)
activations  per decoder layer and token, what autograd saves at the checkpoint level
             (:func:`layer_saved_bytes_per_token`), plus the final norm's input and the hidden
             states the chunked head keeps
head         the log-prob head's backward transient: one chunk of float32 logits and their
             gradient, plus the lm_head weight's gradient (``logprobs.ChunkedTokenLogProbs``);
             ``logp_chunk_tokens: 0``: ``12 x tokens x vocab`` bytes (log-softmax output, its
             gradient and the gather's gradient, all float32)
allocator    what the caching allocator reserves above what is allocated: 3.0 %, the median of
             ``torch_peak_reserved_gb / torch_peak_alloc_gb - 1`` over the committed GPU rows
             (benchmarks/README.md#memory-model)
context      CUDA context and kernel images, outside torch's allocator: NVML peak minus torch's
             reserved peak in the committed GPU rows (benchmarks/README.md#memory-model);
             0 on the CPU (RSS is not modelled there)
===========  ===============================================================================

Tokens per micro-step are those of the longest micro-batch (the worst case that ``peak_mem_gb``
reports): given the data's lengths, ``2 x micro_batch x`` the longest pair's padded width, or
with ``padding_free`` the real tokens of the ``micro_batch`` longest pairs in one row; without
them, ``2 x micro_batch x max_length``. Attention through sdpa or flash-attn saves
q, k, v (GQA-sized), the output and the log-sum-exp, linear in tokens; ``eager`` also saves the
``T x T`` probabilities. A micro-batch with padding gives sdpa a mask: then k and v are repeated
to every head and each layer keeps a ``T x T`` bias per row (:func:`_attention_internal_bytes`).
``benchmarks/memory_model_check.py`` compares this with every committed GPU measurement.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields

from dpo_sweep.config import ModelSpec, TrialConfig
from dpo_sweep.plan import ranks, trl_memory
from dpo_sweep.plan.levers import lever_bytes
from dpo_sweep.plan.memo import by_content, memory_read
from dpo_sweep.plan.shape import ModelShape, model_shape
from dpo_sweep.core.lengths import LengthProfile
from dpo_sweep.core import trial_facts
from dpo_sweep.core.levels import Level

GB = 1e9
#: NVML device-used minus torch's reserved peak on CUDA (see the module doc).
CUDA_CONTEXT_GB = 1.449
#: Reserved above allocated, as a fraction of allocated (median of the committed GPU rows).
ALLOCATOR_OVERHEAD = 0.030
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class MemoryEstimate:
    """One configuration's predicted peak, by part (GB = 1e9 B), at the moment ``peak_at``."""

    weights_gb: float
    grads_gb: float
    optimizer_gb: float
    reference_gb: float
    ema_gb: float
    casts_gb: float
    activations_gb: float
    head_gb: float
    allocator_gb: float
    context_gb: float
    total_gb: float
    peak_at: str  # backward start | last layer backward | backward end | reference forward
    tokens: int   # of the micro-step it sized: the longest one (worst_micro_batch)

    def parts(self) -> dict[str, float]:
        """The parts that add up to ``total_gb``."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("total_gb", "peak_at", "tokens")}


@dataclass(frozen=True)
class ElementBytes:
    """Bytes per element: trained weights (and their grads, AdamW state), matmul activations,
    and the residual stream (fp32 under autocast: the embedding output is fp32)."""

    weight: int
    activation: int
    residual: int
    autocast: bool


def element_bytes(spec: ModelSpec, precision: str) -> ElementBytes:
    """The precision table (docs/trainer.md#precision) in bytes."""
    weight = _BYTES[spec.dtype] if spec.dtype else (2 if precision == "bf16" else 4)
    autocast = precision in ("bf16-mixed", "fp16")
    activation = 2 if autocast else weight
    return ElementBytes(weight=weight, activation=activation, residual=weight, autocast=autocast)


def _norm_bytes(s: ModelShape, b: ElementBytes, lean: bool, liger: bool) -> float:
    """One norm's saved bytes per token. Lean and liger RMSNorm save the input and one float32 per
    token; the stock one a float32 copy of the input and the normalised tensor (lean.py); torch's
    LayerNorm its input, mean and rstd; a LayerNorm written in Python (Cohere's) the centred input,
    the normalised tensor and a float32 copy."""
    if s.norm_kind == "layer":
        return b.residual * s.hidden + 8
    if s.norm_kind == "centered":
        return (8 + b.residual) * s.hidden + 4
    if (lean and s.lean_norm) or liger:
        return b.residual * s.hidden + 4
    return (4 + b.residual) * s.hidden


def _mlp_internal_bytes(s: ModelShape, b: ElementBytes, lean: bool, liger: bool) -> float:
    """The MLP's saved bytes per token beyond its input. Gated: lean: gate and up; liger's SwiGLU:
    also the product; stock: gate, act(gate), up, product. Ungated (GPT-2, GPT-NeoX): what the
    activation saves and its output. An MoE (:func:`_experts_bytes`) adds its routed tokens."""
    if s.gated_mlp:
        widths = 2 if (lean and s.lean_mlp) else (3 if liger else 4)
    else:
        widths = s.act_saved + 1
    dense = b.activation * widths * s.intermediate
    if s.shared_gate:  # the shared expert's output and its sigmoid gate, kept for their product
        dense += b.activation * s.hidden + 4
    return dense + _experts_bytes(s, b)


def _experts_bytes(s: ModelShape, b: ElementBytes) -> float:
    """An MoE layer's routed tokens, per token: each of the top-k copies keeps its input, gate and up
    (one tensor), act(gate), their product and its output scaled by the routing weight (2H + 4I),
    plus the router's float32 probabilities and the int64 orders of the grouped matmuls (as
    transformers' grouped_mm experts save them)."""
    if not s.experts_per_token:
        return 0.0
    k = s.experts_per_token
    routed = k * (b.activation * (2 * s.hidden + 4 * s.expert_intermediate) + 4 + 3 * 8)
    return routed + 4 * s.n_experts + 12 * k + 4


def _attention_internal_bytes(s: ModelShape, b: ElementBytes, attn: str, seq_len: int, masked: bool,
                              lean: bool = False) -> float:
    """What the attention sub-block saves beyond its input, per token. sdpa/flash: q, k, v at
    their GQA sizes, the output (whose storage is the o_proj input) and the float32 log-sum-exp.
    sdpa with a padding mask (``masked``): transformers repeats k and v to every head (the fused
    kernels take GQA only without a mask: ``use_gqa_in_sdpa``), and torch turns the boolean mask
    into a bias of the activations' dtype in every layer's call, ``[rows, 1, T, T]``, which the
    kernel keeps for its backward: ``seq_len`` elements per token and layer. A sliding-window layer
    shorter than the sequence gets such a mask on sdpa too. Family terms: q/k norms keep a float32
    copy of q and k and their normalised values; a fused q/k/v projection with rotary positions
    keeps the whole projection (v is a view of it); rotary positions written with ``torch.cat``
    (partial rotary: Phi-3, GPT-NeoX, StableLM) give q a head-major layout, so the kernel's output
    is copied once more for the o projection."""
    extra = 0.0
    if s.qk_norm:  # lean RMSNorm: the input and one float32 per head row, as for the layer's norms
        lean_norm = lean and s.lean_norm
        extra = ((b.residual * (s.q_dim + s.kv_dim) + 4 * (s.q_dim + s.kv_dim) // (s.q_dim // s.n_heads))
                 if lean_norm else (4 + b.activation) * (s.q_dim + s.kv_dim))
    if s.fused_qkv and s.rope:
        extra += b.activation * (s.q_dim + s.kv_dim)
    if s.rope_cat:
        extra += b.activation * s.q_dim
    if attn == "eager":  # k/v repeated to every head, float32 softmax output and its bf16 copy
        return extra + b.activation * (4 * s.q_dim) + (4 + b.activation) * s.n_heads * seq_len

    def kernel(with_mask: bool) -> float:
        if with_mask and attn != "flash_attention_2":
            return b.activation * (4 * s.q_dim + seq_len) + 4 * s.n_heads
        return b.activation * (2 * s.q_dim + 2 * s.kv_dim) + 4 * s.n_heads

    windowed = s.sliding_share if (s.sliding_window and seq_len > s.sliding_window) else 0.0
    return extra + (1 - windowed) * kernel(masked) + windowed * kernel(True)


def layer_saved_bytes_per_token(s: ModelShape, b: ElementBytes, level: str, *, lean: bool = True,
                                liger: bool = False, attn: str = "sdpa", seq_len: int = 1024,
                                masked: bool = False) -> float:
    """Bytes autograd keeps per token for one decoder layer between forward and backward
    (``masked``: the micro-batch has padding, so the attention gets a mask). Regions wrap the
    family's own attention and MLP (train/checkpointing.py), so what a family adds inside them
    (q/k norms, experts) is freed by the level that recomputes them."""
    regions = Level(level).regions
    norms = s.norms_per_layer * _norm_bytes(s, b, lean, liger)
    # The normed inputs of attention and the MLP (one, shared, where one norm feeds both: Cohere).
    region_inputs = min(2, s.norms_per_layer) * b.activation * s.hidden
    attention = _attention_internal_bytes(s, b, attn, seq_len, masked, lean)
    if regions.attention:
        # The attention region keeps only the kernel's output and log-sum-exp (checkpointing.py);
        # eager's matmul/softmax are not kernel ops, so all of it is recomputed.
        attention = 0.0 if attn == "eager" else b.activation * s.q_dim + 4 * s.n_heads
    mlp = 0.0 if regions.mlp else _mlp_internal_bytes(s, b, lean, liger)
    if regions.layer:
        return b.residual * s.hidden  # only the layer's input
    return norms + region_inputs + attention + mlp


def last_layer_bytes_per_token(s: ModelShape, b: ElementBytes, *, lean: bool = True, liger: bool = False,
                               attn: str = "sdpa", seq_len: int = 1024, masked: bool = False) -> float:
    """What the layer back-propagated last (the first decoder layer) holds during its backward,
    per token, at every checkpoint level: all its tensors, kept since the forward under ``none``,
    rebuilt by the recompute under the checkpointed levels (``full`` rebuilds the whole layer, L1
    the MLP beside the kept rest; L2/L3 rebuild their regions one at a time, which this bounds
    from above by one layer's q/k/v or MLP, a few MB). So at the end of backward no level holds
    more than another, and the level order of the backward start (none >= L1 >= L2 >= L3 >=
    full) is the order of the peak: the rule by which an OOM prunes weaker levels
    (plan/rules.dominates_in_memory)."""
    return layer_saved_bytes_per_token(s, b, "none", lean=lean, liger=liger, attn=attn, seq_len=seq_len,
                                       masked=masked)


def first_backward_bytes_per_token(s: ModelShape, b: ElementBytes, level: str, *, lean: bool = True,
                                   liger: bool = False, attn: str = "sdpa", seq_len: int = 1024,
                                   masked: bool = False) -> float:
    """What the first layer back-propagated (the last decoder layer) adds per token to every
    saved activation while its backward runs: what its level recomputes of it (``none``:
    nothing; ``full``: all of it) and the gradients its MLP's backward holds at once beside those
    of the layer's output and residual input: of the down projection's input, of gate and up, and
    silu's derivative (four MLP-wide tensors); liger's SwiGLU writes the gradients of gate and up
    into the storage of its saved inputs, so only the product's gradient is new (one). Checked
    against the NVML peaks of benchmarks/results/user_case_h200/ (Qwen2 and Mistral shapes at
    4k-32k tokens) and benchmarks/memory_model_check.py's rows."""
    kw = dict(lean=lean, liger=liger, attn=attn, seq_len=seq_len, masked=masked)
    recompute = layer_saved_bytes_per_token(s, b, "none", **kw) - layer_saved_bytes_per_token(s, b, level, **kw)
    mlp_grads = 1 if liger else 4
    return recompute + mlp_grads * b.activation * s.intermediate + 2 * b.residual * s.hidden


def model_saved_bytes_per_token(s: ModelShape, b: ElementBytes, level: str, *, lean: bool = True,
                                liger: bool = False, attn: str = "sdpa", seq_len: int = 1024,
                                masked: bool = False) -> float:
    """Bytes autograd keeps per token for the whole policy forward: the decoder layers, the final
    norm, the hidden states the chunked head keeps (every token counted as a response token: the
    worst case), RoPE's cos/sin (shared by the layers; rebuilt under ``full``) and the int64 token
    ids, labels and row indices."""
    decoder = decoder_saved_bytes_per_token(s, b, level, lean=lean, liger=liger, attn=attn, seq_len=seq_len,
                                            masked=masked)
    return decoder + b.activation * s.hidden + 3 * 8


def decoder_saved_bytes_per_token(s: ModelShape, b: ElementBytes, level: str, *, lean: bool = True,
                                  liger: bool = False, attn: str = "sdpa", seq_len: int = 1024,
                                  masked: bool = False) -> float:
    """Bytes autograd keeps per token for the decoder's forward (the base model, to its final
    norm): the layers, the final norm and RoPE's cos/sin (shared by the layers; rebuilt under
    ``full``). tests/plan/test_memory_families.py measures it on tiny models of many families."""
    layers = s.n_layers * layer_saved_bytes_per_token(s, b, level, lean=lean, liger=liger, attn=attn,
                                                      seq_len=seq_len, masked=masked)
    rope = 0 if Level(level).regions.layer else 2 * b.activation * (s.q_dim // s.n_heads)
    return layers + _norm_bytes(s, b, lean, liger) + rope


def _head_bytes(s: ModelShape, b: ElementBytes, tokens: int, chunk_tokens: int) -> float:
    """Backward transient of the log-prob head, including the lm_head weight's gradient."""
    grad_w = s.vocab * s.hidden * b.weight
    if chunk_tokens == 0:
        return 12.0 * tokens * s.vocab + grad_w
    return min(chunk_tokens, tokens) * s.vocab * (4 + b.activation) + grad_w


def _reference_forward_bytes(s: ModelShape, b: ElementBytes, tokens: int, chunk_tokens: int, seq_len: int,
                             attn: str, masked: bool, trl: bool = False) -> float:
    """A no-grad forward holds one layer's tensors and the head's logits at a time (``trl``: TRL's
    fused head's tile)."""
    layer = tokens * layer_saved_bytes_per_token(s, b, "none", lean=not trl, attn=attn, seq_len=seq_len,
                                                 masked=masked)
    if trl:
        return layer + trl_memory.fused_head_forward_bytes(tokens, s.vocab, b.activation)
    rows = tokens if chunk_tokens == 0 else min(chunk_tokens, tokens)
    head = rows * s.vocab * ((b.activation + 4 + 4) if chunk_tokens == 0 else (b.activation + 4))
    return layer + head


def worst_micro_batch_padded(cfg: TrialConfig, lengths: LengthProfile | None) -> bool:
    """Whether the largest micro-batch ``cfg`` runs has padding: unknown lengths are taken as
    every sequence at ``max_length`` (none)."""
    return lengths is not None and lengths.worst_micro_batch_padded(cfg.micro_batch, cfg.train.padding_free)


def worst_micro_batch(cfg: TrialConfig, lengths: LengthProfile | None, device: str | None = None) -> tuple[int, int]:
    """(tokens, longest row) of the largest micro-batch ``cfg`` runs on ``device`` (None: where the
    planner assumes it runs): its data's
    ``micro_batch`` longest pairs (the worst-case step) when their lengths are known, else every
    sequence at ``max_length`` (rows of one length: no padding to round); padded rows as wide as
    ``train.pad_to_multiple_of`` rounds them."""
    if lengths is None:
        return 2 * cfg.micro_batch * cfg.train.max_length, cfg.train.max_length
    multiple = trial_facts.pad_multiple(cfg.train, device or trial_facts.planned_device(cfg))
    return lengths.worst_micro_batch(cfg.micro_batch, cfg.train.padding_free, multiple)


def predict_peak_gb(cfg: TrialConfig, *, device: str = "cuda", shape: ModelShape | None = None,
                    lengths: LengthProfile | None = None) -> MemoryEstimate:
    """The predicted NVML peak of ``cfg`` on one worker (``device``: ``cuda`` or ``cpu``);
    ``lengths``: the data's, for the longest micro-batch (:func:`worst_micro_batch`)."""
    s = shape or model_shape(cfg.model)
    t = cfg.train
    b = element_bytes(cfg.model, t.precision)
    trl = t.trainer == "trl"  # TRL's DPOTrainer: stock modules, its fused head (plan/trl_memory.py)
    lean, attn = cfg.model.lean_ops and not trl, trial_facts.planned_attention(cfg.model.attn_implementation)
    liger = trial_facts.planned_liger(cfg.model.liger_kernel, s.arch, device) and not trl  # trl_trainer.py: off
    world = cfg.resources.workers_per_trial
    shard = ranks.shard_factor(cfg)  # FSDP2: N; DDP and one worker: 1 (plan/ranks.py)
    tokens, seq_len = worst_micro_batch(cfg, lengths, device)
    masked = worst_micro_batch_padded(cfg, lengths)
    lev = lever_bytes(cfg, s, b.weight, b.activation, b.autocast, lean, liger)  # adapter and optimizer (levers.py)
    gathered = ranks.gathered_parts(cfg, s, b.weight, trained_base=lev.lm_head_grad) if shard > 1 else None
    if gathered is not None:  # the gathered weights are the compute dtype: so is the residual stream
        b = dataclasses.replace(b, residual=ranks.gathered_bytes(t.precision, b.weight))
    kw = dict(lean=lean, liger=liger, attn=attn, seq_len=seq_len, masked=masked)

    weights = lev.weights / shard
    grads = lev.grads / shard
    buckets = grads if (world > 1 and shard == 1) else 0.0  # DDP's gradient buckets, from construction on
    grads_all = grads + buckets if not t.optimizer_in_backward else lev.largest_grad  # in backward: one at a time
    optimizer = lev.optimizer / shard
    reference = s.n_params * b.weight / shard if t.reference == "live" and lev.reference_copy else 0.0
    # FSDP2's gathered weights are bf16 already under bf16-mixed: autocast caches no copies.
    casts = (lev.cast_params * 2 / shard if b.autocast and gathered is None else 0.0) + lev.transient
    ema = 4.0 * lev.trainable / shard if t.ema_decay is not None else 0.0
    static = weights + optimizer + reference + ema + casts
    per_token = model_saved_bytes_per_token(s, b, cfg.checkpoint_level, **kw) + lev.saved_per_token
    activations = tokens * per_token
    head = ((trl_memory.fused_head_backward_bytes(tokens, s.hidden, s.vocab, b.activation, b.weight) if trl
             else _head_bytes(s, b, tokens, t.logp_chunk_tokens))
            - (0.0 if lev.lm_head_grad and gathered is None else s.vocab * s.hidden * b.weight))
    end_transient = max(tokens * last_layer_bytes_per_token(s, b, **kw),
                        s.vocab * s.hidden * b.weight if s.tied and lev.lm_head_grad else 0.0)  # tied: the embedding's grad
    grads_in_step = grads_all if cfg.grad_acc >= 2 else buckets
    # The head's backward is over when the last decoder layer's starts: of it only the lm_head
    # weight's gradient is left, which at grad_acc >= 2 is among the gradients already.
    head_left = s.vocab * s.hidden * b.weight if (cfg.grad_acc == 1 and lev.lm_head_grad) else 0.0
    first_backward = tokens * first_backward_bytes_per_token(s, b, cfg.checkpoint_level, **kw)
    # FSDP2: the gathered layers, the reduce-scatter buffers and the unsharded head gradient (ranks.py).
    at = gathered or ranks.GatheredParts(0.0, 0.0, 0.0, 0.0, 0.0)
    if gathered is not None:
        head += gathered.head_grad
        head_left = 0.0  # among the gathered parts, until the root's reduce-scatter at the end
    moments = {
        "backward start": (grads_in_step, activations, head + at.backward_start),
        "last layer backward": (grads_in_step, activations + first_backward, head_left + at.last_layer_backward),
        "backward end": (grads_all, end_transient, at.backward_end),
        "reference forward": (grads_in_step, 0.0,
                              _reference_forward_bytes(s, b, tokens, t.logp_chunk_tokens, seq_len, attn, masked, trl)
                              + at.reference_forward if t.reference == "live" else 0.0),
    }
    peak_at = max(moments, key=lambda k: sum(moments[k]))  # dict order breaks ties: backward start
    grads, acts, head_part = moments[peak_at]
    allocated = static + grads + acts + head_part
    cuda = device == "cuda"
    allocator = 0.0 if not cuda else (ranks.stream_pools(cfg, s, b.weight, acts) if gathered is not None
                                      else ALLOCATOR_OVERHEAD * allocated)
    context = CUDA_CONTEXT_GB * GB if cuda else 0.0
    return MemoryEstimate(
        weights_gb=weights / GB, grads_gb=grads / GB, optimizer_gb=optimizer / GB, reference_gb=reference / GB,
        ema_gb=ema / GB, casts_gb=casts / GB, activations_gb=acts / GB, head_gb=head_part / GB, allocator_gb=allocator / GB,
        context_gb=context / GB, total_gb=(allocated + allocator + context) / GB, peak_at=peak_at,
        tokens=tokens,
    )


@by_content(memory_read)  # the betas of a configuration share its peak (plan/memo.py)
def predicted_peak_label(cfg: TrialConfig, lengths: LengthProfile | None = None) -> str:
    """The predicted peak in GB for a table, or ``-`` when the model's config cannot be read here
    (a hub id that is not cached, a checkpoint without a config)."""
    try:
        return f"{predict_peak_gb(cfg, device=trial_facts.planned_device(cfg), lengths=lengths).total_gb:.1f}"
    except (OSError, ValueError, KeyError):
        return "-"
