"""benchmarks/full_grid_compare.py on hand-made results dirs (written by dpo_sweep.records' writers) and
on the committed H200 examples. No Ray: the script only reads files."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import full_grid_compare as fgc  # noqa: E402

from dpo_sweep.analysis.results import load_results, load_steps  # noqa: E402
from dpo_sweep.records import StepRecord, TrialResult, write_results, write_steps  # noqa: E402
from dpo_sweep.sweep.trial_run import startup_line  # noqa: E402

EXAMPLES = REPO / "reports" / "examples"
TOKENS_PER_MB = 4 * 128  # grad_acc 4 x 128 tokens


def row(tid: str, mb: int, beta: float = 0.1, status: str = "ok", peak: float = math.nan, step: float = math.nan,
        spread: tuple[float, float] = (0.98, 1.02), by: str | None = None, learning: str | None = None,
        source: str = "extrapolated", startup: float = math.nan, measure: float = math.nan) -> TrialResult:
    """One results row at grad_acc 4; tokens/s from the step time (a step moves mb x 512 tokens)."""
    ok = status == "ok"
    return TrialResult(
        trial_id=tid, status=status, model="tiny-llama", seq_len=128, micro_batch=mb, checkpoint_level="none",
        grad_acc=4, beta=beta, workers_per_trial=1, effective_batch=4 * mb, peak_mem_gb=peak,
        step_time_ms=step if ok else math.nan, step_time_p10_ms=step * spread[0] if ok else math.nan,
        step_time_p90_ms=step * spread[1] if ok else math.nan,
        tokens_per_s=mb * TOKENS_PER_MB / (step / 1000) if ok else math.nan, loss_std=0.01 if ok else math.nan,
        precision="fp32", reference="live", startup_s=startup, measure_s=measure,
        measured_by="" if status == "pruned" else (by or tid), step_time_source=source if ok else "",
        stability_from=(learning or tid) if ok else "")


def steps(tid: str, n: int, ms: float) -> list[StepRecord]:
    return [StepRecord(tid, s, 0.69, 1.0, ms, 1.0, 0.5, 0.1, -10.0, -11.0, 0.01) for s in range(1, n + 1)]


def write_log(out: Path, tid: str, ray_s: float, import_s: float, model_s: float) -> None:
    """Rank 0's log as a sweep writes it: the driver's worker line, then the trainer's model mark."""
    (out / "logs").mkdir(parents=True, exist_ok=True)
    (out / "logs" / f"{tid}.log").write_text(
        startup_line(tid, ray_s, import_s) + "\n"
        f"[{tid}] model tiny-llama: 1.0M params, fp32, attention sdpa, checkpoint none, reference live, "
        f"device cpu, 1 worker(s) [{model_s:.1f} s]\n")


def write_dir(out: Path, trials: list[TrialResult], step_rows: list[StepRecord], rec: dict, wall_s: int,
              console: str = "") -> Path:
    write_results(out, trials)
    write_steps(out, step_rows)
    (out / "recommendation.json").write_text(json.dumps({"trial_id": "x", "config": rec}))
    (out / "command.txt").write_text(f"command: dpo-sweep run space.yaml\nexit status: 0\nwall time: {wall_s} s\n")
    if console:
        (out / "console.log").write_text(console)
    return out


