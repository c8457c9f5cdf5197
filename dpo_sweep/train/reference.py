"""The precomputed reference (``train.reference: precomputed``): log-probs of the pairs a trial
reads, computed by the policy before its first update, and kept for the sweep's next trials.

A trial reads the reference of the pairs of its steps, of its worst-case step and of its held
batch (:func:`pairs_read`), not of the whole data file: its cost grows with its steps, never
with the file (on a 1,500-pair file a trial paid for 1,500 pairs to read a few dozen). The
values depend on the weights the policy starts from and on how a forward computes them, not on
the trial's micro_batch, grad_acc or checkpoint level (:func:`table_key`), so a process that
runs trial after trial on one data set (a warm worker) computes each pair once per sweep and
later trials only look them up (:class:`ReferenceTables`).
"""
from __future__ import annotations

import itertools
from typing import Callable, Sequence

import torch

from dpo_sweep.config import TrialConfig
from dpo_sweep.core.order import micro_batch_order, packed_tokens, pair_length, worst_case_order
from dpo_sweep.train.data import PairDataset

#: ``compute(indices) -> [len(indices), 2]`` (chosen, rejected) log-probs of those pairs.
Compute = Callable[[list[int]], torch.Tensor]

#: Padded tokens (rows x width) of one batch of the reference pass. Without gradients a forward
#: keeps one layer's activations at a time, so it can take far more tokens than a training
#: micro-batch: at the trial's micro_batch (often 1) it is one small forward after another
#: (benchmarks/README.md#trial-costs).
REFERENCE_BATCH_TOKENS = 16_384


def reference_batches(widths: Sequence[int], micro_batch: int, chunked_head: bool,
                      budget_tokens: int = REFERENCE_BATCH_TOKENS) -> list[list[int]]:
    """The reference pass's batches over pairs of padded ``widths`` (longest first, so that
    pairs of similar length share a batch): consecutive pairs while the batch's two rows per
    pair at its widest pair's width stay within ``budget_tokens``, and never fewer pairs than the
    trial's ``micro_batch`` (whose memory its steps need anyway). Without a chunked log-prob head
    (``train.logp_chunk_tokens: 0``) the full-vocabulary logits grow with the batch: batches of
    ``micro_batch`` pairs, what the trial's own forward holds."""
    batches: list[list[int]] = []
    for i in range(len(widths)):
        batch = batches[-1] if batches else None
        if batch is not None:
            width = max(widths[j] for j in (*batch, i))
            room = chunked_head and 2 * (len(batch) + 1) * width <= budget_tokens
            if len(batch) < micro_batch or room:
                batch.append(i)
                continue
        batches.append([i])
    return batches


def pairs_read(cfg: TrialConfig, ds: PairDataset, world: int, rank: int) -> list[int]:
    """The pairs whose reference this rank of ``cfg``'s trial reads, ascending: the micro-batches
    of its ``train.steps`` steps (at most ``grad_acc`` each: ``grad_acc_schedule`` only lowers
    it), the worst-case step's (``train.worst_case_step``) and the held batch of the evaluation
    (``train.evaluate``: the first effective batch in file order)."""
    t = cfg.train
    lengths = [pair_length(p) for p in ds.pairs]
    order = micro_batch_order(len(ds), cfg.micro_batch, world, rank, t.seed, grad_acc=cfg.grad_acc,
                              lengths=lengths if t.group_by_length else None)
    wanted = {i for batch in itertools.islice(order, t.steps * cfg.grad_acc) for i in batch}
    if t.worst_case_step:
        wanted.update(i for batch in worst_case_order(lengths, cfg.micro_batch, world, rank, grad_acc=cfg.grad_acc,
                                                      packed=[packed_tokens(p) for p in ds.pairs]
                                                      if t.padding_free else None)
                      for i in batch)
    if t.evaluate:
        wanted.update(range(min(len(ds), cfg.effective_batch())))
    return sorted(wanted)


def table_key(cfg: TrialConfig) -> str:
    """What the reference values depend on besides the data: the weights (the model spec, the
    seed that initialises a preset, the adapter: QLoRA's reference is the quantised base), the
    forward's arithmetic (precision, attention, liger, lean ops, the log-prob head's chunking)
    and how a pair is laid out (padding side, the width's multiple, packing)."""
    t = cfg.train
    return "|".join(map(str, (cfg.model.model_dump_json(), t.precision, t.seed, t.adapter, t.logp_chunk_tokens,
                              t.padding_side, t.pad_to_multiple_of, t.padding_free)))


class ReferenceTables:
    """Reference log-probs by :func:`table_key`, one ``[pairs, 2]`` float32 CPU table each, NaN
    where a pair's values were never computed. A table is only ever filled in, never changed."""

    def __init__(self) -> None:
        self._tables: dict[str, torch.Tensor] = {}

    def clear(self) -> None:
        self._tables.clear()

    def table(self, key: str, n_pairs: int, wanted: Sequence[int], compute: Compute) -> tuple[torch.Tensor, int]:
        """The table of ``key`` with every pair of ``wanted`` filled in (``compute`` called for the
        ones not yet there), and how many pairs this call computed."""
        table = self._tables.get(key)
        if table is None or table.shape[0] != n_pairs:
            table = self._tables[key] = torch.full((n_pairs, 2), float("nan"), dtype=torch.float32)
        wanted_t = torch.as_tensor(list(wanted), dtype=torch.long)
        missing = wanted_t[torch.isnan(table[wanted_t, 0])].tolist() if len(wanted_t) else []
        if missing:
            table[missing] = compute(missing)
        return table, len(missing)


def missing_rows(table: torch.Tensor, index: torch.Tensor) -> list[int]:
    """The pairs of ``index`` whose values ``table`` does not hold (a bug in :func:`pairs_read`
    would otherwise turn into a NaN loss and a ``diverged`` trial)."""
    return index[torch.isnan(table[index, 0])].tolist()
