"""The planner's rules over a sweep's configurations: what shares a measurement, the order, what
is pruned, how short a memory/time trial may be, and which trial measures the learning.

What a field can change is declared on the field (``json_schema_extra=affects(...)``,
:mod:`dpo_sweep.field_effects`); the rules read those declarations. Configurations equal in every
field that can change memory share a measurement (``measurement_key``): grad_acc enters only as
its class (``short_grad_acc``: 1 against >= 2; the step time is extrapolated, t_opt + G t_micro),
and train.seed not at all on fixed-length synthetic data (every pair as long as every other: no
order changes the padding). Configurations equal in every learning field and in effective batch
share a learning trial (``learning_key``): the micro_batch x grad_acc split and the checkpoint
level are not among them.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

from dpo_sweep.config import TrialConfig
from dpo_sweep.core.dimensions import BY_PATH, Memory
from dpo_sweep.field_effects import Effect, declared_effects
from dpo_sweep.plan.keys import LearningKey, MeasurementKey, MemoryFamily
from dpo_sweep.plan.memo import by_content, learning_read, memory_read
from dpo_sweep.plan.memory import MemoryEstimate
from dpo_sweep.core.levels import Level

#: Every field's declared effect, by its path into ``TrialConfig.model_dump()``.
EFFECTS: Mapping[tuple[str, ...], Effect] = MappingProxyType(declared_effects(TrialConfig))
#: Paths into ``TrialConfig.model_dump()`` that cannot change peak memory or step time.
NOT_MEMORY_FIELDS: tuple[tuple[str, ...], ...] = tuple(p for p, e in EFFECTS.items() if e.memory is Memory.NONE)
#: Fields that set what the loss trajectory is, besides the effective batch.
LEARNING_FIELDS: tuple[tuple[str, ...], ...] = tuple(p for p, e in EFFECTS.items() if e.learning)

Predict = Callable[[TrialConfig], float]


def _get(tree: dict, path: tuple[str, ...]):
    for key in path:
        tree = tree[key]
    return tree


def short_grad_acc(cfg: TrialConfig) -> int:
    """Micro-steps per optimizer step of the memory/time trial that stands for ``cfg``.

    At grad_acc >= 2 the gradients of the first micro-step are alive through every later one, so
    the second micro-step already reaches the peak of any longer accumulation (8B mb 4 L1: 98.6 GB
    at 2, 4 and 8, identical to the byte); 2 measures them all. grad_acc 1 frees the gradients
    between steps and peaks lower: only a grad_acc-1 configuration is measured at 1.
    """
    return min(cfg.grad_acc, 2)


#: The fewest micro-steps a measure trial times over its measured steps. On long-tailed data one
#: micro-step's time differs from the next by tens of percent, in ways its FLOPs do not explain
#: (benchmarks/results/user_case_h200/), so a short run's mean micro-step is only as good as
#: the number of them it timed.
MIN_TIMED_MICRO_STEPS = 24


def measure_grad_acc(cfg: TrialConfig) -> int:
    """Micro-steps per optimizer step of the trial that measures ``cfg``'s group (``cfg``: its
    measuring configuration). 1 at grad_acc 1; 2 (:func:`short_grad_acc`: the memory of any
    longer accumulation; 3 with several workers) on fixed-length synthetic pairs, whose
    micro-steps all take one time; else enough for :data:`MIN_TIMED_MICRO_STEPS` over the
    measured steps; never more than its own grad_acc."""
    # Several workers: the last micro-step carries the gradient all-reduce, so a third is the one
    # that times an accumulating micro-step without it (at 2 the extrapolation to grad_acc G
    # counted G - 1 all-reduces; timing.micro_and_optimizer_ms).
    least = 3 if cfg.resources.workers_per_trial > 1 else 2
    if cfg.grad_acc == 1:
        return 1
    if cfg.data.synthetic is not None and cfg.data.synthetic.lengths == "fixed":
        return min(cfg.grad_acc, least)
    measured = max(1, cfg.train.steps - cfg.train.warmup_steps)
    return min(cfg.grad_acc, max(least, -(-MIN_TIMED_MICRO_STEPS // measured)))


def _memory_settings(cfg: TrialConfig) -> dict[tuple[str, ...], Any]:
    """``cfg``'s values of the fields that can change its peak memory or step time."""
    tree = cfg.model_dump(mode="json")
    picked = {path: _get(tree, path) for path, e in EFFECTS.items() if e.memory is not Memory.NONE}
    for path, e in EFFECTS.items():
        if e.memory is Memory.ACCUMULATES:
            picked[path] = min(picked[path], 2)  # short_grad_acc: 1 against >= 2
    if cfg.data.synthetic is not None and cfg.data.synthetic.lengths == "fixed":
        picked.pop(("train", "seed"))  # every pair as long as every other: no order changes the padding
    return picked


