"""``dpo-sweep trial``: one configuration, in this process, without Ray."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from dpo_sweep import preflight
from dpo_sweep import space as space_mod
from dpo_sweep.records import write_results, write_steps
from dpo_sweep.results_dir import ResultsDir


def cmd_trial(args: argparse.Namespace) -> int:
    sp = space_mod.load(args.space, args.overrides)
    cfg = sp.trials[0]
    out = Path(args.output or f"reports/{sp.name}-trial")
    preflight.check_trial(cfg, out)  # before the training, so that its result cannot be lost
    knobs = ", ".join(f"{k}={v}" for k, v in {**cfg.knobs(), **cfg.swept_columns()}.items())
    print(f"trial {cfg.trial_id}: {knobs}", flush=True)

    from dpo_sweep.train.loop import run_trial

    outcome = run_trial(cfg, log=lambda m: print(m, flush=True))
    write_results(out, [outcome.result])
    write_steps(out, outcome.steps)
    r = outcome.result
    if r.status == "ok":
        print(f"done: peak memory {r.peak_mem_gb:.3f} GB ({r.mem_source}), step time {r.step_time_ms:.0f} ms "
              f"(median of {r.measured_steps}), {r.tokens_per_s:,.0f} tokens/s, loss std "
              f"{r.loss_std:.4g}" + ("" if math.isnan(r.mfu) else f", MFU {r.mfu:.1%}"))
        print(f"stability: {r.stability or 'no verdict (fewer than 5 steps)'} (loss slope {r.loss_slope:+.4g}/step, "
              f"spread {r.loss_spread:.4g}, grad-norm spike {r.grad_norm_spike:.3g}x, log-ratio std max "
              f"{r.logratio_std_max:.3g}" + (f", rollback trigger at step {r.rollback_step}" if r.rollback_step else "")
              + f"), eval_loss {r.eval_loss:.4g}")
    else:
        print(f"done: status {r.status}: {r.error}", file=sys.stderr)
    print(f"wrote {ResultsDir(out).results} and {ResultsDir(out).steps}")
    return 0 if r.status in ("ok", "oom", "diverged") else 1
