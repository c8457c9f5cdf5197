"""What each swept knob costs: per dimension and value, the median change in peak memory (GB) and
in tokens/s against the dimension's first value, holding every other swept setting fixed.

For a value ``v`` of dimension ``d`` the trials are paired with the trial that has ``d``'s base
value (its first, in the space's order) and the same value of every other swept dimension; the
effect is the median over those pairs, and the row says how many pairs there are. Only ``ok``
rows with a measurement count (OOM and pruned rows have no peak or throughput to compare). A
value that never meets the base with the rest held fixed has no pair and says so, rather than
comparing across other settings (which would credit one knob with another's effect). A
micro_batch is held at the same effective batch, not the same grad_acc: at a fixed effective batch
grad_acc follows the micro_batch, and the question is what the micro_batch costs at one update size.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import pandas as pd

from dpo_sweep.analysis import tables
from dpo_sweep.core.dimensions import KNOB_COLUMNS
from dpo_sweep.core.levels import Level
from dpo_sweep.core.status import Status

#: The core dimensions (the table's knobs), before the levers and the swept train fields.
CORE = KNOB_COLUMNS


@dataclass(frozen=True)
class Effect:
    """One value of one dimension against the dimension's base value."""

    dimension: str
    value: str
    base: str
    pairs: int
    """Pairs of ok trials that differ only in this dimension (0: no such pair)."""
    peak_gb: float | None
    """Median change of the peak, GB (None without a pair)."""
    tokens_pct: float | None
    """Median change of tokens/s, percent of the base's."""


def dimensions(analysed: pd.DataFrame) -> list[str]:
    """The swept dimensions that vary: the core four, the model and levers, the swept train fields."""
    dims = list(CORE) + tables.swept_columns(analysed, levers=True)
    return [d for d in dict.fromkeys(dims) if d in analysed and analysed[d].astype(str).nunique() > 1]


def _order(values: list[str], dimension: str) -> list[str]:
    if dimension == "checkpoint_level":
        return sorted(values, key=lambda v: (getattr(Level.of(v), "memory_rank", len(Level)), v))
    try:
        return sorted(values, key=float)
    except ValueError:
        return sorted(values)


def effects(analysed: pd.DataFrame) -> list[Effect]:
    """Every varying dimension's values against its base (see the module doc)."""
    dims = dimensions(analysed)
    ok = analysed[(analysed["status"] == Status.OK) & analysed["peak_mem_gb"].notna() & analysed["tokens_per_s"].notna()]
    held = dims + (["effective_batch"] if "effective_batch" in analysed else [])
    labels = pd.DataFrame({d: [tables.fmt_setting(v) for v in analysed.loc[ok.index, d]] for d in held}, index=ok.index)
    out = []
    for d in dims:
        values = _order(sorted({tables.fmt_setting(v) for v in analysed[d]}), d)
        # A micro_batch is compared at the same effective batch (its grad_acc follows it, as a
        # space's effective_batch makes it); grad_acc at the same micro_batch (it sets the batch).
        skip = {d, "grad_acc"} if d == "micro_batch" else {d, "effective_batch"}
        base, others = values[0], [x for x in held if x not in skip]
        rest = labels[others].astype(str).agg("|".join, axis=1) if others else pd.Series("", index=labels.index)
        base_rows = {key: ok.loc[i] for i, key in rest[labels[d] == base].items()}
        for value in values[1:]:
            mem, tps = [], []
            for i, key in rest[labels[d] == value].items():
                b = base_rows.get(key)
                if b is None:
                    continue
                row = ok.loc[i]
                mem.append(float(row["peak_mem_gb"]) - float(b["peak_mem_gb"]))
                if float(b["tokens_per_s"]) > 0:
                    tps.append(100.0 * (float(row["tokens_per_s"]) - float(b["tokens_per_s"])) / float(b["tokens_per_s"]))
            out.append(Effect(d, value, base, len(mem), statistics.median(mem) if mem else None,
                              statistics.median(tps) if tps else None))
    return out


EFFECT_HEADER = ("dimension", "value", "against", "pairs", "peak memory change (GB)", "tokens/s change")


def unpaired(items: list[Effect]) -> list[str]:
    """Dimensions none of whose values ever meets the base with the rest held (grad_acc when it
    follows micro_batch at one effective batch): left out of the table, named in a note."""
    dims = list(dict.fromkeys(e.dimension for e in items))
    return [d for d in dims if all(e.pairs == 0 for e in items if e.dimension == d)]


def effect_rows(items: list[Effect]) -> list[list[str]]:
    """The effect table's rows as strings (the :func:`unpaired` dimensions left out)."""
    rows, skip = [], set(unpaired(items))
    for e in items:
        if e.dimension in skip:
            continue
        mem = "-" if e.peak_gb is None else f"{e.peak_gb:+.2f}".replace("-0.00", "+0.00")
        tps = "-" if e.tokens_pct is None else tables.signed_pct(e.tokens_pct)
        rows.append([e.dimension, e.value, e.base, str(e.pairs) if e.pairs else "0 (never with the rest held)", mem, tps])
    return rows
