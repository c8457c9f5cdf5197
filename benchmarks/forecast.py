"""Does the sweep's throughput hold over a real run? A sweep's chosen configurations, each run for
``--steps`` (30 or more) optimizer steps on the sweep's own data, against the tokens/s their sweep
rows say (the number the run forecast divides the data's tokens by).

    python benchmarks/user_case.py make --arch qwen2-3b --pairs 1500 --dir /tmp/case      # long-tailed chat pairs
    python benchmarks/user_case.py sweep --dir /tmp/case --out-dir /tmp/uc                # the sweep: /tmp/uc/sweep
    python benchmarks/forecast.py --sweep /tmp/uc/sweep --label qwen2-3b-1500 --steps 30  # on the H200
    python benchmarks/forecast.py --smoke --out-dir /tmp/fc                               # CPU, under a minute

The chosen configurations: the recommendation, its runner-up, then the fastest other ``ok`` rows
of distinct measurements, ``--configs`` in all (3 by default). Each is rebuilt from the sweep's
``space.yaml`` by its trial id, at its own grad_acc, and run in this process through the trainer's
``run_trial`` (one ``WarmState`` kept between them, as a warm worker does). Writes
``benchmarks/results/forecast_h200/<label>/forecast.csv``: ``config, sweep_tokens_per_s,
long_run_tokens_per_s, long_run_steps`` (the long run's median tokens/s over its measured steps:
the statistic the sweep row has), then ``ratio`` (long / sweep), the sweep row's throughput
interval (``dpo_sweep/core/noise.py``, widened for its few steps) and whether the long run is inside
it, the long run's mean tokens/s (all its measured tokens over their time) and where the sweep
row's time came from. ``--smoke`` builds a tiny case and a three-configuration sweep folder
(trials run in this process, then ``dpo-sweep report``'s analysis) and runs the same at 6 steps.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
for path in (REPO_ROOT, REPO_ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import user_case  # noqa: E402  (the case's folder and the in-process trial runner)

COLUMNS = ("config", "sweep_tokens_per_s", "long_run_tokens_per_s", "long_run_steps", "ratio",
           "sweep_low_tokens_per_s", "sweep_high_tokens_per_s", "inside_interval", "long_run_mean_tokens_per_s",
           "step_time_source", "status")


def chosen(sweep_dir: Path, n: int) -> list[str]:
    """Up to ``n`` trial ids of ``sweep_dir``: the recommendation, its runner-up, then the fastest
    other ok rows, one per measurement (rows that share one are the same run)."""
    import pandas as pd

    from dpo_sweep.analysis.results import load_results
    from dpo_sweep.results_dir import ResultsDir

    rec = json.loads(ResultsDir(sweep_dir).recommendation.read_text())
    picks = [t for t in (rec.get("trial_id"), (rec.get("runner_up") or {}).get("trial_id")) if t]
    df = load_results(sweep_dir)
    ok = df[df["status"] == "ok"].copy()
    ok["measurement"] = ok["measured_by"].where(ok["measured_by"].astype(str) != "", ok["trial_id"]) \
        if "measured_by" in ok else ok["trial_id"]
    seen = set(ok.loc[ok["trial_id"].isin(picks), "measurement"])
    for row in ok.sort_values("tokens_per_s", ascending=False).itertuples():
        if len(picks) >= n:
            break
        if row.measurement not in seen and not pd.isna(row.tokens_per_s):
            picks.append(row.trial_id)
            seen.add(row.measurement)
    return picks[:n]


def long_config(sweep_dir: Path, trial_id: str, steps: int):
    """``trial_id``'s configuration from the sweep's space.yaml, run for ``steps`` optimizer steps."""
    from dpo_sweep import space as space_mod
    from dpo_sweep.results_dir import ResultsDir

    trials = {t.trial_id: t for t in space_mod.load(ResultsDir(sweep_dir).space).trials}
    if trial_id not in trials:
        raise SystemExit(f"{trial_id} is not a configuration of {ResultsDir(sweep_dir).space}")
    cfg = trials[trial_id]
    train = cfg.train.model_copy(update={"steps": steps, "evaluate": False})
    return cfg.model_copy(update={"train": train, "trial_id": f"{trial_id}-long"})


def long_runs(sweep_dir: Path, steps: int, n: int, out_csv: Path) -> list[dict]:
    """Each chosen configuration's long run beside its sweep row; ``out_csv`` after each one."""
    import pandas as pd

    from dpo_sweep.core import noise
    from dpo_sweep.analysis.results import load_results

    df = load_results(sweep_dir)
    rows, warm = [], user_case.warm_state()
    for trial_id in chosen(sweep_dir, n):
        sweep_row = df[df["trial_id"] == trial_id].iloc[0]
        (low,), (high,) = noise.throughput_interval(pd.DataFrame([sweep_row]))
        out, _ = user_case.run(long_config(sweep_dir, trial_id, steps), warm)
        r = out.result
        measured = [s for s in out.steps if s.measured and not s.worst_case]
        tokens = sum(s.tokens_per_s * s.step_time_ms / 1e3 for s in measured)
        seconds = sum(s.step_time_ms / 1e3 for s in measured)
        long_tps = r.tokens_per_s if r.status == "ok" else math.nan
        sweep_tps = float(sweep_row["tokens_per_s"])
        rows.append({"config": trial_id, "sweep_tokens_per_s": sweep_tps, "long_run_tokens_per_s": long_tps,
                     "long_run_steps": r.measured_steps, "ratio": long_tps / sweep_tps,
                     "sweep_low_tokens_per_s": float(low), "sweep_high_tokens_per_s": float(high),
                     "inside_interval": bool(low <= long_tps <= high),
                     "long_run_mean_tokens_per_s": tokens / seconds if seconds > 0 else math.nan,
                     "step_time_source": str(sweep_row.get("step_time_source", "")), "status": r.status})
        user_case.write_csv(out_csv, rows)  # after each configuration: a cut-off run keeps its rows
    user_case.table(rows)
    ratios = [abs(r["ratio"] - 1) for r in rows if math.isfinite(r["ratio"])]
    if ratios:
        print(f"|long run / sweep - 1|: max {max(ratios):.1%} over {len(ratios)} configurations "
              f"(goal: within 5%); inside the sweep row's interval: {sum(r['inside_interval'] for r in rows)} of {len(rows)}")
    return rows


