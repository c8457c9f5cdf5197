"""A real user's case: a checkpoint folder of an architecture that is no preset (saved with
``save_pretrained``, its own tokenizer with a chat template) and a JSONL file of long-tailed chat
pairs; then what such a user meets, measured.

    python benchmarks/user_case.py make --arch qwen2-3b --pairs 1500 --dir /tmp/case
    python benchmarks/user_case.py cost --dir /tmp/case --small 64          # trial wall time vs data size
    python benchmarks/user_case.py extrapolate --dir /tmp/case --out-dir D  # short vs full step times
    python benchmarks/user_case.py memory --dir /tmp/case --out-dir D       # predicted vs measured peaks
    python benchmarks/user_case.py sweep --dir /tmp/case --out-dir D        # the 16-configuration sweep, its ETAs

Every trial runs in this process, one after another (one ``WarmState`` kept and released between
them, as a warm worker does), through the trainer's own ``run_trial``; ``cost`` runs each data
set's trials in a fresh process of their own. ``--arch tiny-qwen2`` / ``tiny-mistral``
run the same on a CPU in seconds. Each command prints a table and writes CSV.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

#: Architectures that are no preset. qwen2-3b: Qwen2.5-3B's shape (tied embeddings, a wide MLP);
#: mistral-3b: a Mistral-architecture model of about 3B parameters (untied, GQA 4:1).
ARCHS: dict[str, tuple[str, dict]] = {
    "qwen2-3b": ("qwen2", dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                               num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                               max_position_embeddings=32768)),
    "mistral-3b": ("mistral", dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=26,
                                   num_attention_heads=24, num_key_value_heads=8, vocab_size=32768,
                                   tie_word_embeddings=False, max_position_embeddings=32768, sliding_window=None)),
    "tiny-qwen2": ("qwen2", dict(hidden_size=64, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True)),
    "tiny-mistral": ("mistral", dict(hidden_size=96, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=1, vocab_size=512, tie_word_embeddings=False,
                                     sliding_window=None)),
}
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WORDS = ("the model learns which answer people prefer from pairs of replies to one prompt and a "
         "reference keeps it close to where it started while the loss pushes the chosen reply up").split()


def make(arch: str, pairs: int, out: Path, seed: int = 0, sigma: float = 1.0, prompt_words: int = 120,
         reply_words: int = 90, weights: bool = True) -> None:
    """``out/ckpt`` (config, random bf16 weights, tokenizer) and ``out/pairs.jsonl``: chat pairs
    whose prompt and reply lengths are lognormal (``sigma``), so a few are many times the median."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from dpo_sweep.train.tokenizer import byte_level_tokenizer

    kind, kwargs = ARCHS[arch]
    ckpt = out / "ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)
    config = AutoConfig.for_model(kind, **kwargs)
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if weights:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        model.save_pretrained(ckpt)
    else:  # the shapes and the tokenizer only: enough to lay out steps (refit), not to train
        config.save_pretrained(ckpt)
    tok = byte_level_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(ckpt)
    rng = random.Random(seed)

    def text(median_words: int) -> str:
        n = max(1, min(4000, int(rng.lognormvariate(math.log(median_words), sigma))))
        return " ".join(rng.choice(WORDS) for _ in range(n))

    with (out / "pairs.jsonl").open("w") as fh:
        for _ in range(pairs):
            fh.write(json.dumps({"prompt": [{"role": "user", "content": text(prompt_words)}],
                                 "chosen": [{"role": "assistant", "content": text(reply_words)}],
                                 "rejected": [{"role": "assistant", "content": text(reply_words)}]}) + "\n")
    print(f"wrote {ckpt} ({arch}{'' if weights else ', no weights'}) and {out / 'pairs.jsonl'} ({pairs} pairs)")


def trial_config(case: Path, *, micro_batch: int, level: str, grad_acc: int, max_length: int, steps: int,
                 warmup: int, data_path: Path | None = None, max_pairs: int | None = None, **train):
    from dpo_sweep.config import DataSpec, ModelSpec, ResourcesSpec, TrainSpec, TrialConfig

    data = {"path": str(data_path or case / "pairs.jsonl")}
    if max_pairs:
        data["max_pairs"] = max_pairs
    tid = f"mb{micro_batch}_{level}_ga{grad_acc}"
    return TrialConfig(trial_id=tid, model=ModelSpec(name_or_path=str(case / "ckpt"), dtype="bfloat16"),
                       data=DataSpec(**data),
                       train=TrainSpec(steps=steps, warmup_steps=warmup, max_length=max_length, precision="bf16",
                                       reference="precomputed", evaluate=False, **train),
                       resources=ResourcesSpec(), micro_batch=micro_batch, checkpoint_level=level, grad_acc=grad_acc)


