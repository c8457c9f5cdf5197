"""Which pairs each micro-batch of a trial takes: index arithmetic over the pairs' lengths, no
torch, so that the planner can lay out a configuration's steps (plan/layout.py) exactly as the
trainer will run them (train/batching.py), without running them."""
from __future__ import annotations

import itertools
import random
from typing import Iterator, Protocol, Sequence


class TokenizedPair(Protocol):
    """What the order reads of a pair: its token ids (train/data.py's TokenizedPair)."""

    @property
    def prompt_ids(self) -> Sequence[int]: ...
    @property
    def chosen_ids(self) -> Sequence[int]: ...
    @property
    def rejected_ids(self) -> Sequence[int]: ...


def pair_length(p: TokenizedPair) -> int:
    """A pair's padded width: its prompt and the longer response."""
    return len(p.prompt_ids) + max(len(p.chosen_ids), len(p.rejected_ids))


def padded_width(width: int, multiple: int) -> int:
    """``width`` rounded up to a multiple of ``multiple`` (``train.pad_to_multiple_of``)."""
    return -(-width // multiple) * multiple


def batch_width(rows: Sequence[int], multiple: int) -> int:
    """The width of a padded micro-batch whose rows hold ``rows`` tokens: the longest, rounded up
    to ``multiple`` when the batch has padding anyway. Rows all of one length stay unpadded: no
    attention mask, the kernels' causal path (fixed-length pairs keep their one shape)."""
    longest = max(rows)
    return longest if min(rows) == longest else padded_width(longest, multiple)


def packed_tokens(p: TokenizedPair) -> int:
    """A pair's tokens packed padding-free: the prompt twice (chosen and rejected rows) and both responses."""
    return 2 * len(p.prompt_ids) + len(p.chosen_ids) + len(p.rejected_ids)


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
    rng = random.Random(seed + epoch)
    order = list(range(n_pairs))
    rng.shuffle(order)  # the whole shuffle, then its first ``usable``: a shorter epoch is a prefix
    order = order[:usable]
    if lengths is None:
        return order
    order.sort(key=lambda i: -lengths[i])  # stable: ties keep their shuffled order
    steps = [order[s:s + per_step] for s in range(0, usable, per_step)]
    shuffled = list(range(len(steps)))
    rng.shuffle(shuffled)
    return [i for k in shuffled for i in steps[k]]


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


#: Micro-steps of the worst-case step (at most the trial's grad_acc): from the second on, the
#: gradients of the step's earlier micro-batches are alive, which is all a longer accumulation
#: adds to the peak (at grad_acc 2, 4 and 8 it is the same to the byte:
#: benchmarks/README.md#memory-model); each
#: further micro-step on the longest pairs only costs time (a measure trial at grad_acc 8 of a 3B
#: on 2,048-token pairs: 8 of its longest micro-steps where 2 tell the peak).
WORST_CASE_MICRO_STEPS = 2


def worst_case_micro_steps(grad_acc: int) -> int:
    """The worst-case step's micro-steps at ``grad_acc``."""
    return min(grad_acc, WORST_CASE_MICRO_STEPS)


def longest_first(size: Sequence[int]) -> list[int]:
    """Indices of ``size``, the largest first; equal sizes keep their order (a stable sort)."""
    return sorted(range(len(size)), key=lambda i: -size[i])


def worst_case_order(lengths: Sequence[int], micro_batch: int, world_size: int, rank: int, *,
                     grad_acc: int, packed: Sequence[int] | None = None) -> list[list[int]]:
    """This rank's micro-batches of the worst-case step (:func:`worst_case_micro_steps` of them):
    the longest pairs (by padded width ``lengths``; padding-free, by the tokens each packs,
    ``packed``), the longest last. Rank 0's last micro-batch is then the ``micro_batch`` longest
    pairs - the widest padded batch (or the most packed tokens) any micro-batch of the run can
    hold - and it runs while the gradients of the step's earlier micro-batch are alive, as a real
    step's longest micro-batch can."""
    size = packed if packed is not None else lengths
    per = micro_batch * world_size
    longest = longest_first(size)[:per * worst_case_micro_steps(grad_acc)]
    return [longest[s + rank * micro_batch: s + (rank + 1) * micro_batch] for s in range(0, len(longest), per)][::-1]
