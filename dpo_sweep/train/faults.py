"""Faults injected into a trial on purpose: how the tests make a trial run out of memory, raise or
diverge at a chosen step, on a chosen rank, through the real trainer and the real sweep.

Not part of the space file (a space that names ``train.fail_at_step`` is refused as any unknown
field is): the tests set :data:`FAULTS_ENV` in the environment of the command that starts trials,
which reads it once (``dpo-sweep run``'s driver, ``dpo-sweep trial``) and hands each matching
trial its :class:`InjectedFault` (a Ray sweep: in its ``TrialTask``); the trainer injects it
(:func:`inject`). The value is JSON, one rule or a list of them::

    DPO_SWEEP_TEST_FAULTS='{"step": 2, "kind": "oom", "rank": 1, "when": {"checkpoint_level": "L1"}}'

``step``: the optimizer step (1-based); ``kind``: ``error`` (an exception), ``oom`` (a
``torch.OutOfMemoryError``), ``nan`` (that step's loss poisoned) or ``hang`` (the step never
ends: the sweep's time limit ends the trial); ``rank``: only that worker
(default: every rank); ``when``: the trials it applies to, by values of their configuration (dotted
paths into ``TrialConfig``, e.g. ``train.seed``; default: every trial). The first matching rule wins.
No torch at import: the sweep's driver imports this module.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

from dpo_sweep.errors import UserError

#: The environment variable only tests set (see the module doc).
FAULTS_ENV = "DPO_SWEEP_TEST_FAULTS"
FAULT_KINDS = ("error", "oom", "nan", "hang")


class InjectedFailure(RuntimeError):
    """Raised by an injected ``error`` fault."""


@dataclass(frozen=True)
class InjectedFault:
    """What to inject into one trial: ``kind`` at optimizer step ``step``, on ``rank`` (None: every rank)."""

    step: int
    kind: str = "error"
    rank: int | None = None

    def due(self, step: int, rank: int = 0) -> bool:
        """Whether this fault fires at ``step`` on ``rank``."""
        return self.step == step and (self.rank is None or self.rank == rank)


def inject(fault: InjectedFault | None, step: int, rank: int = 0) -> bool:
    """At the start of ``step``: raise the fault when it is due, or return True when this step's
    loss is to be poisoned (``nan``); False when nothing is due."""
    if fault is None or not fault.due(step, rank):
        return False
    if fault.kind == "oom":
        import torch  # the trainer's process has it already

        raise torch.OutOfMemoryError(f"injected OOM at step {step} ({FAULTS_ENV})")
    if fault.kind == "hang":
        import time

        while True:
            time.sleep(60)
    if fault.kind == "error":
        raise InjectedFailure(f"injected failure at step {step} ({FAULTS_ENV})")
    return True


def _value_at(data: Mapping[str, Any], path: str) -> Any:
    value: Any = data
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise UserError(f"{FAULTS_ENV}: when: {path!r} is not a field of a trial's configuration")
        value = value[part]
    return value


@dataclass(frozen=True)
class FaultRule:
    """One rule of :data:`FAULTS_ENV`: the fault, and the configuration values it applies to."""

    fault: InjectedFault
    when: tuple[tuple[str, Any], ...] = ()

    def matches(self, dumped: Mapping[str, Any]) -> bool:
        return all(_value_at(dumped, path) == value for path, value in self.when)

    @staticmethod
    def parse(item: Any) -> FaultRule:
        if not isinstance(item, dict):
            raise UserError(f"{FAULTS_ENV}: each rule is a JSON object, not {item!r}")
        unknown = set(item) - {"step", "kind", "rank", "when"}
        step, kind, rank, when = item.get("step"), item.get("kind", "error"), item.get("rank"), item.get("when", {})
        if unknown:
            raise UserError(f"{FAULTS_ENV}: unknown key(s) {sorted(unknown)}; allowed: step, kind, rank, when")
        if not isinstance(step, int) or step < 1:
            raise UserError(f"{FAULTS_ENV}: step: {step!r} is not allowed; give an optimizer step, 1 or more")
        if kind not in FAULT_KINDS:
            raise UserError(f"{FAULTS_ENV}: kind: {kind!r} is not allowed; give one of {', '.join(FAULT_KINDS)}")
        if rank is not None and (not isinstance(rank, int) or rank < 0):
            raise UserError(f"{FAULTS_ENV}: rank: {rank!r} is not allowed; give a worker rank, 0 or more")
        if not isinstance(when, dict):
            raise UserError(f"{FAULTS_ENV}: when: give an object of configuration paths and values, not {when!r}")
        return FaultRule(InjectedFault(step, kind, rank), tuple(when.items()))


def fault_rules(environ: Mapping[str, str] | None = None) -> tuple[FaultRule, ...]:
    """The rules of :data:`FAULTS_ENV` (none when it is not set); a :class:`UserError` naming what
    is wrong with its value."""
    text = (os.environ if environ is None else environ).get(FAULTS_ENV, "").strip()
    if not text:
        return ()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{FAULTS_ENV}: not JSON ({err})") from None
    return tuple(FaultRule.parse(item) for item in (data if isinstance(data, list) else [data]))


def fault_for(rules: tuple[FaultRule, ...], cfg: Any) -> InjectedFault | None:
    """The fault of the first rule that matches the trial ``cfg`` (a ``TrialConfig``), or None."""
    if not rules:
        return None
    dumped = cfg.model_dump(mode="json")
    return next((rule.fault for rule in rules if rule.matches(dumped)), None)
