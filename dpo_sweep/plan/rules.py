"""The planner's rules over a sweep's configurations: what shares a measurement, the order, what
is pruned, how short a memory/time trial may be, and which trial measures the learning.

Which fields can change a trial's peak memory or step time (``measurement_key``). Conservative:
a field not listed on the "cannot" side is on the "can" side, so a field added to the config
later splits measurements until someone argues it away.

=======================================  ====  ================================================
field                                    can?  why
=======================================  ====  ================================================
model.* (preset/path, dtype, attention,  yes   shapes, bytes per element, saved tensors, kernels
liger_kernel, lean_ops, remote code)
data.* (source, sizes, columns, seeds)   yes   sequence lengths and padding (synthetic seeds too:
                                               conservative, they are cheap to keep)
train.max_length, padding_side,          yes   tokens per micro-step, head memory, what a trial
pad_to_multiple_of, logp_chunk_tokens,         runs on, how the measurement is taken
precision, reference,
device, warmup_steps, group_by_length,
padding_free, worst_case_step
train.dropout                            yes   dropout's masks are saved tensors
train.seed                               yes*  *except for fixed-length synthetic data: the data
                                               order sets which pairs share a padded micro-batch
resources.*                              yes   workers, parallelism, the memory cap, CPUs
train.adapter, lora_r, lora_alpha,       yes   frozen base, adapters' parameters and saved
lora_dropout, lora_targets, optimizer,         tensors, NF4 weights, optimizer state bytes,
optimizer_in_backward                          gradients alive (lora_alpha too: conservative)
micro_batch, checkpoint_level            yes   activations and recompute
grad_acc                                 as    ``short_grad_acc``: 1 vs >= 2 changes the peak;
                                               the step time is extrapolated (t_opt + G t_micro)
beta, train.loss, label_smoothing        no    a few scalar ops per pair
train.lr, lr_warmup_steps, lr_schedule   no    a scalar in the fused AdamW step
train.weight_decay, adam_betas,          no    the same fused AdamW kernel
adam_eps
train.max_grad_norm                      no    the norm is computed either way (inf: no clip)
train.steps                              no    the measurement's own step count decides
train.evaluate                           no    the held batch runs after the steps, untimed
train.learning_steps, learning_precision no    only the learning trials' (``learning_config``),
                                               whose configurations carry the resolved values
train.seed (fixed synthetic lengths)     no    weights' values and the order of equal lengths
trial_id, space_name                     no    names
=======================================  ====  ================================================
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from typing import Callable, Sequence

from dpo_sweep.config import TrialConfig
from dpo_sweep.plan.memory import MemoryEstimate
from dpo_sweep.core.levels import Level

#: Paths into ``TrialConfig.model_dump()`` that cannot change peak memory or step time.
NOT_MEMORY_FIELDS: tuple[tuple[str, ...], ...] = (
    ("trial_id",), ("space_name",), ("beta",), ("grad_acc",),  # grad_acc enters as short_grad_acc
    ("train", "loss"), ("train", "label_smoothing"), ("train", "lr"), ("train", "lr_warmup_steps"),
    ("train", "lr_schedule"), ("train", "weight_decay"), ("train", "adam_betas"), ("train", "adam_eps"),
    ("train", "max_grad_norm"), ("train", "steps"), ("train", "evaluate"),
    ("train", "learning_steps"), ("train", "learning_precision"),  # a learning trial's cfg carries its own
)
#: Fields that set what the loss trajectory is, besides the effective batch.
LEARNING_FIELDS: tuple[tuple[str, ...], ...] = (
    ("model", "preset"), ("model", "name_or_path"), ("model", "dtype"), ("data",), ("beta",),
    ("train", "lr"), ("train", "lr_warmup_steps"), ("train", "lr_schedule"), ("train", "loss"),
    ("train", "label_smoothing"), ("train", "precision"), ("train", "reference"), ("train", "seed"),
    ("train", "steps"), ("train", "warmup_steps"), ("train", "max_length"), ("train", "weight_decay"),
    ("train", "adam_betas"), ("train", "adam_eps"), ("train", "max_grad_norm"), ("train", "device"),
    ("train", "beta_schedule"), ("train", "adaptive_clip"), ("train", "adaptive_clip_window"),
    ("train", "ema_decay"), ("train", "grad_acc_schedule"),  # the stability knobs (train/knobs.py)
    ("train", "dropout"),
    ("train", "learning_steps"), ("train", "learning_precision"),
    ("train", "adapter"), ("train", "lora_r"), ("train", "lora_alpha"), ("train", "lora_dropout"),
    ("train", "lora_targets"), ("train", "optimizer"),  # what is trained and how it is stepped
)
#: Knobs along which memory only grows, compared by ``dominates_in_memory``.
_GROWING = (("micro_batch",), ("checkpoint_level",), ("train", "max_length"))

Predict = Callable[[TrialConfig], float]


def _drop(tree: dict, path: tuple[str, ...]) -> None:
    node = tree
    for key in path[:-1]:
        node = node.get(key, {})
    node.pop(path[-1], None)


def _get(tree: dict, path: tuple[str, ...]):
    for key in path:
        tree = tree[key]
    return tree


def _canonical(tree: dict) -> str:
    return json.dumps(tree, sort_keys=True, default=str)


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


def _memory_tree(cfg: TrialConfig) -> dict:
    tree = cfg.model_dump(mode="json")
    for path in NOT_MEMORY_FIELDS:
        _drop(tree, path)
    if cfg.data.synthetic is not None and cfg.data.synthetic.lengths == "fixed":
        _drop(tree, ("train", "seed"))  # every pair as long as every other: no order changes the padding
    tree["short_grad_acc"] = short_grad_acc(cfg)
    return tree


def measurement_key(cfg: TrialConfig) -> str:
    """Equal for configurations that must have the same peak memory and micro-step time."""
    return _canonical(_memory_tree(cfg))


def memory_family(cfg: TrialConfig) -> str:
    """``measurement_key`` without the knobs along which memory grows and the grad_acc class:
    configurations of one family differ only in micro_batch, level, max_length and grad_acc."""
    tree = _memory_tree(cfg)
    for path in (*_GROWING, ("short_grad_acc",)):
        _drop(tree, path)
    return _canonical(tree)


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
    by_key: dict[str, list[TrialConfig]] = {}
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
    if memory_family(a) != memory_family(b):
        return False
    return (a.micro_batch >= b.micro_batch and a.train.max_length >= b.train.max_length
            and Level(a.checkpoint_level).memory_rank <= Level(b.checkpoint_level).memory_rank
            and short_grad_acc(a) >= short_grad_acc(b))


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

def learning_key(cfg: TrialConfig) -> str:
    """Equal for configurations whose loss trajectory is the same: same effective batch and
    learning set-up, whatever the micro_batch x grad_acc split or checkpoint level (the trainer
    is tested to give the same update for any split and level)."""
    tree = cfg.model_dump(mode="json")
    picked = {"/".join(p): _get(tree, p) for p in LEARNING_FIELDS}
    picked["effective_batch"] = cfg.effective_batch()
    return _canonical(picked)


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
