"""What a results row's enumerated text columns may say: a trial's ``status`` and where its
``step_time_ms`` comes from (``step_time_source``).

Each is an ``enum.StrEnum``: a member's value is the text results.csv holds, so a member equals
the cell read back from the file (``row["status"] == Status.OK``), writes as that text in CSV and
JSON, and prints as it. Standard library only.
"""
from __future__ import annotations

import enum
from typing import Self


class TextEnum(enum.StrEnum):
    """An enum whose values are the text a results file holds (no members of its own)."""

    @classmethod
    def of(cls, value: object) -> Self | None:
        """The member spelled ``value`` (a CSV cell, a config's field); None for any other value."""
        try:
            return cls(value)
        except ValueError:
            return None


class Status(TextEnum):
    """A trial's outcome (results.csv's ``status``). An OOM or an error is a status of its row, not
    an exception that escapes."""

    OK = "ok"              # every step ran
    OOM = "oom"            # it ran out of memory
    DIVERGED = "diverged"  # a loss or gradient norm went non-finite
    ERROR = "error"        # any other failure (``error`` says which)
    PRUNED = "pruned"      # not run: the planner knows it must run out of memory
    #: It ran past its limit (sweep/stopping.py: the planner's estimate, with a floor) and was
    #: ended; like an ``error`` row lost to the machine (``infrastructure_failure``), --resume runs
    #: it again.
    TIMEOUT = "timeout"
    #: An early-stopping scheduler (search.scheduler: Ray Tune's ASHA) ended its learning trial at a
    #: rung, its held-out metric below the rung's cut: ``stopped_step`` says where. A result, kept
    #: by --resume.
    STOPPED = "stopped"


class TimeSource(TextEnum):
    """Where a row's ``step_time_ms`` comes from (results.csv's ``step_time_source``; empty on a
    row without a step time)."""

    MEASURED = "measured"          # its own steps at its own grad_acc
    EXTRAPOLATED = "extrapolated"  # t_opt + grad_acc x t_micro of a shorter accumulation (plan/extrapolate.py)
    RUNOFF = "runoff"              # a runoff trial timed it in full at its grad_acc (plan/runoff.py)
    #: Simulated ranks (resources.simulate_ranks): one rank's compute time plus the step's
    #: communication over the card's interconnect (core/comms.py), not a time any cluster ran.
    MODELLED = "modelled"
