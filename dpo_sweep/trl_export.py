"""The winner as TRL runs it: ``DPOConfig`` keyword arguments, a ``LoraConfig`` for the adapter, and
one ``# not in TRL`` note per setting the installed TRL cannot express, all in one
:class:`TrlExport` that recommendation.json holds (``"trl"``) and that the printed
``DPOConfig(...)`` text is made from.

What the export sets is what decides memory and speed as measured: batch and accumulation, the
checkpointing, the weights' dtype (``model_init_kwargs={"dtype": ...}``: transformers 5 reads
``dtype`` and drops ``torch_dtype``, and loads a checkpoint in its saved dtype without it), the
autocast, the reference, the padding multiple, the attention, the optimizer and the loss. Every such
field is written even at TRL's default, because TRL's defaults are not the sweep's (DPOConfig turns
checkpointing and bf16 on). What only served the measurement is left out and named in
``left_to_you``: the run's length (``max_steps``), the learning-rate schedule and warm-up (the sweep
measures at a constant rate; the user's own schedule stays theirs), output, logging and saving.

Field names are checked against :class:`dpo_sweep.trl_fields.TrlFields`: a deprecated field is
written under the name TRL gives instead, and a setting with no usable field becomes a note.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpo_sweep.config import LORA_AUTO, TrialConfig
from dpo_sweep.core.levels import Level
from dpo_sweep.errors import SpaceError
from dpo_sweep import trl_fields
from dpo_sweep.trl_fields import TrlFields

#: transformers' names of torchao's low-bit AdamW (TrainingArguments.optim).
TRL_OPTIM = {"adamw_8bit": "adamw_torch_8bit", "adamw_4bit": "adamw_torch_4bit"}
#: train.precision -> (bf16, fp16): TrainingArguments' autocast switches.
_AUTOCAST = {"fp32": (False, False), "bf16": (True, False), "bf16-mixed": (True, False), "fp16": (False, True)}
#: The weights' storage dtype the trainer uses for each precision (train/model.weight_dtype).
_WEIGHT_DTYPE = {"bf16": "bfloat16"}


@dataclass(frozen=True)
class TrlExport:
    """The winner in the installed TRL's terms (recommendation.json's ``"trl"``)."""

    dpo_config: dict[str, Any]
    """``DPOConfig(**dpo_config)``: every setting that decides memory and speed, TRL's field names."""
    peft_config: dict[str, Any] | None
    """``LoraConfig(**peft_config)`` passed as ``DPOTrainer(peft_config=...)``; None for a full fine-tune."""
    model: str | None
    """What to pass as ``DPOTrainer(model=...)``: the checkpoint the sweep trained (None for a preset,
    which has no folder)."""
    not_in_trl: tuple[str, ...]
    """Settings of the winner the installed TRL cannot express, one sentence each."""
    left_to_you: tuple[str, ...]
    """Settings deliberately left out (the run's length, schedule, output), one sentence each."""
    trl_version: str
    """The TRL whose fields these are; ``fields_from`` says whether it is installed here."""
    fields_from: str
    """``installed`` or ``recorded`` (the list kept with dpo-sweep; TRL is not installed here)."""

    def to_json(self) -> dict[str, Any]:
        return {"dpo_config": self.dpo_config, "peft_config": self.peft_config, "model": self.model,
                "not_in_trl": list(self.not_in_trl), "left_to_you": list(self.left_to_you),
                "trl_version": self.trl_version, "fields_from": self.fields_from}


def weight_dtype_name(trial: TrialConfig) -> str:
    """The dtype the trial's weights were stored in (train/model.weight_dtype, torch-free)."""
    return trial.model.dtype or _WEIGHT_DTYPE.get(trial.train.precision, "float32")


def build(trial: TrialConfig, model: dict[str, Any], pad_multiple: int, trl: TrlFields) -> TrlExport:
    """The export of ``trial`` as it ran: ``model`` its model section with ``auto`` resolved,
    ``pad_multiple`` the row width multiple it padded to."""
    wanted, notes = _wanted(trial, model, pad_multiple), []
    config: dict[str, Any] = {}
    for key, value in wanted.items():
        name = trl.current_name(key)
        if name is not None:
            config[name] = value
        else:
            notes.append(_missing_field_note(key, value, trl))
    notes.extend(g.text for g in gaps(trial, model, trl))
    return TrlExport(config, peft_config(trial), model.get("name_or_path"), tuple(notes),
                     tuple(_left_to_you(trial)), trl.version, "installed" if trl.installed else "recorded")


