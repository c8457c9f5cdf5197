"""Micro-batches of whole pairs: the order of pairs, and padding them into tensors."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterator

import torch

from dpo_sweep.telemetry.flops import TokenCounts
from dpo_sweep.train.data import PairDataset, TokenizedPair


@dataclass(frozen=True)
class MicroBatch:
    """``2B`` sequences: rows ``0..B-1`` are prompt+chosen, rows ``B..2B-1`` prompt+rejected.

    ``response_mask[i, t]`` is True where token ``t`` of row ``i`` belongs to the response and so
    counts in the sequence log-prob; prompt and padding are False.
    """

    input_ids: torch.Tensor       # [2B, T] long
    attention_mask: torch.Tensor  # [2B, T] long, 0 on padding
    position_ids: torch.Tensor    # [2B, T] long, counted over real tokens only
    response_mask: torch.Tensor   # [2B, T] bool
    index: torch.Tensor           # [B] position of each pair in the dataset

    @property
    def pairs(self) -> int:
        return self.input_ids.shape[0] // 2

    def tokens(self) -> int:
        """Non-padding tokens of the policy forward (chosen and rejected sequences)."""
        return int(self.attention_mask.sum())

    def to(self, device: torch.device) -> MicroBatch:
        # non_blocking: the copy overlaps with the previous step's tail on CUDA.
        return MicroBatch(*(t.to(device, non_blocking=True) for t in
                            (self.input_ids, self.attention_mask, self.position_ids,
                             self.response_mask, self.index)))


def collate(pairs: list[TokenizedPair], index: list[int], pad_id: int, padding_side: str = "right") -> MicroBatch:
    """Pad whole pairs into one concatenated chosen+rejected batch."""
    seqs, masks = [], []
    for field in ("chosen_ids", "rejected_ids"):
        for p in pairs:
            resp = getattr(p, field)
            seqs.append(list(p.prompt_ids) + list(resp))
            masks.append([False] * len(p.prompt_ids) + [True] * len(resp))
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    resp = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        sl = slice(0, len(s)) if padding_side == "right" else slice(width - len(s), width)
        ids[i, sl] = torch.tensor(s)
        attn[i, sl] = 1
        resp[i, sl] = torch.tensor(m)
    # Positions count real tokens only, so left padding does not shift RoPE phases.
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return MicroBatch(ids, attn, pos, resp, torch.tensor(index, dtype=torch.long))


def usable_pairs(n_pairs: int, micro_batch: int, world_size: int, *, grad_acc: int) -> int:
    """Pairs used per epoch: whole effective batches (micro_batch x grad_acc x workers) only.

    drop_last on the effective batch, not on one micro-batch: every split of the same effective
    batch then leaves out the same pairs, so from the second epoch on they still see the same ones.
    """
    per_step = micro_batch * grad_acc * world_size
    return (n_pairs // per_step) * per_step


def micro_batch_order(n_pairs: int, micro_batch: int, world_size: int, rank: int, seed: int, *,
                      grad_acc: int) -> Iterator[list[int]]:
    """Endless pair indices for this rank's micro-batches.

    Each epoch shuffles with ``seed + epoch``, keeps the first :func:`usable_pairs` of that order
    and cuts them into global micro-batches of ``micro_batch * world_size`` pairs; rank ``r``
    takes the ``r``-th slice of each. Optimizer step ``s`` of an epoch therefore sees the pairs
    ``order[s*E:(s+1)*E]`` (E = effective batch) whatever the split into micro_batch x grad_acc
    x workers, and an epoch ends on a step boundary: that is what makes those splits give the
    same updates in every epoch.
    """
    per = micro_batch * world_size
    usable = usable_pairs(n_pairs, micro_batch, world_size, grad_acc=grad_acc)
    if usable == 0:
        raise ValueError(f"{n_pairs} pairs cannot fill one effective batch of micro_batch {micro_batch} "
                         f"x grad_acc {grad_acc} x {world_size} workers")
    for epoch in itertools.count():
        g = torch.Generator().manual_seed(seed + epoch)
        order = torch.randperm(n_pairs, generator=g)[:usable].tolist()
        for start in range(0, usable, per):
            yield order[start + rank * micro_batch: start + (rank + 1) * micro_batch]


def micro_batches(ds: PairDataset, micro_batch: int, world_size: int, rank: int, seed: int,
                  pad_id: int, padding_side: str = "right", *, grad_acc: int) -> Iterator[MicroBatch]:
    """Endless collated micro-batches for this rank."""
    for idx in micro_batch_order(len(ds), micro_batch, world_size, rank, seed, grad_acc=grad_acc):
        yield collate([ds.pairs[i] for i in idx], idx, pad_id, padding_side)


def flop_token_counts(mb: MicroBatch, chunked_head: bool) -> TokenCounts:
    """The exact token counts the FLOP count needs (telemetry.flops), from a CPU micro-batch.

    ``chunked_head``: the log-prob head computes the lm_head on response tokens only
    (``logp_chunk_tokens > 0``); the plain head computes it on every position but the last.
    """
    lengths = mb.attention_mask.sum(-1)
    # Token t is predicted from position t-1 (logprobs.SequenceLogProbs): response_mask[:, 1:].
    head_rows = mb.response_mask[:, 1:].sum() if chunked_head else (lengths - 1).clamp(min=0).sum()
    return TokenCounts(tokens=int(lengths.sum()), causal_pairs=int((lengths * (lengths + 1) // 2).sum()),
                       head_rows=int(head_rows))
