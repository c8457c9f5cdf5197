"""Calibrate the memory model with the peaks of trials that have finished.

Within one memory family (:func:`dpo_sweep.plan.rules.memory_family`: same model, precision,
reference, ... - only micro_batch, level, max_length and grad_acc differ) the peak at one level,
one grad_acc class (1 or >= 2) and one peak moment is linear in the tokens of the micro-step the
model sized (``MemoryEstimate.tokens``: the longest micro-batch of the data's own lengths when the
estimator has them, else ``2 x micro_batch x max_length``): everything but the activations and the
head's chunk is fixed. A fit in ``max_length`` tokens would be off wherever the worst micro-batch
is not proportional to them (padding-free rows of a long tail, another max_length).
So, per such group:

* two or more measured points at different token counts: a least-squares line through them
  (two points: the line through both, exact);
* one point, or points at one token count: the model's activation term scaled so that the model
  meets the measurement's mean - unless activations are under 10 % of the allocated peak (a small
  micro-batch peaking at the end of backward), or the trial is FSDP2-sharded, where the model is
  shifted by the difference. Under FSDP2 the allocator's stream pools (plan/ranks.py) are a large
  term that is no activation, and a single point's miss is mostly theirs (benchmarks/README.md,
  "Simulated ranks": scaling by it put a larger micro-batch 6.1 % low, shifting 2.3 % high);
* no point: the a-priori model shifted by the median error of the family's measured points
  (what is common to every level: the CUDA context, the static part).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

from dpo_sweep.config import TrialConfig
from dpo_sweep.plan import ranks
from dpo_sweep.plan.memory import MemoryEstimate, predict_peak_gb
from dpo_sweep.plan.keys import MemoryFamily
from dpo_sweep.plan.rules import memory_family, short_grad_acc

Estimator = Callable[[TrialConfig], MemoryEstimate]
#: Below this share of the allocated peak (context left out) activations are too small to scale by.
_MIN_ACTIVATION_SHARE = 0.10


@dataclass(frozen=True)
class Measurement:
    """A finished trial's configuration and its measured peak (GB = 1e9 B)."""

    cfg: TrialConfig
    peak_gb: float


@dataclass(frozen=True)
class GroupFit:
    """How predictions of one group are corrected (see the module doc)."""

    kind: str                     # line | scale | shift
    slope_gb_per_token: float = 0.0
    intercept_gb: float = 0.0
    activation_scale: float = 1.0
    shift_gb: float = 0.0


@dataclass(frozen=True)
class Calibration:
    """Fits per ``group_key`` and the median error per family, for :func:`predicted`."""

    fits: tuple[tuple[tuple, GroupFit], ...]
    family_shift_gb: tuple[tuple[MemoryFamily, float], ...]

    def fit_for(self, key: tuple) -> GroupFit | None:
        return dict(self.fits).get(key)

    def shift_for(self, family: MemoryFamily) -> float:
        return dict(self.family_shift_gb).get(family, 0.0)


def group_key(cfg: TrialConfig, estimate: MemoryEstimate) -> tuple:
    """Configurations whose peak is one line in tokens."""
    return (memory_family(cfg), cfg.checkpoint_level, short_grad_acc(cfg), estimate.peak_at)


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope and intercept of ``(x, y)`` points with at least two distinct x."""
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return slope, my - slope * mx


def _fit_group(points: list[tuple[Measurement, MemoryEstimate]]) -> GroupFit:
    xy = [(float(est.tokens), m.peak_gb) for m, est in points]
    if len({x for x, _ in xy}) >= 2:
        slope, intercept = _line(xy)
        return GroupFit(kind="line", slope_gb_per_token=slope, intercept_gb=intercept)
    measured = statistics.fmean(m.peak_gb for m, _ in points)
    cfg, est = points[0]  # one token count: one prediction
    if (est.activations_gb >= _MIN_ACTIVATION_SHARE * (est.total_gb - est.context_gb)
            and not ranks.sharded(cfg.cfg)):
        fixed = est.total_gb - est.activations_gb
        return GroupFit(kind="scale", activation_scale=(measured - fixed) / est.activations_gb)
    return GroupFit(kind="shift", shift_gb=measured - est.total_gb)


def calibrate(measurements: Sequence[Measurement], estimate: Estimator = predict_peak_gb) -> Calibration:
    """Fit every group and family that has measured points (OOM trials are not measurements)."""
    groups: dict[tuple, list[tuple[Measurement, MemoryEstimate]]] = {}
    errors: dict[MemoryFamily, list[float]] = {}
    for m in measurements:
        est = estimate(m.cfg)
        groups.setdefault(group_key(m.cfg, est), []).append((m, est))
        errors.setdefault(memory_family(m.cfg), []).append(m.peak_gb - est.total_gb)
    fits = tuple((key, _fit_group(points)) for key, points in groups.items())
    shifts = tuple((family, statistics.median(errs)) for family, errs in errors.items())
    return Calibration(fits=fits, family_shift_gb=shifts)


def predicted(calibration: Calibration, cfg: TrialConfig, estimate: Estimator = predict_peak_gb) -> float:
    """The calibrated peak of ``cfg`` in GB."""
    est = estimate(cfg)
    fit = calibration.fit_for(group_key(cfg, est))
    if fit is None:
        return est.total_gb + calibration.shift_for(memory_family(cfg))
    if fit.kind == "line":
        return fit.intercept_gb + fit.slope_gb_per_token * est.tokens
    if fit.kind == "scale":
        return est.total_gb + (fit.activation_scale - 1) * est.activations_gb
    return est.total_gb + fit.shift_gb
