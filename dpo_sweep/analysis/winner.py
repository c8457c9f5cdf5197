"""The recommended configuration, ready to leave the tool: a space file with every setting pinned
(``DIR/recommended.yaml``, one trial for ``dpo-sweep validate`` and ``dpo-sweep trial``) and the
same setting as TRL ``DPOConfig`` arguments, with what TRL cannot express named.

The winner's full configuration is the sweep's own: DIR/space.yaml (the runner's copy) expanded
again, the trial found by id (or, for ids of another version, by its swept values). Settings that
a trial resolves at run time (``auto`` attention and liger-kernel) are pinned to what the winner's
row says it used.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from dpo_sweep import space as space_mod
from dpo_sweep.config import LORA_AUTO, TrialConfig
from dpo_sweep.errors import SpaceError
from dpo_sweep.files import write_text_atomic
from dpo_sweep.results_dir import ResultsDir

#: What each checkpoint level means in TRL terms: only ``none`` and ``full`` exist there.
_TRL_CHECKPOINTING = {"none": False, "full": True}


@dataclass(frozen=True)
class Winner:
    """The recommended trial's configuration and how to use it elsewhere."""

    trial: TrialConfig | None
    """The winner as a trial of DIR/space.yaml; None when it cannot be rebuilt (see ``note``)."""
    space_yaml: str = ""
    """recommended.yaml's text ("" without a trial)."""
    trl_arguments: dict[str, Any] = field(default_factory=dict)
    """``DPOConfig(**trl_arguments)``: the winner in TRL's terms."""
    trl_gaps: list[str] = field(default_factory=list)
    """Settings of the winner that DPOConfig cannot express, one sentence each."""
    note: str = ""
    """Why a recommended trial has no ``trial`` (no space.yaml, an unreadable one, no matching
    trial); empty when nothing was recommended."""


def _row_value(row: pd.Series, column: str) -> Any:
    value = row.get(column)
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def _ran_pad_multiple(row: pd.Series) -> int:
    """The width multiple the row's trial padded to (``pad_multiple``). Rows from before the
    column (0 or none) padded to their longest row: 1."""
    value = _row_value(row, "pad_multiple")
    return max(1, int(float(value))) if value is not None else 1


def _same(a: Any, b: Any) -> bool:
    """A results.csv cell (text, numpy) against a config value."""
    if isinstance(b, bool) or isinstance(a, bool):
        return str(a).lower() == str(b).lower()
    if isinstance(b, (int, float)) and not isinstance(b, bool):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9)
        except (TypeError, ValueError):
            return False
    return str(a) == str(b)


def find_trial(trials: tuple[TrialConfig, ...], row: pd.Series,
               renamed: dict[str, str] | None = None) -> TrialConfig | None:
    """The trial of ``row``: by id (``renamed``: an earlier version's ids of these trials, see
    space.Space.renamed), else the one whose knobs and swept train values it holds."""
    trial_id = str(row.get("trial_id"))
    trial_id = (renamed or {}).get(trial_id, trial_id)
    for t in trials:
        if t.trial_id == trial_id:
            return t
    matches = []
    for t in trials:
        values = {**t.knobs(), **t.swept_columns()}
        values.pop("model", None)  # a label, which other versions may spell differently
        if all(_row_value(row, k) is not None and _same(_row_value(row, k), v) for k, v in values.items()):
            matches.append(t)
    same_model = [t for t in matches if t.model.label() == str(row.get("model"))]
    return (same_model or matches or [None])[0]


def _resolved_model(trial: TrialConfig, row: pd.Series) -> dict[str, Any]:
    """The model section with ``auto`` replaced by what the winner ran with."""
    model = trial.model.model_dump(mode="json", exclude_none=True)
    attention = _row_value(row, "attn_implementation")
    if model.get("attn_implementation") == "auto" and attention in ("sdpa", "flash_attention_2", "eager"):
        model["attn_implementation"] = attention
    liger = _row_value(row, "liger_kernel")
    if model.get("liger_kernel") == "auto" and str(liger).lower() in ("true", "false"):
        model["liger_kernel"] = str(liger).lower() == "true"
    return model