def planned_dir(tmp_path: Path, rec_beta: float = 0.1) -> Path:
    """2 betas x mb 1, 2, 4 measured once each (startup 1 s + measure 0.5 s), mb 8 pruned, one learning
    trial per beta (log: 0.3 + 0.2 + 0.5 s start-up; 4 steps of 250 ms)."""
    out = tmp_path / "planned"
    peaks, times = {1: 10.0, 2: 12.0, 4: 16.0}, {1: 100.0, 2: 150.0, 4: 250.0}
    trials, step_rows = [], []
    for beta in (0.1, 0.3):
        learning = f"p_mb4_b{beta}-learning"
        for mb in (1, 2, 4):
            first = f"p_mb{mb}_b0.1"
            own = beta == 0.1
            trials.append(row(f"p_mb{mb}_b{beta}", mb, beta, peak=peaks[mb], step=times[mb], by=first,
                              learning=learning, startup=1.0 if own else math.nan, measure=0.5 if own else math.nan))
        trials.append(row(f"p_mb8_b{beta}", 8, beta, status="pruned"))
        write_log(out, learning, 0.3, 0.2, 0.5)
        step_rows += steps(learning, 4, 250.0)
    step_rows += [s for mb in (1, 2, 4) for s in steps(f"p_mb{mb}_b0.1", 2, 100.0)]
    rec = {"micro_batch": 4, "checkpoint_level": "none", "grad_acc": 4, "beta": rec_beta}
    return write_dir(out, trials, step_rows, rec, wall_s=30,
                     console="sweep finished: 8 configuration(s) in 5 Ray trial(s), 0 skipped\n")


def full_dir(tmp_path: Path, mb2_step: float = 150.0, mb1: tuple[float, tuple[float, float]] = (103.0, (0.98, 1.02)),
             extra: bool = False, rec_mb: int = 4) -> Path:
    """1 beta, every configuration its own measured trial (startup 2 s + measure 4 s; 5 steps of 200 ms);
    mb 8 ran out of memory with no times recorded (its log: 1.0 + 0.5 + 1.5 s)."""
    out = tmp_path / "full"
    full = dict(source="measured", startup=2.0, measure=4.0)
    trials = [row("f_mb1", 1, peak=10.1, step=mb1[0], spread=mb1[1], **full),
              row("f_mb2", 2, peak=12.0, step=mb2_step, **full), row("f_mb4", 4, peak=16.2, step=250.0, **full),
              row("f_mb8", 8, status="oom", peak=24.0)]
    if extra:
        trials.append(row("f_mb16", 16, peak=30.0, step=800.0, **full))
    write_log(out, "f_mb8", 1.0, 0.5, 1.5)
    step_rows = [s for t in trials if t.status == "ok" and t.micro_batch < 16 for s in steps(t.trial_id, 5, 200.0)]
    rec = {"micro_batch": rec_mb, "checkpoint_level": "none", "grad_acc": 4, "beta": 0.1}
    return write_dir(out, trials, step_rows, rec, wall_s=70)


def run(tmp_path: Path, planned: Path, full: Path, *extra: str) -> tuple[str, pd.DataFrame, str]:
    csv, md = tmp_path / "out.csv", tmp_path / "out.md"
    assert fgc.main([str(planned), str(full), "--csv", str(csv), "--md", str(md), *extra]) == 0
    text = md.read_text()
    return text, pd.read_csv(csv), text.split("## Verdict")[0]


def line(text: str, start: str) -> str:
    found = [ln for ln in text.splitlines() if ln.startswith(start)]
    assert len(found) == 1, (start, text)
    return found[0]


