"""The trial's final weights evaluated on a held batch: ``eval_loss`` of results.csv.

The held batch is the dataset's first ``effective_batch`` pairs in file order (the same pairs
for every trial of a sweep, whatever its split or seed), scored without gradients by the DPO
loss at the last step's beta. With ``train.ema_decay`` the final weights are the EMA weights,
so EMA and plain trials compare on the same pairs. The pairs are also training pairs: this
measures where the optimisation ended, not generalisation.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from dpo_sweep.config import TrainSpec
from dpo_sweep.train.data import PairDataset
from dpo_sweep.train.loss import dpo_loss

#: ``logps_table(model, dataset) -> [N, 2]`` (chosen, rejected) sequence log-probs: the loop's
#: ``precompute_reference`` with its config, device and pad id bound.
LogpsTable = Callable[[torch.nn.Module, PairDataset], torch.Tensor]


def held_batch(ds: PairDataset, pairs: int) -> PairDataset:
    return dataclasses.replace(ds, pairs=ds.pairs[:pairs])


@torch.no_grad()
def held_batch_loss(logps_table: LogpsTable, policy: torch.nn.Module, reference: torch.nn.Module | None,
                    ref_table: torch.Tensor | None, ds: PairDataset, pairs: int, beta: float,
                    train: TrainSpec) -> float:
    """Mean DPO loss of ``policy`` on the held batch; the reference is ``ref_table``'s rows
    (precomputed) or ``reference`` run on the batch (live)."""
    held = held_batch(ds, pairs)
    was_training = policy.training
    policy.eval()
    pol = logps_table(policy, held)
    policy.train(was_training)
    ref = ref_table[:len(held)] if ref_table is not None else logps_table(reference, held)
    chosen = torch.tensor([len(p.chosen_ids) for p in held.pairs])
    rejected = torch.tensor([len(p.rejected_ids) for p in held.pairs])
    losses, _, _ = dpo_loss(pol[:, 0], pol[:, 1], ref[:, 0], ref[:, 1], beta, train.loss,
                            train.label_smoothing, chosen_tokens=chosen, rejected_tokens=rejected)
    return float(losses.mean())