def warm_state():
    """What this process keeps between its trials, as a warm worker does."""
    from dpo_sweep.train.warm_state import WarmState

    return WarmState()


def run(cfg, warm):
    """One trial in this process, then the process left as a fresh one would start the next."""
    from dpo_sweep.train.loop import resolve_device, run_trial

    started = time.perf_counter()
    out = run_trial(cfg, log=lambda m: print(m, flush=True), warm=warm)
    wall = time.perf_counter() - started
    warm.release(resolve_device(cfg))
    return out, wall


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")


def table(rows: list[dict]) -> None:
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in r.values()) + " |")


def synthetic_config(preset: str, pairs: int, steps: int, tokens: int = 64):
    """The CPU form of the cost check: a preset on synthetic pairs (``tokens`` + ``tokens``)."""
    from dpo_sweep.config import DataSpec, ModelSpec, ResourcesSpec, TrainSpec, TrialConfig

    return TrialConfig(trial_id=f"{preset}_{pairs}", model=ModelSpec(preset=preset),
                       data=DataSpec(synthetic={"pairs": pairs, "prompt_tokens": tokens, "response_tokens": tokens}),
                       train=TrainSpec(steps=steps, warmup_steps=1, max_length=4 * tokens, precision="fp32",
                                       reference="precomputed", evaluate=False),
                       resources=ResourcesSpec(), micro_batch=1, checkpoint_level="full", grad_acc=2)


def cost_config(case: Path | None, n: int | None, mb: int, max_length: int, steps: int, preset: str | None,
                pairs: int):
    """The cost check's trial at micro-batch ``mb`` on ``n`` pairs (None: the whole file, or
    ``pairs`` synthetic ones with ``preset``): full checkpointing, grad_acc 2."""
    if preset:
        return synthetic_config(preset, n or pairs, steps).model_copy(update={"micro_batch": mb})
    return trial_config(case, micro_batch=mb, level="full", grad_acc=2, max_length=max_length, steps=steps,
                        warmup=1, max_pairs=n)


