"""Step times extrapolated on the pairs of the real steps: what ``benchmarks/user_case.py``
compares with the planner's own extrapolation (``plan.rows.fitted_step_ms``: ``t_opt + G x`` the
median accumulating micro-step), which is as close or closer on the committed runs
(benchmarks/README.md#step-timing-and-extrapolation), so the planner keeps it. Pure: no Ray, no torch.

A measure trial runs a few micro-steps per optimizer step (``rules.measure_grad_acc``: at least
24 timed on varied lengths); the row is for ``grad_acc`` G. The trainer's own pair order
(``core/order.py``) lays out what every micro-batch of both runs holds (:func:`step_layout`:
its FLOPs over the positions the kernels compute, padding included, and its real tokens). The
short trial's micro-step times are fitted (:func:`fit_micro_steps`, :data:`FITS`), and the real
run's step ``s`` is ``t_opt + the fitted time of each of its micro-batches + the first
micro-step's offset`` (it writes fresh gradient buffers) ``+ the synchronising one's`` (several
workers: the gradient all-reduce, once per step). The row's step time is the median over the
real run's measured steps, its tokens/s their real tokens over their time, and its p10-p90
interval those steps' spread widened by the fit's own relative error e (p10 / (1 + e),
p90 x (1 + e): :class:`Extrapolated`).
"""
from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from dpo_sweep.config import TrialConfig
from dpo_sweep.plan.shape import ModelShape
from dpo_sweep.core.trial_facts import pad_multiple, planned_attention, planned_device
from dpo_sweep.records import StepRecord
from dpo_sweep.core.flops import DecoderShape, TokenCounts, dpo_step_flops
from dpo_sweep.core.lengths import LengthProfile
from dpo_sweep.core.order import batch_width, micro_batch_order

#: steps -> ranks -> micro-batches -> work (FLOPs)
Works = list[list[list[float]]]


