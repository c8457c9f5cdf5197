#!/usr/bin/env python3
"""The winner's TRL export pasted into TRL, as a user would run it, against the sweep's TRL row.

    python3 benchmarks/trl_export_check.py RESULTS_DIR [--steps 4] [--out-dir DIR]
    python3 benchmarks/trl_export_check.py --smoke [--out-dir DIR]     # CPU, tiny, seconds
    python3 benchmarks/trl_export_check.py --write-space CASE_DIR [--budget-gb 48] > trl.yaml

The proof on a GPU, a user's case from ``benchmarks/user_case.py`` (a checkpoint folder and
long-tailed chat pairs):

    python3 benchmarks/user_case.py make --arch qwen2-3b --pairs 1500 --dir /tmp/case
    python3 benchmarks/trl_export_check.py --write-space /tmp/case --budget-gb 48 > /tmp/case/trl.yaml
    dpo-sweep run /tmp/case/trl.yaml --output benchmarks/results/trl_export_check/h200-case
    python3 benchmarks/trl_export_check.py benchmarks/results/trl_export_check/h200-case \
        --out-dir benchmarks/results/trl_export_check/h200-case

RESULTS_DIR is a finished sweep (``dpo-sweep run``) whose space swept ``trainer: [native, trl]``:
its ``recommendation.json`` holds the winner's ``"trl"`` export and, under ``"switch"``, the sweep's
row of the same configuration under the other trainer. The script takes the export as printed -
``DPOConfig(**dpo_config)`` in the export's field names, ``LoraConfig(**peft_config)``,
``DPOTrainer(model=<the export's model folder>)`` - and adds only what the export leaves to the
user: ``max_steps``, an output folder, no saving, no reporting. The data is the sweep's own data
file as text (prompt, chosen, rejected after the space's ``columns`` renaming, chat rows rendered
as the sweep renders them), which TRL tokenizes, ends with EOS and truncates itself; of it the
``steps x effective batch`` longest pairs, so that every step meets the long pairs the sweep's
worst-case step measured. The memory sampler (``dpo_sweep.telemetry``: NVML on a GPU, RSS on the
CPU) records the peak over the steps.

Also ``OUT/trl_predictions.csv``: every ok TRL row of the sweep, its measured peak against the
memory model's prediction (``predicted_peak_gb``: plan/trl_memory.py), ratio and within 5%.

Compared with the sweep's TRL row of the winner's configuration (the winner itself when it is a
TRL row, else ``switch``): ``OUT/trl_export_check.csv`` gets one row - ``export_peak_gb``,
``sweep_trl_peak_gb``, their ratio and ``within_5pct`` - and the script prints it. A native winner
whose switch is only predicted is compared with the prediction (``sweep_source: predicted``).

``--smoke`` builds everything on the CPU first: a tiny Llama saved in bf16, a jsonl of text pairs,
a two-trial sweep result (``dpo-sweep trial`` once per trainer, then ``dpo-sweep report``), and
checks that one; its peaks are RSS and say nothing of the GPU's 5% (tests/benchmarks/ runs it).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CSV_NAME = "trl_export_check.csv"
PREDICTIONS_NAME = "trl_predictions.csv"
COLUMNS = ("results_dir", "winner", "winner_trainer", "sweep_trl_trial", "sweep_source", "sweep_trl_peak_gb",
           "export_peak_gb", "ratio", "within_5pct", "export_step_ms", "steps", "pairs", "device", "trl_version")


PREDICTION_COLUMNS = ("trial_id", "micro_batch", "checkpoint_level", "adapter", "peak_mem_gb", "predicted_peak_gb",
                      "ratio", "within_5pct")


def proof_space(case: Path, budget_gb: float, max_length: int = 2048) -> str:
    """The GPU proof's space on a user's case: both trainers x levels none / full x micro_batch
    1, 2, 4 x adapter full / lora, bf16 weights, under an emulated card of ``budget_gb``."""
    return f"""# The TRL proof (benchmarks/trl_export_check.py): native and TRL rows of one user's case.
# dpo-sweep run THIS --output benchmarks/results/trl_export_check/h200-case
name: trl-proof-{case.name}
model: {{name_or_path: {case / 'ckpt'}, dtype: bfloat16, liger_kernel: false}}
data: {{path: {case / 'pairs.jsonl'}}}
train: {{steps: 4, warmup_steps: 1, max_length: {max_length}, precision: bf16, lora_r: 16}}
resources: {{workers_per_trial: 1, use_gpu: auto, gpu_memory_gb: {budget_gb:g}}}
search:
  micro_batch: [1, 2, 4]
  checkpoint_level: [none, full]
  grad_acc: [2]
  beta: [0.1]
  adapter: [full, lora]
  trainer: [native, trl]