def cost_process(case: Path | None, n: int | None, small: int, max_length: int, steps: int,
                 preset: str | None, pairs: int) -> list[dict]:
    """One data set's trials in this process, as a sweep's warm worker runs them: a first trial
    (mb 1), which tokenizes the data and computes the reference log-probs of the pairs it reads,
    then a second one of another configuration (mb 2), which finds both cached. Before them a
    warm-up trial, left out: imports, the CUDA context, a model build, on the first ``small`` pairs
    at a quarter of ``max_length`` (a preset: 16 + 16 tokens), so it builds none of the measured
    trials' reference log-probs and few of their shapes."""
    warm = warm_state()
    if preset:
        run(synthetic_config(preset, small, 2, tokens=16).model_copy(update={"trial_id": "warm-up"}), warm)
    else:
        run(cost_config(case, small, 1, max(64, max_length // 4), 2, None, pairs), warm)
    rows = []
    for mb in (1, 2):
        out, wall = run(cost_config(case, n, mb, max_length, steps, preset, pairs), warm)
        r = out.result
        rows.append({"pairs": r.pairs_used, "data": "all" if n is None else "small", "trial": "first" if mb == 1 else "second",
                     "config": r.trial_id, "status": r.status, "wall_s": wall, "startup_s": r.startup_s,
                     "startup_model_s": r.startup_model_s, "measure_s": r.measure_s})
    return rows


def cost(case: Path | None, small: int, out_dir: Path, max_length: int, steps: int, preset: str | None = None,
         pairs: int = 4096, repeats: int = 3) -> list[dict]:
    """Trials on the whole file and on its first ``small`` pairs (with ``preset``: on ``pairs`` and
    on ``small`` synthetic pairs). Each data set's trials run in a fresh process of their own
    (:func:`cost_process`), so neither finds what the other's built (cuDNN plans of its widths,
    the reference log-probs); ``repeats`` times, the order alternating. The ratios compare the
    medians, trial by trial; every run is a row of ``out_dir/trial_cost.csv``."""
    import subprocess
    import tempfile

    rows = []
    for repeat in range(repeats):
        for data in (("all", "small") if repeat % 2 == 0 else ("small", "all")):
            with tempfile.TemporaryDirectory() as tmp:
                cmd = [sys.executable, __file__, "cost-process", "--data", data, "--small", str(small),
                       "--max-length", str(max_length), "--steps", str(steps), "--pairs", str(pairs),
                       "--out-dir", tmp, *(["--preset", preset] if preset else ["--dir", str(case)])]
                subprocess.run(cmd, check=True, cwd=REPO_ROOT)
                rows += [{"repeat": repeat, **r} for r in json.loads((Path(tmp) / "cost.json").read_text())]
            write_csv(out_dir / "trial_cost.csv", rows)  # after each process: a cut-off run keeps its rows
    summary = []
    for trial in ("first", "second"):
        wall = {data: statistics.median(r["wall_s"] for r in rows if r["data"] == data and r["trial"] == trial)
                for data in ("all", "small")}
        summary.append({"trial": trial, "all_wall_s": wall["all"], "small_wall_s": wall["small"],
                        "ratio": wall["all"] / wall["small"], "runs": repeats})
    table(rows)
    table(summary)
    write_csv(out_dir / "trial_cost_summary.csv", summary)
    return summary


#: (micro_batch, level) at effective batch ``--effective-batch``: grad_acc = E / micro_batch.
EXTRAPOLATION_CONFIGS = ((1, "full"), (2, "L2"), (2, "full"), (4, "L1"), (4, "L2"), (4, "full"))


def extrapolate_rows(case: Path, effective: int, max_length: int, steps: int, configs,
                     out_dir: Path, pad: int | None = None) -> list[dict]:
    """Each configuration's measure trial (at ``rules.measure_grad_acc``, as the planner runs it) and its full trial:
    the planner's row from the first (``plan.rows.shared_row``: its extrapolated step time, its
    p10-p90 widened by its ``extrapolation_error``), the FLOP-weighted ``ratio`` and ``line`` fits of
    ``plan/extrapolate.py`` beside it, the second's measured step time. Every step of both trials
    goes to ``out_dir/extrapolation_steps.csv`` (their micro-step times in ``micro_ms``)."""
    from dpo_sweep.plan.extrapolate import extrapolate, fit_micro_steps, step_layout
    from dpo_sweep.plan.memory import predict_peak_gb
    from dpo_sweep.plan.shape import built_shape
    from dpo_sweep.core.trial_facts import planned_device
    from dpo_sweep.plan.rows import shared_row
    from dpo_sweep.plan.rules import measure_grad_acc
    from dpo_sweep.records import write_steps
    from dpo_sweep.core.lengths import LengthProfile

    rows, all_steps, warm = [], [], warm_state()
    for mb, level in configs:
        full = trial_config(case, micro_batch=mb, level=level, grad_acc=effective // mb, max_length=max_length,
                            steps=steps, warmup=1, **({} if pad is None else {"pad_to_multiple_of": pad}))
        if pad is not None:  # named apart from the same configuration at the default multiple
            full = full.model_copy(update={"trial_id": f"{full.trial_id}_pad{pad}"})
        again = sum(r["config"].split("_run")[0] == full.trial_id for r in rows)
        if again:  # a configuration given again (run-to-run spread in one process): its own name
            full = full.model_copy(update={"trial_id": f"{full.trial_id}_run{again + 1}"})
        short = full.model_copy(update={"grad_acc": measure_grad_acc(full), "trial_id": full.trial_id + "-short"})
        lengths = LengthProfile.of(warm.tokenized_pairs(full)[1])
        shape = built_shape(full.model)
        predicted_gb = predict_peak_gb(short, device=planned_device(short), lengths=lengths, shape=shape).total_gb
        measured, _ = run(short, warm)
        timed, _ = run(full, warm)
        all_steps += [*measured.steps, *timed.steps]
        m, f = measured.result, timed.result
        ok = m.status == "ok" and f.status == "ok"

        def predicted(how: str):
            fit = fit_micro_steps(measured.steps, step_layout(short, lengths, shape).works, 1, how) if ok else None
            return extrapolate(fit, full, step_layout(full, lengths, shape)) if fit else None

        ratio, line = predicted("ratio"), predicted("line")
        row = shared_row(full, m, measured.steps, ran_grad_acc=short.grad_acc, measured_by=short.trial_id,
                         predicted_peak_gb=predicted_gb) if ok else None
        truth = f.step_time_ms if ok else math.nan
        rows.append({
            "config": full.trial_id, "status": f"{m.status}/{f.status}",
            "extrapolated_step_ms": row.step_time_ms if row else math.nan, "full_step_ms": truth,
            "error": row.step_time_ms / truth - 1 if row else math.nan,
            "extrapolation_error": row.extrapolation_error if row else math.nan,
            "interval_ms": f"{row.step_time_p10_ms:.0f}-{row.step_time_p90_ms:.0f}" if row else "",
            "full_p10_p90_ms": f"{f.step_time_p10_ms:.0f}-{f.step_time_p90_ms:.0f}",
            "ratio_step_ms": ratio.step_ms if ratio else math.nan,
            "ratio_error": ratio.step_ms / truth - 1 if ratio else math.nan,
            "line_step_ms": line.step_ms if line else math.nan, "line_error": line.step_ms / truth - 1 if line else math.nan,
            "short_peak_gb": m.peak_mem_gb, "full_peak_gb": f.peak_mem_gb, "predicted_peak_gb": predicted_gb,
        })
        write_csv(out_dir / "extrapolation.csv", rows)  # after each configuration: a cut-off run keeps its rows
        write_steps(out_dir / "extrapolation_steps", all_steps)
    return rows


def with_shape_flags(steps: list, cfg, lengths, multiple: int, seen: set) -> list:
    """``steps`` of ``cfg``'s trial with ``micro_new`` and ``micro_step_ms`` as the trainer now
    records them, for a steps.csv written before it did: a micro-step is new where its shape
    (rows, padded width; ``multiple``: the run's ``train.pad_to_multiple_of``) is not in ``seen``
    (the shapes the process ran before, in file order), which it joins."""
    import dataclasses
    import itertools

    from dpo_sweep.telemetry.timing import micro_and_optimizer_ms
    from dpo_sweep.core.order import micro_batch_order, padded_width, worst_case_order

    g = cfg.grad_acc
    order = list(itertools.islice(micro_batch_order(len(lengths.widths), cfg.micro_batch, 1, 0, cfg.train.seed,
                                                    grad_acc=g), cfg.train.steps * g))
    worst = list(worst_case_order(list(lengths.widths), cfg.micro_batch, 1, 0, grad_acc=g))
    out = []
    for s in steps:
        ms = [float(x) for x in s.micro_ms.split(",")]
        batches = worst[-len(ms):] if s.worst_case else order[(s.step - 1) * g:s.step * g]
        flags = []
        for idx in batches:
            shape = (2 * len(idx), padded_width(max(lengths.widths[i] for i in idx), multiple))
            flags.append(shape not in seen)
            seen.add(shape)
        micro, _ = micro_and_optimizer_ms([*ms, s.optimizer_ms], new=flags)
        out.append(dataclasses.replace(s, micro_step_ms=micro, micro_new="".join("1" if f else "0" for f in flags)))
    return out


def refit(case: Path, steps_csv: Path, max_length: int, pad: int = 1, out_csv: Path | None = None) -> list[dict]:
    """The extrapolations again from an earlier run's steps.csv (``extrapolate``'s or a sweep's), without a GPU:
    the case's data laid out here (``make --no-weights`` gives the same pairs for the same seed).
    ``planner_ms``: the planner's own (``plan.rows.fitted_step``) as it now reads the steps, with its
    ``extrapolation_error`` and the p10-p90 interval the row gets (``interval_ms``; ``holds_full``:
    the full run's median step inside it),
    first-of-their-shape micro-steps left out (:func:`with_shape_flags` where the file has no
    ``micro_new``; ``pad``: the run's ``train.pad_to_multiple_of``)."""
    from dpo_sweep.plan.extrapolate import FITS, extrapolate, fit_micro_steps, step_layout
    from dpo_sweep.plan.shape import built_shape
    from dpo_sweep.plan.rows import fitted_step
    from dpo_sweep.records import StepRecord, read_csv_rows, rows_as
    from dpo_sweep.telemetry.timing import percentile
    from dpo_sweep.core.lengths import LengthProfile
    from dpo_sweep.train.tokenizer import tokenized_pairs

    by_trial: dict[str, list] = {}
    for step in rows_as(StepRecord, read_csv_rows(steps_csv)):
        by_trial.setdefault(step.trial_id, []).append(step)

    def config(tid: str):
        """The configuration trial ``tid`` ran, as the file has it: its knobs from the id
        (``mb2_L1_ga16-short``, a sweep's ``t005_mb2_L1_ga16_b0.1-runoff``), its grad_acc and
        steps from its steps."""
        knobs = tid.split("-")[0].split("_")
        knobs = knobs[1:] if knobs[0][1:].isdigit() else knobs
        ran = by_trial[tid]
        return trial_config(case, micro_batch=int(knobs[0][2:]), level=knobs[1], grad_acc=int(ran[0].grad_acc),
                            max_length=max_length, steps=max(s.step for s in ran if not s.worst_case), warmup=1,
                            pad_to_multiple_of=pad)  # laid out at the run's multiple

    seen: set = set()
    for tid, trial_steps in by_trial.items():
        if not trial_steps[0].micro_new:
            cfg = config(tid)
            by_trial[tid] = with_shape_flags(trial_steps, cfg, LengthProfile.of(tokenized_pairs(cfg)[1]), pad, seen)
    # (full run, measure trial): extrapolate's <config> and <config>-short; a sweep's learning
    # trials and runoffs, which time the configuration its measure trial <id> extrapolated
    pairs = [(tid, tid + "-short") for tid in by_trial if tid + "-short" in by_trial]
    pairs += [(tid, tid.rsplit("-", 1)[0]) for tid in by_trial
              if tid.endswith(("-runoff", "-learning")) and tid.rsplit("-", 1)[0] in by_trial]
    rows = []
    for tid, short_id in pairs:
        full, short = config(tid), config(short_id)
        lengths, shape = LengthProfile.of(tokenized_pairs(full)[1]), built_shape(full.model)
        truth = statistics.median(s.step_time_ms for s in by_trial[tid] if s.measured and not s.worst_case)
        row = {"config": tid, "full_step_ms": truth}
        planner = fitted_step(by_trial[short_id], short.grad_acc, full.grad_acc)
        row["planner_ms"], row["planner_error"] = planner.step_ms, planner.step_ms / truth - 1
        # the row's p10-p90 as the planner writes it: the short run's, scaled, widened by its own error
        short_ms = [s.step_time_ms for s in by_trial[short_id] if s.measured and not s.worst_case]
        ratio, widen = planner.step_ms / statistics.median(short_ms), 1 + planner.rel_error
        low, high = percentile(short_ms, 10) * ratio / widen, percentile(short_ms, 90) * ratio * widen
        row["extrapolation_error"], row["interval_ms"] = planner.rel_error, f"{low:.0f}-{high:.0f}"
        row["holds_full"] = low <= truth <= high
        for how in FITS:
            fit = fit_micro_steps(by_trial[short_id], step_layout(short, lengths, shape).works, 1, how)
            ext = extrapolate(fit, full, step_layout(full, lengths, shape))
            row[f"{how}_ms"], row[f"{how}_error"] = ext.step_ms, ext.step_ms / truth - 1
        rows.append(row)
    table(rows)
    if out_csv:
        write_csv(out_csv, rows)
    return rows


def parse_configs(text: str, grad_acc: int | None = None) -> tuple:
    """``--configs 4:L1,4:full`` as (micro_batch, level) pairs, or with ``grad_acc`` as triples."""
    pairs = [(int(mb), level) for mb, level in (item.split(":") for item in text.split(",") if item)]
    return tuple(pairs if grad_acc is None else [(mb, level, grad_acc) for mb, level in pairs])


def extrapolation(case: Path, out_dir: Path, effective: int, max_length: int, steps: int,
                  configs=EXTRAPOLATION_CONFIGS, pad: int | None = None) -> None:
    rows = extrapolate_rows(case, effective, max_length, steps, configs, out_dir, pad)
    table(rows)
    write_csv(out_dir / "extrapolation.csv", rows)
    errs = [abs(r["error"]) for r in rows if math.isfinite(r["error"])]
    if errs:
        print(f"|extrapolated / full - 1|: median {statistics.median(errs):.1%}, max {max(errs):.1%} "
              f"over {len(errs)} configurations")


#: (micro_batch, level, grad_acc) of the memory check.
MEMORY_CONFIGS = tuple((mb, lv, 2) for mb in (1, 4) for lv in ("none", "L1", "L2", "full"))


def memory(case: Path, out_dir: Path, max_length: int, steps: int, configs=MEMORY_CONFIGS, ema: bool = False) -> None:
    """Predicted (the planner's memory model on the data's own lengths) vs measured peaks."""
    from dpo_sweep.plan.memory import predict_peak_gb
    from dpo_sweep.plan.shape import built_shape
    from dpo_sweep.core.trial_facts import planned_device
    from dpo_sweep.core.lengths import LengthProfile

    rows, warm = [], warm_state()
    for mb, level, ga in configs:
        extra = {"ema_decay": 0.99} if ema else {}
        cfg = trial_config(case, micro_batch=mb, level=level, grad_acc=ga, max_length=max_length, steps=steps,
                           warmup=1, **extra)
        lengths = LengthProfile.of(warm.tokenized_pairs(cfg)[1])
        est = predict_peak_gb(cfg, device=planned_device(cfg), lengths=lengths, shape=built_shape(cfg.model))
        out, _ = run(cfg, warm)
        r = out.result
        rows.append({"config": cfg.trial_id + ("_ema" if ema else ""), "status": r.status,
                     "predicted_gb": est.total_gb, "measured_gb": r.peak_mem_gb,
                     "error": est.total_gb / r.peak_mem_gb - 1 if r.status == "ok" else math.nan,
                     "torch_alloc_gb": r.torch_peak_alloc_gb, "peak_at": est.peak_at,
                     "activations_gb": est.activations_gb, "tokens": est.tokens})
        write_csv(out_dir / f"memory_{case.name}.csv", rows)
    table(rows)


def probe(case: Path, out_dir: Path, max_length: int, micro_batch: int) -> None:
    """What one forward of the worst-case micro-batch leaves saved for backward, and what its
    backward adds at its peak, at each checkpoint level, against the memory model's terms."""
    import torch

    from dpo_sweep.plan.memory import (GB, element_bytes, last_layer_bytes_per_token, model_saved_bytes_per_token)
    from dpo_sweep.plan.shape import built_shape
    from dpo_sweep.train.setup import autocast, build_trial, configure_device_memory, forward_inputs, load_data
    from dpo_sweep.core.trial_facts import planned_attention

    cuda = torch.cuda.is_available()
    # An indexed device: set_per_process_memory_fraction (configure_device_memory) refuses a bare "cuda".
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    allocated = torch.cuda.memory_allocated if cuda else (lambda: 0)
    peak = torch.cuda.max_memory_allocated if cuda else (lambda: 0)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    reset = torch.cuda.reset_peak_memory_stats if cuda else (lambda: None)
    rows, warm = [], warm_state()
    for level in ("none", "L1", "L2", "full"):
        cfg = trial_config(case, micro_batch=micro_batch, level=level, grad_acc=1, max_length=max_length, steps=1,
                           warmup=0)
        configure_device_memory(cfg, device)
        data = load_data(cfg, 1, lambda m: None, time.perf_counter(), warm)
        setup = build_trial(cfg, device, 1, 0, data, lambda m: None, time.perf_counter(), warm)
        batch = next(setup.worst_batches)
        has_padding = bool((batch.attention_mask == 0).any())
        gpu = batch.to(device)
        sync()
        base = allocated()
        reset()
        with autocast(cfg, device):
            logps, _ = setup.policy(*forward_inputs(gpu, has_padding))
        sync()
        saved = allocated() - base
        fwd_peak = peak() - base
        reset()
        logps.sum().backward()
        sync()
        bwd_peak = peak() - base
        s, b = built_shape(cfg.model), element_bytes(cfg.model, cfg.train.precision)
        tokens = batch.slots()
        kw = dict(lean=cfg.model.lean_ops, liger=setup.built.liger_kernel, attn=planned_attention(cfg.model.attn_implementation),
                  seq_len=batch.input_ids.shape[1])
        rows.append({"level": level, "tokens": tokens, "liger": setup.built.liger_kernel,
                     "attn": setup.built.attn_implementation,
                     "saved_gb": saved / GB, "model_saved_gb": tokens * model_saved_bytes_per_token(s, b, level, **kw) / GB,
                     "saved_bytes_per_token_layer": saved / tokens / s.n_layers,
                     "forward_peak_gb": fwd_peak / GB, "backward_peak_gb": bwd_peak / GB,
                     "model_last_layer_gb": tokens * last_layer_bytes_per_token(
                         s, b, **{k: v for k, v in kw.items() if k != "level"}) / GB})
        del setup, logps, gpu, data
        warm.release(device)
        write_csv(out_dir / f"probe_{case.name}_mb{micro_batch}.csv", rows)
    table(rows)


def sweep_space(case: Path, max_length: int, budget_gb: float, effective: int) -> str:
    """The user's 16-configuration sweep of the case: micro_batch 1-8 x none/L1/L2/full at one
    effective batch, ``budget_gb`` emulated (``resources.gpu_memory_gb``), precomputed reference."""
    return f"""# A real user's sweep (benchmarks/user_case.py sweep): the case's checkpoint folder and chat pairs.
name: user-case-{case.name}
model: {{name_or_path: {case / 'ckpt'}, dtype: bfloat16}}
data: {{path: {case / 'pairs.jsonl'}}}
train: {{steps: 4, warmup_steps: 1, max_length: {max_length}, precision: bf16, reference: precomputed}}
resources: {{workers_per_trial: 1, use_gpu: auto, gpu_memory_gb: {budget_gb:g}}}
search:
  micro_batch: [1, 2, 4, 8]
  checkpoint_level: [none, L1, L2, full]
  effective_batch: [{effective}]
  beta: [0.1]
"""


#: A progress line's ``| 1 min 05 s elapsed, ~3 min 10 s left``.
_PROGRESS = r"\| ([\d hmins]+?) elapsed, ~([\d hmins]+?|\?) left"


def _seconds(text: str) -> float:
    import re

    if text == "?":
        return math.nan
    units = {"h": 3600, "min": 60, "s": 1}
    return float(sum(int(n) * units[u] for n, u in re.findall(r"(\d+) (h|min|s)\b", text)))


def eta_rows(lines: list[tuple[float, str]], end_s: float) -> list[dict]:
    """Each progress line's estimate of what is left against what was left (``end_s``: the
    sweep's wall time; ``lines``: (seconds since the start, console line))."""
    import re

    rows = []
    for at, line in lines:
        if m := re.search(_PROGRESS, line):
            left = _seconds(m.group(2))
            rows.append({"at_s": round(at, 1), "elapsed_said_s": _seconds(m.group(1)), "eta_s": left,
                         "true_left_s": round(end_s - at, 1),
                         "error": (left / (end_s - at) - 1) if end_s > at and math.isfinite(left) else math.nan})
    return rows


def run_timestamped(cmd: list[str], timeout_s: float, grace_s: float = 60.0) -> tuple[int, list, float, bool]:
    """``cmd`` to its end, each output line printed and kept with its seconds since the start:
    (exit code, lines, wall seconds, whether it was stopped). Past ``timeout_s`` it gets a SIGINT,
    a Ctrl-C (a sweep stops as a user would stop it: rows kept, the resume command printed), then
    after ``grace_s`` a SIGTERM, then a SIGKILL."""
    import signal
    import subprocess
    import threading

    def default_sigint() -> None:
        # A command started from a background job inherits SIGINT ignored (a shell without job
        # control sets that), and Python then installs no KeyboardInterrupt: the Ctrl-C would be lost.
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    started, lines, stopped = time.monotonic(), [], threading.Event()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT,
                          preexec_fn=default_sigint) as proc:
        def stop() -> None:
            if proc.poll() is not None:
                return
            stopped.set()
            for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 20.0), (signal.SIGKILL, None)):
                proc.send_signal(sig)
                try:
                    proc.wait(timeout=wait_s)
                    return
                except subprocess.TimeoutExpired:
                    continue

        timer = threading.Timer(timeout_s, stop)
        timer.daemon = True
        timer.start()
        try:
            for line in proc.stdout:
                lines.append((time.monotonic() - started, line.rstrip()))
                print(f"[{lines[-1][0]:7.1f} s] {line.rstrip()}", flush=True)
        finally:
            rc = proc.wait()
            timer.cancel()
    return rc, lines, time.monotonic() - started, stopped.is_set()


