"""Micro-batches of whole pairs: padding them into tensors (which pairs each one takes: core/order.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from dpo_sweep.core.flops import TokenCounts
from dpo_sweep.train.data import PairDataset, TokenizedPair
from dpo_sweep.core.order import batch_width, micro_batch_order, packed_tokens, pair_length, usable_pairs, worst_case_order


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
    #: Packed (padding-free) batches only: ``[1, T]`` the sequence (0..2B-1) of each token.
    sequence_ids: torch.Tensor | None = None

    @property
    def pairs(self) -> int:
        return self.index.shape[0]

    def tokens(self) -> int:
        """Non-padding tokens of the policy forward (chosen and rejected sequences)."""
        return int(self.attention_mask.sum())

    def slots(self) -> int:
        """Token positions the forward computes, padding included."""
        return self.input_ids.numel()

    def max_seq_len(self) -> int:
        """The longest sequence (prompt + response) of the micro-batch."""
        if self.sequence_ids is not None:
            return int(torch.bincount(self.sequence_ids[0]).max())
        return int(self.attention_mask.sum(-1).max())

    def to(self, device: torch.device) -> MicroBatch:
        # non_blocking: the copy overlaps with the previous step's tail on CUDA.
        return MicroBatch(*(None if t is None else t.to(device, non_blocking=True) for t in
                            (self.input_ids, self.attention_mask, self.position_ids,
                             self.response_mask, self.index, self.sequence_ids)))


def collate(pairs: list[TokenizedPair], index: list[int], pad_id: int, padding_side: str = "right",
            multiple: int = 1) -> MicroBatch:
    """Pad whole pairs into one concatenated chosen+rejected batch, as wide as its longest row,
    rounded up to ``multiple`` when it has padding (``order.batch_width``; ``train.pad_to_multiple_of``
    as ``trial_facts.pad_multiple`` resolves it)."""
    seqs, masks = [], []
    for field in ("chosen_ids", "rejected_ids"):
        for p in pairs:
            resp = getattr(p, field)
            seqs.append(list(p.prompt_ids) + list(resp))
            masks.append([False] * len(p.prompt_ids) + [True] * len(resp))
    width = batch_width([len(s) for s in seqs], multiple)
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


def micro_batches(ds: PairDataset, micro_batch: int, world_size: int, rank: int, seed: int,
                  pad_id: int, padding_side: str = "right", *, grad_acc: int, group_by_length: bool = False,
                  padding_free: bool = False, multiple: int = 1) -> Iterator[MicroBatch]:
    """Endless collated micro-batches for this rank."""
    lengths = [pair_length(p) for p in ds.pairs] if group_by_length else None
    for idx in micro_batch_order(len(ds), micro_batch, world_size, rank, seed, grad_acc=grad_acc,
                                 lengths=lengths):
        yield make_batch(ds, idx, pad_id, padding_side, padding_free, multiple)


def flop_token_counts(mb: MicroBatch, chunked_head: bool) -> TokenCounts:
    """The exact token counts the FLOP count needs (core/flops.py), from a CPU micro-batch.

    ``chunked_head``: the log-prob head computes the lm_head on response tokens only
    (``logp_chunk_tokens > 0``); the plain head computes it on every position but the last.
    """
    # A packed row (padding_free) holds several sequences, each attending only to itself.
    lengths = (torch.bincount(mb.sequence_ids[0]) if mb.sequence_ids is not None
               else mb.attention_mask.sum(-1))
    rows = mb.attention_mask.sum(-1)  # what the plain head computes logits for, per row
    # Token t is predicted from position t-1 (logprobs.SequenceLogProbs): response_mask[:, 1:].
    head_rows = mb.response_mask[:, 1:].sum() if chunked_head else (rows - 1).clamp(min=0).sum()
    return TokenCounts(tokens=int(lengths.sum()), causal_pairs=int((lengths * (lengths + 1) // 2).sum()),
                       head_rows=int(head_rows))


def worst_case_batches(ds: PairDataset, micro_batch: int, world_size: int, rank: int, pad_id: int,
                       padding_side: str = "right", *, grad_acc: int, padding_free: bool = False,
                       multiple: int = 1) -> Iterator[MicroBatch]:
    """The worst-case step's micro-batches (:func:`worst_case_order`) for this rank."""
    lengths = [pair_length(p) for p in ds.pairs]
    packed = [packed_tokens(p) for p in ds.pairs] if padding_free else None
    for idx in worst_case_order(lengths, micro_batch, world_size, rank, grad_acc=grad_acc, packed=packed):
        yield make_batch(ds, idx, pad_id, padding_side, padding_free, multiple)


def make_batch(ds: PairDataset, idx: list[int], pad_id: int, padding_side: str, padding_free: bool,
               multiple: int = 1) -> MicroBatch:
    """Pairs ``idx`` of ``ds``, padded (:func:`collate`) or packed into one row (:func:`pack`)."""
    pairs = [ds.pairs[i] for i in idx]
    return pack(pairs, idx) if padding_free else collate(pairs, idx, pad_id, padding_side, multiple)


def pack(pairs: list[TokenizedPair], index: list[int]) -> MicroBatch:
    """Chosen then rejected sequences of whole pairs, end to end in one ``[1, T]`` row: no padding.

    ``position_ids`` restart at 0 for every sequence: transformers reads that as packed sequences
    (``masking_utils.find_packed_sequence_indices``, or flash-attn's varlen path) and keeps each
    sequence's attention to itself, so given no attention mask each sequence sees what it would
    see alone. A sequence's first token is never a target: in a padded row nothing precedes it.
    """
    ids, pos, resp, seq = [], [], [], []
    sequences = [(p, field) for field in ("chosen_ids", "rejected_ids") for p in pairs]
    for k, (p, field) in enumerate(sequences):
        tokens = list(p.prompt_ids) + list(getattr(p, field))
        ids += tokens
        pos += range(len(tokens))
        mask = [False] * len(p.prompt_ids) + [True] * (len(tokens) - len(p.prompt_ids))
        resp += [False] + mask[1:]
        seq += [k] * len(tokens)
    row = [torch.tensor([v]) for v in (ids, pos, seq)]
    return MicroBatch(row[0], torch.ones_like(row[0]), row[1], torch.tensor([resp]),
                      torch.tensor(index, dtype=torch.long), row[2])
