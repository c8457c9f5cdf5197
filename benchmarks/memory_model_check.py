"""The planner's memory model against every committed H200 measurement (CPU only, seconds).

    python benchmarks/memory_model_check.py [--out benchmarks/results/memory_model_check/committed-h200-rows]

For each row of the committed results files below it builds the row's TrialConfig, predicts its
peak with :func:`dpo_sweep.plan.memory.predict_peak_gb` (a priori: nothing fitted to the row)
and prints predicted vs measured - the NVML peak (``peak_mem_gb``, which includes the CUDA
context) and torch's allocated peak - with the relative errors; the table is also written to
``OUT/memory_model_check.csv``. OOM rows are listed with the cap they ran under and whether the
prediction is over it. The measurements predate the per-step peak change: ``peak_mem_gb`` is the
peak over the measured steps.
"""
from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # h200_common puts the checkout on sys.path too

from h200_common import REPO_ROOT as ROOT, results_dir  # noqa: E402
from dpo_sweep.config import DataSpec, ModelSpec, ResourcesSpec, SyntheticData, TrainSpec, TrialConfig  # noqa: E402
from dpo_sweep.plan.calibrate import Measurement, calibrate, predicted  # noqa: E402
from dpo_sweep.plan.memory import predict_peak_gb  # noqa: E402
from dpo_sweep.plan.rules import memory_family  # noqa: E402


@dataclass(frozen=True)
class Source:
    """A committed results file and what its rows leave out."""

    path: str
    defaults: dict[str, str] = field(default_factory=dict)


_SWEEP_40GB = {"gpu_memory_gb": "40", "lean_ops": "True", "liger_kernel": "True"}
SOURCES = (
    Source("benchmarks/results/trainer_h200/vs-trl-first-run/trainer_h200.csv"),
    Source("benchmarks/results/trainer_h200/rerun-after-ray-polling/trainer_h200_rerun.csv"),
    # Predates lean ops and liger (its allocated peak equals trainer_h200's stock row to the byte).
    Source("benchmarks/results/h200_checks/first-trial-1b/results.csv", {"lean_ops": "False", "liger_kernel": "False"}),
    # An OOM row's lean_ops/liger_kernel are the record's defaults (False), not what ran: the space
    # ran with the config's defaults (on), so for rows that are not ok these defaults win.
    Source("benchmarks/results/sweep_overhead/h200-x2-fresh-train-workers/llama-3.2-1b-40gb-quick_results.csv", _SWEEP_40GB),
    # Two-GPU rows are shown but left out of the summary: the model of DDP buckets and FSDP
    # shards is rough (FSDP's all-gathered layers are not modelled).
    Source("benchmarks/results/multi_gpu/h200-x2-ddp-fsdp/multi_gpu.csv",
           {"seq_len": "1024", "checkpoint_level": "none", "lean_ops": "True", "liger_kernel": "True"}),
    Source("reports/examples/llama-3.2-1b-40gb-quick-2xh200/results.csv", _SWEEP_40GB),
)
COLUMNS = ["source", "row", "status", "gpus", "model", "micro_batch", "checkpoint_level", "grad_acc", "reference",
           "lean_ops", "liger_kernel", "logp_chunk_tokens", "measured_peak_gb", "predicted_peak_gb",
           "peak_rel_err", "calibrated_peak_gb", "calibrated_rel_err", "measured_alloc_gb", "predicted_alloc_gb", "alloc_rel_err", "peak_at", "cap_gb"]


def _flag(value: str) -> bool:
    return value.strip().lower() == "true"


