"""The planner's check: a planned sweep against ``--full-grid`` on the same space (CPU, seconds).

    python benchmarks/full_grid_compare.py PLANNED_DIR FULL_DIR [--csv OUT.csv] [--md OUT.md]
        [--beta-multiplier N]

Per memory/time configuration (the results.csv columns that can change peak memory or step time,
``plan/rules.py``'s table; not beta, loss, lr or the optimizer's scalars): each run's status, peak,
step time (planned: extrapolated from a short grad_acc; full: measured), tokens/s and place on the
memory/time frontier (memory min, throughput max by ``analysis/pareto.py``; loss std is beta's,
which a 1-beta full grid does not sweep); then whether frontiers and recommendations agree, and the
GPU time: ``startup_s + measure_s`` of every Ray trial - the rows that were their own trial
(``measured_by`` their id) and the ``<id>-learning`` trials, which have no row: their start-up from
``logs/<id>.log`` (worker line + model mark, 0.1 s resolution), their steps from steps.csv (gaps
between steps not counted); so too a failed trial without recorded times. ``--beta-multiplier N``
scales the full grid's costs by N: beta changes neither memory nor time
(``tests/plan/test_plan_premise.py``), so a full grid of N betas costs N times a 1-beta one.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))  # h200_common puts the checkout on sys.path too

import h200_common  # noqa: E402,F401  (the checkout on sys.path)
from dpo_sweep import space as space_mod  # noqa: E402
from dpo_sweep.core import noise  # noqa: E402
from dpo_sweep.analysis import pareto  # noqa: E402
from dpo_sweep.analysis.results import load_results, load_steps  # noqa: E402
from dpo_sweep.analysis.tables import fmt_float, fmt_sig, is_finite, to_markdown  # noqa: E402
from dpo_sweep.errors import UserError  # noqa: E402
from dpo_sweep.plan.rules import NOT_MEMORY_FIELDS  # noqa: E402
from dpo_sweep.core.levels import Level  # noqa: E402
from dpo_sweep.records import RESULTS_COLUMNS  # noqa: E402
from sweep_overhead import MARK, WORKER  # noqa: E402  (the console lines' one reader)

#: results.csv columns that name a configuration's memory/time set-up (the first three always shown).
#: Not ``attn_implementation``, ``liger_kernel``, ``lean_ops``, ``device``: the trainer resolves them
#: (auto -> sdpa), so a pruned row, never run, holds the defaults; space.yaml is compared instead.
CONFIG_COLUMNS = ("micro_batch", "checkpoint_level", "grad_acc", "seq_len", "model", "num_workers",
                  "precision", "reference")
#: Peaks are "the same" within this: repeated runs of one configuration peak up to 1.6% apart
#: (plan/rules.py, BUDGET_MARGIN's note: 8B mb 4 full 84.49 vs 83.12 GB).
PEAK_TOL_PCT = 2.0
#: Step times are "the same" within this: the median p10-p90 spread of one run's measured steps
#: is 3-4% on the committed H200 sweeps (the output prints each run's); further apart but with
#: overlapping p10-p90 intervals is "noise" (the analyser's tie rule, dpo_sweep/core/noise.py).
TIME_TOL_PCT = 5.0
GOAL_RATIO = 1 / 3
MEMORY_TIME = pareto.objectives_from_spec({"memory": "min", "throughput": "max"})
NUMBERS = ("peak_mem_gb", "step_time_ms", "step_time_p10_ms", "step_time_p90_ms", "tokens_per_s")
SIDES = ("planned", "full")
_NOT_MEMORY = {path[-1] for path in NOT_MEMORY_FIELDS} | {"loss_type"}


def config_columns(*frames: pd.DataFrame) -> list[str]:
    """CONFIG_COLUMNS plus the swept fields (columns beyond the contract's) that may change memory."""
    swept = [c for df in frames for c in df.columns if c not in RESULTS_COLUMNS and c not in _NOT_MEMORY]
    return list(dict.fromkeys([*CONFIG_COLUMNS, *swept]))


def _cell(value) -> str:
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value)).lower()
    if is_finite(value) and float(value).is_integer():
        return str(int(value))
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def configurations(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One row per configuration: its rows' statuses, count, median numbers, frontier membership."""
    on = pareto.analyse_frontier(df, MEMORY_TIME)["on_frontier"].to_numpy()
    df = df.assign(on_frontier=on, **{k: (df[k] if k in df else pd.Series("", index=df.index)).map(_cell)
                                      for k in keys})
    grouped = df.groupby(keys, sort=False)
    out = grouped.agg(status=("status", lambda s: "/".join(sorted(set(s)))), rows=("trial_id", "size"),
                      on_frontier=("on_frontier", "any"), **{c: (c, "median") for c in NUMBERS})
    return out.reset_index()


def compare(planned: pd.DataFrame, full: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The two runs' configurations side by side; a configuration only one has is ``absent`` in the other."""
    both = configurations(planned, keys).merge(configurations(full, keys), on=keys, how="outer",
                                               suffixes=("_planned", "_full"))
    for side in SIDES:
        both[f"status_{side}"] = both[f"status_{side}"].fillna("absent")
    both["peak_diff_pct"] = (both.peak_mem_gb_planned / both.peak_mem_gb_full - 1) * 100
    both["peak_same"] = np.where(both.peak_diff_pct.isna(), "-",
                                 np.where(both.peak_diff_pct.abs() <= PEAK_TOL_PCT, "yes", "no"))
    both["step_time_diff_pct"] = (both.step_time_ms_planned / both.step_time_ms_full - 1) * 100
    overlap = noise.overlaps(both.step_time_p10_ms_planned, both.step_time_p90_ms_planned,
                             both.step_time_p10_ms_full, both.step_time_p90_ms_full)
    both["step_time_same"] = np.select(
        [both.step_time_diff_pct.isna(), both.step_time_diff_pct.abs() <= TIME_TOL_PCT, overlap],
        ["-", "yes", "noise"], "no")
    return both.sort_values(keys, key=lambda s: s.map(lambda lv: Level(lv).memory_rank) if s.name == "checkpoint_level"
                            else pd.to_numeric(s, errors="coerce"), kind="mergesort").reset_index(drop=True)


def step_spread_pct(df: pd.DataFrame) -> float:
    """Median (p90 - p10) / median step time over a run's rows with a spread, in %."""
    spread = noise.has_spread(df)
    return float(np.median(((df.step_time_p90_ms - df.step_time_p10_ms) / df.step_time_ms)[spread]) * 100
                 ) if spread.any() else math.nan


@dataclass(frozen=True)
class RunCost:
    """What one sweep cost; seconds."""

    trials: int
    learning: int
    untimed: tuple[str, ...]      # trials with no start-up time found
    trial_s: float                # sum of startup_s + measure_s
    step_s: float                 # sum of steps.csv step_time_ms
    wall_s: float                 # command.txt's wall time (NaN without one)
    console_trials: float         # console.log's "in N Ray trial(s)" (NaN without one)

    def scaled(self, n: float) -> "RunCost":
        return replace(self, trials=int(self.trials * n), learning=int(self.learning * n), trial_s=self.trial_s * n,
                       step_s=self.step_s * n, wall_s=self.wall_s * n, console_trials=self.console_trials * n)


def log_startup_s(log: Path) -> float:
    """Ray + import (the worker line) + the trainer's data and model build (its model mark)."""
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    worker = next((m for line in lines if (m := WORKER.search(line))), None)
    model = next((m for line in lines if (m := MARK.search(line)) and m[2] == "model"), None)
    return float(worker[2]) + float(worker[3]) + float(model[3]) if worker and model else math.nan


def _wall_s(out_dir: Path) -> float:
    """The sweep's wall time: command.txt's, plus each command-*.txt's (a --resume that finished it)."""
    walls = [_number_in(p, r"wall time: ([\d.]+) s") for p in sorted(out_dir.glob("command*.txt"))]
    return sum(walls) if walls and all(map(is_finite, walls)) else math.nan


def _number_in(path: Path, pattern: str) -> float:
    match = re.search(pattern, path.read_text(errors="replace")) if path.is_file() else None
    return float(match[1]) if match else math.nan


def run_cost(out_dir: Path, df: pd.DataFrame, steps: pd.DataFrame | None) -> RunCost:
    own = (df.measured_by == df.trial_id) | ((df.measured_by == "") & (df.status != "pruned"))
    # Trials without a row of their own: the learning trials and the runoff (their rows' timed_by).
    ids = [v for c in ("stability_from", "timed_by") if c in df for v in df[c] if isinstance(v, str) and v]
    learning = sorted(set(ids) - set(df.trial_id))
    rows = df[own].set_index("trial_id")
    step_s = (steps.groupby("trial_id").step_time_ms.sum() / 1000.0) if steps is not None else pd.Series(dtype=float)
    total, untimed = 0.0, []
    for tid in [*rows.index, *learning]:
        startup = rows.startup_s.get(tid, math.nan)
        startup = startup if is_finite(startup) else log_startup_s(out_dir / "logs" / f"{tid}.log")
        measure = rows.measure_s.get(tid, math.nan)
        measure = measure if is_finite(measure) else step_s.get(tid, 0.0)
        if not is_finite(startup):
            untimed.append(tid)
        total += (startup if is_finite(startup) else 0.0) + measure
    return RunCost(trials=len(rows) + len(learning), learning=len(learning), untimed=tuple(untimed), trial_s=total,
                   step_s=float(step_s.sum()), wall_s=_wall_s(out_dir),
                   console_trials=_number_in(out_dir / "console.log", r"in (\d+) Ray trial\(s\)"))


def recommended(out_dir: Path) -> dict:
    path = out_dir / "recommendation.json"
    try:
        return (json.loads(path.read_text()).get("config") or {}) if path.is_file() else {}
    except ValueError as err:
        raise UserError(f"{path} is not valid JSON ({err}); run `dpo-sweep report {out_dir}` to rewrite it") from None


def space_differences(dirs: tuple[Path, Path]) -> str:
    """The space.yaml sections (search: its keys) the two runs differ in, besides name and beta."""
    if not all((d / "space.yaml").is_file() for d in dirs):
        return "not compared (a space.yaml is missing)"
    raw = [space_mod.load_raw(d / "space.yaml") for d in dirs]
    flat = [{**{k: v for k, v in r.items() if k not in ("name", "search")},
             **{f"search.{k}": v for k, v in (r.get("search") or {}).items() if k != "beta"}} for r in raw]
    differ = sorted(k for k in {*flat[0], *flat[1]} if flat[0].get(k) != flat[1].get(k))
    return f"differ in {', '.join(differ)}: not the same space" if differ else "the same besides name and beta"


def _listed(rows: pd.DataFrame, shown: list[str]) -> str:
    return ", ".join(f"mb {r.micro_batch} {r.checkpoint_level} ga {r.grad_acc}"
                     + "".join(f" {k} {r[k]}" for k in shown[3:]) for _, r in rows.iterrows()) or "-"


def verdict_lines(table: pd.DataFrame, shown: list[str], recs: tuple[dict, dict]) -> list[str]:
    has = {s: table[f"status_{s}"] != "absent" for s in SIDES}
    both, sp, sf = has["planned"] & has["full"], table.status_planned, table.status_full
    expected = (sp == "pruned") & (sf == "oom")
    peak, time = table[table.peak_same != "-"], table[table.step_time_same != "-"]
    on = {s: table[f"on_frontier_{s}"].fillna(False).astype(bool) for s in SIDES}
    rec_p, rec_f = recs
    mt = [k for k in dict.fromkeys((*shown, "seq_len", "num_workers", "model")) if k in rec_p and k in rec_f]
    same_mt = bool(rec_p and rec_f) and all(_cell(rec_p[k]) == _cell(rec_f[k]) for k in mt)
    same_beta = "beta" in rec_p and "beta" in rec_f and _cell(rec_p["beta"]) == _cell(rec_f["beta"])
    return [
        f"- configurations: {int(both.sum())} in both; only in planned: {_listed(table[~has['full']], shown)}; "
        f"only in full: {_listed(table[~has['planned']], shown)}",
        f"- status: same for {int((both & (sp == sf)).sum())}; pruned where the full grid ran out of memory "
        f"(the planner's purpose): {int((both & expected).sum())}; "
        f"other: {_listed(table[both & (sp != sf) & ~expected], shown)}",
        f"- peak memory within {PEAK_TOL_PCT:g}%: {int((peak.peak_same == 'yes').sum())} of {len(peak)}; "
        f"outside: {_listed(peak[peak.peak_same == 'no'], shown)}",
        f"- step time within {TIME_TOL_PCT:g}%: {int((time.step_time_same == 'yes').sum())} of {len(time)}; further "
        f"but within the p10-p90 noise: {int((time.step_time_same == 'noise').sum())}; outside both: "
        f"{_listed(time[time.step_time_same == 'no'], shown)}",
        f"- frontier: same ({int(on['planned'].sum())} configurations)" if (on["planned"] == on["full"]).all() else
        f"- frontier: differs; only planned's: {_listed(table[on['planned'] & ~on['full']], shown)}; "
        f"only full's: {_listed(table[on['full'] & ~on['planned']], shown)}",
        *(f"- recommended ({side}): " + (", ".join(f"{k} {v}" for k, v in rec.items()) or "none")
          for side, rec in zip(SIDES, recs)),
        f"- recommendation memory/time ({', '.join(mt) or '-'}): {'same' if same_mt else 'differs'}",
        f"- recommendation beta: {'same' if same_beta else 'differs'}",
    ]


def _ratio(a: float, b: float) -> float:
    return a / b if is_finite(a) and is_finite(b) and b > 0 else math.nan


def cost_lines(costs: tuple[RunCost, RunCost], multiplier: float) -> list[str]:
    def trials(c: RunCost) -> str:
        seen = f"; console.log: {fmt_float(c.console_trials, 0)}" if is_finite(c.console_trials) else ""
        untimed = f"; no start-up time: {', '.join(c.untimed)}" if c.untimed else ""
        return f"{c.trials} ({c.trials - c.learning} memory/time + {c.learning} learning or runoff{seen}{untimed})"

    what = [("Ray trials", "trials", 0), ("GPU time: trials' startup + measure (s)", "trial_s", 1),
            ("optimizer steps (steps.csv, s)", "step_s", 1), ("sweep wall time (command.txt, s)", "wall_s", 0)]
    rows = [[name, *(trials(c) if attr == "trials" else fmt_float(getattr(c, attr), digits) for c in costs),
             fmt_float(_ratio(getattr(costs[0], attr), getattr(costs[1], attr)), 3)] for name, attr, digits in what]
    tag = f"full x {multiplier:g} (a {multiplier:g}-beta full grid from this one)" if multiplier != 1 else "full"
    gpu = _ratio(costs[0].trial_s, costs[1].trial_s)
    goal = "-" if not is_finite(gpu) else ("met" if gpu < GOAL_RATIO else "missed")
    return [to_markdown(["", "planned", tag, "planned / full"], rows),
            f"- GPU time planned / full: {fmt_float(gpu, 3)} (goal < 1/3: {goal})"]


def render(table: pd.DataFrame, keys: list[str], dirs: tuple[Path, Path], spaces: str, recs: tuple[dict, dict],
           spreads: tuple[float, float], costs: tuple[RunCost, RunCost], multiplier: float) -> str:
    shown = [*CONFIG_COLUMNS[:3], *(k for k in keys[3:] if table[k].nunique(dropna=False) > 1)]

    def frontier(on, status: str) -> str:  # "-" for a configuration that never finished ok, as frontier.md
        return {True: "yes", False: "no"}.get(on, "-") if "ok" in status.split("/") else "-"

    header = [*shown, "status P", "status F", "peak P (GB)", "peak F (GB)", "peak diff %", "step P (ms)",
              "step F (ms)", "step diff %", "same step?", "tokens/s P", "tokens/s F", "frontier P", "frontier F"]
    rows = [[*(str(r[k]) for k in shown), r.status_planned, r.status_full, fmt_float(r.peak_mem_gb_planned, 2),
             fmt_float(r.peak_mem_gb_full, 2), fmt_float(r.peak_diff_pct, 1), fmt_float(r.step_time_ms_planned, 0),
             fmt_float(r.step_time_ms_full, 0), fmt_float(r.step_time_diff_pct, 1), r.step_time_same,
             fmt_sig(r.tokens_per_s_planned, 5), fmt_sig(r.tokens_per_s_full, 5),
             frontier(r.on_frontier_planned, r.status_planned), frontier(r.on_frontier_full, r.status_full)]
            for _, r in table.iterrows()]
    return "\n".join([
        "# Planned sweep vs --full-grid", "",
        f"P (planned): `{dirs[0]}`; F (full grid): `{dirs[1]}`; space.yaml: {spaces}. "
        f"One row per memory/time configuration ({', '.join(keys)}); `-`: no value (NaN, or absent). "
        "GB = 1e9 bytes; differences are (P - F) / F.", "",
        f"Thresholds: peaks the same within {PEAK_TOL_PCT:g}% (repeated runs of one configuration peak up to "
        f"1.6% apart); step times within {TIME_TOL_PCT:g}% (the median p10-p90 spread of a row's measured steps: "
        f"P {fmt_float(spreads[0], 1)}%, F {fmt_float(spreads[1], 1)}%), `noise` when further apart but their "
        "p10-p90 intervals overlap. Frontier: memory min, throughput max (the analyser's, p10-p90 ties kept); a "
        "configuration is on it when any of its rows is.", "",
        to_markdown(header, rows), "## Verdict", "", *verdict_lines(table, shown, recs), "",
        "## Cost", "", *cost_lines(costs, multiplier), ""])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("planned_dir", type=Path)
    p.add_argument("full_dir", type=Path)
    p.add_argument("--csv", type=Path, help="write the per-configuration table here")
    p.add_argument("--md", type=Path, help="write the printed markdown here")
    p.add_argument("--beta-multiplier", type=float, default=1.0,
                   help="scale the full grid's costs by N (a 1-beta full grid standing for an N-beta one)")
    args = p.parse_args(argv)
    dirs = (args.planned_dir, args.full_dir)
    try:
        if not args.beta_multiplier > 0:
            raise UserError(f"--beta-multiplier is {args.beta_multiplier:g}; use the number of betas, 1 or more")
        frames = tuple(load_results(d) for d in dirs)
        costs = tuple(run_cost(d, df, load_steps(d)) for d, df in zip(dirs, frames))
        recs = tuple(recommended(d) for d in dirs)
        spaces = space_differences(dirs)
    except UserError as err:
        print(err, file=sys.stderr)
        return 2
    keys = config_columns(*frames)
    table = compare(*frames, keys)
    md = render(table, keys, dirs, spaces, recs, tuple(step_spread_pct(df) for df in frames),
                (costs[0], costs[1].scaled(args.beta_multiplier)), args.beta_multiplier)
    print(md)
    if args.md:
        args.md.write_text(md)
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
