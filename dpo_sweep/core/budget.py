"""Whether a peak fits a memory budget, decided in the units the reports print.

The usable memory is the budget less a safety margin, and it is printed, like every peak, to
0.01 GB (GB = 1e9 bytes). A product such as ``24 x 0.95`` is 22.799999999999997 in floating
point, so a 22.80 GB peak compared as a float would not fit a usable 22.80 GB, and the text would
ask for a budget of "at least 24.00 GB" while 24 GB was given. Comparing both numbers as printed
makes the decision the one a reader checks by hand.

Neutral ground, beside noise.py: the recommendation (analysis/recommend.py) and the planner's
runoff (plan/schedule.py, plan/runoff.py) both decide which rows fit with it.
"""
from __future__ import annotations

import math

#: Decimal places of GB in every printed peak and budget.
GB_DIGITS = 2
#: Fraction of a budget kept free when none is given (--safety-margin): the recommendation's,
#: validate's fit tables' and the planner's runoff's.
DEFAULT_SAFETY_MARGIN = 0.05


def usable_gb(budget_gb: float, safety_margin: float) -> float:
    """The peak a configuration must stay under: ``budget_gb x (1 - safety_margin)``."""
    return budget_gb * (1.0 - safety_margin)


def fits(peak_gb: float, usable: float | None) -> bool:
    """True when ``peak_gb`` printed to :data:`GB_DIGITS` is at most ``usable`` printed the same
    way; any peak fits when ``usable`` is None (no budget); a NaN peak never fits."""
    if usable is None:
        return True
    if not math.isfinite(peak_gb):
        return False
    return round(peak_gb, GB_DIGITS) <= round(usable, GB_DIGITS)


def needed_gb(peak_gb: float, safety_margin: float) -> float:
    """The smallest budget, in printed steps of 0.01 GB (at least one), that ``peak_gb``
    :func:`fits` after ``safety_margin``."""
    step = 10.0**-GB_DIGITS
    steps = max(1, math.floor(peak_gb / (1.0 - safety_margin) / step) - 2)  # at or just below the answer
    while not fits(peak_gb, usable_gb(steps * step, safety_margin)):
        steps += 1
    return round(steps * step, GB_DIGITS)
