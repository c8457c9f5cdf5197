"""``dpo-sweep validate SPACE.yaml``: the space file, the data, models and tokenizers it names
checked (exit 2 on a refusal), then the trials' table with each one's predicted peak and plan;
with ``--gpu``, a fit table per card. Runs nothing; what it is doing goes to stderr once it has
taken a second (:class:`Progress`)."""
from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, TextIO

from dpo_sweep import preflight
from dpo_sweep import space as space_mod
from dpo_sweep.core.budget import DEFAULT_SAFETY_MARGIN
from dpo_sweep.core.dimensions import CONFIG_COLUMNS, RESOURCE_COLUMNS
from dpo_sweep.errors import UserError


class Progress:
    """What ``validate`` is doing, on stderr, once it has taken a second (a space of 100,000
    configurations takes tens): on a terminal one line rewritten in place, in a log a line at
    most every :data:`LOG_EVERY_S` and at each new phase. A small space says nothing."""

    QUIET_S = 1.0     # nothing before this
    LOG_EVERY_S = 5.0  # between two lines in a log (a terminal's line is rewritten 5 times a second)
    clock: Callable[[], float] = staticmethod(time.monotonic)

    def __init__(self, stream: TextIO | None = None, clock: Callable[[], float] | None = None) -> None:
        self._stream, self._clock = stream or sys.stderr, clock or self.clock
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._start, self._last, self._width = self._clock(), None, 0

    def say(self, what: str, phase: bool = False) -> None:
        now = self._clock()
        if now - self._start < self.QUIET_S:
            return
        if not phase and self._last is not None and now - self._last < (0.2 if self._tty else self.LOG_EVERY_S):
            return
        self._last = now
        line = f"validate: {what} ({now - self._start:.0f} s)"
        if self._tty:
            self._stream.write("\r" + line.ljust(self._width))
            self._width = max(self._width, len(line))
        else:
            self._stream.write(line + "\n")
        self._stream.flush()

    def points(self, done: int, total: int) -> None:
        self.say(f"{done:,} of {total:,} points of the grid resolved")

    def end(self) -> None:
        """Clear a terminal's line before the table is printed."""
        if self._tty and self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()
            self._width = 0


def cmd_validate(args: argparse.Namespace) -> int:
    """``dpo-sweep validate SPACE.yaml [--set KEY=VALUE ...] [--gpu NAME[,NAME...]]``: see the module doc."""
    progress = Progress()
    try:
        return _validate(args, progress)
    finally:
        progress.end()


def _validate(args: argparse.Namespace, progress: Progress) -> int:
    sp = space_mod.load(args.space, args.overrides, progress=progress.points)
    progress.say(f"checking the data, models and tokenizers of {len(sp.trials):,} trial(s)", phase=True)
    data = preflight.check_inputs(sp.trials, levers=False)  # the data, model and tokenizer too, not only the file
    progress.end()
    print(f"{args.space}: valid, {len(sp.trials)} trial(s)" + (f", {len(sp.skipped)} point(s) skipped" if sp.skipped else ""))
    for point in sp.skipped:
        print(point.line())
    for note in preflight.lever_notes(sp.trials):
        print(note)
    for summary in data:
        print(summary.line())
        for note in summary.notes():
            print(note)
    # Imported once the inputs passed: the plan's labels import pandas (through the schedule), which
    # a refused file need not wait for. predicted_peak_label: the planner's memory model (docs/planner.md#planner).
    from dpo_sweep.plan.fit import FitPlanner, fit_text, predictor
    from dpo_sweep.plan.labels import plan_labels
    from dpo_sweep.plan.memory import predicted_peak_label

    lengths = preflight.lengths_by_trial(sp.trials, data)  # the worst micro-batch of each trial's own data
    progress.say(f"planning {len(sp.trials):,} trial(s) and predicting their peaks", phase=True)
    # The configuration's columns (the resources where the trials differ in them), then the plan's.
    knobs = {t.trial_id: t.knobs() for t in sp.trials}
    columns = [c for c in (*CONFIG_COLUMNS, "effective_batch")
               if c not in RESOURCE_COLUMNS or len({k[c] for k in knobs.values()}) > 1]
    header = ["trial_id", *columns, "loss", "precision", "predicted peak (GB)", "plan"]
    # The budget here: resources.gpu_memory_gb (no card is asked); the lengths as `run` plans with.
    plan = plan_labels(sp.trials, lengths=lengths)
    rows = [[t.trial_id, *[str(knobs[t.trial_id][k]) for k in columns], t.train.loss, t.train.precision,
             predicted_peak_label(t, lengths[t.trial_id]), plan[t.trial_id]] for t in sp.trials]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    progress.end()
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    if args.gpu:
        margin = DEFAULT_SAFETY_MARGIN if args.safety_margin is None else args.safety_margin
        if not 0.0 <= margin < 1.0:
            raise UserError(f"--safety-margin is {margin}; give a fraction in [0, 1), e.g. 0.05 for 5%")
        fits = FitPlanner(predictor(lengths), margin)
        for card in args.gpu:
            print()
            fewest = [fits.fewest_cards(t, card) for t in sp.trials]
            print(fit_text(card, sp.trials, fits.table(sp.trials, card), margin, fewest))
    return 0