"""


def prediction_rows(results: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Every ok TRL row: measured peak against the planner's prediction."""
    rows = []
    for r in results:
        if (r.get("trainer") or "native") != "trl" or r.get("status") != "ok" or not r.get("predicted_peak_gb"):
            continue
        peak, predicted = float(r["peak_mem_gb"]), float(r["predicted_peak_gb"])
        ratio = predicted / peak if peak > 0 else math.nan
        rows.append({"trial_id": r["trial_id"], "micro_batch": r["micro_batch"],
                     "checkpoint_level": r["checkpoint_level"], "adapter": r.get("adapter") or "full",
                     "peak_mem_gb": peak, "predicted_peak_gb": predicted, "ratio": ratio,
                     "within_5pct": bool(math.isfinite(ratio) and abs(ratio - 1) <= 0.05)})
    return rows


def _write(path: Path, columns: tuple[str, ...], rows: list[dict[str, Any]], append: bool) -> None:
    new = not (append and path.exists())
    with path.open("a" if append else "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        if new:
            writer.writeheader()
        writer.writerows({k: r[k] for k in columns} for r in rows)


def sweep_trl_row(recommendation: dict[str, Any], results: list[dict[str, str]]) -> tuple[str, str, float]:
    """(trial id, source, peak GB) of the sweep's TRL measurement of the winner's configuration."""
    winner = next((r for r in results if r["trial_id"] == recommendation["trial_id"]), None)
    if winner is not None and (winner.get("trainer") or "native") == "trl":
        return winner["trial_id"], "measured", float(winner["peak_mem_gb"])
    switch = (recommendation.get("trl") or {}).get("switch") or {}
    peak = switch.get("peak_mem_gb")
    return str(switch.get("trial_id") or "-"), str(switch.get("source") or "none"), float(peak) if peak else math.nan


def text_pairs(space: dict[str, Any], tokenizer: Any, count: int) -> list[dict[str, str]]:
    """The ``count`` longest pairs of the sweep's data file as text, as the sweep reads them."""
    from dpo_sweep.config import DataSpec
    from dpo_sweep.errors import DataError
    from dpo_sweep.train.data import check_columns, normalise_row
    from dpo_sweep.train.sources import read_rows

    spec = DataSpec(**space["data"])
    if spec.synthetic is not None:
        raise DataError("the sweep's data is synthetic token ids: there is no text to give TRL; "
                        "check a sweep of a data file (data.path or data.hf)")
    src = read_rows(spec)
    rename = check_columns(src, spec)
    pairs = []
    for i, row in enumerate(src.rows[:spec.max_pairs] if spec.max_pairs else src.rows):
        renamed = {rename.get(k, k): v for k, v in row.items()}
        prompt, chosen, rejected, _ = normalise_row(renamed, tokenizer, src.where(i))
        pairs.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    pairs.sort(key=lambda p: -(len(p["prompt"]) + max(len(p["chosen"]), len(p["rejected"]))))
    return pairs[:count]


def run_export(export: dict[str, Any], pairs: list[dict[str, str]], steps: int, out_dir: Path) -> dict[str, Any]:
    """The export pasted into TRL for ``steps`` steps: its peak (GB) and median step time (ms)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import DPOConfig, DPOTrainer

    from dpo_sweep.telemetry import StepTimer, make_memory_sampler

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    mine = dict(max_steps=steps, output_dir=str(out_dir), report_to="none", save_strategy="no",
                logging_steps=1, disable_tqdm=True, use_cpu=device.type == "cpu")
    args = DPOConfig(**export["dpo_config"], **mine)
    peft = LoraConfig(**export["peft_config"]) if export.get("peft_config") else None
    sampler = make_memory_sampler(device)
    timer = StepTimer(device, 1)

    class Measure(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            timer.start_step()

        def on_step_end(self, args, state, control, **kwargs):
            timer.end_step()

    with sampler:
        trainer = DPOTrainer(model=export["model"], args=args, train_dataset=Dataset.from_list(pairs),
                             peft_config=peft, callbacks=[Measure()])
        sampler.reset_peak()  # the steps' peak, as the sweep's rows (not the model's loading)
        trainer.train()
        peak = sampler.peaks().peak_gb
    sampler.close()
    return {"export_peak_gb": peak, "export_step_ms": timer.median_ms(), "device": str(device)}


def check(results_dir: Path, steps: int, out_dir: Path) -> dict[str, Any]:
    """Run the winner's export of ``results_dir`` and write its comparison row."""
    import trl
    import yaml

    from dpo_sweep.records import read_csv_rows
    from dpo_sweep.results_dir import ResultsDir
    from dpo_sweep.train.tokenizer import load_tokenizer
    from dpo_sweep.config import ModelSpec

    files = ResultsDir(results_dir)
    recommendation = json.loads(files.recommendation.read_text())
    export = recommendation.get("trl")
    if not export or not export.get("model"):
        raise SystemExit(f"{files.recommendation}: no TRL export with a model folder (a preset has none)")
    space = yaml.safe_load(files.space.read_text())
    batch = export["dpo_config"]["per_device_train_batch_size"] * export["dpo_config"]["gradient_accumulation_steps"]
    pairs = text_pairs(space, load_tokenizer(ModelSpec(**space["model"])), steps * batch)
    results = read_csv_rows(files.results)
    trial, source, sweep_peak = sweep_trl_row(recommendation, results)
    with tempfile.TemporaryDirectory(prefix="trl-export-check-") as tmp:
        measured = run_export(export, pairs, steps, Path(tmp))
    ratio = measured["export_peak_gb"] / sweep_peak if sweep_peak and math.isfinite(sweep_peak) else math.nan
    row = {"results_dir": str(results_dir), "winner": recommendation["trial_id"],
           "winner_trainer": recommendation["config"].get("trainer", "native"), "sweep_trl_trial": trial,
           "sweep_source": source, "sweep_trl_peak_gb": sweep_peak, **measured, "ratio": ratio,
           "within_5pct": bool(math.isfinite(ratio) and abs(ratio - 1) <= 0.05), "steps": steps,
           "pairs": len(pairs), "trl_version": trl.__version__}
    out_dir.mkdir(parents=True, exist_ok=True)
    _write(out_dir / CSV_NAME, COLUMNS, [row], append=True)
    _write(out_dir / PREDICTIONS_NAME, PREDICTION_COLUMNS, prediction_rows(results), append=False)
    return row


def smoke_results(root: Path) -> Path:
    """A CPU sweep result of a tiny bf16 folder with ``trainer: [native, trl]`` (``dpo-sweep trial``
    per trainer, then ``report``): what :func:`check` reads."""
    import shutil

    import torch
    import yaml
    from transformers import AutoModelForCausalLM, LlamaConfig

    from dpo_sweep.cli import main
    from dpo_sweep.results_dir import ResultsDir
    from dpo_sweep.train.tokenizer import byte_level_tokenizer

    folder = root / "ckpt"
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=512, bos_token_id=256, eos_token_id=257, pad_token_id=258)
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(folder)
    byte_level_tokenizer().save_pretrained(folder)
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "omega"]
    with (root / "pairs.jsonl").open("w") as f:
        for i in range(24):
            say = lambda n: " ".join(rng.choice(words) for _ in range(n))  # noqa: E731
            f.write(json.dumps({"prompt": f"q{i}: {say(rng.randint(2, 8))}? ", "chosen": say(rng.randint(2, 6)),
                                "rejected": say(rng.randint(2, 6))}) + "\n")
    space = {"name": "trl-export-smoke", "model": {"name_or_path": str(folder), "attn_implementation": "sdpa"},
             "data": {"path": str(root / "pairs.jsonl"), "min_prompt_tokens": 4, "min_response_tokens": 2},
             "train": {"steps": 2, "warmup_steps": 1, "max_length": 96, "precision": "bf16", "device": "cpu",
                       "evaluate": False, "lr": 1e-4},
             "resources": {"use_gpu": False},
             "search": {"micro_batch": [2], "checkpoint_level": ["none"], "grad_acc": [1], "beta": [0.1],
                        "trainer": ["native", "trl"]}}
    (root / "space.yaml").write_text(yaml.safe_dump(space))
    out = root / "results"
    rows: list[dict[str, str]] = []
    for trainer in ("native", "trl"):
        one = root / trainer
        if main(["trial", str(root / "space.yaml"), "--set", f"trainer={trainer}", "--output", str(one)]) != 0:
            raise SystemExit(f"the smoke's {trainer} trial failed")
        with (one / ResultsDir.RESULTS).open(newline="") as f:
            rows += list(csv.DictReader(f))
    out.mkdir()
    with ResultsDir(out).results.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)
    shutil.copyfile(root / "space.yaml", ResultsDir(out).space)
    if main(["report", str(out)]) != 0:
        raise SystemExit("the smoke's report failed")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results_dir", nargs="?", type=Path, help="a finished sweep's folder")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps of the export's run")
    parser.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "results" / "trl_export_check" / "new")
    parser.add_argument("--smoke", action="store_true", help="CPU: build a tiny sweep result and check it")
    parser.add_argument("--write-space", type=Path, metavar="CASE_DIR",
                        help="print the GPU proof's space for a user_case.py case folder, run nothing")
    parser.add_argument("--budget-gb", type=float, default=48.0, help="the emulated card of --write-space")
    args = parser.parse_args(argv)
    if args.write_space is not None:
        print(proof_space(args.write_space, args.budget_gb), end="")
        return 0
    if args.smoke:
        with tempfile.TemporaryDirectory(prefix="trl-export-smoke-") as tmp:
            row = check(smoke_results(Path(tmp)), min(args.steps, 2), args.out_dir)
    elif args.results_dir is None:
        parser.error("give RESULTS_DIR, or --smoke")
    else:
        row = check(args.results_dir, args.steps, args.out_dir)
    print(" ".join(f"{k}={row[k]}" for k in COLUMNS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