@by_content(memory_read)
def measurement_key(cfg: TrialConfig) -> MeasurementKey:
    """Equal for configurations that must have the same peak memory and micro-step time."""
    return MeasurementKey.of(_memory_settings(cfg))


@by_content(memory_read)
def memory_family(cfg: TrialConfig) -> MemoryFamily:
    """``measurement_key`` without the knobs along which memory grows and the grad_acc class:
    configurations of one family differ only in micro_batch, level, max_length and grad_acc."""
    return MemoryFamily.of({path: value for path, value in _memory_settings(cfg).items()
                            if EFFECTS[path].memory is Memory.CHANGES})


@dataclass(frozen=True)
class MeasurementGroup:
    """Configurations that share one memory/time measurement, taken by ``measuring``."""

    measuring: TrialConfig
    members: tuple[TrialConfig, ...]  # measuring included, in input order

    def measured_by(self) -> dict[str, str]:
        """``trial_id -> trial_id`` of the trial whose measurement the row carries."""
        return {m.trial_id: self.measuring.trial_id for m in self.members}


def dedupe(trials: Sequence[TrialConfig]) -> list[MeasurementGroup]:
    """One group per ``measurement_key``, in order of first appearance. The measuring trial is the
    member with the smallest grad_acc (the cheapest to run at its short accumulation), then the
    first in input order."""
    by_key: dict[MeasurementKey, list[TrialConfig]] = {}
    for cfg in trials:
        by_key.setdefault(measurement_key(cfg), []).append(cfg)
    return [MeasurementGroup(measuring=min(members, key=lambda c: c.grad_acc), members=tuple(members))
            for members in by_key.values()]


def order(trials: Sequence[TrialConfig], predict: Predict) -> list[TrialConfig]:
    """Cheapest predicted peak first; equal predictions keep their input order (sorted is stable)."""
    return sorted(trials, key=predict)


def dominates_in_memory(a: TrialConfig, b: TrialConfig) -> bool:
    """True when ``a`` needs at least the memory of ``b``: the same configuration in every other
    memory field, and a micro_batch, max_length and grad_acc class at least ``b``'s and a level
    that keeps at least as many activations. (At grad_acc 1 a small micro-batch can peak at the
    end of backward, where a checkpointed level rebuilds the first layer's tensors; ``none``
    still holds them then, so the order holds, and the memory model counts them alike:
    memory.last_layer_bytes_per_token.)"""
    return memory_position(a).dominates(memory_position(b))


@dataclass(frozen=True)
class MemoryPosition:
    """Where a configuration stands on the fields memory only grows along (:data:`GROWING_FIELDS`),
    within its :func:`memory_family`: read once, compared many times."""

    family: MemoryFamily
    orders: tuple[float, ...]

    def dominates(self, other: "MemoryPosition") -> bool:
        """This configuration needs at least the memory of ``other`` (:func:`dominates_in_memory`)."""
        return self.family == other.family and all(a >= b for a, b in zip(self.orders, other.orders))