def _resolved_train(trial: TrialConfig, row: pd.Series) -> dict[str, Any]:
    """The train section with ``pad_to_multiple_of: auto`` replaced by the multiple the winner ran with."""
    train = trial.train.model_dump(mode="json")
    if train["pad_to_multiple_of"] == "auto":
        train["pad_to_multiple_of"] = _ran_pad_multiple(row)
    return train


def pinned_space(trial: TrialConfig, row: pd.Series, objectives: dict[str, Any] | None = None) -> dict[str, Any]:
    """A space mapping whose one trial is ``trial``, every section written out in full."""
    raw = {
        "name": f"{trial.space_name}-recommended",
        "model": _resolved_model(trial, row),
        "data": trial.data.model_dump(mode="json", exclude_none=True),
        "train": _resolved_train(trial, row),
        "resources": trial.resources.model_dump(mode="json"),
        "search": {"micro_batch": [trial.micro_batch], "checkpoint_level": [trial.checkpoint_level],
                   "grad_acc": [trial.grad_acc], "beta": [trial.beta]},
    }
    if objectives:
        raw["objectives"] = objectives
    return raw


def space_text(raw: dict[str, Any], trial: TrialConfig, results_dir: Path) -> str:
    """recommended.yaml: a header with the commands, then the mapping."""
    path = ResultsDir(results_dir).recommended
    header = (f"# The recommended configuration of the sweep in {results_dir}: trial {trial.trial_id},\n"
              "# every setting pinned (one trial). Written by `dpo-sweep report`; the runtime choices\n"
              "# (attention, liger-kernel) are pinned to what the trial ran with.\n"
              f"# Check it only:      dpo-sweep validate {path}\n"
              f"# Run it once:        dpo-sweep trial {path}\n")
    return header + yaml.safe_dump(raw, sort_keys=False, default_flow_style=None, width=100)


def trl_config(trial: TrialConfig, row: pd.Series) -> tuple[dict[str, Any], list[str]]:
    """(DPOConfig keyword arguments, what TRL cannot express) for ``trial``."""
    t, model = trial.train, _resolved_model(trial, row)
    args: dict[str, Any] = {
        "per_device_train_batch_size": trial.micro_batch,
        "gradient_accumulation_steps": trial.grad_acc,
        "gradient_checkpointing": _TRL_CHECKPOINTING.get(trial.checkpoint_level, True),
        "beta": trial.beta,
        "loss_type": t.loss,
        "learning_rate": t.lr,
        "lr_scheduler_type": ("constant_with_warmup" if t.lr_schedule == "constant" and t.lr_warmup_steps
                              else t.lr_schedule),
        "warmup_steps": t.lr_warmup_steps,
        "weight_decay": t.weight_decay,
        "adam_beta1": t.adam_betas[0],
        "adam_beta2": t.adam_betas[1],
        "adam_epsilon": t.adam_eps,
        "max_grad_norm": 0.0 if t.max_grad_norm is None else t.max_grad_norm,
        "max_length": t.max_length,
        "max_steps": t.steps,
        "bf16": t.precision in ("bf16", "bf16-mixed"),
        "fp16": t.precision == "fp16",
        "precompute_ref_log_probs": t.reference == "precomputed",
        "seed": t.seed,
    }
    if t.label_smoothing:
        args["label_smoothing"] = t.label_smoothing
    if t.padding_free:
        args["padding_free"] = True
    elif (multiple := _ran_pad_multiple(row)) > 1:
        args["pad_to_multiple_of"] = multiple  # TRL's "auto" pads only on Neuron
    if t.group_by_length:
        args["group_by_length"] = True
    if t.dropout:  # TRL turns dropout off by default, as the trainer does
        args["disable_dropout"] = False
    if model.get("liger_kernel") is True:
        args["use_liger_kernel"] = True
    if t.optimizer in _TRL_OPTIM:
        args["optim"] = _TRL_OPTIM[t.optimizer]
    init = {"attn_implementation": model["attn_implementation"]} if model.get("attn_implementation") != "auto" else {}
    if t.precision == "bf16":
        init["torch_dtype"] = "bfloat16"  # pure bf16: the weights themselves, not only autocast
    if init:
        args["model_init_kwargs"] = init
    workers = trial.resources.workers_per_trial
    if workers > 1 and trial.resources.parallelism == "fsdp":
        args["fsdp"] = "full_shard"
    return args, _trl_gaps(trial, model)


