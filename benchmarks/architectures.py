"""Model families as users bring them: checkpoint folders of several architectures at real shapes,
each swept through the product (``dpo-sweep run --full-grid``: every configuration measured, none
shared or pruned), and each row's measured peak beside the memory model's prediction.

    python benchmarks/architectures.py --label first-run            # on the H200 (about 20 min)
    python benchmarks/architectures.py --smoke --out /tmp/archs      # tiny shapes, CPU, seconds

writes ``benchmarks/results/architectures_h200/<label>/architectures.csv`` (``--out``: that folder)
with the columns ``model_type, trial_id, status, peak_mem_gb, predicted_peak_gb`` (and the
configuration and the prediction's error beside them), one row per configuration, and prints the
table. Each architecture's folder holds random bf16 weights saved with ``save_pretrained`` and the
byte-level tokenizer; its sweep's results folder stays under ``--work`` for a closer look.
"""
from __future__ import annotations

import argparse
import csv
import math
import multiprocessing
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

COLUMNS = ("model_type", "trial_id", "status", "peak_mem_gb", "predicted_peak_gb", "micro_batch",
           "checkpoint_level", "attn_implementation", "predicted_error")


@dataclass(frozen=True)
class Arch:
    """One architecture: its transformers model_type and config, and the configurations it runs."""

    label: str
    model_type: str
    config: dict
    micro_batch: tuple[int, ...]
    levels: tuple[str, ...]
    attn: str = "auto"


#: Real shapes (public configs' sizes; random weights). Gemma-2's soft-capped attention runs on
#: eager (transformers refuses sdpa for it), with which L2/L3 are refused: none, L1 and full.
ARCHS: tuple[Arch, ...] = (
    Arch("gemma2-2b", "gemma2", dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                                     num_attention_heads=8, num_key_value_heads=4, head_dim=256, vocab_size=256000,
                                     query_pre_attn_scalar=256, sliding_window=4096, final_logit_softcapping=30.0,
                                     attn_logit_softcapping=50.0, tie_word_embeddings=True),
         (1, 2), ("none", "L1", "full"), attn="eager"),
    Arch("phi3-mini", "phi3", dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                                   num_attention_heads=32, num_key_value_heads=32, vocab_size=32064,
                                   tie_word_embeddings=False), (2,), ("none", "L1", "L2", "full")),
    Arch("qwen3-moe-4b", "qwen3_moe", dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                                           num_experts=32, num_experts_per_tok=4, num_hidden_layers=24,
                                           num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                                           vocab_size=151936, tie_word_embeddings=False), (2,), ("none", "L1", "full")),
    Arch("olmo2-1b", "olmo2", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                   num_attention_heads=16, num_key_value_heads=16, vocab_size=100352,
                                   tie_word_embeddings=False), (2, 4), ("none", "L2")),
    Arch("gemma3-1b", "gemma3_text", dict(hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
                                          num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                                          vocab_size=262144, sliding_window=512, query_pre_attn_scalar=256,
                                          tie_word_embeddings=True), (2, 4), ("none", "L2")),
)

#: The same families at test sizes, for the CPU smoke mode: each a few hundred kB.
_TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=512, tie_word_embeddings=False)
SMOKE: tuple[Arch, ...] = (
    Arch("tiny-gemma2", "gemma2", {**_TINY, "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 32},
         (1,), ("none", "full"), attn="eager"),
    Arch("tiny-qwen3-moe", "qwen3_moe", {**_TINY, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                                         "moe_intermediate_size": 32}, (1,), ("none", "L1")),
)


def make_checkpoint(arch: Arch, folder: Path, seed: int = 0) -> Path:
    """A user-style checkpoint folder: config, random bf16 weights and the byte-level tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from dpo_sweep.train.tokenizer import byte_level_tokenizer

    if (folder / "config.json").is_file():
        return folder
    config = AutoConfig.for_model(arch.model_type, bos_token_id=256, eos_token_id=257, pad_token_id=258,
                                  **arch.config)
    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    byte_level_tokenizer().save_pretrained(folder)
    del model
    return folder


def build_checkpoint(arch: Arch, folder: Path) -> Path:
    """:func:`make_checkpoint` in a child process. The memory sampler reads the whole GPU's used
    memory, so a model built here would stay in this process's allocator cache and CUDA context
    through the sweep it then starts, and count in every trial's peak (on an H200, 8.7 GB for
    Gemma-2 2B and 19.8 GB for Qwen3-MoE 4.7B over what the trial's own process held)."""
    if (folder / "config.json").is_file():
        return folder
    child = multiprocessing.get_context("spawn").Process(target=make_checkpoint, args=(arch, folder))
    child.start()
    child.join()
    if child.exitcode != 0:
        raise RuntimeError(f"building {arch.label}'s checkpoint in {folder} failed (exit {child.exitcode})")
    return folder


def space_text(arch: Arch, ckpt: Path, *, smoke: bool) -> str:
    """The sweep's space file: the architecture's configurations, bf16 (fp32 on the CPU)."""
    import yaml

    tokens = 24 if smoke else 512
    return yaml.safe_dump({
        "name": f"architectures-{arch.label}",
        "model": {"name_or_path": str(ckpt), "attn_implementation": arch.attn},
        "data": {"synthetic": {"pairs": 16 if smoke else 128, "prompt_tokens": tokens, "response_tokens": tokens}},
        "train": {"steps": 2 if smoke else 4, "warmup_steps": 1, "max_length": 2 * tokens,
                  "precision": "fp32" if smoke else "bf16", "reference": "precomputed"},
        "resources": {"workers_per_trial": 1, "use_gpu": False if smoke else True},
        "search": {"micro_batch": list(arch.micro_batch), "checkpoint_level": list(arch.levels),
                   "grad_acc": [1], "beta": [0.1]},
    }, sort_keys=False)


def sweep(arch: Arch, work: Path, *, smoke: bool) -> Path:
    """``dpo-sweep run --full-grid`` of ``arch``'s space, in a process of its own; its results folder."""
    ckpt = build_checkpoint(arch, work / arch.label / "ckpt")
    space = work / arch.label / "space.yaml"
    space.write_text(space_text(arch, ckpt, smoke=smoke))
    out = work / arch.label / "results"
    cmd = [sys.executable, "-m", "dpo_sweep", "run", str(space), "--output", str(out), "--no-dashboard",
           "--full-grid"] + (["--resume"] if (out / "results.csv").is_file() else [])
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=False, cwd=REPO_ROOT, env=_env())
    return out


