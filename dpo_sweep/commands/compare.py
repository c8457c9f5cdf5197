"""``dpo-sweep compare DIR1 DIR2``: two sweeps side by side (the comparison itself, as data, is
:mod:`dpo_sweep.analysis.compare`'s). Reads only; writes nothing."""
from __future__ import annotations

import argparse

from dpo_sweep.analysis.compare import compare, format_comparison


def cmd_compare(args: argparse.Namespace) -> int:
    """``dpo-sweep compare DIR1 DIR2``."""
    print(format_comparison(compare(args.first, args.second), args.first, args.second))
    return 0
