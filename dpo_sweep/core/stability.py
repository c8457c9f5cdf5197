"""Stability signals of one trial and its verdict: pure functions over its per-step values.

Neutral ground (standard library only): the trainer computes a trial's verdict and its rollback
step from its steps for results.csv, the analyser reads the same definitions.

Signals (TRL's names where TRL has one, per optimizer step, every step that ran: a learning
trajectory starts at step 1, so the warm-up steps that the time medians leave out count here):

* ``loss_slope``: least-squares slope of the loss per step (negative: it falls);
* ``loss_spread``: the loss's spread around its best non-increasing fit (:func:`monotone_spread`):
  what a falling loss does not explain, its rises;
* ``grad_norm_spike``: the largest ``grad_norm`` over the median of the 5 steps before it
  (:func:`trailing_spike`);
* ``logratio_mean`` / ``logratio_std`` (per step, from the trainer): mean and std over the step's
  sequences (chosen and rejected) of ``log pi(y|x) - log ref(y|x)`` per response token (the
  mean is steps.csv's ``kl``); per token, so the 1.5 threshold means the same at any length;
  ``logratio_std_max`` is the largest per-step std;
* ``reward_accuracy_slope`` / ``reward_margin_slope``: slopes of ``rewards/accuracies`` and
  ``rewards/margins`` per step;
* ``rollback_step``: the step at which the log-ratio std has stayed above
  :data:`ROLLBACK_LOGRATIO_STD` for :data:`ROLLBACK_STEPS` consecutive steps (the rollback trigger
  of the seed article on DPO stability), None when it never fires.

The verdict (:func:`verdict`), with ``scale`` = |loss| at step 1, where the policy is still the
reference: the loss type's value at a zero margin (ln 2 for sigmoid, 1 for hinge, (1 / 2 beta)^2
for ipo), so every threshold is relative to a scale the configuration fixes:

* ``diverging``: a non-finite loss or grad norm (under fp16 a non-finite grad norm is a step
  GradScaler skipped, by design, and not counted: :func:`skipped_step`, the trainer's rule too);
  or the rollback trigger fired (the policy has moved from the reference by more than 1.5 nats
  per token, in spread, for 5 steps: the loss may then be falling *because* the policy
  degenerates); or the fitted loss *rises* over the run by more than :data:`RISE_FRACTION` of
  ``scale`` and by more than :data:`RISE_OVER_SPREAD` x its line spread (a rise the step-to-step
  noise around the line, :func:`detrended_std`, cannot explain); or it rises *late*, after a
  fall: its mean over the last steps is above its lowest such mean by more than
  :data:`RISE_FRACTION` of ``scale`` and :data:`LATE_RISE_OVER_NOISE` x its step noise
  (:func:`late_rise`: a loss that falls 8 steps and climbs 8 back fits a line of slope ~0); or the
  grad norm grows, the same way, by more than :data:`GRAD_NORM_GROWTH` x (on a log scale, floored
  like :func:`trailing_spike`: a norm growing 1.7x a step is never 5x the median of the 5 before);
* ``noisy``: otherwise, a spread above :data:`NOISY_SPREAD_FRACTION` of ``scale``, or a grad-norm
  spike above :data:`NOISY_GRAD_SPIKE`;
* ``stable``: otherwise; ``""`` (no verdict) with fewer than :data:`MIN_VERDICT_STEPS` finite steps.

How the thresholds are chosen (docs/stability.md#stability; the runs they rest on:
benchmarks/README.md#stability-thresholds). bf16 rounding moves the loss of same-maths splits by
at most 3.3% of the scale; healthy runs spread 0-5.2% around the monotone fit (a straight line
would read their drop to ~0 once the pairs repeat as ~30%), with no grad norm above 1.33x the
median of its 5 predecessors. ``noisy`` starts at 10%: above every healthy run, three times bf16's
rounding. A rise of 5% of the scale that is also twice the line spread is beyond both. A late rise
is judged against the step noise that second differences measure (blind to a line and to one
kink); at 3x that noise, pure noise reads a late rise in about 1% of runs. A grad norm grows 2.7x
in the beta schedule's first steps; 10x is beyond it. A grad norm 5x its recent median is a spike
no healthy run comes near. A healthy run's per-token log-ratio std stays below 1.7.
"""
from __future__ import annotations

import math
from typing import Sequence

