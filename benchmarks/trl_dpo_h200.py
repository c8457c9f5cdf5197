#!/usr/bin/env python3
"""TRL's DPOTrainer on the same configurations as ``trainer_h200.py``, measured the same way.

    python3 benchmarks/trl_dpo_h200.py [--configs 1b-mb8-none,...] [--max-minutes 3]
        [--preset-scale h200|tiny] [--out-dir benchmarks/results/trainer_h200/new]

For each of the six TRL configurations (1B mb 8 none/full, 1B mb 4 none, 8B mb 4 none/full,
8B mb 1 none) a FRESH process (this file with ``--child NAME``) builds a random-initialised model of
the preset's shape directly on the GPU in bf16 (``preset_config`` +
``AutoModelForCausalLM.from_config(dtype=bfloat16, attn_implementation="sdpa")``), a live reference
model (a deep copy), and a text dataset that our byte-level tokenizer turns into exactly
prompt 511 + BOS and response 511 + EOS tokens (one ASCII letter = one token; TRL 1.16 tokenizes
``prompt``/``chosen``/``rejected`` text itself and appends EOS). It then runs
``DPOTrainer(DPOConfig(per_device_train_batch_size=mb, gradient_accumulation_steps=1, max_steps=8,
bf16=True, gradient_checkpointing=<full>, max_length=1024, loss_type="sigmoid", beta=0.1,
learning_rate=5e-6, ...))`` with a callback that synchronises CUDA at each optimizer step's begin and
end (median of steps 4-8, i.e. the first 3 excluded) and resets the NVML peak sampler
(``dpo_sweep.telemetry.make_memory_sampler``) when the measured steps start.

Writes ``OUT/trl_h200.csv`` (same columns as ``trainer_h200.csv``: join on ``config``), one row
appended per finished config, and refreshes ``OUT/trainer_h200.md`` when it can.
"""
from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import math
import os
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from h200_common import (  # noqa: E402
    CONFIGS_BY_NAME,
    DEFAULT_RESULTS_DIR,
    bench_device,
    SCALES,
    TRL_CONFIG_NAMES,
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
    run_with_timeout,
    select_configs,
    start_csv,
    to_gib,
)

CSV_NAME = "trl_h200.csv"
RUN_META_NAME = "trl_h200.run.json"
MIN_START_S = {"tiny-llama": 5, "llama-3.2-1b": 35, "llama-3-8b": 80}
DEFAULT_TIMEOUT_S = {"tiny-llama": 90, "llama-3.2-1b": 150, "llama-3-8b": 240}
LETTERS = "abcdefghijklmnopqrstuvwxyz"


# --- child: one configuration in this process ------------------------------------------------

def synthetic_text(pairs: int, prompt_tokens: int, response_tokens: int, bos: str, seed: int = 0
                   ) -> dict[str, list[str]]:
    """prompt = BOS + prompt_tokens letters, chosen/rejected = response_tokens letters each.

    With the byte-level tokenizer one ASCII letter is one token and ``<s>`` one special token;
    TRL appends EOS to chosen/rejected, so a sequence is prompt_tokens + response_tokens + 2.
    """
    rng = random.Random(seed)

    def letters(n: int) -> str:
        return "".join(rng.choice(LETTERS) for _ in range(n))

    return {
        "prompt": [bos + letters(prompt_tokens) for _ in range(pairs)],
        "chosen": [letters(response_tokens) for _ in range(pairs)],
        "rejected": [letters(response_tokens) for _ in range(pairs)],
    }