def decoder_shape(s: ModelShape) -> DecoderShape:
    head_dim = s.q_dim // s.n_heads
    return DecoderShape(hidden=s.hidden, intermediate=s.intermediate, n_heads=s.n_heads,
                        n_kv_heads=s.kv_dim // head_dim, head_dim=head_dim, n_layers=s.n_layers, vocab=s.vocab)


def computed_counts(lengths: LengthProfile, idx: Sequence[int], *, padding_free: bool, chunked_head: bool,
                    attn: str = "sdpa", multiple: int = 1) -> TokenCounts:
    """What the kernels compute for the micro-batch of pairs ``idx``. Padded: every row as wide as
    the widest pair (rounded up to ``multiple``, ``train.pad_to_multiple_of``, when it has padding),
    padding included;
    packed: the sequences end to end in one row. Attention
    through sdpa or eager with a mask (padding, or packed sequences' block mask) computes the
    whole square of a row; flash-attn only each sequence's causal half."""
    seqs = [lengths.prompt[i] + r for i in idx for r in (lengths.chosen[i], lengths.rejected[i])]
    responses = sum(lengths.chosen[i] + lengths.rejected[i] for i in idx)
    rows, width = (1, sum(seqs)) if padding_free else (len(seqs), batch_width(seqs, multiple))
    tokens = rows * width
    square = attn not in ("flash_attention_2", "flash_attention_3")
    causal_pairs = rows * width * width if square else sum(n * (n + 1) // 2 for n in seqs)
    head_rows = responses if chunked_head else tokens - rows
    return TokenCounts(tokens=tokens, causal_pairs=causal_pairs, head_rows=head_rows)


@dataclass(frozen=True)
class Layout:
    """What every step of a configuration's run holds, as the trainer will run it."""

    works: Works                 # steps -> ranks -> micro-batches -> FLOPs over the computed positions
    tokens: tuple[int, ...]      # per step, the real (non-padding) tokens of all ranks


def step_layout(cfg: TrialConfig, lengths: LengthProfile, shape: ModelShape) -> Layout:
    """Every micro-batch of ``cfg``'s ``train.steps`` steps, per rank, in the order the trainer
    runs them (``core/order.micro_batch_order``)."""
    t = cfg.train
    world, chunked, g = cfg.resources.workers_per_trial, t.logp_chunk_tokens > 0, cfg.grad_acc
    dshape, attn, packed = decoder_shape(shape), planned_attention(cfg.model.attn_implementation), lengths.packed()
    multiple = pad_multiple(t, planned_device(cfg))
    works, tokens = [], [0] * t.steps
    for rank in range(world):
        order = micro_batch_order(len(lengths.widths), cfg.micro_batch, world, rank, t.seed, grad_acc=g,
                                  lengths=lengths.widths if t.group_by_length else None)
        rank_works = []
        for k, idx in enumerate(itertools.islice(order, t.steps * g)):
            counts = computed_counts(lengths, idx, padding_free=t.padding_free, chunked_head=chunked, attn=attn,
                                     multiple=multiple)
            rank_works.append(dpo_step_flops(shape=dshape, counts=counts, level=cfg.checkpoint_level,
                                             reference=t.reference, chunked_head=chunked, lean_mlp=cfg.model.lean_ops))
            tokens[k // g] += sum(packed[i] for i in idx)  # a pair's real tokens, padded or not
        works.append(rank_works)
    return Layout([[rank[s * g:(s + 1) * g] for rank in works] for s in range(t.steps)], tuple(tokens))


@dataclass(frozen=True)
class MicroStepFit:
    """``micro-step ms = intercept + per_flop x work``; the first micro-step of a step and (several
    workers) the synchronising last one add their offsets; ``optimizer_ms`` once per step."""

    intercept_ms: float
    per_flop_ms: float
    first_offset_ms: float
    sync_offset_ms: float
    optimizer_ms: float
    rel_error: float  # the fitted price's relative standard error: RMS residual / sqrt(micro-steps)

    def micro_ms(self, work: float) -> float:
        return self.intercept_ms + self.per_flop_ms * work


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) through ``(work, ms)``; through the origin (the median
    ms per FLOP) when the works do not spread or the line would be unphysical."""
    works = [w for w, _ in points]
    if len(set(works)) >= 2:
        mw, mt = statistics.fmean(works), statistics.fmean(t for _, t in points)
        slope = sum((w - mw) * (t - mt) for w, t in points) / sum((w - mw) ** 2 for w in works)
        intercept = mt - slope * mw
        if slope > 0 and intercept >= 0:
            return intercept, slope
    return 0.0, statistics.median(t / w for w, t in points if w > 0)


#: A micro-step priced above this many times the median price is a one-off stall (a fresh
#: trial's autotuning or kernel plans: up to ten times a micro-step's time), which a
#: long run amortises, and is left out of the price.
STALL_FACTOR = 3.0


def _ratio(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(0, total ms over total work) of the micro-steps that are no stall: the short run's
    throughput on the positions it computed."""
    median = statistics.median(t / w for w, t in points)
    kept = [(w, t) for w, t in points if t / w <= STALL_FACTOR * median]
    return 0.0, sum(t for _, t in kept) / sum(w for w, _ in kept)


def _median(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(the median micro-step, 0): every micro-step of the real run costs the short run's median."""
    return statistics.median(t for _, t in points), 0.0


#: Micro-steps of shapes the process had run before that a fit needs before it leaves out the
#: first ones of their shape (``StepRecord.micro_new``).
MIN_REPEATED = 8


#: How the micro-step times are fitted. ``median``: every micro-step costs the
#: short run's median one (its work ignored); ``ratio``: the short run's time over its work,
#: times each real micro-batch's work; ``line``: a + b x work. A micro-step's time does not follow
#: its FLOPs at the sizes measured, and with 24 timed micro-steps the median is the closest of the
#: three (benchmarks/README.md#step-timing-and-extrapolation).
FITS = {"median": _median, "ratio": _ratio, "line": _line}


def fit_micro_steps(steps: Sequence[StepRecord], works: Works, world: int, how: str = "median") -> MicroStepFit | None:
    """The fit from a measure trial's measured typical steps (their ``micro_ms``) and the works of
    its micro-batches (:func:`step_layout` of the configuration it ran; rank 0's, whose times the
    steps carry); None when no step recorded its micro-steps."""
    timed = [(s, [float(x) for x in s.micro_ms.split(",")]) for s in steps
             if s.measured and not s.worst_case and s.micro_ms and 1 <= s.step <= len(works)]
    if not timed:
        return None
    first, middle, last = [], [], []
    # A micro-step of a shape the process ran first (``micro_new``: CUDA's kernel plans built) is
    # left out while enough others remain: a long run builds those plans once.
    repeats = sum(flag == "0" for s, _ in timed for flag in s.micro_new)
    for s, ms in timed:
        w = works[s.step - 1][0]
        new = s.micro_new if repeats >= MIN_REPEATED else ""
        for j, (t, wj) in enumerate(zip(ms, w)):
            if j < len(new) and new[j] == "1":
                continue
            (first if j == 0 else last if world > 1 and j == len(ms) - 1 else middle).append((wj, t))
    fitted = middle or first
    intercept, slope = FITS[how](fitted)

    def offset(points: list[tuple[float, float]]) -> float:
        """What a kind of micro-step (the first, the synchronising one) adds to the fitted one."""
        if not points or points is fitted:
            return 0.0
        if how != "line":  # the mean difference: an offset a long run pays every step
            return (sum(t for _, t in points) - sum(intercept + slope * w for w, _ in points)) / len(points)
        return statistics.median(t - (intercept + slope * w) for w, t in points)

    first_offset, sync_offset = offset(first), offset(last)
    residuals = [(t - intercept - slope * w - off) / max(1e-9, intercept + slope * w + off)
                 for points, off in ((first, first_offset), (middle, 0.0), (last, sync_offset)) for w, t in points]
    optimizer = statistics.median(s.step_time_ms - sum(ms) for s, ms in timed)
    # The fit's own error: the residuals' RMS over the square root of how many it fitted (the
    # standard error of a mean price), what a real run of many micro-steps is uncertain by.
    return MicroStepFit(intercept, slope, first_offset, sync_offset, optimizer,
                        math.sqrt(statistics.fmean(r * r for r in residuals) / len(residuals)))


@dataclass(frozen=True)
class Extrapolated:
    """A configuration's predicted step times over its real measured steps."""

    step_ms: float   # median
    p10_ms: float    # the steps' spread, widened by the fit's relative error
    p90_ms: float
    tokens_per_s: float  # median over the same steps of their real tokens over their time
    rel_error: float


def _quantile(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[round(q * 10) - 1]


def extrapolate(fit: MicroStepFit, cfg: TrialConfig, layout: Layout) -> Extrapolated:
    """``cfg``'s step times from ``fit`` over its ``layout`` (:func:`step_layout`): each rank's
    micro-steps back to back, the step as long as its slowest rank, its measured steps (after
    ``train.warmup_steps``) summarised."""
    sync = fit.sync_offset_ms if cfg.resources.workers_per_trial > 1 else 0.0
    times = [fit.optimizer_ms + max(sum(fit.micro_ms(w) for w in rank) + fit.first_offset_ms + sync
                                    for rank in step)
             for step in layout.works]
    skip = cfg.train.warmup_steps if cfg.train.warmup_steps < len(times) else 0
    measured, tokens = times[skip:], layout.tokens[skip:]
    return Extrapolated(statistics.median(measured), _quantile(measured, 0.1) / (1 + fit.rel_error),
                        _quantile(measured, 0.9) * (1 + fit.rel_error),
                        statistics.median(n / (ms / 1e3) for n, ms in zip(tokens, measured)), fit.rel_error)