VERDICTS = ("stable", "noisy", "diverging")
MIN_VERDICT_STEPS = 5
NOISY_SPREAD_FRACTION = 0.10
NOISY_GRAD_SPIKE = 5.0
SPIKE_WINDOW = 5
SPIKE_MIN_HISTORY = 3
SPIKE_FLOOR_FRACTION = 0.01
RISE_FRACTION = 0.05
RISE_OVER_SPREAD = 2.0
LATE_RISE_OVER_NOISE = 3.0
GRAD_NORM_GROWTH = 10.0
ROLLBACK_LOGRATIO_STD = 1.5
ROLLBACK_STEPS = 5


def _finite(values: Sequence[float]) -> bool:
    return all(math.isfinite(v) for v in values)


def slope(values: Sequence[float]) -> float:
    """Least-squares slope of ``values`` against 0, 1, 2, ...; NaN with fewer than 2 finite values."""
    n = len(values)
    if n < 2 or not _finite(values):
        return math.nan
    mx, my = (n - 1) / 2, sum(values) / n
    sxx = sum((x - mx) ** 2 for x in range(n))
    return sum((x - mx) * (y - my) for x, y in enumerate(values)) / sxx


#: The fewest values :func:`detrended_std` gives a spread of (a line through 2 points fits exactly).
MIN_STD_VALUES = 3


def detrended_std(values: Sequence[float]) -> float:
    """Spread of values around their least-squares line: sqrt(sum(residual^2) / (n - 2)).

    This is ``loss_std``: a loss that falls steadily has a std of 0, a loss that jumps around its
    trend does not. NaN with fewer than :data:`MIN_STD_VALUES` values.
    """
    n = len(values)
    if n < MIN_STD_VALUES or not _finite(values):
        return math.nan
    b = slope(values)
    mx, my = (n - 1) / 2, sum(values) / n
    resid = [y - (my + b * (x - mx)) for x, y in enumerate(values)]
    return math.sqrt(sum(r * r for r in resid) / (n - 2))


def median(values: Sequence[float]) -> float:
    """Median of the finite values; NaN when there are none."""
    v = sorted(x for x in values if math.isfinite(x))
    if not v:
        return math.nan
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def trailing_spike(values: Sequence[float], window: int = SPIKE_WINDOW) -> float:
    """The largest ratio of a value to the median of the ``window`` values before it, over the
    steps that have at least :data:`SPIKE_MIN_HISTORY` before them; NaN when none has.

    A spike is a jump against the recent past: a grad norm that decays 100x as the loss
    converges has ratios below 1 (max over the whole run's median would call it a spike). The
    median is floored at :data:`SPIKE_FLOOR_FRACTION` of the first step's norm: once a run has
    converged its norms are ~0 (1e-5 of step 1's), and 0.002 after 0.00002 is a
    ratio of 100 but no spike."""
    finite = [v for v in values if math.isfinite(v)]
    floor = SPIKE_FLOOR_FRACTION * abs(finite[0]) if finite else 0.0
    ratios = []
    for t in range(SPIKE_MIN_HISTORY, len(values)):
        med = max(median(values[max(0, t - window):t]), floor)
        if math.isfinite(values[t]) and med > 0:
            ratios.append(values[t] / med)
    return max(ratios) if ratios else math.nan


