"""What one rank of a multi-worker trial holds beyond a one-worker trial's parts, for the memory
model (plan/memory.py adds them up; train/parallel.py is what it models).

==============  ==============================  ==============================================
part            ddp                             fsdp / fsdp_grad_op (FSDP2, N ranks)
==============  ==============================  ==============================================
weights, grads  a whole replica                 1/N each (the sharded fp32 master weights and
optimizer, ema                                  their fp32 gradients under ``bf16-mixed``)
buckets         a copy of the gradients         none (reduce-scatter buffers, below)
reference       a whole copy                    1/N, sharded like the policy
casts           autocast's bf16 weight copies   none: the gathered weights are bf16 already
residual        fp32 under autocast             bf16: the gathered embedding is (and the
                                                inputs are cast to it)
gathered        -                               the root group (embeddings, final norm, head),
                                                gathered from the forward to the end of its
                                                backward; 2 decoder layers in flight (the one
                                                running and the one prefetched); fsdp_grad_op:
                                                every layer from its forward to its backward
reduce-scatter  -                               a layer's unsharded bf16 gradients beside the
                                                previous layer's fp32 buffer still in flight; at
                                                the end of backward the root's (the embedding
                                                and head gradients, their fp32 copy; the root
                                                resharded before it)
allocator       3% of allocated                 the streams' own cached blocks (stream_pools)
reference fwd   -                               its 2 layers in flight and its root gathered
==============  ==============================  ==============================================

LoRA composes: the frozen base is sharded and gathered like full fine-tuning's, only the adapters
have gradients and optimizer state (their shards); QLoRA and the low-bit optimizers are refused
under FSDP2 by the trainer's checks where they do not compose and otherwise shard as their bytes.
Standard library only.
"""
from __future__ import annotations

from dataclasses import dataclass

from dpo_sweep.config import TrialConfig

FSDP_MODES = ("fsdp", "fsdp_grad_op")


def world(cfg: TrialConfig) -> int:
    return cfg.resources.workers_per_trial


def sharded(cfg: TrialConfig) -> bool:
    """Whether ``cfg``'s models are sharded with FSDP2 (several workers and an FSDP mode)."""
    return world(cfg) > 1 and cfg.resources.parallelism in FSDP_MODES


def shard_factor(cfg: TrialConfig) -> int:
    """What the sharded parts are divided by: N under FSDP2, else 1."""
    return world(cfg) if sharded(cfg) else 1


def gathered_bytes(precision: str, weight_bytes: int) -> int:
    """Bytes per element of a gathered weight: bf16 under ``bf16-mixed`` (the mixed-precision
    policy's parameter dtype), else the storage dtype."""
    return 2 if precision == "bf16-mixed" else weight_bytes


@dataclass(frozen=True)
class GatheredParts:
    """Bytes one FSDP2 rank holds beyond its shards at each moment of the step (memory.py's)."""

    backward_start: float
    last_layer_backward: float
    backward_end: float
    reference_forward: float
    head_grad: float  # the lm_head weight's gradient as the head's backward makes it (unsharded)


#: FSDP2's all-gather and reduce-scatter streams keep their own cached blocks (the caching
#: allocator pools per stream): reserved beyond allocated, fitted on simulated-rank probes
#: (benchmarks/README.md, "Simulated ranks"): about the root's and two layers' gathered and fp32
#: reduce-scatter buffers, less a share of the activations' blocks the peak reuses.
STREAM_POOL_FACTOR = 1.07
ACTIVATION_REUSE = 0.115


def stream_pools(cfg: TrialConfig, s, weight_bytes: int, activations: float) -> float:
    """Bytes the allocator reserves beyond the allocated peak under FSDP2 (see the constants)."""
    g = gathered_bytes(cfg.train.precision, weight_bytes)
    buffers = (root_params(s) + 2 * layer_params(s)) * (g + weight_bytes)
    return max(0.0, STREAM_POOL_FACTOR * buffers - ACTIVATION_REUSE * activations)


def root_params(s) -> int:
    """The root group's parameters: the embedding, the untied head and the final norm."""
    return s.vocab * s.hidden * (1 if s.tied else 2) + s.hidden


def layer_params(s) -> float:
    """One decoder layer's parameters (their mean over the layers)."""
    return (s.n_params - root_params(s)) / s.n_layers


def gathered_parts(cfg: TrialConfig, s, weight_bytes: int, trained_base: bool) -> GatheredParts:
    """:class:`GatheredParts` of ``cfg`` on the model of shape ``s`` (``trained_base``: the base
    weights have gradients, full fine-tuning; LoRA's adapters' are negligible here)."""
    g = gathered_bytes(cfg.train.precision, weight_bytes)
    root = root_params(s) * g
    layer = layer_params(s) * g
    in_flight = (s.n_layers if cfg.resources.parallelism == "fsdp_grad_op" else 2) * layer
    reduce_bytes = weight_bytes  # the reduction dtype: fp32 under bf16-mixed, else the storage's
    # A layer's backward: its unsharded gradients and the previous layer's fp32 reduce-scatter input.
    scatter = layer_params(s) * (g + reduce_bytes) if trained_base else 0.0
    head = s.vocab * s.hidden * g if trained_base else 0.0
    # The root is resharded before its reduce-scatter: its unsharded gradients and their fp32 copy.
    root_grads = root_params(s) * (g + reduce_bytes) if trained_base else 0.0
    reference = 0.0
    if cfg.train.reference == "live":
        reference = root + 2 * layer
    return GatheredParts(
        backward_start=root + in_flight,
        last_layer_backward=root + in_flight + scatter + head,
        backward_end=root_grads,
        reference_forward=reference,
        head_grad=head,
    )
