"""What one rank of a multi-worker trial sends per optimizer step, and how long that takes over
its card's interconnect: the communication a simulated trial's modelled step time adds to its
one-rank compute time (train/summary.py; train/parallel.py says what each parallelism sends).

Ring collectives over N ranks, per rank: an all-gather or a reduce-scatter of a tensor of B bytes
moves (N-1)/N x B, an all-reduce twice that. Per optimizer step of ``grad_acc`` micro-steps:

* ``ddp``: one all-reduce of the trainable parameters' gradients (``no_sync`` on the other
  micro-steps; on every micro-step under ``resources.sync_every_micro_step``);
* ``fsdp``: per micro-step, the parameters all-gathered for the forward and again for the
  backward, the gradients reduce-scattered; ``fsdp_grad_op``: one all-gather per micro-step;
* a live reference under FSDP2: its parameters all-gathered once per micro-step (forward only).

Gathered parameters travel in the compute dtype (bf16 under ``bf16-mixed``), gradients in the
reduction dtype (fp32 under ``bf16-mixed``). No overlap of communication with compute is
assumed: the modelled step time is an upper bound of the real one, whose collectives partly
hide behind the compute. Standard library only.
"""
from __future__ import annotations

from dataclasses import dataclass

#: Where the card is unknown (a CPU, a card the catalog lacks): PCIe Gen4 x16, one direction.
DEFAULT_INTERCONNECT_GB_S = 32.0

_STORAGE_BYTES = {"fp32": 4, "bf16": 2, "bf16-mixed": 4, "fp16": 4}


@dataclass(frozen=True)
class StepTraffic:
    """Bytes one rank sends per optimizer step, by collective."""

    all_gather: float
    reduce_scatter: float
    all_reduce: float

    @property
    def total(self) -> float:
        return self.all_gather + self.reduce_scatter + self.all_reduce

    def ms(self, interconnect_gb_s: float) -> float:
        """The step's communication time at ``interconnect_gb_s`` (GB/s, one direction)."""
        return self.total / (interconnect_gb_s * 1e9) * 1e3


def grows_with_micro_steps(parallelism: str, sync_every_micro_step: bool = False) -> bool:
    """Whether a step's communication recurs with each micro-step (FSDP2's gathers and
    reduce-scatters; DDP's all-reduce only under ``sync_every_micro_step``)."""
    return parallelism != "ddp" or sync_every_micro_step


def step_traffic(*, parallelism: str, world: int, params: int, trainable: int, grad_acc: int, precision: str,
                 live_reference: bool, reference_params: int = 0, sync_every_micro_step: bool = False) -> StepTraffic:
    """:class:`StepTraffic` of one rank of ``world``; ``params``: the policy's parameters
    (all gathered under FSDP2, frozen ones too), ``trainable``: those with gradients,
    ``reference_params``: a live reference's own copy (0 for LoRA's adapters-off policy)."""
    if world <= 1:
        return StepTraffic(0.0, 0.0, 0.0)
    ring = (world - 1) / world
    storage = _STORAGE_BYTES.get(precision, 4)
    gathered = 2 if precision == "bf16-mixed" else storage
    reduced = storage
    if parallelism == "ddp":
        per_sync = 2 * ring * trainable * reduced
        syncs = grad_acc if sync_every_micro_step else 1
        return StepTraffic(0.0, 0.0, syncs * per_sync)
    gathers = 2 if parallelism == "fsdp" else 1
    gather_micro = ring * gathered * (gathers * params + (reference_params if live_reference else 0))
    scatter_micro = ring * trainable * reduced
    return StepTraffic(grad_acc * gather_micro, grad_acc * scatter_micro, 0.0)