SMOKE_SPACE = """# benchmarks/forecast.py --smoke: a tiny case's three configurations
name: forecast-smoke
model: {{name_or_path: {ckpt}, dtype: float32}}
data: {{path: {pairs}}}
train: {{steps: 4, warmup_steps: 1, max_length: 128, precision: fp32, reference: precomputed, evaluate: false}}
resources: {{workers_per_trial: 1, use_gpu: false}}
search:
  micro_batch: {micro_batches}
  checkpoint_level: [none]
  effective_batch: [4]
  beta: [0.1]
"""


def smoke_sweep(work: Path, micro_batches: tuple[int, ...] = (1, 2, 4), pairs: int = 48) -> Path:
    """A tiny long-tailed case and a sweep folder of its configurations at effective batch 4
    (results.csv, steps.csv, space.yaml, data.json, recommendation.json), its trials run in this
    process."""
    from dpo_sweep import preflight, records, space as space_mod
    from dpo_sweep.commands.report import analyse_dir
    from dpo_sweep.results_dir import ResultsDir
    from dpo_sweep.core.lengths import write_data_json

    case = work / "case"
    user_case.make("tiny-qwen2", pairs, case, prompt_words=20, reply_words=15)
    sweep_dir = work / "sweep"
    sweep_dir.mkdir(parents=True, exist_ok=True)
    space_file = ResultsDir(sweep_dir).space
    space_file.write_text(SMOKE_SPACE.format(ckpt=case / "ckpt", pairs=case / "pairs.jsonl",
                                             micro_batches=list(micro_batches)))
    trials = space_mod.load(space_file).trials
    write_data_json(sweep_dir, [s.shape for s in preflight.check_inputs(trials) if s.shape is not None])
    warm, results, steps = user_case.warm_state(), [], []
    for cfg in trials:
        out, _ = user_case.run(cfg, warm)
        results.append(out.result)
        steps += out.steps
    records.write_results(sweep_dir, results)
    records.write_steps(sweep_dir, steps)
    analyse_dir(sweep_dir)
    return sweep_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", type=Path, help="a finished sweep's results folder (space.yaml, results.csv, recommendation.json)")
    ap.add_argument("--label", help="the run's name: its folder under --out-dir")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps of each long run (at least 30 for the proof)")
    ap.add_argument("--configs", type=int, default=3, help="configurations to run long")
    ap.add_argument("--out-dir", type=Path, default=REPO_ROOT / "benchmarks" / "results" / "forecast_h200")
    ap.add_argument("--smoke", action="store_true", help="CPU: a tiny case, its sweep and 6-step runs")
    args = ap.parse_args(argv)
    if args.smoke:
        with tempfile.TemporaryDirectory() as tmp:
            long_runs(smoke_sweep(Path(tmp)), 6, args.configs, args.out_dir / (args.label or "smoke") / "forecast.csv")
        return 0
    if args.sweep is None or not args.label:
        ap.error("give --sweep DIR and --label NAME (or --smoke)")
    if args.steps < 30:
        print(f"note: {args.steps} steps; the proof asks for at least 30", file=sys.stderr)
    long_runs(args.sweep, args.steps, args.configs, args.out_dir / args.label / "forecast.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
