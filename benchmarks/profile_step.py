"""Where a trial's step time goes: torch.profiler over measured steps of one configuration.

Usage (GPU machine, repository root):
    python3 benchmarks/profile_step.py search_spaces/llama-3.2-1b-h200.yaml --set micro_batch=8 \
        --set checkpoint_level=none --out DIR

Prints the top operators by device time and a coarse split (matmul, attention, elementwise/norm,
optimizer, copies, other) and writes DIR/profile_<label>.txt.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # h200_common puts the checkout on sys.path too

from h200_common import bench_device, results_dir  # noqa: E402

from dpo_sweep import space as space_mod  # noqa: E402
from dpo_sweep.train.loop import run_trial  # noqa: E402

#: Groups of aten operators (their self device time covers the kernels they launch; profiler
#: ranges such as ProfilerStep* and Triton kernels outside aten are counted as "other").
GROUPS = [
    ("matmul", r"^aten::(mm|addmm|bmm|matmul|linear)$"),
    ("attention", r"attention|flash|efficient"),
    ("optimizer", r"adam|foreach"),
    ("copy/cast", r"^aten::(copy_|_to_copy|cat|index|index_select|gather|scatter|contiguous)"),
    ("elementwise", r"^aten::"),
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("space")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--out", default=str(results_dir("profile_step")))
    ap.add_argument("--label", default="step")
    args = ap.parse_args()
    cfg = space_mod.load(args.space, args.overrides + ["train.steps=6", "train.warmup_steps=3"]).trials[0]
    cuda = bench_device().type == "cuda"
    acts = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    sched = torch.profiler.schedule(wait=3, warmup=1, active=2)
    with torch.profiler.profile(activities=acts, schedule=sched) as prof:
        out = run_trial(cfg, on_step=lambda _r: prof.step(), log=print)
    r = out.result
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=30, max_name_column_width=70)
    groups: dict[str, float] = defaultdict(float)
    total = 0.0
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0) or 0
        if not cuda:
            t = e.self_cpu_time_total
        name = e.key.lower()
        if t <= 0 or name.startswith("profilerstep") or name == "command buffer full":
            continue  # ranges and waits, not work
        total += t
        for g, pat in GROUPS:
            if re.search(pat, name):
                groups[g] += t
                break
        else:
            groups["other"] += t
    lines = [f"config: {cfg.knobs()} precision={cfg.train.precision} reference={cfg.train.reference} "
             f"lean_ops={cfg.model.lean_ops} liger={cfg.model.liger_kernel}",
             f"result: status={r.status} step_time_ms={r.step_time_ms:.1f} tokens/s={r.tokens_per_s:,.0f} "
             f"peak_mem_gb={r.peak_mem_gb:.2f} mfu={r.mfu:.3f}",
             f"device time over 2 profiled steps: {total / 1e3:.1f} ms"]
    lines += [f"  {g:12s} {t / 1e3:9.1f} ms  {100 * t / total:5.1f}%" for g, t in
              sorted(groups.items(), key=lambda kv: -kv[1])]
    text = "\n".join(lines) + "\n\n" + table
    print(text)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"profile_{args.label}.txt").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
