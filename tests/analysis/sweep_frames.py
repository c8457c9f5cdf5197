"""Hand-made results for the analysis and report tests (imported by both test folders)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from dpo_sweep.analysis.results import load_results
from dpo_sweep.records import StepRecord, TrialResult, write_results, write_steps

HOSTILE = "<script>alert(1)</script>"


def trial(trial_id: str, mem: float = math.nan, time_ms: float = math.nan, std: float = math.nan,
          tps: float | None = None, status: str = "ok", mb: int = 1, level: str = "none", ga: int = 1,
          beta: float = 0.1, model: str = "tiny-llama", error: str = "", seed: int | str | None = None
          ) -> TrialResult:
    """One results row; tokens/s defaults to 1e6 / step time (so faster steps = more throughput).

    ``seed``: a swept ``seed`` column, by default the trial id, so that hand-made rows are
    different learning set-ups (analysis/noise_floor.py pools the loss std of the same maths);
    rows given one seed (and equal effective batch, beta, ...) are the same maths."""
    if tps is None:
        tps = 1e6 / time_ms if math.isfinite(time_ms) and time_ms > 0 else math.nan
    return TrialResult(trial_id=trial_id, status=status, model=model, seq_len=128, micro_batch=mb,
                       checkpoint_level=level, grad_acc=ga, beta=beta, workers_per_trial=1,
                       effective_batch=mb * ga, peak_mem_gb=mem, step_time_ms=time_ms,
                       tokens_per_s=tps, loss_std=std, error=error,
                       extra={"seed": trial_id if seed is None else seed})


def write_dir(out_dir: Path, trials: Iterable[TrialResult], steps: Iterable[StepRecord] = (),
              env: dict[str, Any] | None = None) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_results(out_dir, trials)
    steps = list(steps)
    if steps:
        write_steps(out_dir, steps)
    if env is not None:
        (out_dir / "environment.json").write_text(json.dumps(env))
    return out_dir


def frame(tmp_path: Path, trials: Iterable[TrialResult]) -> pd.DataFrame:
    """Trials written as results.csv and loaded back: the frame the analyser really sees."""
    return load_results(write_dir(tmp_path / "frame", trials))


def steps_for(trial_id: str, n: int, mem: float, loss0: float = 0.69) -> list[StepRecord]:
    return [StepRecord(trial_id, s, loss0 - 0.01 * s, 1.0, 100.0, mem, 0.5, 0.1, -10.0, -11.0, 0.01,
                       logratio_std=0.2 + 0.01 * s) for s in range(n)]


def sweep_trials(model: str = "tiny-llama") -> list[TrialResult]:
    """A small 3x3x2 sweep with two OOMs, one diverged and one error row."""
    out = []
    i = 0
    for mb in (2, 4, 8):
        for level, mem_scale, time_scale in (("none", 1.0, 1.0), ("L1", 0.75, 1.2), ("L2", 0.55, 1.35)):
            for ga in (1, 2):
                i += 1
                mem = 4.0 + mb * 3.0 * mem_scale
                if mem > 27:
                    out.append(trial(f"t{i:02d}", status="oom", mb=mb, level=level, ga=ga, model=model,
                                     error="CUDA out of memory"))
                    continue
                time_ms = 50.0 * mb * ga * time_scale
                out.append(trial(f"t{i:02d}", mem, time_ms, 0.02 + 0.001 * (i % 5),
                                 tps=mb * ga * 256 * 1000 / time_ms, mb=mb, level=level, ga=ga, model=model))
    out.append(trial("t90", 9.0, 80.0, 3.0, status="diverged", mb=4, level="L1", ga=1, model=model))
    out.append(trial("t91", status="error", mb=4, level="L3", ga=1, model=model, error="worker died"))
    return out