def test_agreeing_runs(tmp_path, capsys):
    text, table, head = run(tmp_path, planned_dir(tmp_path), full_dir(tmp_path))
    assert capsys.readouterr().out.strip() == text.strip()
    assert line(text, "- configurations:") == "- configurations: 4 in both; only in planned: -; only in full: -"
    assert "pruned where the full grid ran out of memory (the planner's purpose): 1; other: -" in text
    assert line(text, "- peak memory within 2%:") == "- peak memory within 2%: 3 of 3; outside: -"
    assert line(text, "- step time within 5%:").startswith("- step time within 5%: 3 of 3;")
    assert line(text, "- frontier:") == "- frontier: same (3 configurations)"
    assert line(text, "- recommendation memory/time") == \
        "- recommendation memory/time (micro_batch, checkpoint_level, grad_acc): same"
    assert line(text, "- recommendation beta:") == "- recommendation beta: same"
    # GPU time: planned 3 x (1 + 0.5) + 2 learning x ((0.3 + 0.2 + 0.5) + 4 x 0.25) = 8.5 s;
    # full 3 x (2 + 4) + the OOM's 1.0 + 0.5 + 1.5 from its log = 21 s.
    assert line(text, "| GPU time:") == "| GPU time: trials' startup + measure (s) | 8.5 | 21.0 | 0.405 |"
    assert line(text, "| Ray trials |").startswith(
        "| Ray trials | 5 (3 memory/time + 2 learning or runoff; console.log: 5) | 4 (4 memory/time + 0 learning or runoff) |")
    assert line(text, "| optimizer steps") == "| optimizer steps (steps.csv, s) | 2.6 | 3.0 | 0.867 |"
    assert line(text, "| sweep wall time") == "| sweep wall time (command.txt, s) | 30 | 70 | 0.429 |"
    assert line(text, "- GPU time planned / full:") == "- GPU time planned / full: 0.405 (goal < 1/3: missed)"
    assert "peaks the same within 2%" in head and "step times within 5%" in head and "P 4.0%, F 4.0%" in head
    # NaN is "-": the OOM row has a peak (up to the OOM) but no step time, the pruned one nothing.
    assert line(head, "| 8 | none | 4 |") == "| 8 | none | 4 | pruned | oom | - | 24.00 |" + " - |" * 9
    by_mb = table.set_index("micro_batch")
    assert by_mb.loc[1, "peak_diff_pct"] == pytest.approx((10.0 - 10.1) / 10.1 * 100)
    assert by_mb.loc[1, "step_time_diff_pct"] == pytest.approx((100 - 103) / 103 * 100)
    assert list(by_mb.rows_planned) == [2, 2, 2, 2] and list(by_mb.rows_full) == [1, 1, 1, 1]
    assert by_mb.loc[8, ["status_planned", "status_full"]].tolist() == ["pruned", "oom"]
    assert math.isnan(by_mb.loc[8, "step_time_ms_full"]) and math.isnan(by_mb.loc[8, "peak_diff_pct"])
    assert by_mb.on_frontier_planned.tolist() == [True, True, True, False] == by_mb.on_frontier_full.tolist()


def test_beta_multiplier_scales_the_full_grid(tmp_path):
    text, _, _ = run(tmp_path, planned_dir(tmp_path), full_dir(tmp_path), "--beta-multiplier", "2")
    assert "| planned | full x 2 (a 2-beta full grid from this one) | planned / full |" in text
    assert line(text, "| GPU time:") == "| GPU time: trials' startup + measure (s) | 8.5 | 42.0 | 0.202 |"
    assert line(text, "- GPU time planned / full:") == "- GPU time planned / full: 0.202 (goal < 1/3: met)"


def test_differing_frontier_and_recommendation(tmp_path):
    # Full grid: mb 2 is 2x slower (dominated by mb 1), mb 1 10% slower but inside its wide p10-p90
    # spread, an mb 16 only it ran, and mb 1 recommended; the planned run recommends beta 0.3.
    full = full_dir(tmp_path, mb2_step=300.0, mb1=(110.0, (0.85, 1.15)), extra=True, rec_mb=1)
    text, table, _ = run(tmp_path, planned_dir(tmp_path, rec_beta=0.3), full)
    assert line(text, "- configurations:") == \
        "- configurations: 4 in both; only in planned: -; only in full: mb 16 none ga 4"
    assert line(text, "- frontier:") == \
        "- frontier: differs; only planned's: mb 2 none ga 4; only full's: mb 16 none ga 4"
    assert line(text, "- step time within 5%:") == ("- step time within 5%: 1 of 3; further but within the p10-p90 "
                                                   "noise: 1; outside both: mb 2 none ga 4")
    assert line(text, "- recommendation memory/time").endswith(": differs")
    assert line(text, "- recommendation beta:") == "- recommendation beta: differs"
    by_mb = table.set_index("micro_batch")
    assert by_mb.step_time_same.to_dict() == {1: "noise", 2: "no", 4: "yes", 8: "-", 16: "-"}
    assert by_mb.loc[16, "status_planned"] == "absent" and by_mb.loc[16, "on_frontier_full"]