def _wanted(trial: TrialConfig, model: dict[str, Any], pad_multiple: int) -> dict[str, Any]:
    """The DPOConfig settings of ``trial`` under the names of the newest TRL they were written for;
    :func:`build` renames deprecated ones and turns unknown ones into notes."""
    t = trial.train
    bf16, fp16 = _AUTOCAST[t.precision]
    wanted: dict[str, Any] = {
        "per_device_train_batch_size": trial.micro_batch,
        "gradient_accumulation_steps": trial.grad_acc,
        "gradient_checkpointing": Level(trial.checkpoint_level).trl_level is Level.FULL,
        "beta": trial.beta,
        "loss_type": [t.loss],
        "learning_rate": t.lr,
        "weight_decay": t.weight_decay,
        "adam_beta1": t.adam_betas[0],
        "adam_beta2": t.adam_betas[1],
        "adam_epsilon": t.adam_eps,
        "max_grad_norm": 0.0 if t.max_grad_norm is None else t.max_grad_norm,
        "max_length": t.max_length,
        "bf16": bf16,
        "fp16": fp16,
        "precompute_ref_log_probs": t.reference == "precomputed",
        "pad_to_multiple_of": None if t.padding_free or pad_multiple <= 1 else pad_multiple,
        "seed": t.seed,
        # train.dropout: the model's own dropout kept (its masks are saved tensors); TRL's default: off
        "disable_dropout": not t.dropout,
    }
    if t.padding_free:
        wanted["padding_free"] = True
    if t.group_by_length:
        wanted["group_by_length"] = True
    if model.get("liger_kernel") is True:
        wanted["use_liger_kernel"] = True
    if t.optimizer in TRL_OPTIM:
        wanted["optim"] = TRL_OPTIM[t.optimizer]
    if model.get("trust_remote_code"):
        wanted["trust_remote_code"] = True
    if trial.resources.workers_per_trial > 1 and trial.resources.parallelism == "fsdp":
        wanted["fsdp"] = "full_shard"
    # dtype always: transformers 5 loads a checkpoint in its saved dtype unless told, and reads
    # `dtype` (a `torch_dtype` key is dropped)
    init = {"dtype": weight_dtype_name(trial)}
    if model.get("attn_implementation") not in (None, "auto"):
        init["attn_implementation"] = model["attn_implementation"]
    wanted["model_init_kwargs"] = init
    return wanted


def peft_config(trial: TrialConfig) -> dict[str, Any] | None:
    """peft's ``LoraConfig`` keyword arguments for a LoRA / QLoRA winner; None for a full fine-tune.
    With a peft model and no ``ref_model``, TRL's reference is the model with its adapters off, as here."""
    t = trial.train
    if t.adapter == "full":
        return None
    return {"r": t.lora_r, "lora_alpha": t.lora_alpha, "lora_dropout": t.lora_dropout,
            "target_modules": target_modules(trial), "task_type": "CAUSAL_LM"}


def target_modules(trial: TrialConfig) -> list[str] | str:
    """peft's ``target_modules`` for the trial's ``lora_targets``, as the trainer passes them
    (:func:`~dpo_sweep.models.family.peft_target_modules`: an MoE's paths in the layer) where the
    model's config can be read here; else the names listed, or for ``auto`` peft's nearest,
    ``all-linear`` (which also adapts an MoE's routers and any other linear layer of the decoder)."""
    try:
        from dpo_sweep.models.family import peft_target_modules, spec_family

        return peft_target_modules(spec_family(trial.model), trial.train.lora_targets)
    except Exception:  # noqa: BLE001 - a folder no longer there, a hub id not cached: peft's own rule
        return list(trial.train.lora_targets) if trial.train.lora_targets != LORA_AUTO else "all-linear"


def _missing_field_note(key: str, value: Any, trl: TrlFields) -> str:
    """Why a setting the winner ran with is not in the export."""
    if key == "use_liger_kernel":
        instead = trl.deprecated.get(key, "")
        return ("liger_kernel true: liger-kernel's fused RMSNorm/RoPE/SwiGLU; TRL "
                f"{trl.version} deprecates use_liger_kernel" + (f" and names {instead} instead (the Hub's "
                                                                "kernels, not liger-kernel)" if instead else "")
                + ": without liger-kernel, memory and speed differ from rows measured with it")
    if key in trl.unavailable:
        return f"{key}={value!r}: TRL {trl.version} has the field but ignores it (its help: temporarily unavailable)"
    if key in trl.deprecated:
        return f"{key}={value!r}: deprecated in TRL {trl.version}, with no field named in its place"
    return f"{key}={value!r}: TRL {trl.version}'s DPOConfig has no field {key}"