def _env() -> dict:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def rows(arch: Arch, results: Path) -> list[dict]:
    """The architecture's rows of ``results/results.csv`` in :data:`COLUMNS` (an error row where the
    sweep wrote none)."""
    path = results / "results.csv"
    if not path.is_file():
        return [dict(model_type=arch.model_type, trial_id="-", status="error", peak_mem_gb=math.nan,
                     predicted_peak_gb=math.nan, micro_batch="", checkpoint_level="", attn_implementation=arch.attn,
                     predicted_error=math.nan)]
    out = []
    with path.open() as fh:
        for r in csv.DictReader(fh):
            measured, predicted = _num(r.get("peak_mem_gb")), _num(r.get("predicted_peak_gb"))
            out.append(dict(model_type=arch.model_type, trial_id=r["trial_id"], status=r["status"],
                            peak_mem_gb=measured, predicted_peak_gb=predicted, micro_batch=r["micro_batch"],
                            checkpoint_level=r["checkpoint_level"], attn_implementation=arch.attn,
                            predicted_error=predicted / measured - 1 if measured and measured > 0 else math.nan))
    return out


def _num(text) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def write_csv(path: Path, table: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(table)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--label", default="run", help="benchmarks/results/architectures_h200/<label>/")
    p.add_argument("--out", type=Path, help="the folder architectures.csv goes to (default: by --label)")
    p.add_argument("--work", type=Path, default=Path("/tmp/dpo-architectures"),
                   help="checkpoint folders and each sweep's results (kept: a second run reuses the folders)")
    p.add_argument("--only", help="comma-separated architecture labels")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: the script's own check")
    args = p.parse_args(argv)
    archs = SMOKE if args.smoke else ARCHS
    if args.only:
        archs = tuple(a for a in archs if a.label in args.only.split(","))
    out = args.out or REPO_ROOT / "benchmarks" / "results" / "architectures_h200" / args.label
    table = [row for arch in archs for row in rows(arch, sweep(arch, args.work, smoke=args.smoke))]
    write_csv(out / "architectures.csv", table)
    print("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS))
    for r in table:
        print("| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r.values()) + " |")
    ok = [r for r in table if r["status"] == "ok"]
    within = [r for r in ok if abs(r["predicted_error"]) <= 0.05]
    summary = f"{len(within)} of {len(ok)} ok rows predicted within 5% of their measured peak"
    print(summary)
    write_readme(out / "README.md", argv if argv is not None else sys.argv[1:], summary)
    return 0


def write_readme(path: Path, argv: list[str], summary: str) -> None:
    """The label folder's provenance (tests/benchmarks/test_results_layout.py wants one): the
    command, the machine and the summary; what the numbers mean is for the person who ran it to add."""
    import datetime
    import platform

    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU (CPU)"
    path.write_text(f"# Model families at real shapes: measured vs predicted peaks\n\n"
                    f"**Machine:** {gpu}, {platform.node()}, torch {torch.__version__}, "
                    f"{datetime.date.today().isoformat()}. **Command:**\n\n"
                    f"    python benchmarks/architectures.py {' '.join(argv)}\n\n"
                    f"`architectures.csv`: one row per configuration of each folder's `dpo-sweep run --full-grid`; "
                    f"`predicted_error` = predicted / measured - 1. {summary}.\n")


if __name__ == "__main__":
    sys.exit(main())