def test_a_missing_dir_is_refused(tmp_path, capsys):
    assert fgc.main([str(tmp_path / "nowhere"), str(planned_dir(tmp_path))]) == 2
    assert "nowhere does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*") if (p / "console.log").is_file()))
def test_committed_examples_count_and_time_their_trials(name):
    """Against what the sweep itself recorded: the console's Ray trial count, and every trial's
    startup_s against the start-up its log gives (the learning trials' only source)."""
    out = EXAMPLES / name
    df = load_results(out)
    cost = fgc.run_cost(out, df, load_steps(out))
    if math.isfinite(cost.console_trials):  # absent when the sweep was stopped at a timeout
        assert cost.trials == cost.console_trials
    assert not cost.untimed
    own = df[(df.measured_by == df.trial_id) & df.startup_s.notna()]
    for r in own.itertuples():  # three 0.1 s roundings, and model build -> first step
        assert fgc.log_startup_s(out / "logs" / f"{r.trial_id}.log") == pytest.approx(r.startup_s, abs=0.2)


def test_the_committed_h200_comparison(tmp_path):
    """benchmarks/results/full_grid_compare/h200-llama-3.2-1b-betas/: the planned 1B sweep and its
    --full-grid; every Ray trial of the planned run counted (its runoff is named only in rows'
    timed_by, read as text)."""
    root = REPO / "benchmarks" / "results" / "full_grid_compare" / "h200-llama-3.2-1b-betas"
    text, table, _ = run(tmp_path, root / "llama-3.2-1b-h200-betas-planned", root / "llama-3.2-1b-h200-betas-full-grid")
    assert "- recommendation memory/time (micro_batch, checkpoint_level, grad_acc, seq_len, num_workers, model): same" in text
    assert "| Ray trials | 27 (25 memory/time + 2 learning or runoff; console.log: 27) |" in text
    assert "goal < 1/3: met" in text and "peak memory within 2%: 25 of 25" in text


def test_the_committed_h200_comparison_with_runoff_rounds(tmp_path):
    """The planned 1B sweep with the frontier's runoff rounds against the same full grid: the
    full grid's frontier and recommendation; and the 3-beta space's 50 rows (stopped at its
    timeout) against three of that full grid."""
    root = REPO / "benchmarks" / "results" / "full_grid_compare" / "h200-llama-3.2-1b-betas"
    full = root / "llama-3.2-1b-h200-betas-full-grid"
    text, _, _ = run(tmp_path, root / "llama-3.2-1b-h200-betas-planned-rounds", full)
    # Every row of both runs has 3 measured steps, read with noise.py's small-sample widening: the
    # planned rows' extrapolated intervals (4.5% median spread against the full grid's 1.8%) then
    # tie three of the full grid's points to leaner ones, which its runoff rounds (timed under the
    # narrower intervals) did not re-time.
    assert "- frontier: differs; only planned's: -; only full's: mb 2 full ga 32, mb 8 none ga 8, mb 16 full ga 4" in text
    assert "- recommendation memory/time (micro_batch, checkpoint_level, grad_acc, seq_len, num_workers, model): same" in text
    assert "| Ray trials | 31 (25 memory/time + 6 learning or runoff; console.log: 31) |" in text
    text, _, _ = run(tmp_path, root / "llama-3.2-1b-h200-betas-3beta-planned-partial", full, "--beta-multiplier", "3")
    assert "- frontier: differs; only planned's: -; only full's: mb 8 none ga 8" in text and "goal < 1/3: met" in text
    assert "- recommendation memory/time (micro_batch, checkpoint_level, grad_acc, seq_len, num_workers, model): same" in text