#: transformers' names of torchao's low-bit AdamW (TrainingArguments.optim).
_TRL_OPTIM = {"adamw_8bit": "adamw_torch_8bit", "adamw_4bit": "adamw_torch_4bit"}


def _target_modules(trial: TrialConfig) -> list[str] | str:
    """peft's ``target_modules`` for the trial's ``lora_targets``: ``auto`` as the family's own names
    where the model's config can be read here, else peft's nearest, ``all-linear`` (which also adapts
    an MoE's routers and any other linear layer of the decoder)."""
    if trial.train.lora_targets != LORA_AUTO:
        return list(trial.train.lora_targets)
    try:
        from dpo_sweep.train.family import spec_family

        return list(spec_family(trial.model).linears)
    except Exception:  # noqa: BLE001 - a folder no longer there, a hub id not cached: peft's own rule
        return "all-linear"


def _peft_gap(trial: TrialConfig) -> str:
    """The adapter as DPOTrainer takes it: a peft config beside DPOConfig, not a field of it."""
    t = trial.train
    lora = (f"LoraConfig(r={t.lora_r}, lora_alpha={t.lora_alpha}, lora_dropout={t.lora_dropout}, "
            f"target_modules={_target_modules(trial)!r}, task_type='CAUSAL_LM')")
    text = (f"adapter {t.adapter}: pass DPOTrainer(..., peft_config={lora}); with a peft model and no "
            "ref_model TRL's reference is the model with its adapters off, as here")
    if t.adapter == "qlora":
        text += (". QLoRA's frozen base in 4-bit NF4 (torchao's NF4 here): with bitsandbytes, model_init_kwargs "
                 "quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4', "
                 "bnb_4bit_compute_dtype=torch.bfloat16)")
    return text


def _trl_gaps(trial: TrialConfig, model: dict[str, Any]) -> list[str]:
    t, gaps = trial.train, []
    if t.adapter != "full":
        gaps.append(_peft_gap(trial))
    if t.optimizer_in_backward:
        gaps.append("optimizer_in_backward: each parameter stepped in its gradient hook during backward; "
                    "the Trainer steps the optimizer after backward (more gradient memory)")
    if trial.checkpoint_level not in _TRL_CHECKPOINTING:
        gaps.append(f"checkpoint_level {trial.checkpoint_level}: TRL checkpoints whole decoder layers or "
                    "nothing (gradient_checkpointing True = level full); the selective levels L1-L3 need "
                    "dpo_sweep.train.checkpointing applied to the model before DPOTrainer wraps it. "
                    "gradient_checkpointing above is the nearest TRL setting (more recompute, less memory)")
    if model.get("lean_ops"):
        gaps.append("lean_ops: the memory-lean RMSNorm/SwiGLU autograd (dpo_sweep/train/lean.py) has no "
                    "TRL switch; without it activation memory is higher than measured here")
    if t.logp_chunk_tokens:
        gaps.append(f"logp_chunk_tokens {t.logp_chunk_tokens}: the chunked lm_head + log-softmax has no "
                    "DPOConfig field; TRL materialises the full-vocabulary logits (more memory)")
    if t.beta_schedule != "constant":
        gaps.append(f"beta_schedule {t.beta_schedule}: DPOConfig's beta is a constant")
    if t.adaptive_clip:
        gaps.append(f"adaptive_clip (window {t.adaptive_clip_window}): per-parameter P90 clipping needs a "
                    "custom optimizer step; TRL clips the total norm only (max_grad_norm)")
    if t.ema_decay is not None:
        gaps.append(f"ema_decay {t.ema_decay:g}: TRL keeps no moving average of the policy's weights")
    if t.grad_acc_schedule != "constant":
        gaps.append(f"grad_acc_schedule {t.grad_acc_schedule}: gradient_accumulation_steps is a constant in TRL")
    if t.padding_side != "right":
        gaps.append(f"padding_side {t.padding_side}: a tokenizer setting (tokenizer.padding_side), not DPOConfig's")
    workers = trial.resources.workers_per_trial
    if workers > 1:
        gaps.append(f"{workers} workers ({trial.resources.parallelism}): a launcher setting, e.g. "
                    f"`accelerate launch --num_processes {workers}`, not a DPOConfig field")
    return gaps


