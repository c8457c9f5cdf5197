"""Multi-GPU trials on one host: DDP vs FSDP2, scaling, and the all-reduce per micro-step.

Each configuration runs in fresh processes under ``torch.distributed.run`` (one process per GPU,
NCCL; NVLink multicast stays off as the machine sets it), rank 0 appends a row to
``multi_gpu.csv`` and the script prints a table, ``multi_gpu.md`` beside it.

    python3 benchmarks/multi_gpu.py --out benchmarks/results/multi_gpu/new [--configs a,b] [--max-minutes 8]

Trials use the trainer's defaults (bf16, lean ops, liger auto, chunked log-probs, live
reference), 1024-token synthetic sequences, 8 steps with the first 3 left out of the medians.
``peak_mem_gb`` is the per-GPU NVML peak (max over the workers); ``tokens_per_s`` counts the
tokens of all workers. Scaling efficiency = tokens/s on N GPUs / (N x tokens/s on one GPU at the
same per-GPU micro-batch).
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # h200_common puts the checkout on sys.path too

from h200_common import REPO_ROOT as REPO, gpu_name, results_dir  # noqa: E402
SPACE = REPO / "search_spaces" / "llama-3.2-1b-h200.yaml"
COLUMNS = ["config", "gpus", "parallelism", "preset", "micro_batch", "grad_acc", "sync_every_micro_step",
           "status", "step_time_ms", "tokens_per_s", "peak_mem_gb", "torch_peak_alloc_gb", "mfu",
           "loss_mean", "wall_s", "error"]


@dataclass(frozen=True)
class MultiConfig:
    name: str
    gpus: int
    parallelism: str
    micro_batch: int
    grad_acc: int = 1
    sync_every_micro_step: bool = False
    preset: str = "llama-3.2-1b"


CONFIGS = (
    MultiConfig("1b-1gpu-mb8", 1, "ddp", 8),
    MultiConfig("1b-ddp2-mb8", 2, "ddp", 8),
    MultiConfig("1b-fsdp2-mb8", 2, "fsdp", 8),
    MultiConfig("1b-ddp2-mb4-ga4", 2, "ddp", 4, 4),
    MultiConfig("1b-ddp2-mb4-ga4-syncall", 2, "ddp", 4, 4, sync_every_micro_step=True),
    MultiConfig("8b-ddp2-mb4", 2, "ddp", 4, preset="llama-3-8b"),
    MultiConfig("8b-fsdp2-mb4", 2, "fsdp", 4, preset="llama-3-8b"),
    MultiConfig("8b-1gpu-mb4", 1, "ddp", 4, preset="llama-3-8b"),
)
STEPS, WARMUP = 8, 3


def overrides(c: MultiConfig) -> list[str]:
    pairs = c.micro_batch * c.grad_acc * c.gpus * STEPS
    return [f"model.preset={c.preset}", f"micro_batch={c.micro_batch}", f"grad_acc={c.grad_acc}",
            "checkpoint_level=none", f"resources.workers_per_trial={c.gpus}",
            f"resources.parallelism={c.parallelism}",
            f"resources.sync_every_micro_step={str(c.sync_every_micro_step).lower()}",
            f"data.synthetic.pairs={pairs}", f"train.steps={STEPS}", f"train.warmup_steps={WARMUP}"]


def worker(name: str, csv_path: Path) -> int:
    """One rank of one configuration (started by torch.distributed.run)."""
    import torch.distributed as dist

    from dpo_sweep import space as space_mod
    from dpo_sweep.train.loop import run_trial

    c = next(x for x in CONFIGS if x.name == name)
    dist.init_process_group("nccl")
    try:
        cfg = space_mod.load(SPACE, overrides(c)).trials[0]
        out = run_trial(cfg, log=print, catch_failures=False)
        if dist.get_rank() == 0:
            r = out.result
            append(csv_path, {**row_of(c), "status": r.status, "step_time_ms": r.step_time_ms,
                              "tokens_per_s": r.tokens_per_s, "peak_mem_gb": r.peak_mem_gb,
                              "torch_peak_alloc_gb": r.torch_peak_alloc_gb, "mfu": r.mfu,
                              "loss_mean": r.loss_mean, "error": r.error})
    finally:
        dist.destroy_process_group()
    return 0


def row_of(c: MultiConfig) -> dict:
    return {"config": c.name, "gpus": c.gpus, "parallelism": c.parallelism, "preset": c.preset,
            "micro_batch": c.micro_batch, "grad_acc": c.grad_acc,
            "sync_every_micro_step": c.sync_every_micro_step}


def append(path: Path, row: dict) -> None:
    new = not path.exists()
    with path.open("a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerow(row)


def render(rows: list[dict]) -> str:
    def f(x: str, spec: str = ",.0f") -> str:
        try:
            v = float(x)
        except (TypeError, ValueError):
            return "-"
        return "-" if not math.isfinite(v) else format(v, spec)

    single = {(r["preset"], r["micro_batch"]): float(r["tokens_per_s"]) for r in rows
              if r["gpus"] == "1" and r["status"] == "ok"}
    lines = ["| config | GPUs | parallelism | micro_batch | grad_acc | all-reduce | status | step ms | tokens/s "
             "| per-GPU NVML peak GB | torch alloc GB | scaling efficiency |",
             "|---|---:|---|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        base = single.get((r["preset"], r["micro_batch"]))
        eff = "-"
        if base and r["status"] == "ok" and r["gpus"] != "1":
            eff = f"{float(r['tokens_per_s']) / (int(r['gpus']) * base):.2f}"
        sync = "every micro-step" if r["sync_every_micro_step"] == "True" else "once per step"
        lines.append(f"| {r['config']} | {r['gpus']} | {r['parallelism']} | {r['micro_batch']} | {r['grad_acc']} "
                     f"| {sync} | {r['status']} | {f(r['step_time_ms'])} | {f(r['tokens_per_s'])} "
                     f"| {f(r['peak_mem_gb'], '.2f')} | {f(r['torch_peak_alloc_gb'], '.2f')} | {eff} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(results_dir("multi_gpu")))
    ap.add_argument("--configs", help="comma-separated names (default: all)")
    ap.add_argument("--max-minutes", type=float, default=8.0)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = Path(args.out)
    csv_path = out / "multi_gpu.csv"
    if args.worker:
        return worker(args.worker, csv_path)
    out.mkdir(parents=True, exist_ok=True)
    csv_path.unlink(missing_ok=True)
    import torch

    have = torch.cuda.device_count()
    wanted = set(args.configs.split(",")) if args.configs else None
    t_end = time.monotonic() + args.max_minutes * 60
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    for c in CONFIGS:
        if wanted and c.name not in wanted:
            continue
        left = t_end - time.monotonic()
        if c.gpus > have or left < 40:
            append(csv_path, {**row_of(c), "status": "not run",
                              "error": f"needs {c.gpus} GPUs, {have} here" if c.gpus > have else "time budget"})
            continue
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={c.gpus}",
               __file__, "--worker", c.name, "--out", str(out)]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=min(left, 240))
            text, code = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as err:
            text, code = str(err.stdout or "") + str(err.stderr or ""), "timeout"
        (out / f"multi_gpu_{c.name}.log").write_text(text[-20000:])
        if code != 0:
            status = "oom" if "OutOfMemoryError" in text else ("timeout" if code == "timeout" else "error")
            err_line = next((ln for ln in reversed(text.splitlines()) if "Error" in ln), f"exit {code}")
            append(csv_path, {**row_of(c), "status": status, "error": err_line[:300],
                              "wall_s": round(time.monotonic() - t0, 1)})
        print(f"[{c.name}] exit {code} in {time.monotonic() - t0:.0f} s", flush=True)
    from dpo_sweep.records import read_csv_rows

    rows = read_csv_rows(csv_path)
    table = render(rows)
    gpu = gpu_name()
    (out / "multi_gpu.md").write_text(
        f"# Multi-GPU trials ({have} x {gpu})\n\nCommand: `python3 benchmarks/multi_gpu.py --out {args.out}"
        f"{' --configs ' + args.configs if args.configs else ''}`\n\n{table}")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