def row_config(row: dict[str, str]) -> TrialConfig:
    """The TrialConfig a results row was measured with (1024-token synthetic pairs)."""
    seq_len = int(row["seq_len"])
    cap = row.get("gpu_memory_gb")
    return TrialConfig(
        trial_id=row.get("config") or row["trial_id"],
        model=ModelSpec(preset=row.get("preset") or row["model"], lean_ops=_flag(row["lean_ops"]),
                        liger_kernel=_flag(row["liger_kernel"])),
        data=DataSpec(synthetic=SyntheticData(prompt_tokens=seq_len // 2, response_tokens=seq_len // 2 - 1)),
        train=TrainSpec(max_length=seq_len, precision=row.get("precision") or "bf16",
                        reference=row.get("reference") or row.get("reference_mode") or "live",
                        logp_chunk_tokens=int(row.get("logp_chunk_tokens") or 1024)),
        resources=ResourcesSpec(gpu_memory_gb=float(cap) if cap else None, workers_per_trial=int(row.get("gpus", 1)),
                                parallelism=row.get("parallelism") or "ddp"),
        micro_batch=int(row["micro_batch"]), grad_acc=int(row["grad_acc"]),
        checkpoint_level=row["checkpoint_level"],
    )


def _rel(predicted: float, measured: float) -> float:
    return predicted / measured - 1 if measured and math.isfinite(measured) else math.nan


def check_row(source: Source, row: dict[str, str]) -> dict[str, object]:
    """One table row: the prediction next to the measurement."""
    given = {k: v for k, v in row.items() if v not in (None, "")}
    row = {**source.defaults, **given} if given["status"] == "ok" else {**given, **source.defaults}
    cfg = row_config(row)
    est = predict_peak_gb(cfg)
    measured = float(row["peak_mem_gb"]) if row["status"] == "ok" else math.nan
    alloc = float(row.get("torch_peak_alloc_gb") or "nan") if row["status"] == "ok" else math.nan
    predicted_alloc = est.total_gb - est.context_gb - est.allocator_gb
    return {
        "source": source.path, "row": cfg.trial_id, "status": row["status"],
        "gpus": cfg.resources.workers_per_trial, "model": cfg.model.label(),
        "micro_batch": cfg.micro_batch, "checkpoint_level": cfg.checkpoint_level, "grad_acc": cfg.grad_acc,
        "reference": cfg.train.reference, "lean_ops": cfg.model.lean_ops, "liger_kernel": cfg.model.liger_kernel,
        "logp_chunk_tokens": cfg.train.logp_chunk_tokens, "measured_peak_gb": measured,
        "predicted_peak_gb": est.total_gb, "peak_rel_err": _rel(est.total_gb, measured),
        "measured_alloc_gb": alloc, "predicted_alloc_gb": predicted_alloc,
        "alloc_rel_err": _rel(predicted_alloc, alloc), "peak_at": est.peak_at,
        "cap_gb": cfg.resources.gpu_memory_gb or "", "calibrated_peak_gb": math.nan,
        "calibrated_rel_err": math.nan, "_cfg": cfg,
    }


def add_calibrated(rows: list[dict[str, object]]) -> None:
    """Per file and memory family: calibrate on the first two measured rows (as a sweep would,
    once two trials are done) and predict the family's other measured rows."""
    by_family: dict[tuple, list[dict[str, object]]] = {}
    for r in rows:
        if r["status"] == "ok" and r["gpus"] == 1:
            by_family.setdefault((r["source"], memory_family(r["_cfg"])), []).append(r)
    for family in by_family.values():
        if len(family) < 3:
            continue
        fit = calibrate([Measurement(r["_cfg"], float(r["measured_peak_gb"])) for r in family[:2]])
        for r in family[2:]:
            r["calibrated_peak_gb"] = predicted(fit, r["_cfg"])
            r["calibrated_rel_err"] = _rel(float(r["calibrated_peak_gb"]), float(r["measured_peak_gb"]))


def check_all(root: Path = ROOT) -> list[dict[str, object]]:
    """Every row of every source (OOM and two-GPU rows included)."""
    out = []
    for source in SOURCES:
        with open(root / source.path, newline="") as fh:
            for row in csv.DictReader(fh):
                if row.get("trainer", "dpo-sweep") != "dpo-sweep":
                    continue
                out.append(check_row(source, row))
    add_calibrated(out)
    return out


def summary(rows: list[dict[str, object]]) -> dict[str, float]:
    """Error statistics over the ok single-GPU rows (relative errors of the NVML peak)."""
    errs = [float(r["peak_rel_err"]) for r in rows if r["status"] == "ok" and r["gpus"] == 1]
    cal = [float(r["calibrated_rel_err"]) for r in rows if math.isfinite(float(r["calibrated_rel_err"]))]
    return {"rows": len(errs), "max_abs_err": max(abs(e) for e in errs),
            "calibrated_rows": len(cal), "calibrated_max_abs_err": max((abs(e) for e in cal), default=math.nan),
            "median_abs_err": statistics.median(abs(e) for e in errs), "max_over": max(errs),
            "max_under": min(errs), "within_5pct": sum(abs(e) <= 0.05 for e in errs),
            "within_15pct": sum(abs(e) <= 0.15 for e in errs)}


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:+.1%}" if abs(v) < 1 and v != 0 else f"{v:.2f}"
    return str(v)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(results_dir("memory_model_check", "committed-h200-rows")))
    args = p.parse_args(argv)
    rows = check_all()
    shown = ["row", "status", "gpus", "micro_batch", "checkpoint_level", "grad_acc", "reference", "lean_ops",
             "logp_chunk_tokens", "measured_peak_gb", "predicted_peak_gb", "peak_rel_err", "calibrated_rel_err",
             "alloc_rel_err", "peak_at"]
    table = [[_fmt(r[c]) for c in shown] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(shown)]
    print("  ".join(c.ljust(w) for c, w in zip(shown, widths)))
    for t in table:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths)))
    for r in rows:
        if r["status"] == "oom":
            print(f"{r['row']} ({r['source']}): oom under a {r['cap_gb']} GB cap, predicted "
                  f"{float(r['predicted_peak_gb']):.1f} GB")
    s = summary(rows)
    print(f"{s['rows']} measured single-GPU rows: max |error| {s['max_abs_err']:.1%}, median {s['median_abs_err']:.1%}, "
          f"largest over-prediction {s['max_over']:+.1%}, largest under-prediction {s['max_under']:+.1%}; "
          f"{s['within_5pct']} within 5 %, {s['within_15pct']} within 15 %; calibrated on the first two rows of "
          f"their file and family: {s['calibrated_rows']} rows, max |error| {s['calibrated_max_abs_err']:.1%}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "memory_model_check.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out / 'memory_model_check.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
