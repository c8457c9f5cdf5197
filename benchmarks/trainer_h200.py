#!/usr/bin/env python3
"""Our DPO trainer on one H200: step time, tokens/s and memory per named configuration, vs TRL.

    python3 benchmarks/trainer_h200.py [--configs 1b-mb8-none,8b-mb4-none] [--max-minutes 5]
        [--preset-scale h200|tiny] [--out-dir benchmarks/results/trainer_h200/new] [--render-only]

Each configuration (see ``h200_common.CONFIGS``, highest priority first) runs in a FRESH
``python3 -m dpo_sweep trial SPACE.yaml`` process, so its memory peak starts clean: a temporary
space file pins the model preset, micro_batch, checkpoint level, reference mode, liger on/off,
logp_chunk_tokens, bf16, sdpa, synthetic pairs of prompt 511 + BOS and response 511 + EOS (exactly
1024 tokens a sequence), 8 optimizer steps of which the first 3 are warm-up (left out of the
medians and of the peak), grad_acc 1, beta 0.1, lr 5e-6.

Each finished configuration is appended to ``OUT/trainer_h200.csv`` at once and the markdown
``OUT/trainer_h200.md`` is rewritten, so a run cut short still leaves its data. ``--max-minutes``
stops *starting* configurations when the budget is spent; each child also runs under ``timeout``.
The markdown shows the issue's TRL figures and, when ``OUT/trl_h200.csv`` exists (written by
``trl_dpo_h200.py``), TRL as measured on this machine.

``--preset-scale tiny`` swaps in the tiny-llama preset and 32-token sequences, fp32 (2 steps, 1
warm-up) so the whole script runs on a CPU in well under a minute: it tests the plumbing only.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import json
import math
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from h200_common import (  # noqa: E402
    CONFIGS,
    CONFIGS_BY_NAME,
    DEFAULT_RESULTS_DIR,
    GOALS,
    SCALES,
    TRL_REFERENCE,
    BenchConfig,
    Budget,
    Scale,
    append_row,
    base_row,
    child_env,
    child_failure,
    command_line,
    gpu_name,
    num,
    read_rows,
    run_with_timeout,
    select_configs,
    start_csv,
    to_gib,
)

CSV_NAME = "trainer_h200.csv"
MD_NAME = "trainer_h200.md"
RUN_META_NAME = "trainer_h200.run.json"
TRL_CSV_NAME = "trl_h200.csv"
TRL_META_NAME = "trl_h200.run.json"

#: Smallest wall time worth starting a config with (import + model build + 8 steps), seconds.
MIN_START_S = {"tiny-llama": 5, "llama-3.2-1b": 30, "llama-3-8b": 75}
#: Per-config hard limit (the child is killed past it), seconds.
DEFAULT_TIMEOUT_S = {"tiny-llama": 60, "llama-3.2-1b": 120, "llama-3-8b": 200}


# --- one configuration -----------------------------------------------------------------------

def space_yaml(cfg: BenchConfig, scale: Scale) -> str:
    """The one-trial space file of a configuration (the search dims pinned to one value each)."""
    return "\n".join([
        f"# benchmarks/trainer_h200.py: {cfg.name} ({scale.name} scale)",
        f"name: bench-{cfg.name}",
        f"model: {{preset: {scale.preset(cfg)}, attn_implementation: sdpa, "
        f"liger_kernel: {str(cfg.liger_kernel).lower()}, lean_ops: {str(cfg.lean_ops).lower()}}}",
        f"data: {{synthetic: {{pairs: {scale.pairs(cfg)}, prompt_tokens: {scale.prompt_tokens}, "
        f"response_tokens: {scale.response_tokens}, seed: 0}}}}",
        f"train: {{steps: {scale.steps}, warmup_steps: {scale.warmup_steps}, lr: 5.0e-6, "
        f"max_length: {scale.seq_len}, loss: sigmoid, precision: {scale.precision}, reference: {cfg.reference}, "
        f"logp_chunk_tokens: {cfg.logp_chunk_tokens}, seed: 0}}",
        "resources: {workers_per_trial: 1, use_gpu: auto}",
        f"search: {{micro_batch: [{cfg.micro_batch}], checkpoint_level: [{cfg.checkpoint_level}], "
        "grad_acc: [1], beta: [0.1]}",
        "",
    ])


def run_config(cfg: BenchConfig, scale: Scale, gpu: str, timeout_s: float, work: Path,
               logs_dir: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one configuration in a fresh process; return its CSV row (status set on failure)."""
    row = base_row(cfg, scale, "dpo-sweep", gpu)
    cdir = work / cfg.name
    cdir.mkdir(parents=True, exist_ok=True)
    space = cdir / "space.yaml"
    space.write_text(space_yaml(cfg, scale))
    out = cdir / "out"
    cmd = [sys.executable, "-m", "dpo_sweep", "trial", str(space), "--output", str(out)]
    proc = run_with_timeout(cmd, timeout_s, logs_dir / f"{cfg.name}.log", env=env or child_env())
    row["wall_s"] = round(proc.wall_s, 1)
    results = read_rows(out / "results.csv")
    if not results:
        row.update(child_failure(proc, timeout_s))
        return row
    for key, value in results[0].items():
        if key not in ("trial_id", "trainer"):  # the bench's own trainer label (dpo-sweep or TRL) stays
            row[key] = value
    peak_gb = num(row.get("peak_mem_gb"))
    row["peak_mem_gib"] = to_gib(peak_gb)
    step_peaks = [num(r.get("peak_mem_gb")) for r in read_rows(out / "steps.csv")]
    step_peaks = [p for p in step_peaks if math.isfinite(p)]
    row["peak_mem_all_steps_gb"] = max(step_peaks) if step_peaks else math.nan
    return row


