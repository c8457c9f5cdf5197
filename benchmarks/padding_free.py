"""Padding-free packing vs padded batches (and grouping by length) on long-tailed data.

Runs one trial per batching mode on the same lognormal synthetic pairs and prints peak memory
(worst case and typical), step time, tokens/s and the padding share; writes the table as CSV.
Each mode runs in a fresh process: on the CPU the peak is the process RSS high-water mark, which
one trial would otherwise hand on to the next (and on a GPU the allocator's cache).

CPU, tiny model (seconds):
    python3 benchmarks/padding_free.py --out benchmarks/results/padding_free/cpu-tiny
H200, Llama-3.2-1B shape (random weights, no download):
    python3 benchmarks/padding_free.py --preset llama-3.2-1b --precision bf16 --micro-batch 8 \\
        --max-length 2048 --prompt-tokens 256 --response-tokens 192 --pairs 512 --steps 8 \\
        --attn sdpa --out benchmarks/results/padding_free/h200-llama-3.2-1b
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # h200_common puts the checkout on sys.path too

from h200_common import results_dir  # noqa: E402

from dpo_sweep.config import DataSpec, ModelSpec, ResourcesSpec, TrainSpec, TrialConfig  # noqa: E402
from dpo_sweep.train.loop import run_trial  # noqa: E402

#: name -> the train fields that select it.
MODES = {
    "padded": {},
    "group_by_length": {"group_by_length": True},
    "padding_free": {"padding_free": True},
    "padding_free+group": {"padding_free": True, "group_by_length": True},
}
COLUMNS = ("mode", "status", "peak_mem_gb", "peak_mem_typical_gb", "step_time_ms", "tokens_per_s",
           "padding_frac", "mem_source", "attn_implementation", "error")


def trial_config(args: argparse.Namespace, mode: str) -> TrialConfig:
    data = DataSpec(synthetic={"pairs": args.pairs, "prompt_tokens": args.prompt_tokens,
                               "response_tokens": args.response_tokens, "lengths": "lognormal",
                               "sigma": args.sigma, "seed": 0})
    train = TrainSpec(steps=args.steps, warmup_steps=args.warmup_steps, lr=1e-5, max_length=args.max_length,
                      precision=args.precision, seed=0, **MODES[mode])
    return TrialConfig(space_name="padding_free_bench", trial_id=mode,
                       model=ModelSpec(preset=args.preset, attn_implementation=args.attn),
                       data=data, train=train, resources=ResourcesSpec(),
                       micro_batch=args.micro_batch, checkpoint_level=args.checkpoint_level)


def one_mode_row(argv: list[str], mode: str, out: Path) -> dict:
    """Run this script for ``mode`` alone in a fresh process; its CSV row (values as text)."""
    import subprocess

    cmd = [sys.executable, __file__, *_without_modes_and_out(argv), "--modes", mode, "--out", str(out)]
    subprocess.run(cmd, check=True)
    with (out / "padding_free.csv").open(newline="") as fh:
        row = next(csv.DictReader(fh))
    return {c: (row[c] if c in ("mode", "status", "mem_source", "attn_implementation", "error")
                else float(row[c])) for c in COLUMNS}


def _without_modes_and_out(argv: list[str]) -> list[str]:
    kept, skip = [], False
    for a in argv:
        if a in ("--modes", "--out"):
            skip = True
            continue
        if skip and not a.startswith("--"):
            continue
        skip = False
        kept.append(a)
    return kept


def table(rows: list[dict]) -> str:
    head = "| " + " | ".join(COLUMNS[:-1]) + " |\n|" + " --- |" * (len(COLUMNS) - 1)
    fmt = {"peak_mem_gb": "{:.3f}", "peak_mem_typical_gb": "{:.3f}", "step_time_ms": "{:.1f}",
           "tokens_per_s": "{:,.0f}", "padding_frac": "{:.1%}"}
    lines = ["| " + " | ".join(fmt.get(c, "{}").format(r[c]) for c in COLUMNS[:-1]) + " |" for r in rows]
    return "\n".join([head, *lines])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny-llama")
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "flash_attention_2", "eager", "auto"])
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--checkpoint-level", default="none")
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=48, help="median prompt length")
    ap.add_argument("--response-tokens", type=int, default=32, help="median response length")
    ap.add_argument("--sigma", type=float, default=0.8, help="lognormal spread of the lengths")
    ap.add_argument("--pairs", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup-steps", type=int, default=1)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--out", default=str(results_dir("padding_free")))
    args = ap.parse_args(argv)
    out = Path(args.out)
    if len(args.modes) == 1:
        mode = args.modes[0]
        r = run_trial(trial_config(args, mode), log=None).result
        rows = [{"mode": mode, **{c: getattr(r, c) for c in COLUMNS[1:]}}]
        print(f"{mode}: {r.status} peak {r.peak_mem_gb:.3f} GB, {r.tokens_per_s:,.0f} tokens/s", flush=True)
    else:
        rows = [one_mode_row(argv or sys.argv[1:], mode, out / mode) for mode in args.modes]
    print(table(rows))
    out.mkdir(parents=True, exist_ok=True)
    with (out / "padding_free.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out / 'padding_free.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