def run_child(cfg: BenchConfig, scale: Scale, gpu: str, result_path: Path) -> int:
    """Train with TRL for ``scale.steps`` steps; write the CSV row as JSON to ``result_path``."""
    import torch

    from dpo_sweep.telemetry import StepTimer, make_memory_sampler, percentile
    from dpo_sweep.train import metrics

    row: dict[str, Any] = base_row(cfg, scale, "trl", gpu)
    row.update(status="error", loss_type="sigmoid", precision=scale.precision, reference="live",
               attn_implementation="sdpa")
    t_start = time.perf_counter()
    device = bench_device()
    row["device"] = str(device)
    sampler = make_memory_sampler(device)
    row["mem_source"] = sampler.source
    sampler.start()
    timer: Any = None
    try:
        import datasets
        import transformers
        import trl
        from transformers import AutoModelForCausalLM, TrainerCallback
        from trl import DPOConfig, DPOTrainer

        from dpo_sweep.models.presets import preset_config
        from dpo_sweep.train.tokenizer import byte_level_tokenizer

        row["_versions"] = (f"trl {trl.__version__}, transformers {transformers.__version__}, "
                            f"torch {torch.__version__}, datasets {datasets.__version__}")

        class StepCallback(TrainerCallback):
            """Wall time per optimizer step (our StepTimer: a sync at each step boundary), and the
            NVML peak over the measured steps."""

            def __init__(self) -> None:
                self.steps = StepTimer(device, scale.warmup_steps)
                self.logs: dict[int, dict[str, float]] = {}
                self.pre_measure_peak_gb = math.nan
                self.peak_gb = math.nan
                self.torch_peaks = (math.nan, math.nan)
                self.t_measure = math.nan
                self.t_end = math.nan

            def on_step_begin(self, args, state, control, **kwargs):
                if state.global_step == scale.warmup_steps:  # the measured steps start now
                    self.pre_measure_peak_gb = sampler.peak_gb()
                    sampler.reset_peak()
                    self.t_measure = time.perf_counter()
                self.steps.start_step()

            def on_step_end(self, args, state, control, **kwargs):
                self.steps.end_step()
                if state.global_step == scale.steps:  # read before train()'s own teardown
                    self.peak_gb = sampler.peak_gb()
                    self.torch_peaks = sampler.torch_peaks_gb()
                    self.t_end = time.perf_counter()

            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "loss" in logs:
                    self.logs[state.global_step] = dict(logs)

        tok = byte_level_tokenizer()
        ds = datasets.Dataset.from_dict(
            synthetic_text(scale.pairs(cfg), scale.prompt_tokens, scale.response_tokens, tok.bos_token))
        dtype = torch.bfloat16 if scale.precision == "bf16" else torch.float32
        torch.manual_seed(0)
        with torch.device(device):  # weights created on the GPU directly, no CPU copy
            model = AutoModelForCausalLM.from_config(preset_config(scale.preset(cfg)), dtype=dtype,
                                                     attn_implementation="sdpa")
        model.config.use_cache = False
        ref_model = copy.deepcopy(model)
        full = cfg.checkpoint_level == "full"
        out_dir = tempfile.mkdtemp(prefix="trl_h200_")
        args = DPOConfig(
            output_dir=out_dir, per_device_train_batch_size=cfg.micro_batch, gradient_accumulation_steps=1,
            max_steps=scale.steps, bf16=scale.precision == "bf16", gradient_checkpointing=full,
            gradient_checkpointing_kwargs={"use_reentrant": False} if full else None,
            max_length=scale.seq_len, logging_steps=1, report_to=[], save_strategy="no",
            learning_rate=5e-6, beta=0.1, loss_type="sigmoid", seed=0, disable_tqdm=True,
            use_cpu=device.type == "cpu", dataloader_num_workers=0,
        )
        timer = StepCallback()
        trainer = DPOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=ds,
                             processing_class=tok, callbacks=[timer])
        first = trainer.train_dataset[0]
        got = (len(first["prompt_ids"]), len(first["chosen_ids"]), len(first["rejected_ids"]))
        want = (scale.prompt_tokens + 1, scale.response_tokens + 1, scale.response_tokens + 1)
        if got != want:
            raise RuntimeError(f"tokenized lengths (prompt, chosen, rejected) = {got}, expected {want}")
        row["optim"] = str(trainer.args.optim)
        trainer.train()
        row["status"] = "ok"
    except torch.OutOfMemoryError as err:
        row["status"] = "oom"
        row["error"] = f"OutOfMemoryError: {str(err).splitlines()[0] if str(err) else ''}"[:300]
    except Exception as err:  # noqa: BLE001 - a failed config is a row, not a crash
        traceback.print_exc()
        row["status"] = "error"
        row["error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"[:300]
    finally:
        try:
            sampler.close()
        except Exception:  # noqa: BLE001
            pass

    if timer is not None and timer.steps.step_times_ms:
        measured = timer.steps.measured_ms()
        tokens = 2 * scale.seq_len * cfg.micro_batch  # no padding: every sequence is seq_len long
        logs = [v for k, v in sorted(timer.logs.items()) if k > scale.warmup_steps]
        peak = timer.peak_gb
        row.update(
            peak_mem_gb=peak, peak_mem_gib=to_gib(peak),
            peak_mem_all_steps_gb=max(timer.pre_measure_peak_gb, peak)
            if math.isfinite(timer.pre_measure_peak_gb) else peak,
            torch_peak_alloc_gb=timer.torch_peaks[0], torch_peak_reserved_gb=timer.torch_peaks[1],
            step_time_ms=metrics.median(measured), step_time_p90_ms=percentile(measured, 90),
            tokens_per_s=metrics.median([tokens / (ms / 1e3) for ms in measured]),
            loss_mean=metrics.mean([lg["loss"] for lg in logs]),
            loss_std=metrics.detrended_std([lg["loss"] for lg in logs]),
            grad_norm_mean=metrics.mean([lg.get("grad_norm", math.nan) for lg in logs]),
            reward_accuracy=metrics.mean([lg.get("rewards/accuracies", math.nan) for lg in logs]),
            reward_margin=metrics.mean([lg.get("rewards/margins", math.nan) for lg in logs]),
            steps=len(timer.steps.step_times_ms), measured_steps=len(measured), pairs_used=scale.pairs(cfg),
            startup_s=timer.t_measure - t_start if math.isfinite(timer.t_measure) else math.nan,
            measure_s=timer.t_end - timer.t_measure,
        )
        if row["status"] == "ok" and len(measured) < scale.steps - scale.warmup_steps:
            row["status"], row["error"] = "error", f"only {len(timer.steps.step_times_ms)} of {scale.steps} steps ran"
    result_path.write_text(json.dumps(row, default=str))
    print(f"[{cfg.name}] TRL {row['status']}: step {row.get('step_time_ms', math.nan):.0f} ms, "
          f"{row.get('tokens_per_s', math.nan):,.0f} tok/s, NVML peak {row.get('peak_mem_gb', math.nan):.2f} GB "
          f"{row.get('error', '')}", flush=True)
    return 0 if row["status"] in ("ok", "oom") else 1


# --- parent: one fresh process per configuration ---------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", help="comma-separated names (default: all six): " + ", ".join(TRL_CONFIG_NAMES))
    p.add_argument("--max-minutes", type=float, default=None, help="stop starting new configs after this long")
    p.add_argument("--preset-scale", choices=sorted(SCALES), default="h200")
    p.add_argument("--out-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    p.add_argument("--logs-dir", type=Path, default=None, help="keep each child's log here (default: a temp dir)")
    p.add_argument("--timeout-s", type=float, default=None, help="per-config hard limit (default: by model size)")
    p.add_argument("--append", action="store_true", help="append to an existing CSV instead of starting a new one")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--gpu-name", help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    scale = SCALES[args.preset_scale]
    if args.child:
        return run_child(CONFIGS_BY_NAME[args.child], scale, args.gpu_name or "", args.result)

    configs = select_configs(args.configs, TRL_CONFIG_NAMES)
    out_dir: Path = args.out_dir
    csv_path = out_dir / CSV_NAME
    start_csv(csv_path, args.append)
    budget = Budget(args.max_minutes)
    gpu = gpu_name()
    meta: dict[str, Any] = {
        "command": command_line(argv),
        "gpu": gpu, "scale": scale.name, "started": dt.datetime.now().isoformat(timespec="seconds"),
        "versions": "", "not_run": {},
    }
    meta_path = out_dir / RUN_META_NAME
    meta_path.write_text(json.dumps(meta, indent=1))
    env = child_env()
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               WANDB_DISABLED="true", ACCELERATE_LOG_LEVEL="error")
    print(f"GPU: {gpu}; TRL on {len(configs)} config(s); scale {scale.name}", flush=True)
    with tempfile.TemporaryDirectory(prefix="trl_h200_") as tmp:
        work = Path(tmp)
        logs_dir = args.logs_dir or work / "logs"
        for cfg in configs:
            preset = scale.preset(cfg)
            left = budget.remaining_s()
            if left < MIN_START_S[preset]:
                meta["not_run"][cfg.name] = f"time budget spent ({max(left, 0):.0f} s left)"
                print(f"[{cfg.name}] skipped: budget", flush=True)
                continue
            timeout_s = min(args.timeout_s or DEFAULT_TIMEOUT_S[preset], left)
            print(f"[{cfg.name}] TRL start (timeout {timeout_s:.0f} s)", flush=True)
            result = work / f"{cfg.name}.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", cfg.name,
                   "--preset-scale", scale.name, "--gpu-name", gpu, "--result", str(result)]
            proc = run_with_timeout(cmd, timeout_s, logs_dir / f"trl-{cfg.name}.log", env=env)
            if result.is_file():
                row = json.loads(result.read_text())
                meta["versions"] = row.pop("_versions", meta["versions"])
            else:
                row = base_row(cfg, scale, "trl", gpu)
                row.update(child_failure(proc, timeout_s))
            row["wall_s"] = round(proc.wall_s, 1)
            append_row(csv_path, row)
            meta_path.write_text(json.dumps(meta, indent=1))
            print(f"[{cfg.name}] TRL {row['status']} in {row['wall_s']} s: step "
                  f"{num(row.get('step_time_ms')):.0f} ms, {num(row.get('tokens_per_s')):,.0f} tok/s, "
                  f"NVML peak {num(row.get('peak_mem_gb')):.2f} GB {row.get('error', '')}", flush=True)
            _refresh_markdown(out_dir)
    meta_path.write_text(json.dumps(meta, indent=1))
    _refresh_markdown(out_dir)
    print(f"wrote {csv_path}")
    return 0


def _refresh_markdown(out_dir: Path) -> None:
    """Rewrite trainer_h200.md with the TRL-measured column (when our results exist)."""
    if not (out_dir / "trainer_h200.csv").is_file():
        return
    try:
        from trainer_h200 import write_markdown

        write_markdown(out_dir)
    except Exception as err:  # noqa: BLE001 - the CSV is the result; the markdown is a view
        print(f"(markdown not refreshed: {type(err).__name__}: {err})", file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