def trl_text(args: dict[str, Any], gaps: list[str], width: int = 100) -> str:
    """``DPOConfig(...)`` as Python, its arguments wrapped at ``width`` columns, then one
    ``# not in TRL:`` line per gap."""
    lines, line = [], "DPOConfig("
    for i, (key, value) in enumerate(args.items()):
        item = f"{key}={value!r}" + ("," if i < len(args) - 1 else ")")
        if len(line) + len(item) + 1 > width and line.strip() != "DPOConfig(":
            lines.append(line.rstrip())
            line = "          "
        line += item + " "
    lines.append(line.rstrip())
    return "\n".join(lines + [f"# not in TRL: {g}" for g in gaps])


def without_step_time(raw: dict[str, Any]) -> dict[str, Any]:
    """A results dir's space copy without ``objectives.step_time``, an objective of older versions
    that the analysis reads as throughput (and a space file to run refuses)."""
    objectives = raw.get("objectives")
    if isinstance(objectives, dict) and "step_time" in objectives:
        return {**raw, "objectives": {k: v for k, v in objectives.items() if k != "step_time"}}
    return raw


def winner_of(results_dir: Path, row: pd.Series | None, objectives: dict[str, Any] | None = None) -> Winner:
    """The winner of ``results_dir`` (``row``: its results row; None: nothing was recommended)."""
    if row is None:
        return Winner(None)
    path = ResultsDir(results_dir).space
    if not path.is_file():
        return Winner(None, note=f"{path} is absent ({ResultsDir.RESULTS} only), so the winner's other "
                      "settings are unknown")
    try:
        space = space_mod.parse(without_step_time(space_mod.load_raw(path)), str(path))
    except SpaceError as err:
        return Winner(None, note=f"{path} no longer validates, so the winner cannot be pinned: "
                      + str(err).splitlines()[-1].strip())
    trial = find_trial(space.trials, row, space.renamed)
    if trial is None:
        return Winner(None, note=f"no trial of {path} matches {row.get('trial_id')}: the space file changed")
    # Named as its row is (a folder of an earlier version numbered its ids by list position).
    trial = trial.model_copy(update={"trial_id": str(row.get("trial_id"))})
    if objectives and "step_time" in objectives:  # the older time objective, as the analysis read it
        objectives = {**without_step_time({"objectives": objectives})["objectives"], "throughput": "max"}
    args, gaps = trl_config(trial, row)
    text = space_text(pinned_space(trial, row, objectives), trial, results_dir)
    return Winner(trial, text, args, gaps)


def write_winner(results_dir: Path, winner: Winner) -> Path | None:
    """Write (or, with no winner, remove a stale) DIR/recommended.yaml; its path when written."""
    path = ResultsDir(results_dir).recommended
    if winner.trial is None:
        path.unlink(missing_ok=True)
        return None
    write_text_atomic(path, winner.space_yaml)
    return path

