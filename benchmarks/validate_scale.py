#!/usr/bin/env python3
"""``dpo-sweep validate`` on spaces of many configurations: wall time and peak memory.

    python3 benchmarks/validate_scale.py [--sizes 1000 10000 100000] [--repeats 3] [--label NAME]

Each size is a space over the tiny-llama preset and 4,096 synthetic pairs whose grid is the
product micro_batch (5) x checkpoint_level (5) x grad_acc (10) x beta (25 at most) x lr (as many
as the size needs): the shape a user's "try everything" file takes. Each is validated in a
process of its own, as a user runs it (``python -m dpo_sweep validate SPACE``, stdout to a file);
the table gives the median wall time over ``--repeats`` runs, the largest peak RSS (the
process's ru_maxrss) and the lines printed. Writes
benchmarks/results/validate_scale/<label>/results.csv and the spaces beside it (not the tables). CPU only: no GPU
is asked (validate runs nothing).
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
KNOBS = {"micro_batch": [1, 2, 4, 8, 16], "checkpoint_level": ["none", "L1", "L2", "L3", "full"],
         "grad_acc": list(range(1, 11))}


def space(size: int) -> dict:
    """A space of exactly ``size`` configurations (a multiple of 250, or fewer than 250 betas)."""
    base = 5 * 5 * 10
    if size % base:
        raise SystemExit(f"--sizes: {size} is not a multiple of {base} (micro_batch x level x grad_acc)")
    rest = size // base
    betas = next(b for b in range(min(25, rest), 0, -1) if rest % b == 0)
    lrs = rest // betas
    return {
        "name": f"validate-{size}",
        "model": {"preset": "tiny-llama"},
        "data": {"synthetic": {"pairs": 4096, "prompt_tokens": 48, "response_tokens": 48}},
        "train": {"steps": 6, "warmup_steps": 2, "max_length": 128, "precision": "fp32", "seed": 0},
        "resources": {"use_gpu": False},
        "search": {**KNOBS, "beta": [round(0.02 * (i + 1), 2) for i in range(betas)],
                   "lr": [round(1e-5 * (i + 1), 7) for i in range(lrs)]},
    }


def validate_once(path: Path, out: Path) -> tuple[float, float, int, int]:
    """(wall s, peak RSS GB, exit code, stdout lines) of one ``validate`` in its own process."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.monotonic()
    with out.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "dpo_sweep", "validate", str(path)], stdout=fh,
                                stderr=subprocess.DEVNULL, env=env, cwd=REPO)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = sum(1 for _ in out.open())
    return wall, usage.ru_maxrss / 1e6, proc.returncode, lines  # ru_maxrss: KiB on Linux


def run(sizes: list[int], repeats: int, folder: Path) -> list[dict]:
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in sizes:
        path = folder / f"space-{size}.yaml"
        path.write_text(yaml.safe_dump(space(size), sort_keys=False))
        with tempfile.TemporaryDirectory() as tmp:  # the table: 100,000 lines, not kept
            runs = [validate_once(path, Path(tmp) / "stdout.txt") for _ in range(repeats)]
        if any(rc != 0 for _, _, rc, _ in runs):
            raise SystemExit(f"validate {path} exited {[rc for _, _, rc, _ in runs]}; run it to see why")
        rows.append({"configurations": size, "repeats": repeats,
                     "median_wall_s": round(statistics.median(w for w, *_ in runs), 2),
                     "max_wall_s": round(max(w for w, *_ in runs), 2),
                     "peak_rss_gb": round(max(r for _, r, *_ in runs), 3), "stdout_lines": runs[0][3]})
        print(f"{size:>12,}  median {rows[-1]['median_wall_s']:>7.2f} s  peak RSS {rows[-1]['peak_rss_gb']:.2f} GB",
              flush=True)
    with (folder / "results.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--label", default="new", help="results go to benchmarks/results/validate_scale/LABEL/")
    ap.add_argument("--out", type=Path, default=None, help="the folder instead (tests)")
    args = ap.parse_args(argv)
    folder = args.out or REPO / "benchmarks" / "results" / "validate_scale" / args.label
    rows = run(args.sizes, args.repeats, folder)
    print(f"\n{'configurations':>14}  {'median s':>9}  {'max s':>7}  {'peak RSS GB':>11}  {'lines':>7}")
    for r in rows:
        print(f"{r['configurations']:>14,}  {r['median_wall_s']:>9.2f}  {r['max_wall_s']:>7.2f}  "
              f"{r['peak_rss_gb']:>11.3f}  {r['stdout_lines']:>7,}")
    print(f"\nwrote {folder / 'results.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
