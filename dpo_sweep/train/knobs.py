"""The seed articles' stability knobs, each a small piece the loop calls once per step.

* :func:`seed_beta` - ``train.beta_schedule: seed``: the DPO-stability article's beta schedule;
* :class:`AdaptiveClip` - ``train.adaptive_clip``: each parameter's gradient clipped at the P90
  of its own recent gradient norms;
* :class:`WeightEma` - ``train.ema_decay``: an exponential moving average of the weights, which
  become the trial's final weights;
* :class:`GradAccSchedule` - ``train.grad_acc_schedule: seed``: the grad-acc article's dynamic
  accumulation (32, then 16 once KL is stable, 4 for the last 10% of steps).

All state lives in the objects the loop builds per trial (no module state); nothing here syncs
the GPU with the host except where a docstring says so.
"""
from __future__ import annotations

import math

import torch
from torch import nn

#: The schedule's end points for beta 0.1, the article's starting beta.
_SEED_BETA_BASE = 0.1


def seed_beta(step: int, total_steps: int, beta: float = _SEED_BETA_BASE) -> float:
    """Beta at optimizer ``step`` (1-based) of ``total_steps`` under the article's schedule.

    With ``k = step - 1`` and ``p = k / total_steps`` (the article's ``current_step /
    total_steps``, counted from 0): ``0.1 + 0.2 p / 0.1`` (linear 0.1 -> 0.3) while p < 0.1;
    0.15 for the last 5% (p >= 0.95); ``0.2 + 0.1 cos(2 pi p)`` in between. Those are the values
    for ``beta`` 0.1; another ``beta`` scales the whole schedule by ``beta / 0.1``, so a swept
    beta keeps its meaning (the start of the schedule).
    """
    p = (step - 1) / total_steps
    if p < 0.1:
        value = 0.1 + 0.2 * p / 0.1
    elif p >= 0.95:
        value = 0.15
    else:
        value = 0.2 + 0.1 * math.cos(2 * math.pi * p)
    return value * beta / _SEED_BETA_BASE


class AdaptiveClip:
    """Layer-wise adaptive gradient clipping: each parameter's gradient is scaled down to the P90
    of that parameter's own gradient norms over the last ``window`` optimizer steps.

    The history holds the *unclipped* norms (clipped ones would ratchet the threshold down), and
    a parameter is clipped only once ``min_history`` norms are known: before that a P90 of one or
    two values is no estimate. Norms, history and quantiles stay on the device: no host sync.
    With several workers each clips its own (DDP: identical, already all-reduced) gradients.
    """

    def __init__(self, params: list[nn.Parameter], window: int, min_history: int = 5):
        self.params = params
        self.window = window
        self.min_history = min(min_history, window)
        device = params[0].device
        self.history = torch.zeros(len(params), window, dtype=torch.float32, device=device)
        self.seen = 0

    def clip_(self) -> None:
        """Clip the gradients in place (after unscaling, before the global norm clip)."""
        grads = [p.grad for p in self.params]
        norms = torch.stack([g.detach().float().norm() for g in grads])
        filled = min(self.seen, self.window)
        if filled >= self.min_history:
            threshold = torch.quantile(self.history[:, :filled], 0.9, dim=1)
            scale = torch.clamp(threshold / (norms + 1e-12), max=1.0)
            torch._foreach_mul_(grads, [s.to(g.dtype) for s, g in zip(scale, grads)])
        self.history[:, self.seen % self.window] = norms
        self.seen += 1


class WeightEma:
    """``ema = decay x ema + (1 - decay) x w`` after every optimizer step, kept in fp32 (a bf16
    average would round the (1 - decay) share of each update away). Costs one fp32 copy of the
    trainable weights in memory."""

    def __init__(self, params: list[nn.Parameter], decay: float):
        self.params = params
        self.decay = decay
        self.shadow = [p.detach().float().clone() for p in params]

    @torch.no_grad()
    def update(self) -> None:
        # One parameter at a time: a float32 copy of every bf16 weight at once is a transient as
        # large as the shadow itself, at the step's fullest moment (the gradients still alive).
        for shadow, p in zip(self.shadow, self.params):
            shadow.lerp_(p.detach().float(), 1.0 - self.decay)

    @torch.no_grad()
    def copy_to_params(self) -> None:
        """Make the averaged weights the model's weights (the trial's final weights)."""
        for p, s in zip(self.params, self.shadow):
            p.copy_(s.to(p.dtype))


#: "KL is stable": over the last KL_STABLE_WINDOW step-to-step changes, each change of the
#: per-token KL estimate is at most KL_STABLE_REL of its value at that step.
KL_STABLE_WINDOW = 3
KL_STABLE_REL = 0.1


def kl_is_stable(kl_per_step: list[float], window: int = KL_STABLE_WINDOW, rel: float = KL_STABLE_REL) -> bool:
    """True when the last ``window`` changes of ``kl_per_step`` are each within ``rel`` of the
    step's |KL|. At step 1 the policy is the reference (KL 0) and KL grows fast in relative terms
    for a few steps, so a run is never "stable" at its very start."""
    if len(kl_per_step) < window + 1:
        return False
    tail = kl_per_step[-(window + 1):]
    return all(math.isfinite(b) and abs(b - a) <= rel * abs(b) for a, b in zip(tail, tail[1:]))


class GradAccSchedule:
    """Micro-steps per optimizer step. ``constant``: the configured grad_acc every step. ``seed``:
    the grad-acc article's schedule, as fractions of the configured grad_acc G (G = 32 gives the
    article's 32, 16, 4): G until KL is stable (:func:`kl_is_stable`), then G / 2, and G / 8 for
    the last 10% of steps (p = (step - 1) / steps >= 0.9); never below 1. Once KL has been stable
    the schedule stays at G / 2 (it does not go back). The effective batch then changes per step:
    steps.csv's ``grad_acc`` says each step's, results.csv's ``grad_acc`` / ``effective_batch``
    are the first phase's."""

    def __init__(self, kind: str, grad_acc: int, total_steps: int):
        self.kind = kind
        self.grad_acc = grad_acc
        self.total_steps = total_steps
        self.kl: list[float] = []
        self.halved = False

    def for_step(self, step: int) -> int:
        if self.kind == "constant":
            return self.grad_acc
        if (step - 1) / self.total_steps >= 0.9:
            return max(1, self.grad_acc // 8)
        return max(1, self.grad_acc // 2) if self.halved else self.grad_acc

    def observe(self, kl: float) -> None:
        """The step's KL (already on the host: the loop reads its metrics once per step)."""
        self.kl.append(kl)
        self.halved = self.halved or kl_is_stable(self.kl)