# --- markdown (compute, then render) ---------------------------------------------------------

def _f(x: float, spec: str = ",.0f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


def _ratio(ours: float, theirs: float) -> float:
    return ours / theirs if math.isfinite(ours) and math.isfinite(theirs) and theirs > 0 else math.nan


def _goal_cell(name: str, mem_x: float, tok_x: float) -> str:
    if name not in GOALS:
        return ""
    max_mem, min_tok = GOALS[name]
    parts = []
    if max_mem is not None:
        ok = math.isfinite(mem_x) and mem_x <= max_mem
        parts.append(f"peak <= {max_mem:.2f}x: {'PASS' if ok else 'FAIL'}")
    if min_tok is not None:
        ok = math.isfinite(tok_x) and tok_x >= min_tok
        parts.append(f"tok/s >= {min_tok:.2f}x: {'PASS' if ok else 'FAIL'}")
    return "; ".join(parts)


def comparison_rows(ours: list[dict[str, str]], trl_measured: list[dict[str, str]]) -> list[dict[str, Any]]:
    """One plain dict per our row: our numbers, TRL's (reference and measured) and the ratios."""
    trl_by_name = {r["config"]: r for r in trl_measured}
    out = []
    for r in sorted(ours, key=lambda r: [c.name for c in CONFIGS].index(r["config"])
                    if r["config"] in CONFIGS_BY_NAME else 99):
        cfg = CONFIGS_BY_NAME.get(r["config"])
        peak_gb = num(r.get("peak_mem_gb"))
        tok = num(r.get("tokens_per_s"))
        ref = TRL_REFERENCE.get(cfg.trl_ref) if cfg and cfg.trl_ref else None
        meas = trl_by_name.get(cfg.trl_ref) if cfg and cfg.trl_ref else None
        meas_ok = meas is not None and meas.get("status") == "ok"
        mem_x_ref = _ratio(peak_gb, ref.peak_gb) if ref else math.nan
        tok_x_ref = _ratio(tok, ref.tokens_per_s) if ref else math.nan
        out.append({
            "config": r["config"], "status": r.get("status", ""), "error": r.get("error", ""),
            "step_ms": num(r.get("step_time_ms")), "tokens_per_s": tok, "peak_gb": peak_gb,
            "peak_gib": to_gib(peak_gb),
            "alloc_gb": num(r.get("torch_peak_alloc_gb")), "all_gb": num(r.get("peak_mem_all_steps_gb")),
            "trl_key": cfg.trl_ref if cfg else None,
            "ref": ref, "mem_x_ref": mem_x_ref, "tok_x_ref": tok_x_ref,
            "goal": _goal_cell(r["config"], mem_x_ref, tok_x_ref),
            "trl_measured": meas,
            "trl_measured_status": meas.get("status", "") if meas else "",
            "mem_x_meas": _ratio(peak_gb, num(meas.get("peak_mem_gb"))) if meas_ok else math.nan,
            "tok_x_meas": _ratio(tok, num(meas.get("tokens_per_s"))) if meas_ok else math.nan,
        })
        out[-1]["goal_meas"] = (_goal_cell(r["config"], out[-1]["mem_x_meas"], out[-1]["tok_x_meas"])
                                if meas_ok else "")
    return out


def lever_rows(ours: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Each config with a baseline of ours: what changing its one lever did."""
    by_name = {r["config"]: r for r in ours}
    out = []
    for cfg in CONFIGS:
        if cfg.baseline is None or cfg.name not in by_name or cfg.baseline not in by_name:
            continue
        a, b = by_name[cfg.name], by_name[cfg.baseline]
        if a.get("status") != "ok" or b.get("status") != "ok":
            continue
        pa, pb = num(a["peak_mem_gb"]), num(b["peak_mem_gb"])
        ta, tb = num(a["step_time_ms"]), num(b["step_time_ms"])
        aa, ab = num(a.get("torch_peak_alloc_gb")), num(b.get("torch_peak_alloc_gb"))
        out.append({
            "config": cfg.name, "lever": cfg.lever, "baseline": cfg.baseline,
            "d_peak_gb": pa - pb, "d_peak_pct": 100 * (pa / pb - 1) if pb else math.nan,
            "d_alloc_gb": aa - ab,
            "d_step_pct": 100 * (ta / tb - 1) if tb else math.nan,
            "d_tok_pct": 100 * (num(a["tokens_per_s"]) / num(b["tokens_per_s"]) - 1)
            if num(b["tokens_per_s"]) else math.nan,
        })
    return out


def render_markdown(ours: list[dict[str, str]], trl_measured: list[dict[str, str]],
                    meta: dict[str, Any], trl_meta: dict[str, Any] | None) -> str:
    rows = comparison_rows(ours, trl_measured)
    have_trl = bool(trl_measured)
    scale = SCALES.get(meta.get("scale", "h200"), SCALES["h200"])
    lines = [
        "# dpo-sweep trainer vs TRL DPOTrainer, one GPU",
        "",
        f"- GPU: **{meta.get('gpu', '?')}**; started {meta.get('started', '?')}; scale `{scale.name}`"
        + (" (**tiny: plumbing test, numbers mean nothing**)" if scale.tiny_model else ""),
        f"- Command: `{meta.get('command', '?')}`"
        + (f" (run by `{meta['entry']}`)" if meta.get("entry") else ""),
    ]
    if trl_meta:
        lines.append(f"- TRL measured with: `{trl_meta.get('command', '?')}` ({trl_meta.get('versions', '')})")
    lines += [
        f"- Every config: a fresh `python3 -m dpo_sweep trial` process; precision {scale.precision} "
        "(bf16: weights, grads and AdamW state bf16), reference live unless the name says so, sdpa, "
        f"sigmoid loss, beta 0.1, lr 5e-6, grad_acc 1; synthetic pairs, prompt {scale.prompt_tokens}+BOS and "
        f"response {scale.response_tokens}+EOS = {scale.seq_len} tokens a sequence; {scale.steps} optimizer "
        f"steps, the first {scale.warmup_steps} left out of the medians and of the peaks.",
        "- tokens/s counts policy tokens: 2 x seq_len x micro_batch per step / median step time.",
        "- NVML peak = device-used peak over the measured steps, shown in GiB (2^30 B, TRL's table) and "
        "GB (1e9 B, our results.csv); `whole-run` also counts warm-up (ours: the max of steps.csv's per-step "
        "peaks; TRL's: model build too); memory source of our rows: "
        + (", ".join(sorted({r.get("mem_source", "") or "?" for r in ours})) or "-")
        + ". torch peak alloc in GB. Ratios convert units first; "
        "`x TRL` < 1 is less memory, > 1 is more tokens/s.",
        "- `TRL ref` = the issue's table (trl 1.16.0, transformers 5.17, torch 2.11, one H200); lever rows "
        "are compared with the TRL row of their baseline shape. Goals are judged against `TRL ref`."
        + (" `TRL here` = `trl_dpo_h200.py` on this machine." if have_trl else
           " No trl_h200.csv yet: TRL measured here is not shown."),
        "",
        "| config | status | step ms | tokens/s | NVML peak GiB | NVML peak GB | torch alloc GB | "
        "whole-run NVML GB | TRL ref (ms / tok/s / GiB) | peak x TRL ref | tok/s x TRL ref | goal"
        + (" | TRL here (ms / tok/s / GiB) | peak x TRL here | tok/s x TRL here | goal vs TRL here |"
           if have_trl else " |"),
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---"
        + ("|---|---:|---:|---|" if have_trl else "|"),
    ]
    for r in rows:
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r['error'][:80]}"
        status = status.replace("|", "/")
        ref = r["ref"]
        ref_cell = (f"{r['trl_key']}: {ref.step_ms:,.0f} / {ref.tokens_per_s:,.0f} / {ref.peak_gib:.1f}"
                    if ref else "-")
        cells = [r["config"], status, _f(r["step_ms"]), _f(r["tokens_per_s"]), _f(r["peak_gib"], ".1f"),
                 _f(r["peak_gb"], ".1f"), _f(r["alloc_gb"], ".1f"), _f(r["all_gb"], ".1f"), ref_cell,
                 _f(r["mem_x_ref"], ".2f"), _f(r["tok_x_ref"], ".2f"), r["goal"]]
        if have_trl:
            m = r["trl_measured"]
            if m is None:
                cells += ["-", "-", "-", ""]
            elif m.get("status") != "ok":
                cells += [f"{r['trl_key']}: {m.get('status')}", "-", "-", ""]
            else:
                pg = num(m.get("peak_mem_gb"))
                cells += [f"{r['trl_key']}: {_f(num(m.get('step_time_ms')))} / {_f(num(m.get('tokens_per_s')))}"
                          f" / {_f(to_gib(pg), '.1f')}",
                          _f(r["mem_x_meas"], ".2f"), _f(r["tok_x_meas"], ".2f"), r["goal_meas"]]
        lines.append("| " + " | ".join(cells) + " |")

    levers = lever_rows(ours)
    lines += ["", "## Which lever bought what (each row changes one setting of its baseline)", ""]
    if levers:
        lines += [
            "| config | lever | baseline | NVML peak delta GB | peak delta % | torch alloc delta GB | "
            "step time delta % | tokens/s delta % |",
            "|---|---|---|---:|---:|---:|---:|---:|",
        ]
        for lv in levers:
            lines.append(f"| {lv['config']} | {lv['lever']} | {lv['baseline']} | {_f(lv['d_peak_gb'], '+.1f')} | "
                         f"{_f(lv['d_peak_pct'], '+.0f')} | {_f(lv['d_alloc_gb'], '+.1f')} | "
                         f"{_f(lv['d_step_pct'], '+.1f')} | {_f(lv['d_tok_pct'], '+.1f')} |")
        lines += ["", "Negative memory deltas are savings; for `naive-logps` the deltas are what giving up "
                  "the chunked log-prob head costs (so the chunking bought their negative)."]
    else:
        lines.append("(no pair of a config and its baseline both finished ok)")

    if have_trl:
        lines += ["", "## TRL measured here (trl_h200.csv)", "",
                  "| config | status | step ms | tokens/s | NVML peak GiB | NVML peak GB | torch alloc GB | "
                  "whole-run NVML GB | vs TRL ref: ms / tok/s / peak |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
        for m in trl_measured:
            pg = num(m.get("peak_mem_gb"))
            ref = TRL_REFERENCE.get(m["config"])
            tok = num(m.get("tokens_per_s"))
            vs = (f"{_f(_ratio(num(m.get('step_time_ms')), ref.step_ms), '.2f')} / "
                  f"{_f(_ratio(tok, ref.tokens_per_s), '.2f')} / {_f(_ratio(pg, ref.peak_gb), '.2f')}") if ref else "-"
            st = m.get("status", "") if m.get("status") == "ok" else f"{m.get('status')}: {m.get('error', '')[:80]}"
            lines.append(f"| {m['config']} | {st.replace('|', '/')} | {_f(num(m.get('step_time_ms')))} | {_f(tok)} | "
                         f"{_f(to_gib(pg), '.1f')} | {_f(pg, '.1f')} | "
                         f"{_f(num(m.get('torch_peak_alloc_gb')), '.1f')} | "
                         f"{_f(num(m.get('peak_mem_all_steps_gb')), '.1f')} | {vs} |")

    not_run = meta.get("not_run") or {}
    if not_run:
        lines += ["", "## Not run", ""] + [f"- {k}: {v}" for k, v in not_run.items()]
    return "\n".join(lines) + "\n"


def summary_text(out_dir: Path) -> str:
    """A compact plain-text table of both CSVs, for a terminal (the markdown has the detail)."""
    rows = comparison_rows(read_rows(out_dir / CSV_NAME), read_rows(out_dir / TRL_CSV_NAME))
    head = (f"{'config':<26}{'status':<9}{'step ms':>9}{'tok/s':>9}{'peak GiB':>10}{'peak GB':>9}"
            f"{'xTRLref mem':>12}{'xTRLref tok':>12}{'xTRLhere mem':>13}{'xTRLhere tok':>13}  goal")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['config']:<26}{r['status'][:8]:<9}{_f(r['step_ms']):>9}{_f(r['tokens_per_s']):>9}"
                     f"{_f(r['peak_gib'], '.1f'):>10}{_f(r['peak_gb'], '.1f'):>9}{_f(r['mem_x_ref'], '.2f'):>12}"
                     f"{_f(r['tok_x_ref'], '.2f'):>12}{_f(r['mem_x_meas'], '.2f'):>13}{_f(r['tok_x_meas'], '.2f'):>13}"
                     f"  {r['goal']}" + (f" | vs TRL here: {r['goal_meas']}" if r["goal_meas"] else "")
                     + ("" if r["status"] == "ok" else f"  [{r['error'][:100]}]"))
    for m in read_rows(out_dir / TRL_CSV_NAME):
        pg = num(m.get("peak_mem_gb"))
        gib = to_gib(pg)
        lines.append(f"TRL {m['config']:<22}{m.get('status', '')[:8]:<9}{_f(num(m.get('step_time_ms'))):>9}"
                     f"{_f(num(m.get('tokens_per_s'))):>9}{_f(gib, '.1f'):>10}"
                     f"{_f(pg, '.1f'):>9}" + ("" if m.get("status") == "ok" else f"  [{m.get('error', '')[:100]}]"))
    return "\n".join(lines)


def write_markdown(out_dir: Path) -> Path:
    meta_path = out_dir / RUN_META_NAME
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    trl_meta_path = out_dir / TRL_META_NAME
    trl_meta = json.loads(trl_meta_path.read_text()) if trl_meta_path.is_file() else None
    md = render_markdown(read_rows(out_dir / CSV_NAME), read_rows(out_dir / TRL_CSV_NAME), meta, trl_meta)
    path = out_dir / MD_NAME
    path.write_text(md)
    return path


# --- main ------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", help="comma-separated names (default: all, in priority order): "
                   + ", ".join(c.name for c in CONFIGS))
    p.add_argument("--max-minutes", type=float, default=None,
                   help="stop starting new configs after this many minutes (default: no limit)")
    p.add_argument("--preset-scale", choices=sorted(SCALES), default="h200",
                   help="h200: the real shapes, 1024 tokens, 8 steps; tiny: tiny-llama, 32 tokens (CPU plumbing test)")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    p.add_argument("--logs-dir", type=Path, default=None, help="keep each child's log here (default: a temp dir)")
    p.add_argument("--timeout-s", type=float, default=None, help="per-config hard limit (default: by model size)")
    p.add_argument("--append", action="store_true", help="append to an existing CSV instead of starting a new one")
    p.add_argument("--jobs", type=int, default=1, help="configs at once (tiny scale only: a GPU run must be serial)")
    p.add_argument("--render-only", action="store_true", help="only rewrite the markdown from the CSVs")
    p.add_argument("--summary", action="store_true", help="only print a compact table of the CSVs")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.render_only or args.summary:
        if args.render_only:
            print(f"wrote {write_markdown(out_dir)}")
        if args.summary:
            print(summary_text(out_dir))
        return 0
    scale = SCALES[args.preset_scale]
    if args.jobs > 1 and not scale.tiny_model:
        raise SystemExit("--jobs > 1 is for --preset-scale tiny only: concurrent GPU runs spoil each other's peaks")
    configs = select_configs(args.configs)
    budget = Budget(args.max_minutes)
    gpu = gpu_name()
    has_gpu = not gpu.startswith("no GPU")
    csv_path = out_dir / CSV_NAME
    start_csv(csv_path, args.append)
    meta: dict[str, Any] = {
        "command": command_line(argv),
        "gpu": gpu, "scale": scale.name, "started": dt.datetime.now().isoformat(timespec="seconds"),
        "not_run": {}, "entry": os.environ.get("H200_ENTRY", ""),
    }
    lock = threading.Lock()
    env = child_env()
    if args.jobs > 1:
        env["OMP_NUM_THREADS"] = "1"  # concurrent CPU children must not fight over the cores

    def save_meta() -> None:
        (out_dir / RUN_META_NAME).write_text(json.dumps(meta, indent=1))

    save_meta()
    print(f"GPU: {gpu}; {len(configs)} config(s); scale {scale.name}; budget "
          f"{'none' if args.max_minutes is None else f'{args.max_minutes:g} min'}", flush=True)
    tmp = tempfile.TemporaryDirectory(prefix="trainer_h200_")
    work = Path(tmp.name)
    logs_dir = args.logs_dir or work / "logs"

    def one(cfg: BenchConfig) -> None:
        preset = scale.preset(cfg)
        if cfg.liger_kernel is True and not has_gpu:
            with lock:
                meta["not_run"][cfg.name] = "liger_kernel needs a CUDA GPU (Triton kernels)"
                save_meta()
            return
        left = budget.remaining_s()
        if left < MIN_START_S[preset]:
            with lock:
                meta["not_run"][cfg.name] = f"time budget spent ({max(left, 0):.0f} s left < {MIN_START_S[preset]} s)"
                save_meta()
            print(f"[{cfg.name}] skipped: budget", flush=True)
            return
        timeout_s = min(args.timeout_s or DEFAULT_TIMEOUT_S[preset], left)
        print(f"[{cfg.name}] start (timeout {timeout_s:.0f} s, {left:.0f} s of budget left)", flush=True)
        row = run_config(cfg, scale, gpu, timeout_s, work, logs_dir, env)
        with lock:
            append_row(csv_path, row)
            write_markdown(out_dir)
        print(f"[{cfg.name}] {row.get('status')} in {row.get('wall_s')} s: step {_f(num(row.get('step_time_ms')))} ms, "
              f"{_f(num(row.get('tokens_per_s')))} tok/s, NVML peak {_f(num(row.get('peak_mem_gb')), '.2f')} GB"
              + (f" ({row.get('error')})" if row.get("status") != "ok" else ""), flush=True)

    try:
        if args.jobs > 1:
            with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
                list(pool.map(one, configs))
        else:
            for cfg in configs:
                one(cfg)
    finally:
        save_meta()
        md = write_markdown(out_dir)
        tmp.cleanup()
    print(f"wrote {csv_path} and {md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
