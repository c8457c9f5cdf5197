"""Micro-batches of whole pairs: the order of pairs, and padding them into tensors."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterator, Sequence

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


def pair_length(p: TokenizedPair) -> int:
    """A pair's padded width: its prompt and the longer response."""
    return len(p.prompt_ids) + max(len(p.chosen_ids), len(p.rejected_ids))


def packed_tokens(p: TokenizedPair) -> int:
    """A pair's tokens packed padding-free: the prompt twice (chosen and rejected rows) and both responses."""
    return 2 * len(p.prompt_ids) + len(p.chosen_ids) + len(p.rejected_ids)


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


def epoch_order(n_pairs: int, usable: int, per_step: int, seed: int, epoch: int,
                lengths: Sequence[int] | None = None) -> list[int]:
    """The pairs of one epoch, step after step (``per_step`` = the effective batch).

    Plain: a shuffle with ``seed + epoch``, its first ``usable``. With ``lengths``
    (``train.group_by_length``) those same pairs are sorted by length (longest first, ties in
    shuffled order), cut into steps of ``per_step`` pairs, and the steps shuffled with the same
    generator: each step holds pairs of similar length, and which pairs a step holds depends on
    the effective batch only, not on its split into micro_batch x grad_acc x workers.
    """
    g = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(n_pairs, generator=g)[:usable].tolist()
    if lengths is None:
        return order
    order.sort(key=lambda i: -lengths[i])  # stable: ties keep their shuffled order
    steps = [order[s:s + per_step] for s in range(0, usable, per_step)]
    return [i for k in torch.randperm(len(steps), generator=g).tolist() for i in steps[k]]


def micro_batch_order(n_pairs: int, micro_batch: int, world_size: int, rank: int, seed: int, *,
                      grad_acc: int, lengths: Sequence[int] | None = None) -> Iterator[list[int]]:
    """Endless pair indices for this rank's micro-batches.

    Each epoch takes :func:`epoch_order` (``lengths``: grouped by length) and cuts it into global
    micro-batches of ``micro_batch * world_size`` pairs; rank ``r`` takes the ``r``-th slice of
    each. Optimizer step ``s`` of an epoch therefore sees the pairs ``order[s*E:(s+1)*E]``
    (E = effective batch) whatever the split into micro_batch x grad_acc x workers, and an epoch
    ends on a step boundary: that is what makes those splits give the same updates in every epoch.
    """
    per = micro_batch * world_size
    usable = usable_pairs(n_pairs, micro_batch, world_size, grad_acc=grad_acc)
    if usable == 0:
        raise ValueError(f"{n_pairs} pairs cannot fill one effective batch of micro_batch {micro_batch} "
                         f"x grad_acc {grad_acc} x {world_size} workers")
    for epoch in itertools.count():
        order = epoch_order(n_pairs, usable, per * grad_acc, seed, epoch, lengths)
        for start in range(0, usable, per):
            yield order[start + rank * micro_batch: start + (rank + 1) * micro_batch]


def worst_case_order(lengths: Sequence[int], micro_batch: int, world_size: int, rank: int, *,
                     grad_acc: int, packed: Sequence[int] | None = None) -> list[list[int]]:
    """This rank's micro-batches of the worst-case step: the effective batch's worth of longest
    pairs (by padded width ``lengths``; padding-free, by the tokens each packs, ``packed``), the
    longest last. Rank 0's last micro-batch is then the ``micro_batch`` longest pairs - the widest
    padded batch (or the most packed tokens) any micro-batch of the run can hold - and it runs
    while the gradients of the step's earlier micro-batches are alive, as a real step's longest
    micro-batch can."""
    size = packed if packed is not None else lengths
    per = micro_batch * world_size
    longest = sorted(range(len(size)), key=lambda i: -size[i])[:per * grad_acc]
    return [longest[s + rank * micro_batch: s + (rank + 1) * micro_batch] for s in range(0, len(longest), per)][::-1]


def micro_batches(ds: PairDataset, micro_batch: int, world_size: int, rank: int, seed: int,
                  pad_id: int, padding_side: str = "right", *, grad_acc: int, group_by_length: bool = False,
                  padding_free: bool = False) -> Iterator[MicroBatch]:
    """Endless collated micro-batches for this rank."""
    lengths = [pair_length(p) for p in ds.pairs] if group_by_length else None
    for idx in micro_batch_order(len(ds), micro_batch, world_size, rank, seed, grad_acc=grad_acc,
                                 lengths=lengths):
        yield make_batch(ds, idx, pad_id, padding_side, padding_free)


def flop_token_counts(mb: MicroBatch, chunked_head: bool) -> TokenCounts:
    """The exact token counts the FLOP count needs (telemetry.flops), from a CPU micro-batch.

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
                       padding_side: str = "right", *, grad_acc: int, padding_free: bool = False
                       ) -> Iterator[MicroBatch]:
    """The worst-case step's micro-batches (:func:`worst_case_order`) for this rank."""
    lengths = [pair_length(p) for p in ds.pairs]
    packed = [packed_tokens(p) for p in ds.pairs] if padding_free else None
    for idx in worst_case_order(lengths, micro_batch, world_size, rank, grad_acc=grad_acc, packed=packed):
        yield make_batch(ds, idx, pad_id, padding_side, padding_free)


def make_batch(ds: PairDataset, idx: list[int], pad_id: int, padding_side: str, padding_free: bool) -> MicroBatch:
    """Pairs ``idx`` of ``ds``, padded (:func:`collate`) or packed into one row (:func:`pack`)."""
    pairs = [ds.pairs[i] for i in idx]
    return pack(pairs, idx) if padding_free else collate(pairs, idx, pad_id, padding_side)


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
