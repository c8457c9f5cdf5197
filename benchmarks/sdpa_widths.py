"""sdpa's forward + backward on a padded bf16 batch (a boolean mask, as transformers passes it
with padding) at a row width the process has not run yet against the same width again, with
every backend allowed and with cuDNN attention left out; and which kernel ran. What
``train.pad_to_multiple_of`` is for: a backend that builds a plan per shape pays it at every new
width, and long-tailed lengths at micro_batch 1 give nearly every micro-step a new width.

    python benchmarks/sdpa_widths.py --out-dir D      # CUDA only; prints a table, writes D/sdpa_widths.csv
"""
from __future__ import annotations

import argparse
import csv
import random
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

#: The backends each run may choose from.
CHOICES = {
    "all": [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
    "no-cudnn": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
}


def inputs(width: int, rows: int, heads: int, head_dim: int):
    q, k, v = (torch.randn(rows, heads, width, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    mask = torch.ones(width, width, dtype=torch.bool, device="cuda").tril().expand(rows, 1, width, width).clone()
    mask[0, :, :, width - width // 5:] = False  # the first row is padded: a fifth of it
    return q, k, v, mask


def call_ms(q, k, v, mask) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) * 1e3


def kernels(choice: str, width: int, rows: int, heads: int, head_dim: int) -> str:
    """The attention kernels one call of ``choice`` ran (a profiler's CUDA kernel names)."""
    args = inputs(width, rows, heads, head_dim)
    with sdpa_kernel(CHOICES[choice]), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call_ms(*args)
    names = {e.key for e in prof.key_averages()}
    picked = sorted(n for n in names if any(s in n.lower() for s in ("cudnn", "fmha", "flash", "efficient", "attention")))
    return "; ".join(n[:80] for n in picked[:4])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=Path("benchmarks/results/sdpa_widths"))
    ap.add_argument("--widths", type=int, default=16, help="new widths per backend choice")
    ap.add_argument("--rows", type=int, default=2, help="rows (sequences) per batch: 2 = one pair at micro_batch 1")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args(argv)
    rng = random.Random(0)
    rows = []
    for choice in CHOICES:
        with sdpa_kernel(CHOICES[choice]):
            call_ms(*inputs(2048, args.rows, args.heads, args.head_dim))  # the process's first call, left out
            # widths no earlier choice used (odd ones: no multiple of 64 or 2048)
            for width in (2 * rng.randrange(250, 1000) + 1 for _ in range(args.widths)):
                for seen in ("new", "again"):
                    ms = call_ms(*inputs(width, args.rows, args.heads, args.head_dim))
                    rows.append({"backends": choice, "width": width, "call": seen, "ms": round(ms, 3)})
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with (args.out_dir / "sdpa_widths.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; "
          f"rows {args.rows}, heads {args.heads}, head_dim {args.head_dim}, bf16, boolean mask")
    print("| backends | kernels | new width: median ms | same width again: median ms |")
    print("| --- | --- | --- | --- |")
    for choice in CHOICES:
        med = {seen: statistics.median(r["ms"] for r in rows if r["backends"] == choice and r["call"] == seen)
               for seen in ("new", "again")}
        print(f"| {choice} | {kernels(choice, 1001, args.rows, args.heads, args.head_dim)} | {med['new']:.1f} | "
              f"{med['again']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
