"""How several workers share a trial: the policy under DDP or FSDP2, the frozen reference under
FSDP2, and the simulated ranks of ``resources.simulate_ranks`` (one rank of an N-rank trial
alone, through PyTorch's fake process group).

* ``ddp``: a replica per worker; the gradients all-reduced in buckets once per optimizer step
  (``no_sync`` on the accumulation micro-steps).
* ``fsdp``: FSDP2 ``fully_shard`` per decoder layer and once more at the root (embeddings, final
  norm, head): parameters, gradients and optimizer state are sharded; each layer is all-gathered
  for its forward and again for its backward, and its gradients are reduce-scattered on every
  micro-step (an unsharded accumulation would hold a whole model's gradients on every rank).
  ``bf16-mixed``: bf16 gathered parameters, fp32 reduction.
* ``fsdp_grad_op``: the same without resharding after forward (ZeRO-2-like, FSDP1's
  SHARD_GRAD_OP): the gathered layers stay from their forward to their backward, one all-gather
  less per micro-step.
* Under FSDP2 the live reference is sharded the same way (no gradients, no optimizer), resharded
  after each layer's forward.

Simulated ranks: the fake backend (``torch.testing._internal.distributed.fake_pg``, as
torchtitan's memory estimator runs FSDP2) gives the process the rank 0 of ``workers_per_trial``
ranks: it reads its own micro-batches and holds its own shards, gathered layers and activations,
real tensors of real sizes, while every collective returns at once. What other ranks would have
sent is not there (a gathered layer's other shards are uninitialised memory), so a simulated
trial's losses are no learning signal; its memory and its compute time are the rank's.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from dpo_sweep.config import TrialConfig
from dpo_sweep.core.trial_facts import ranks_simulated
from dpo_sweep.train.checkpointing import decoder_layers

FSDP_MODES = ("fsdp", "fsdp_grad_op")


def sharded(cfg: TrialConfig, world: int) -> bool:
    """Whether the trial's models are sharded with FSDP2 (several ranks and an FSDP mode)."""
    return world > 1 and cfg.resources.parallelism in FSDP_MODES


@contextlib.contextmanager
def simulated_group(cfg: TrialConfig) -> Iterator[bool]:
    """The fake process group of ``workers_per_trial`` ranks, this process rank 0, while the body
    runs, where ``cfg`` runs simulated and no group exists yet; yields whether it made one."""
    if not ranks_simulated(cfg) or (dist.is_available() and dist.is_initialized()):
        yield False
        return
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=cfg.resources.workers_per_trial)
    try:
        yield True
    finally:
        dist.destroy_process_group()


def simulating() -> bool:
    """Whether this process's group is the fake one (its collectives return at once)."""
    return dist.is_available() and dist.is_initialized() and dist.get_backend() == "fake"


def _mixed_precision(cfg: TrialConfig):  # -> MixedPrecisionPolicy
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if cfg.train.precision == "bf16-mixed":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def _shard(cfg: TrialConfig, module: nn.Module, lm: nn.Module, reshard_after_forward: bool) -> None:
    from torch.distributed.fsdp import fully_shard

    mp = _mixed_precision(cfg)
    for layer in decoder_layers(lm):
        fully_shard(layer, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(module, mp_policy=mp, reshard_after_forward=reshard_after_forward)


def wrap_policy(cfg: TrialConfig, policy_logps: nn.Module, device: torch.device, world: int) -> nn.Module:
    """The policy's log-prob module (``.lm``: the causal LM) for ``world`` workers."""
    if world == 1:
        return policy_logps
    if sharded(cfg, world):
        _shard(cfg, policy_logps, policy_logps.lm, reshard_after_forward=cfg.resources.parallelism == "fsdp")
        _free_cache(device)
        return policy_logps
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(policy_logps, device_ids=[device.index] if device.type == "cuda" else None)
    if simulating():
        # The fake group's all-reduce gives DDP's reducer no result: the bucket stands for it.
        ddp.register_comm_hook(None, _bucket_as_is)
    return ddp


def shard_reference(cfg: TrialConfig, reference_logps: nn.Module, device: torch.device, world: int) -> nn.Module:
    """The frozen reference's log-prob module, sharded like the policy under FSDP2 (each layer
    resharded after its forward: it has no backward); as it is otherwise."""
    if sharded(cfg, world):
        _shard(cfg, reference_logps, reference_logps.lm, reshard_after_forward=True)
        _free_cache(device)
    return reference_logps


def _free_cache(device: torch.device) -> None:
    # The unsharded weights are gone once sharded: their blocks go back, so the steps' NVML
    # peaks are theirs, not the build's.
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _bucket_as_is(_state, bucket):  # noqa: ANN001 - DDP reads the annotations, and refuses strings
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def no_sync(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """DDP: skip the all-reduce on accumulation micro-steps (one per optimizer step, overlapped
    with the last micro-step's backward). FSDP2 reduce-scatters on every micro-step (see the
    module doc), so it has nothing to skip."""
    if hasattr(model, "no_sync") and not sync:
        return model.no_sync()
    return contextlib.nullcontext()