@by_content(memory_read)
def memory_position(cfg: TrialConfig) -> MemoryPosition:
    tree = cfg.model_dump(mode="json")
    return MemoryPosition(memory_family(cfg), tuple(memory_order(path, _get(tree, path)) for path in GROWING_FIELDS))


#: The fields along which memory only grows (``Memory.GROWS``, and grad_acc's class: ACCUMULATES).
GROWING_FIELDS: tuple[tuple[str, ...], ...] = tuple(p for p, e in EFFECTS.items()
                                                    if e.memory in (Memory.GROWS, Memory.ACCUMULATES))


def memory_order(path: tuple[str, ...], value: Any) -> float:
    """``value`` of the field at ``path`` on the order memory grows along: the dimension table's
    (core/dimensions.py: a checkpoint level by the activations it keeps), grad_acc by its class
    (:func:`short_grad_acc`: 1 against >= 2), any other field by its number."""
    if EFFECTS[path].memory is Memory.ACCUMULATES:
        return min(float(value), 2.0)
    d = BY_PATH.get(path)
    return d.memory_order(value) if d is not None else float(value)


def prune_after_oom(oom_cfg: TrialConfig, pending: Sequence[TrialConfig]) -> list[tuple[TrialConfig, str]]:
    """The pending configurations that must run out of memory too, each with its reason."""
    return [(cfg, f"pruned: needs at least the memory of {oom_cfg.trial_id}, which ran out of memory "
                  f"(micro_batch {cfg.micro_batch} >= {oom_cfg.micro_batch}, checkpoint "
                  f"{cfg.checkpoint_level} keeps at least the activations of {oom_cfg.checkpoint_level}, "
                  f"max_length {cfg.train.max_length} >= {oom_cfg.train.max_length})")
            for cfg in pending if cfg.trial_id != oom_cfg.trial_id and dominates_in_memory(cfg, oom_cfg)]


#: Prune over budget only when the prediction exceeds it by this fraction. The memory model
#: over-predicts the committed GPU NVML peaks by at most +2.4 % (and under-predicts by up to
#: -6.8 %; benchmarks/memory_model_check.py), and repeated runs of one configuration differ by up
#: to 1.6 % (8B mb 4 full: 84.49 vs 83.12 GB). 5 % is twice the worst over-prediction: a
#: configuration it prunes would have needed more than the budget in every committed case.
BUDGET_MARGIN = 0.05


def budgeted_gb(cfg: TrialConfig, estimate: MemoryEstimate) -> float:
    """The part of the estimate that a budget bounds. ``resources.gpu_memory_gb`` caps torch's
    allocator only (``set_per_process_memory_fraction``), so against that cap the CUDA context is
    left out; a real card's memory bounds the whole NVML peak."""
    return estimate.total_gb - (estimate.context_gb if cfg.resources.gpu_memory_gb else 0.0)


def prune_over_budget(cfg: TrialConfig, predicted_gb: float, budget_gb: float,
                      margin: float = BUDGET_MARGIN, uncapped_gb: float = 0.0) -> str | None:
    """The reason ``cfg`` is not run, or None: its predicted peak, less ``uncapped_gb``, above
    ``budget_gb x (1 + margin)``. ``predicted_gb``: the row's ``predicted_peak_gb`` (the NVML
    peak), which the reason quotes as the column shows it; ``uncapped_gb``: what of it the budget
    does not bound (``predicted_gb`` minus :func:`budgeted_gb`: the CUDA context under
    ``resources.gpu_memory_gb``)."""
    limit = budget_gb * (1 + margin)
    bounded_gb = predicted_gb - uncapped_gb
    if bounded_gb <= limit:
        return None
    part = (f" ({bounded_gb:.2f} GB of it in torch's allocator, which resources.gpu_memory_gb caps; the "
            f"{uncapped_gb:.2f} GB CUDA context is outside it)" if uncapped_gb else "")
    return (f"pruned: predicted peak {predicted_gb:.2f} GB{part} is over the {budget_gb:.1f} GB budget by more "
            f"than the model's {margin:.0%} margin ({limit:.1f} GB)")


