"""Re-judge committed sweeps' stability from their steps.csv with today's dpo_sweep.core.stability.

The verdict is a pure function of a trial's per-step values, so a results directory made by older
code can be judged again without re-running it. Prints, per directory, how many trials moved from
each old verdict (results.csv) to each new one, and saves every trial's new signals:

    python benchmarks/stability_rejudge.py reports/examples/*-h200 [--out benchmarks/results/stability_rejudge/committed-learning-runs]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))  # h200_common puts the checkout on sys.path too

from h200_common import results_dir  # noqa: E402

from dpo_sweep.core import stability  # noqa: E402
from dpo_sweep.analysis.results import load_results, load_steps  # noqa: E402
from dpo_sweep.analysis.tables import to_markdown  # noqa: E402

SIGNAL_INPUTS = ("loss", "grad_norm", "logratio_std", "reward_accuracy", "reward_margin")


def rejudge(results_dir: Path) -> pd.DataFrame:
    """One row per trial of ``results_dir``'s steps.csv: its old verdict and today's signals."""
    steps = load_steps(results_dir)
    if steps.empty or not set(SIGNAL_INPUTS) <= set(steps.columns):
        return pd.DataFrame()
    results = load_results(results_dir)
    old = dict(zip(results["trial_id"].astype(str), results["stability"].fillna("").astype(str)))
    rows = []
    for trial_id, trial in steps.groupby("trial_id", sort=False):
        trial = trial.sort_values("step")
        sig = stability.signals(*(trial[c].astype(float).tolist() for c in SIGNAL_INPUTS))
        scale = abs(float(trial["loss"].iloc[0])) or math.nan
        rows.append({"dir": results_dir.name, "trial_id": str(trial_id), "steps": len(trial),
                     "old_stability": old.get(str(trial_id), "(no row)"), **sig,
                     "loss_spread_of_scale": sig["loss_spread"] / scale})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=results_dir("stability_rejudge"))
    args = ap.parse_args(argv)
    if missing := [d for d in args.dirs if not d.is_dir()]:
        print(f"stability_rejudge: not a directory: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    for d in args.dirs:
        if not (d / "steps.csv").is_file():
            print(f"skipped {d}: no steps.csv (no trial got to a step)")
    table = pd.concat([rejudge(d) for d in args.dirs if (d / "steps.csv").is_file()] or [pd.DataFrame()],
                      ignore_index=True)
    if table.empty:
        print("stability_rejudge: no trial has the per-step stability inputs", file=sys.stderr)
        return 2
    counts = (table.assign(new=table["stability"].replace("", "(none)"))
              .groupby(["dir", "old_stability", "new"]).size().rename("trials").reset_index())
    md = to_markdown(list(counts.columns), counts.astype(str).values.tolist())
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "trials.csv", index=False)
    (args.out / "summary.md").write_text(f"`python {' '.join(sys.argv)}`\n\n{md}\n")
    print(f"\n{len(table)} trial(s); saved {args.out / 'trials.csv'} and {args.out / 'summary.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