def monotone_fit(values: Sequence[float]) -> list[float]:
    """The least-squares non-increasing fit of ``values`` (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [m for m, n in blocks for _ in range(int(n))]


def monotone_spread(values: Sequence[float]) -> float:
    """Spread of values around their best non-increasing fit: sqrt(sum(residual^2) / (n - 1)).

    This is ``loss_spread``: a DPO loss is meant to fall, so what the fit cannot follow - every
    rise - is the spread. A loss that falls, steadily or in one drop (a random-init model's loss
    can go from ln 2 to 0.02 in one step when the pairs start repeating), has a spread of 0; around
    a straight line that drop would read as 30% of the scale. Pure noise of std s reads ~0.6-0.8 s
    (the fit follows its falls). NaN with fewer than 3 values."""
    n = len(values)
    if n < 3 or not _finite(values):
        return math.nan
    fit = monotone_fit(values)
    return math.sqrt(sum((y - f) ** 2 for y, f in zip(values, fit)) / (n - 1))


def rollback_step(logratio_std: Sequence[float], threshold: float = ROLLBACK_LOGRATIO_STD,
                  run: int = ROLLBACK_STEPS) -> int | None:
    """1-based step at which ``logratio_std`` has been above ``threshold`` for ``run`` consecutive
    steps (the step the rollback would happen at); None when that never happens."""
    streak = 0
    for step, value in enumerate(logratio_std, start=1):
        streak = streak + 1 if value > threshold else 0  # NaN compares False: breaks the streak
        if streak == run:
            return step
    return None


def skipped_step(grad_norm: float, precision: str) -> bool:
    """True for a step that fp16's GradScaler skips: its gradients overflowed (a non-finite grad
    norm), so it lowers the scale and leaves the weights alone. Not divergence."""
    return precision == "fp16" and not math.isfinite(grad_norm)


def late_rise(values: Sequence[float]) -> tuple[float, float]:
    """(rise, noise): how far the mean of the last ``w`` values lies above the lowest mean of any
    ``w`` consecutive values (``w`` = a quarter of the run, at least 3), and the per-step noise:
    the median absolute second difference scaled to a standard deviation (1.4826 / sqrt 6), which
    a straight line and a single kink leave at 0. (NaN, NaN) with fewer than ``w + 2`` values."""
    n = len(values)
    w = max(3, n // 4)
    if n < w + 2 or not _finite(values):
        return math.nan, math.nan
    means = [sum(values[i:i + w]) / w for i in range(n - w + 1)]
    second = [abs(values[i + 2] - 2 * values[i + 1] + values[i]) for i in range(n - 2)]
    return means[-1] - min(means), 1.4826 * median(second) / math.sqrt(6)


def _rises_late(values: Sequence[float], least: float) -> bool:
    rise, noise = late_rise(values)
    return rise > least and rise > LATE_RISE_OVER_NOISE * noise  # NaN compares False


def verdict(losses: Sequence[float], grad_norms: Sequence[float], rollback: int | None = None,
            precision: str = "") -> str:
    """``stable``, ``noisy``, ``diverging`` or ``""`` (too few steps); the rules are the module doc's.
    ``rollback``: :func:`rollback_step` of the trial's log-ratio std; ``precision``: the trial's
    (fp16's skipped steps are left out of the grad norms)."""
    grad_norms = [g for g in grad_norms if not skipped_step(g, precision)]
    if not _finite(losses) or not _finite(grad_norms) or rollback is not None:
        return "diverging"
    if len(losses) < MIN_VERDICT_STEPS or len(grad_norms) < MIN_VERDICT_STEPS:
        return ""
    scale = abs(losses[0]) or max(abs(v) for v in losses)
    rise = slope(losses) * (len(losses) - 1)
    if rise > RISE_FRACTION * scale and rise > RISE_OVER_SPREAD * detrended_std(losses):
        return "diverging"
    floor = SPIKE_FLOOR_FRACTION * abs(grad_norms[0])
    log_norms = [math.log(max(g, floor)) for g in grad_norms] if floor > 0 else []
    if _rises_late(losses, RISE_FRACTION * scale) or _rises_late(log_norms, math.log(GRAD_NORM_GROWTH)):
        return "diverging"
    if monotone_spread(losses) > NOISY_SPREAD_FRACTION * scale or trailing_spike(grad_norms) > NOISY_GRAD_SPIKE:
        return "noisy"
    return "stable"


def signals(losses: Sequence[float], grad_norms: Sequence[float], logratio_std: Sequence[float],
            reward_accuracy: Sequence[float], reward_margin: Sequence[float],
            precision: str = "") -> dict[str, float | int | str | None]:
    """Every signal of the module doc from a trial's per-step values (all steps that ran, in order),
    keyed by its results.csv column (fields of the results row, ``TrialResult``, which types them);
    ``precision``: the trial's (train.precision)."""
    std_finite = [v for v in logratio_std if math.isfinite(v)]
    rollback = rollback_step(logratio_std)
    return {
        "stability": verdict(losses, grad_norms, rollback, precision),
        "loss_slope": slope(losses),
        "loss_spread": monotone_spread(losses),
        "grad_norm_spike": trailing_spike(grad_norms),
        "logratio_std_max": max(std_finite) if std_finite else math.nan,
        "reward_accuracy_slope": slope(reward_accuracy),
        "reward_margin_slope": slope(reward_margin),
        "rollback_step": rollback,
    }
