"""The data's shape after tokenisation and truncation: lengths, their histograms, the worst batch.

Measured once per (data, tokenizer, max_length) by preflight, before Ray starts, and carried on:
to ``validate``'s predicted peaks (the planner's memory model sizes the longest micro-batch, not
``max_length``) and to the results folder's ``data.json``, which the report draws.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol, Sequence

from dpo_sweep.core.order import TokenizedPair, batch_width, longest_first, pair_length
from dpo_sweep.files import write_text_atomic
from dpo_sweep.results_dir import ResultsDir


class PairDataset(Protocol):
    """What the lengths read of a data set (train/data.py's PairDataset)."""

    @property
    def pairs(self) -> Sequence[TokenizedPair]: ...
    @property
    def source(self) -> str: ...
    @property
    def truncated(self) -> int: ...
    @property
    def dropped(self) -> int: ...
    def __len__(self) -> int: ...


#: Bars per histogram in data.json: enough to show a long tail, few enough to read.
HISTOGRAM_BINS = 24


@dataclass(frozen=True)
class LengthProfile:
    """Per pair, in dataset order: token counts after truncation (responses with their EOS)."""

    prompt: tuple[int, ...]
    chosen: tuple[int, ...]
    rejected: tuple[int, ...]
    widths: tuple[int, ...]  # the padded row width: batching.pair_length

    @staticmethod
    def of(ds: PairDataset) -> LengthProfile:
        return LengthProfile(tuple(len(p.prompt_ids) for p in ds.pairs), tuple(len(p.chosen_ids) for p in ds.pairs),
                             tuple(len(p.rejected_ids) for p in ds.pairs), tuple(pair_length(p) for p in ds.pairs))

    def packed(self) -> list[int]:
        """Per pair, its tokens packed padding-free (:func:`~dpo_sweep.train.batching.packed_tokens`)."""
        return [2 * p + c + r for p, c, r in zip(self.prompt, self.chosen, self.rejected)]

    @cached_property
    def _widest_first(self) -> tuple[int, ...]:
        """Pair indices, widest padded row first (ties in dataset order)."""
        return tuple(longest_first(self.widths))

    @cached_property
    def _most_tokens_first(self) -> tuple[int, ...]:
        """Pair indices, most packed tokens first (ties in dataset order)."""
        return tuple(longest_first(self.packed()))

    def _worst_pairs(self, micro_batch: int, padding_free: bool) -> list[int]:
        """The pairs of the micro-batch with the most the worst-case step runs
        (:func:`~dpo_sweep.train.batching.worst_case_order`): padded, the ``micro_batch`` widest;
        packed, the ``micro_batch`` with the most tokens. The order is sorted once per profile: the
        planner asks for every configuration of a space (100,000 in some)."""
        return list((self._most_tokens_first if padding_free else self._widest_first)[:micro_batch])

    def _rows(self, pairs: Sequence[int]) -> list[int]:
        """The padded rows' real tokens of a micro-batch of ``pairs``: prompt + chosen, prompt + rejected."""
        return [self.prompt[i] + r for i in pairs for r in (self.chosen[i], self.rejected[i])]

    def worst_micro_batch(self, micro_batch: int, padding_free: bool, multiple: int = 1) -> tuple[int, int]:
        """(tokens, longest row) of that micro-batch: padded, 2 x micro_batch rows of its width
        (:func:`~dpo_sweep.core.order.batch_width`: the widest, rounded up to ``multiple`` when
        it has padding); packed, its pairs' tokens in one row."""
        longest = self._worst_pairs(micro_batch, padding_free)
        if not padding_free:
            width = batch_width(self._rows(longest), multiple)
            return 2 * len(longest) * width, width
        tokens = sum(self.packed()[i] for i in longest)
        return tokens, tokens

    def worst_micro_batch_padded(self, micro_batch: int, padding_free: bool) -> bool:
        """Whether that micro-batch has padding (then the attention gets a mask): a row of its
        pairs shorter than the widest (rounding to a multiple pads only a batch that has padding
        already). Packed into one row, it has none."""
        if padding_free:
            return False
        rows = self._rows(self._worst_pairs(micro_batch, padding_free))
        return min(rows) < max(rows)

def histogram(values: Sequence[int], bins: int = HISTOGRAM_BINS) -> dict[str, list[int]]:
    """Counts of ``values`` in ``bins`` equal-width integer bins: ``{"edges": [lo0, ..., hi], "counts"}``;
    bin i holds ``edges[i] <= v < edges[i+1]`` (the last bin includes its upper edge)."""
    lo, hi = min(values), max(values)
    step = max(1, -(-(hi - lo + 1) // bins))  # ceil: whole tokens per bin
    n = -(-(hi - lo + 1) // step)
    counts = [0] * n
    for v in values:
        counts[(v - lo) // step] += 1
    return {"edges": [lo + i * step for i in range(n)] + [hi], "counts": counts}


def _stats(values: Sequence[int]) -> dict[str, Any]:
    q = statistics.quantiles(values, n=10, method="inclusive") if len(values) > 1 else [values[0]] * 9
    return {"min": min(values), "median": statistics.median(values), "p90": q[8], "max": max(values),
            "histogram": histogram(values)}


def data_shape(ds: PairDataset, profile: LengthProfile, *, model: str, max_length: int,
               max_pairs: int | None = None) -> dict[str, Any]:
    """One data set's entry in data.json (plain data, for the report to draw). ``tokens``: every
    pair's real tokens as the trainer's tokens_per_s counts them (the prompt twice, chosen,
    rejected), for the run forecast; ``max_pairs``: ``data.max_pairs`` when it limits the read."""
    shape = {
        "source": ds.source, "model": model, "max_length": max_length, "pairs": len(ds),
        "truncated": ds.truncated, "dropped": ds.dropped, "tokens": sum(profile.packed()),
        "lengths": {name: _stats(getattr(profile, name)) for name in ("prompt", "chosen", "rejected")},
    }
    if max_pairs is not None:
        shape["max_pairs"] = max_pairs
    return shape


def write_data_json(out_dir: str | Path, shapes: Sequence[dict[str, Any]]) -> Path:
    """``data.json``: ``{"datasets": [data_shape, ...]}`` in the results folder."""
    path = ResultsDir(out_dir).data
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps({"datasets": list(shapes)}, indent=1) + "\n")
    return path