@dataclass(frozen=True)
class Gap:
    """A setting of a trial that TRL's DPOConfig does not express."""

    setting: str
    """The sweep's setting, e.g. ``checkpoint_level L2``."""
    text: str
    """The ``# not in TRL:`` sentence."""
    refuses_trl: bool
    """Whether a ``train.trainer: trl`` trial with it is refused: True where TRL would train something
    else (a schedule, a clip, a selective checkpoint); False where only the native trainer's own
    implementation differs (its lean autograd, its log-prob head, its truncation), which a trl
    trial simply runs without."""


def gaps(trial: TrialConfig, model: dict[str, Any], trl: TrlFields) -> list[Gap]:
    """Settings of the winner that no DPOConfig field expresses."""
    t, out = trial.train, []
    if t.adapter == "qlora":
        out.append(Gap("adapter qlora", "adapter qlora: the frozen base was held in 4-bit NF4 by torchao; in TRL, "
                       "model_init_kwargs quantization_config=BitsAndBytesConfig(load_in_4bit=True, "
                       "bnb_4bit_quant_type='nf4', bnb_4bit_compute_dtype=torch.bfloat16) is the nearest "
                       "(bitsandbytes, not measured here)", True))
    if t.optimizer_in_backward:
        out.append(Gap("optimizer_in_backward", "optimizer_in_backward: each parameter stepped in its gradient hook "
                       "during backward; the Trainer steps the optimizer after backward (more gradient memory)", True))
    if Level(trial.checkpoint_level).trl_level != trial.checkpoint_level:
        out.append(Gap(f"checkpoint_level {trial.checkpoint_level}",
                       f"checkpoint_level {trial.checkpoint_level}: TRL checkpoints whole decoder layers or "
                       "nothing; the selective levels L1-L3 need dpo_sweep.train.checkpointing applied to the model "
                       "before DPOTrainer wraps it; whole-layer checkpointing (level full) is the nearest TRL "
                       "setting (more recompute, less memory)", True))
    native = t.trainer == "native"  # a trl row was measured with TRL's own modules and head
    if model.get("lean_ops") and native:
        out.append(Gap("lean_ops", "lean_ops: the memory-lean RMSNorm/SwiGLU autograd (dpo_sweep/train/lean.py) has "
                       "no TRL switch; without it activation memory is higher than measured here", False))
    if trl.fused_lm_head and native:
        out.append(Gap("logp_chunk_tokens", f"logp_chunk_tokens {t.logp_chunk_tokens}: TRL {trl.version}'s "
                       "DPOTrainer computes log-probs through its own fused LM head (vocabulary tiles, no DPOConfig "
                       "field for their size); the head's memory differs from what was measured", False))
    elif t.logp_chunk_tokens and native:
        out.append(Gap("logp_chunk_tokens", f"logp_chunk_tokens {t.logp_chunk_tokens}: the chunked lm_head + "
                       f"log-softmax has no DPOConfig field; TRL {trl.version} materialises the full-vocabulary "
                       "logits (more memory)", False))
    out.append(Gap("truncation", "truncation: the sweep cuts a long prompt's start and keeps its end (then the "
                   f"responses' ends); TRL {trl.version} keeps a sequence's start and cuts its end (truncation_mode "
                   "keep_start), so pairs longer than max_length train on other tokens", False))
    if t.label_smoothing:
        out.append(Gap(f"label_smoothing {t.label_smoothing:g}", f"label_smoothing {t.label_smoothing:g}: "
                       "TRL's sigmoid loss ignores it (its label_smoothing serves the robust and exo_pair "
                       "losses, other maths)", True))
    if t.beta_schedule != "constant":
        out.append(Gap(f"beta_schedule {t.beta_schedule}", f"beta_schedule {t.beta_schedule}: DPOConfig's beta is "
                       "a constant", True))
    if t.adaptive_clip:
        out.append(Gap("adaptive_clip", f"adaptive_clip (window {t.adaptive_clip_window}): per-parameter P90 "
                       "clipping needs a custom optimizer step; TRL clips the total norm only (max_grad_norm)", True))
    if t.ema_decay is not None:
        out.append(Gap(f"ema_decay {t.ema_decay:g}", f"ema_decay {t.ema_decay:g}: TRL keeps no moving average of "
                       "the policy's weights", True))
    if t.grad_acc_schedule != "constant":
        out.append(Gap(f"grad_acc_schedule {t.grad_acc_schedule}", f"grad_acc_schedule {t.grad_acc_schedule}: "
                       "gradient_accumulation_steps is a constant in TRL", True))
    if t.padding_side != "right":
        out.append(Gap(f"padding_side {t.padding_side}", f"padding_side {t.padding_side}: a tokenizer setting "
                       "(tokenizer.padding_side), not DPOConfig's", True))
    workers = trial.resources.workers_per_trial
    if workers > 1:
        out.append(Gap(f"workers_per_trial {workers}", f"{workers} workers ({trial.resources.parallelism}): a "
                       f"launcher setting, e.g. `accelerate launch --num_processes {workers}`, not a DPOConfig "
                       "field", True))
    return out


