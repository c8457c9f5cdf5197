#!/usr/bin/env python3
"""Cost and accuracy of the memory sampler.

    python3 benchmarks/telemetry_overhead.py [--out DIR] [--steps 30] [--step-ms 50] [--interval-s 0.02 ...]

1. Overhead: a fixed workload of bf16 matmuls sized to ~--step-ms per "step" is timed with
   StepTimer, without a sampler and with one sampling every --interval-s (rounds alternate so
   clock or thermal drift hits both alike). Prints the median step ms of each and the overhead %,
   plus the cost of one reading and the share of each interval it takes (the duty cycle).
2. Accuracy: known tensor sizes are allocated; the sampler's peak is compared with
   torch reserved + the context baseline (NVML used before allocating minus torch reserved then),
   and a spike freed before peak_gb() is asked checks that the thread alone catches it.

Writes DIR/telemetry_overhead.csv (long format: section, case, metric, value, unit) and
DIR/environment.json. Default DIR: benchmarks/results/telemetry_overhead/new. Without CUDA it says so and runs the same
two measurements on the CPU with the RSS sampler and small sizes, to show the script works.
GB = 1e9 bytes.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # h200_common puts the checkout on sys.path too

from h200_common import bench_device, results_dir  # noqa: E402
from dpo_sweep.telemetry import StepTimer, make_memory_sampler, write_environment  # noqa: E402
from dpo_sweep.telemetry.timing import synchronize  # noqa: E402

GB = 1e9
WARMUP_STEPS = 3


def _matmul_workload(device: torch.device, target_step_ms: float):
    """A step function of repeated matmuls lasting about target_step_ms, and its repeat count."""
    if device.type == "cuda":
        size, dtype = 8192, torch.bfloat16
    else:
        size, dtype = 512, torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    synchronize(device)
    trials = 10
    t0 = time.perf_counter()
    for _ in range(trials):
        a @ b
    synchronize(device)
    per_matmul_ms = (time.perf_counter() - t0) * 1e3 / trials
    repeats = max(1, round(target_step_ms / per_matmul_ms))

    def step() -> None:
        for _ in range(repeats):
            a @ b

    return step, repeats, per_matmul_ms


def _time_steps(device: torch.device, step, n_steps: int) -> list[float]:
    timer = StepTimer(device, warmup_steps=WARMUP_STEPS)
    for _ in range(n_steps + WARMUP_STEPS):
        timer.start_step()
        step()
        timer.end_step()
    return timer.measured_ms()


def _reading_cost_us(device: torch.device, n: int = 2000) -> float:
    sampler = make_memory_sampler(device)
    t0 = time.perf_counter()
    for _ in range(n):
        sampler.sample_now()
    cost_us = (time.perf_counter() - t0) * 1e6 / n
    sampler.close()
    return cost_us


def measure_overhead(device, steps, step_ms, intervals_s, rounds) -> list[tuple]:
    step, repeats, per_matmul_ms = _matmul_workload(device, step_ms)
    print(f"\n## Overhead ({device}): {repeats} matmuls of {per_matmul_ms:.2f} ms per step, "
          f"{steps} measured steps x {rounds} rounds")
    rows: list[tuple] = []
    baseline_ms: list[float] = []
    with_sampler_ms: dict[float, list[float]] = {interval: [] for interval in intervals_s}
    source = "?"
    for _ in range(rounds):
        baseline_ms += _time_steps(device, step, steps)
        for interval in intervals_s:
            sampler = make_memory_sampler(device, interval_s=interval)
            source = sampler.source
            with sampler:
                with_sampler_ms[interval] += _time_steps(device, step, steps)
            sampler.close()

    base_median = statistics.median(baseline_ms)
    reading_us = _reading_cost_us(device)
    print(f"{'mode':<28} {'median step ms':>15} {'overhead %':>11} {'duty cycle %':>13}")
    print(f"{'no sampler':<28} {base_median:>15.3f} {'-':>11} {'-':>13}")
    rows += [("overhead", "no sampler", "median_step_ms", base_median, "ms"),
             ("overhead", "no sampler", "steps", len(baseline_ms), "count")]
    for interval, times in with_sampler_ms.items():
        median = statistics.median(times)
        overhead_pct = (median - base_median) / base_median * 100
        duty_pct = reading_us / (interval * 1e6) * 100
        case = f"{source} sampler @ {interval * 1e3:g} ms"
        print(f"{case:<28} {median:>15.3f} {overhead_pct:>+11.2f} {duty_pct:>13.3f}")
        rows += [("overhead", case, "median_step_ms", median, "ms"),
                 ("overhead", case, "overhead_pct", overhead_pct, "%"),
                 ("overhead", case, "reading_duty_cycle_pct", duty_pct, "%")]
    print(f"one {source} reading costs {reading_us:.1f} us (sampling thread's CPU time per wake-up)")
    rows.append(("overhead", f"{source} reading", "cost_per_reading_us", reading_us, "us"))
    return rows


def _allocate(device: torch.device, gb: float) -> torch.Tensor:
    if device.type == "cuda":
        return torch.empty(int(gb * GB), dtype=torch.uint8, device=device)  # cudaMalloc commits at once
    return torch.ones(int(gb * GB), dtype=torch.uint8)  # host pages count only once written


def _torch_reserved_gb(device: torch.device) -> float:
    return torch.cuda.memory_reserved(device) / GB if device.type == "cuda" else 0.0


def _release(device: torch.device) -> None:
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()


def measure_accuracy(device, sizes_gb, interval_s) -> list[tuple]:
    sampler = make_memory_sampler(device, interval_s=interval_s)
    expected_label = "torch reserved + context" if device.type == "cuda" else "baseline + buffer"
    print(f"\n## Accuracy ({sampler.source} sampler, {device}): peak vs {expected_label}, GB")
    header = (f"{'case':<22} {'baseline':>9} {'context':>8} {'reserved':>9} {'expected':>9} "
              f"{'peak':>9} {'peak-exp':>9} {'rise':>8}")
    print(header)
    rows: list[tuple] = []
    with sampler:
        for gb, spike in [(gb, False) for gb in sizes_gb] + [(sizes_gb[len(sizes_gb) // 2], True)]:
            _release(device)
            sampler.reset_peak()
            baseline_gb = sampler.sample_now()
            reserved0_gb = _torch_reserved_gb(device)
            context_gb = baseline_gb - reserved0_gb  # CUDA context and other non-torch memory
            tensor = _allocate(device, gb)
            synchronize(device)
            reserved_gb = _torch_reserved_gb(device)
            expected_gb = (reserved_gb + context_gb) if device.type == "cuda" else baseline_gb + gb
            if spike:  # let only the thread see it, then free before asking for the peak
                seen, deadline = sampler.samples_taken, time.monotonic() + 10.0
                while sampler.samples_taken < seen + 3 and time.monotonic() < deadline:
                    time.sleep(interval_s / 2)
                del tensor
                _release(device)
            peak_gb = sampler.peak_gb()
            case = f"{'spike ' if spike else ''}{gb:g} GB"
            print(f"{case:<22} {baseline_gb:>9.3f} {context_gb:>8.3f} {reserved_gb:>9.3f} "
                  f"{expected_gb:>9.3f} {peak_gb:>9.3f} {peak_gb - expected_gb:>+9.3f} "
                  f"{peak_gb - baseline_gb:>8.3f}")
            for metric, value in [("alloc_gb", gb), ("baseline_gb", baseline_gb),
                                  ("context_gb", context_gb), ("torch_reserved_gb", reserved_gb),
                                  ("expected_gb", expected_gb), ("sampler_peak_gb", peak_gb),
                                  ("peak_minus_expected_gb", peak_gb - expected_gb),
                                  ("peak_rise_gb", peak_gb - baseline_gb)]:
                rows.append(("accuracy", f"{sampler.source} {case}", metric, value, "GB"))
            if not spike:
                del tensor
    sampler.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=results_dir("telemetry_overhead"),
                        help="directory for telemetry_overhead.csv and environment.json")
    parser.add_argument("--steps", type=int, default=30, help="measured steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of with/without")
    parser.add_argument("--step-ms", type=float, default=50.0, help="target GPU time per step")
    parser.add_argument("--interval-s", type=float, nargs="+", default=[0.02],
                        help="sampler intervals to compare (default: the sampler's 0.02)")
    parser.add_argument("--sizes-gb", type=float, nargs="+", default=None,
                        help="allocation sizes (default 1 2 4 8 16 on GPU, 0.1 0.2 0.4 on CPU)")
    args = parser.parse_args(argv)

    device = bench_device()
    if device.type == "cuda":
        torch.zeros(1, device=device)  # the context exists before any baseline
        print(f"device: {torch.cuda.get_device_name(device)}")
        steps, rounds, step_ms = args.steps, args.rounds, args.step_ms
        sizes_gb = args.sizes_gb or [1.0, 2.0, 4.0, 8.0, 16.0]
    else:
        device = torch.device("cpu")
        print("no CUDA: running a small CPU version (RSS sampler) to show the script works; "
              "the numbers that matter come from a GPU")
        steps, rounds, step_ms = min(args.steps, 10), 1, min(args.step_ms, 20.0)
        sizes_gb = args.sizes_gb or [0.1, 0.2, 0.4]

    rows = measure_overhead(device, steps, step_ms, args.interval_s, rounds)
    rows += measure_accuracy(device, sizes_gb, args.interval_s[0])

    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "telemetry_overhead.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["section", "case", "metric", "value", "unit"])
        writer.writerows(rows)
    env_path = write_environment(args.out)
    print(f"\nwrote {csv_path} and {env_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