# --- step time -------------------------------------------------------------------------------
# What the trainer must record for this fit (loop.py is being split; it does not record it yet):
# per optimizer step, the wall time of each micro-step (forward + backward, synchronised at its
# end, e.g. CUDA events around each micro-step) and of the optimizer phase (unscale, clip, step,
# zero_grad). Then t_micro is the median micro-step and t_opt the median optimizer phase.

@dataclass(frozen=True)
class StepTimeModel:
    """``step_ms = t_opt_ms + grad_acc x t_micro_ms``."""

    t_opt_ms: float
    t_micro_ms: float


def extrapolate_step_ms(t_opt_ms: float, t_micro_ms: float, grad_acc: int) -> float:
    """The optimizer-step time at ``grad_acc`` micro-steps: micro-steps run back to back, the
    optimizer phase once per step."""
    return t_opt_ms + grad_acc * t_micro_ms


def fit_step_time(step_ms: Sequence[float], micro_ms: Sequence[Sequence[float]]) -> StepTimeModel:
    """From a short trial's measured steps: ``step_ms[i]`` and the times of its micro-steps
    ``micro_ms[i]``. t_micro is the median micro-step, t_opt the median of what each step spends
    outside its micro-steps."""
    if not step_ms or len(step_ms) != len(micro_ms) or any(not m for m in micro_ms):
        raise ValueError("fit_step_time: one non-empty list of micro-step times per measured step")
    t_micro = statistics.median(t for m in micro_ms for t in m)
    t_opt = statistics.median(s - sum(m) for s, m in zip(step_ms, micro_ms))
    return StepTimeModel(t_opt_ms=t_opt, t_micro_ms=t_micro)


# --- learning trials ---------------------------------------------------------------------------

@by_content(learning_read)
def learning_key(cfg: TrialConfig) -> LearningKey:
    """Equal for configurations whose loss trajectory is the same: same effective batch and
    learning set-up, whatever the micro_batch x grad_acc split or checkpoint level (the trainer
    is tested to give the same update for any split and level)."""
    tree = cfg.model_dump(mode="json")
    picked: dict[tuple[str, ...], Any] = {p: _get(tree, p) for p in LEARNING_FIELDS}
    picked[("effective_batch",)] = cfg.effective_batch()
    return LearningKey.of(picked)


def learning_config(cfg: TrialConfig, precision: str | None = None) -> TrialConfig:
    """``cfg`` as its set-up's learning trial runs it: ``train.learning_steps_resolved()`` steps
    (warm-up kept below them), in ``precision`` (default ``train.learning_precision_resolved()``).
    When ``auto`` turns pure bf16 into bf16-mixed, a ``model.dtype: bfloat16`` goes too: the fp32
    master weights and AdamW state are what let small updates happen."""
    t = cfg.train
    steps = t.learning_steps_resolved()
    precision = precision or t.learning_precision_resolved()
    train = t.model_copy(update={"steps": steps, "warmup_steps": min(t.warmup_steps, steps - 1),
                                 "precision": precision})
    model = cfg.model
    if t.learning_precision == "auto" and precision != t.precision and model.dtype == "bfloat16":
        model = model.model_copy(update={"dtype": None})
    return cfg.model_copy(update={"train": train, "model": model})


def pick_learning_trial(group: Sequence[TrialConfig], predict: Predict, budget_gb: float,
                        step_ms: Predict | None = None) -> TrialConfig | None:
    """The configuration of ``group`` that measures its learning: the fastest predicted one that
    fits ``budget_gb``. Without a time model (``step_ms``), the one with the largest micro_batch
    (fewest micro-steps), then the least recompute, then input order. None when nothing fits."""
    fits = [c for c in group if predict(c) <= budget_gb]
    if not fits:
        return None
    if step_ms is not None:
        return min(fits, key=step_ms)
    return min(fits, key=lambda c: (-c.micro_batch, c.grad_acc, Level(c.checkpoint_level).memory_rank))
