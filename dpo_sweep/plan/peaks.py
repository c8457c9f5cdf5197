"""The peaks the sweep's plan orders and prunes by: the memory model over each configuration's own
data, calibrated on every peak measured so far, and the budget that bounds them. Pure."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

from dpo_sweep.config import ModelSpec, TrialConfig
from dpo_sweep.plan.calibrate import Measurement, calibrate, predicted
from dpo_sweep.plan.memory import MemoryEstimate, predict_peak_gb
from dpo_sweep.plan.shape import ModelShape, model_shape
from dpo_sweep.plan.rules import budgeted_gb, prune_over_budget
from dpo_sweep.core.lengths import LengthProfile
from dpo_sweep.core.trial_facts import planned_device

Estimator = Callable[[TrialConfig], MemoryEstimate]


@dataclass(frozen=True)
class DataEstimate:
    """The memory model over each configuration's own data: the lengths preflight measured, by
    trial id (``preflight.lengths_by_trial``), so that the plan orders, prunes and calibrates on
    the worst micro-batch the trial will run - what ``validate`` prints - not on every sequence
    at max_length. A trial without lengths is sized at max_length. ``shapes``: the models' shapes
    the preflight built (``startup.model_shapes``); a model without one is built here. A class,
    not a closure: the plan travels with the recorder, which Tune pickles."""

    lengths: Mapping[str, LengthProfile | None] = field(default_factory=dict)
    shapes: Mapping[ModelSpec, ModelShape] = field(default_factory=dict)

    def __call__(self, cfg: TrialConfig) -> MemoryEstimate:
        return predict_peak_gb(cfg, device=planned_device(cfg), lengths=self.lengths.get(cfg.trial_id),
                               shape=model_shape(cfg.model, self.shapes))


class PeakModel:
    """The calibrated memory model and the budget: ``predict`` a configuration's peak, whether
    it is ``over_budget``, and ``add`` each measured peak to the calibration."""

    def __init__(self, estimate: Estimator, budget_gb: float | None, margin: float) -> None:
        self.estimate = estimate
        self.budget_gb = budget_gb
        self.margin = margin
        self._measurements: list[Measurement] = []
        self._calibration = calibrate([])

    def add(self, cfg: TrialConfig, peak_gb: float) -> None:
        """``cfg`` (as it ran) peaked at ``peak_gb``: the predictions from now on take it in."""
        self._measurements.append(Measurement(cfg, peak_gb))
        self._calibration = calibrate(self._measurements, self.estimate)

    def predict(self, cfg: TrialConfig) -> float:
        """The calibrated predicted peak (GB); NaN when the model's config cannot be read here."""
        try:
            return predicted(self._calibration, cfg, self.estimate)
        except (OSError, ValueError, KeyError):
            return math.nan

    def budget_of(self, cfg: TrialConfig) -> float | None:
        """What bounds the peak: the emulated card (resources.gpu_memory_gb), else the GPU's
        memory the sweep was given; None (no pruning over budget) when neither is known."""
        return cfg.resources.gpu_memory_gb or self.budget_gb

    def over_budget(self, cfg: TrialConfig) -> str | None:
        """Why ``cfg`` is pruned before it runs, or None (see rules.prune_over_budget)."""
        budget = self.budget_of(cfg)
        gb = self.predict(cfg)
        if budget is None or math.isnan(gb):
            return None
        est = self.estimate(cfg)
        return prune_over_budget(cfg, gb, budget, self.margin, uncapped_gb=est.total_gb - budgeted_gb(cfg, est))