def refusals(trial: TrialConfig, trl: TrlFields) -> list[str]:
    """Why ``trial`` cannot run as ``train.trainer: trl`` under ``trl``, one sentence each (empty:
    it can): its settings that TRL would train differently, and fields the export needs that this
    TRL lacks or ignores (``liger_kernel: true`` where TRL deprecates ``use_liger_kernel``: a trl
    trial runs as its export will, and the export writes no deprecated field; ``auto`` is off there)."""
    model = trial.model.model_dump(mode="json")
    wanted = _wanted(trial, model, 1)
    missing = [_missing_field_note(k, v, trl) for k, v in wanted.items() if trl.current_name(k) is None]
    return missing + [g.text for g in gaps(trial, model, trl) if g.refuses_trl]


def _left_to_you(trial: TrialConfig) -> list[str]:
    t = trial.train
    return [f"the run's length (num_train_epochs or max_steps): the sweep ran {t.steps} steps to measure",
            "the learning-rate schedule and warm-up (lr_scheduler_type, warmup_steps): the sweep measured at "
            "a constant rate; memory and speed do not depend on them",
            "output_dir, logging, saving and evaluation"]


def text(export: TrlExport, width: int = 100) -> str:
    """The export as Python to paste: a comment naming the TRL version, ``peft_config =
    LoraConfig(...)`` (with an adapter), then ``DPOConfig(...)`` wrapped at ``width`` columns, then
    one ``# not in TRL:`` line per note and one ``# yours to set:`` line per setting left out."""
    source = "installed here" if export.fields_from == "installed" else "the list recorded with dpo-sweep"
    lines = [f"# TRL {export.trl_version}'s field names ({source}); DPOTrainer(model={export.model!r}, args=..., "
             "peft_config=peft_config)" if export.peft_config is not None else
             f"# TRL {export.trl_version}'s field names ({source}); DPOTrainer(model={export.model!r}, args=...)"]
    if export.peft_config is not None:
        lines += _call("peft_config = LoraConfig", export.peft_config, width)
    lines += _call("DPOConfig", export.dpo_config, width)
    return "\n".join(lines + [f"# not in TRL: {g}" for g in export.not_in_trl]
                     + [f"# yours to set: {g}" for g in export.left_to_you])


def _call(head: str, args: dict[str, Any], width: int) -> list[str]:
    lines, line, indent = [], f"{head}(", " " * (len(head) + 1)
    for i, (key, value) in enumerate(args.items()):
        item = f"{key}={value!r}" + ("," if i < len(args) - 1 else ")")
        if len(line) + len(item) + 1 > width and line.strip() != f"{head}(":
            lines.append(line.rstrip())
            line = indent
        line += item + " "
    if not args:
        line += ")"
    lines.append(line.rstrip())
    return lines


class SpaceCheck:
    """Finds the ``train.trainer: trl`` trials that TRL cannot run as configured (they are skipped)
    and refuses a space of nothing else, every reason of every such trial in one message; reads TRL's
    fields once, at the first such trial (importing TRL takes seconds)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.fields: TrlFields | None = None
        self.refused: dict[str, list[str]] = {}  # reason -> the trials it refuses

    def check(self, trial: TrialConfig) -> list[str]:
        """Why ``trial`` cannot run in TRL (empty: it can, or it is a native trial)."""
        if trial.train.trainer != "trl":
            return []
        if self.fields is None:
            missing = trl_fields.trainer_refusal()
            if missing:
                raise SpaceError(f"{self.source}: {missing}")
            self.fields = trl_fields.from_installed()
        reasons = refusals(trial, self.fields)
        for reason in reasons:
            self.refused.setdefault(reason, []).append(trial.trial_id)
        return [f"train.trainer trl cannot run it in TRL {self.fields.version}: {r}" for r in reasons]

    def raise_if_refused(self) -> None:
        if not self.refused:
            return
        version = self.fields.version if self.fields is not None else "?"
        reasons = "; ".join(f"{reason} (trial {', '.join(ids[:2])}{' and more' if len(ids) > 2 else ''})"
                            for reason, ids in self.refused.items())
        raise SpaceError(f"{self.source}: train.trainer trl cannot run {len(self.refused)} setting(s) in TRL "
                         f"{version}: {reasons}. Change them, or sweep these settings with trainer: native only")