def sweep(case: Path, out_dir: Path, max_length: int, budget_gb: float, effective: int, timeout_s: float) -> None:
    """``dpo-sweep run`` of :func:`sweep_space` in a subprocess, every console line timestamped:
    its wall time, and each ETA it printed against the truth (``eta.csv``); the results folder in
    ``out_dir/sweep``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    space = out_dir / "space.yaml"
    space.write_text(sweep_space(case, max_length, budget_gb, effective))
    cmd = [sys.executable, "-m", "dpo_sweep", "run", str(space), "--output", str(out_dir / "sweep"), "--no-dashboard"]
    rc, lines, wall, stopped = run_timestamped(cmd, timeout_s)
    (out_dir / "console.log").write_text("".join(f"[{at:7.1f} s] {text}\n" for at, text in lines))
    rows = eta_rows(lines, wall)
    if rows:
        write_csv(out_dir / "eta.csv", rows)
        table(rows)
    # From the end of the first minute on (of the command's wall time), while at least 30 s are left:
    # near the end a few seconds off read as a large share of what is left.
    late = [abs(r["error"]) for r in rows if r["at_s"] >= 60 and r["true_left_s"] >= 30 and math.isfinite(r["error"])]
    print(f"sweep: exit {rc}{f', stopped at its {timeout_s:.0f} s limit' if stopped else ''}, {wall:.0f} s; "
          "ETA from the first minute on, 30 s or more left: "
          + (f"max |error| {max(late):.0%} over {len(late)} lines" if late else "no such line"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=("make", "cost", "cost-process", "extrapolate", "memory", "probe", "refit", "sweep"))
    ap.add_argument("--dir", type=Path, help="the case's folder (make writes it)")
    ap.add_argument("--preset", help="cost: a preset on synthetic pairs instead of the case's folder")
    ap.add_argument("--arch", choices=sorted(ARCHS), default="qwen2-3b")
    ap.add_argument("--pairs", type=int, default=1500)
    ap.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of the lengths")
    ap.add_argument("--small", type=int, default=64, help="cost: the small data set's pairs")
    ap.add_argument("--repeats", type=int, default=3, help="cost: fresh processes per data set (median)")
    ap.add_argument("--data", choices=("all", "small"), help="cost-process (run by cost): which data set")
    ap.add_argument("--out-dir", type=Path, default=Path("benchmarks/results/user_case"))
    ap.add_argument("--max-length", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--effective-batch", type=int, default=32)
    ap.add_argument("--ema", action="store_true", help="memory: with train.ema_decay")
    ap.add_argument("--micro-batch", type=int, default=4, help="probe: the micro-batch")
    ap.add_argument("--configs", help="extrapolate / memory: MB:LEVEL,... instead of the built-in list "
                                      "(memory runs them at grad_acc 2)")
    ap.add_argument("--no-weights", action="store_true", help="make: config and tokenizer only (for refit)")
    ap.add_argument("--pad-multiple", type=int, help="extrapolate: train.pad_to_multiple_of (default: auto); "
                                                        "refit: the one the run had (default 1)")
    ap.add_argument("--steps-csv", type=Path, help="refit: an extrapolate run's extrapolation_steps/steps.csv, or a sweep's steps.csv")
    ap.add_argument("--budget-gb", type=float, default=48.0, help="sweep: the card emulated (resources.gpu_memory_gb)")
    ap.add_argument("--timeout-s", type=float, default=540.0, help="sweep: stop the sweep after this long")
    args = ap.parse_args(argv)
    if args.command == "make":
        make(args.arch, args.pairs, args.dir, sigma=args.sigma, weights=not args.no_weights)
    elif args.command == "refit":
        refit(args.dir, args.steps_csv, args.max_length, args.pad_multiple or 1, args.out_dir / "refit.csv")
    elif args.command == "cost":
        cost(args.dir, args.small, args.out_dir, args.max_length, args.steps, args.preset, args.pairs, args.repeats)
    elif args.command == "cost-process":
        rows = cost_process(args.dir, None if args.data == "all" else args.small, args.small, args.max_length,
                            args.steps, args.preset, args.pairs)
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "cost.json").write_text(json.dumps(rows))
    elif args.command == "extrapolate":
        extrapolation(args.dir, args.out_dir, args.effective_batch, args.max_length, args.steps,
                      parse_configs(args.configs) if args.configs else EXTRAPOLATION_CONFIGS, args.pad_multiple)
    elif args.command == "sweep":
        sweep(args.dir, args.out_dir, args.max_length, args.budget_gb, args.effective_batch, args.timeout_s)
    elif args.command == "probe":
        probe(args.dir, args.out_dir, args.max_length, args.micro_batch)
    else:
        memory(args.dir, args.out_dir, args.max_length, args.steps, ema=args.ema,
               configs=parse_configs(args.configs, grad_acc=2) if args.configs else MEMORY_CONFIGS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
