"""Typed configuration: the search-space file's sections and one resolved trial.

Every field carries a short doc and says what it can change (``json_schema_extra=affects(...)``:
peak memory and step time, the loss trajectory; :mod:`dpo_sweep.field_effects`); cross-field
checks live in the model validators, refusals of combinations in :mod:`dpo_sweep.refusals`. The
train section and the resolved trial are here, the other sections in :mod:`dpo_sweep.sections`
(imported here too). The search space file (``search_spaces/*.yaml``) is parsed into
:class:`dpo_sweep.space.SweepSpace`; each point of its search grid becomes one
:class:`TrialConfig`, which is all a trainer worker needs.
"""
from __future__ import annotations

from typing import Any, Iterable, Literal, get_args

from pydantic import Field, model_validator

from dpo_sweep.core.dimensions import CARRIED_TRAIN_FIELDS, DIMENSIONS, TRAIN_COLUMNS, Memory, value_at

from dpo_sweep.field_effects import affects
from dpo_sweep.results_dir import ResultsDir
from dpo_sweep.sections import (MODEL_PRESETS, DataSpec, ModelPreset, ModelSpec,  # noqa: F401 (imported from here)
                                ObjectivesSpec, ResourcesSpec, SamplerSpec, SCHEDULER_KEY, SchedulerSpec, SyntheticData,
                                scheduler_of, _Strict)

#: From most activations kept to fewest (none > L1 > L2 >= L3 > full): the order the planner prunes
#: weaker levels in after an OOM (core/levels.py: Level.memory_rank) and the tables list them in.
CheckpointLevel = Literal["none", "L1", "L2", "L3", "full"]
CHECKPOINT_LEVELS: tuple[str, ...] = get_args(CheckpointLevel)
Adapter = Literal["full", "lora", "qlora"]
OptimizerName = Literal["adamw", "adamw_8bit", "adamw_4bit"]
#: The decoder's linear layers (Llama/Qwen2/Mistral names) that LoRA adapts by default: all of
#: them, never the lm_head (its weight is the chunked head's, frozen: train/logprobs.py).
DEFAULT_LORA_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                         "down_proj")
#: ``train.lora_targets: auto``: the model family's own linear layers (models/family.py).
LORA_AUTO: tuple[str, ...] = ("auto",)
LossType = Literal["sigmoid", "ipo", "hinge"]
LOSS_TYPES: tuple[str, ...] = get_args(LossType)
Precision = Literal["fp32", "bf16", "bf16-mixed", "fp16"]
#: ``auto`` or a Precision, one flat Literal (a union of two would report two errors for one typo).
LearningPrecision = Literal["auto", "fp32", "bf16", "bf16-mixed", "fp16"]
#: A learning trial's steps when ``train.learning_steps`` is null: max(train.steps, this). stability.py's
#: rollback trigger needs 5 consecutive steps of log-ratio std > 1.5 and a verdict needs 5 steps; the
#: trigger fires after several steps and a random-init model's loss stays at ln 2 until the synthetic
#: pairs repeat, so 5 steps show neither (benchmarks/README.md#stability-thresholds).
DEFAULT_LEARNING_STEPS = 16


class TrainSpec(_Strict):
    """How each trial trains. Fields named here can also be swept under ``search:``."""

    steps: int = Field(6, ge=1, description="Optimizer steps per trial.",
                       json_schema_extra=affects(Memory.NONE, learning=True,
                                                 why="the measurement's own step count decides"))
    trainer: Literal["native", "trl"] = Field(
        "native",
        description="native: dpo-sweep's own DPO trainer; trl: TRL's DPOTrainer (pip install "
        "'dpo-sweep[trl]', TRL >= 1.16) on the same model, pairs, precision, reference, adapter and "
        "padding, measured by the same sampler and step timer (docs/trainer.md). Settings TRL cannot "
        "express (checkpoint levels L1-L3, schedules of beta or grad_acc, ...) are refused with trl.",
        json_schema_extra=affects(Memory.CHANGES, learning=False),
    )
    warmup_steps: int = Field(
        2, ge=0, description="Steps left out of the time/memory medians (not an LR warm-up).",
        json_schema_extra=affects(Memory.CHANGES, learning=True,
                                  why="how the measurement is taken"),
    )
    lr: float = Field(5.0e-6, gt=0, description="Peak AdamW learning rate.",
                      json_schema_extra=affects(Memory.NONE, learning=True))
    lr_warmup_steps: int = Field(0, ge=0, description="Linear LR warm-up from 0 over this many steps.",
                                 json_schema_extra=affects(Memory.NONE, learning=True))
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="LR after warm-up: constant, or decay to 0 at the last step.",
        json_schema_extra=affects(Memory.NONE, learning=True),
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.",
                                json_schema_extra=affects(Memory.NONE, learning=True))
    adam_betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.",
                                            json_schema_extra=affects(Memory.NONE, learning=True))
    adam_eps: float = Field(1e-8, gt=0, description="AdamW epsilon.",
                            json_schema_extra=affects(Memory.NONE, learning=True))
    max_grad_norm: float | None = Field(
        1.0, description="Clip the total gradient norm to this (null: no clipping).",
        json_schema_extra=affects(Memory.NONE, learning=True,
                                  why="the norm is computed either way"),
    )
    max_length: int = Field(256, ge=8, description="Tokens per sequence (prompt + response).",
                            json_schema_extra=affects(Memory.GROWS, learning=True))
    loss: LossType = Field("sigmoid", description="DPO loss type: sigmoid, ipo or hinge.",
                           json_schema_extra=affects(Memory.NONE, learning=True))
    label_smoothing: float = Field(
        0.0, ge=0.0, lt=0.5,
        description="Conservative DPO (cDPO) label smoothing, sigmoid loss only (refused with ipo "
        "or hinge). TRL's sigmoid ignores this field: compare with TRL at 0.",
        json_schema_extra=affects(Memory.NONE, learning=True),
    )
    precision: Precision = Field(
        "bf16",
        description="fp32 | bf16 (weights, grads, AdamW state in bf16) | bf16-mixed (fp32 master, "
        "bf16 autocast) | fp16 (fp32 master, fp16 autocast, GradScaler).",
        json_schema_extra=affects(Memory.CHANGES, learning=True),
    )
    reference: Literal["live", "precomputed"] = Field(
        "live",
        description="live: a frozen copy of the policy runs every step; precomputed: reference "
        "log-probs computed once before training by the untrained policy (no reference copy).",
        json_schema_extra=affects(Memory.CHANGES, learning=True),
    )
    logp_chunk_tokens: int = Field(
        1024, ge=0,
        description="Tokens per chunk of the lm_head + log-softmax (recomputed in backward); "
        "0 = naive full-vocabulary logits for the whole batch.",
        json_schema_extra=affects(Memory.CHANGES, learning=False),
    )
    beta_schedule: Literal["constant", "seed"] = Field(
        "constant",
        description="constant: beta every step; seed: the DPO-stability article's schedule "
        "(0.1 -> 0.3 over the first 10% of steps, 0.2 + 0.1 cos(2 pi step / steps), 0.15 for the "
        "last 5%), scaled by beta / 0.1 (train/knobs.py).",
        json_schema_extra=affects(Memory.CHANGES, learning=True),
    )
    adaptive_clip: bool = Field(
        False, description="Clip each parameter's gradient at the P90 of its own norms over the last "
        "adaptive_clip_window steps (before the max_grad_norm clip).",
        json_schema_extra=affects(Memory.CHANGES, learning=True),
    )
    adaptive_clip_window: int = Field(20, ge=2, description="Steps of gradient-norm history per parameter.",
                                      json_schema_extra=affects(Memory.CHANGES, learning=True))
    ema_decay: float | None = Field(
        None, gt=0, lt=1,
        description="Exponential moving average of the weights (e.g. 0.99), updated every step; the "
        "averaged weights are the trial's final weights (eval_loss). null: no EMA.",
        json_schema_extra=affects(Memory.CHANGES, learning=True),
    )
    grad_acc_schedule: Literal["constant", "seed"] = Field(
        "constant",
        description="constant: grad_acc every step; seed: grad_acc until KL is stable, then grad_acc/2, "
        "grad_acc/8 for the last 10% of steps (32, 16, 4 at grad_acc 32).",
        json_schema_extra=affects(Memory.CHANGES, learning=True),
    )
    padding_side: Literal["right", "left"] = Field("right", description="Where batches are padded.",
                                                   json_schema_extra=affects(Memory.CHANGES, learning=False))
    pad_to_multiple_of: int | Literal["auto"] = Field(
        "auto",
        description="Round the width of a micro-batch that has padding up to a multiple of this many "
        "tokens (rows all of one length stay as they are; padding_free packs without padding). auto: 64 (at most max_length) on CUDA, 1 (the batch's "
        "longest row) on the CPU. On CUDA sdpa's cuDNN attention builds a plan for each new row width: on the H200 a "
        "micro-step of a width not seen before took ~200 ms more (a 3B model at micro_batch 1, "
        "~300 ms a micro-step), so on long-tailed lengths nearly every micro-step paid it; 64 bounds "
        "the widths at max_length / 64. TRL: DPOConfig(pad_to_multiple_of=...).",
        json_schema_extra=affects(Memory.CHANGES, learning=False),
    )
    group_by_length: bool = Field(
        False,
        description="Cut each epoch's pairs, sorted by length, into effective batches and shuffle "
        "their order: micro-batches of similar length, less padding. Deterministic by seed; every "
        "split of the same effective batch still sees the same pairs per step.",
        json_schema_extra=affects(Memory.CHANGES, learning=False),
    )
    padding_free: bool = Field(
        False,
        description="Pack the chosen and rejected sequences of a micro-batch into one row without "
        "padding (position_ids restart per sequence; transformers masks across sequences).",
        json_schema_extra=affects(Memory.CHANGES, learning=False),
    )
    worst_case_step: bool = Field(
        True,
        description="After the steps, run one more step on the longest pairs (two micro-steps, the "
        "longest micro-batch the run can meet last, while the first one's gradients are alive): its "
        "peak is peak_mem_gb; it is left out of step times, tokens/s and the loss statistics.",
        json_schema_extra=affects(Memory.CHANGES, learning=False),
    )
    evaluate: bool = Field(
        True,
        description="After the steps, the final weights' DPO loss on a held batch (eval_loss). The "
        "planner turns it off in the trials that only time or measure a configuration, whose rows "
        "take eval_loss from their learning trial.",
        json_schema_extra=affects(Memory.NONE, learning=False,
                                  why="the held batch runs after the timed steps"),
    )
    eval_steps: int | None = Field(
        None, ge=1,
        description="With data.eval_pairs: a learning trial scores the held-out split every this many "
        "steps and after its last (the rungs search.scheduler compares). null: 4 points, every "
        "ceil(steps / 4) steps.",
        json_schema_extra=affects(Memory.NONE, learning=False, why="the held-out split is scored between steps"),
    )
    learning_steps: int | None = Field(
        None, ge=1,
        description="Optimizer steps of the planner's learning trials (<trial_id>-learning), which give "
        "every row its stability columns. null: max(steps, DEFAULT_LEARNING_STEPS = 16).",
        json_schema_extra=affects(Memory.NONE, learning=True,
                                  why="a learning trial's configuration carries the resolved value"),
    )
    learning_precision: LearningPrecision = Field(
        "auto",
        description="Precision of the planner's learning trials. auto: pure bf16 becomes bf16-mixed "
        "(fp32 master weights and AdamW state, bf16 autocast: updates of lr ~1e-5 round away in pure "
        "bf16), any other precision stays.",
        json_schema_extra=affects(Memory.NONE, learning=True,
                                  why="a learning trial's configuration carries the resolved value"),
    )
    adapter: Adapter = Field(
        "full",
        description="full: every weight trained; lora: peft LoRA adapters on lora_targets, the base "
        "frozen, the reference the same model with its adapters disabled (no copy); qlora: lora on a "
        "base whose decoder linear weights are torchao NF4 (4-bit), compute in bf16 (CUDA only).",
        json_schema_extra=affects(Memory.CHANGES, learning=True),
    )
    lora_r: int = Field(16, ge=1, description="LoRA rank (adapter: lora or qlora).",
                        json_schema_extra=affects(Memory.CHANGES, learning=True))
    lora_alpha: float = Field(32.0, gt=0, description="LoRA scale numerator: updates scaled by alpha / r.",
                              json_schema_extra=affects(Memory.CHANGES, learning=True,
                                                        why="conservative: a scale only"))
    lora_dropout: float = Field(
        0.0, ge=0.0, lt=1.0,
        description="Dropout on each adapter's input (0: none, and no extra saved tensor per target).",
        json_schema_extra=affects(Memory.CHANGES, learning=True),
    )
    lora_targets: tuple[str, ...] = Field(
        LORA_AUTO, min_length=1,
        description="Module names that get adapters (peft target_modules). auto: the model family's own "
        "linear layers of attention and MLP (Llama: q/k/v/o_proj, gate/up/down_proj; Phi-3: qkv_proj, "
        "o_proj, gate_up_proj, down_proj; GPT-NeoX: query_key_value, dense, dense_h_to_4h, dense_4h_to_h; "
        "GPT-2: c_attn, c_proj, c_fc), never the lm_head, routers or 3-D expert weights "
        "(docs/trainer.md's family table).",
        json_schema_extra=affects(Memory.CHANGES, learning=True),
    )
    optimizer_in_backward: bool = Field(
        False,
        description="Step each parameter in its post-accumulate-grad hook, so gradients are never all "
        "alive at once. Needs grad_acc 1, max_grad_norm null, no adaptive_clip, no fp16 loss scaling, "
        "one worker; the step's grad_norm is still reported.",
        json_schema_extra=affects(Memory.CHANGES, learning=False),
    )
    optimizer: OptimizerName = Field(
        "adamw",
        description="adamw: torch AdamW (fused on CUDA); adamw_8bit / adamw_4bit: torchao's low-bit "
        "AdamW (states in 8 or 4 bits, blockwise scaled; CUDA only).",
        json_schema_extra=affects(Memory.CHANGES, learning=True),
    )
    dropout: bool = Field(
        False,
        description="false: every dropout of the policy and the reference is off (nn.Dropout modules and the "
        "attention dropout the checkpoint's config sets), as TRL's DPOConfig(disable_dropout=True), so "
        "policy and reference agree at step 1; lora_dropout stays as set. true: the policy keeps the "
        "checkpoint's dropout (TRL: disable_dropout=False).",
        json_schema_extra=affects(Memory.CHANGES, learning=True,
                                  why="dropout's masks are saved tensors"),
    )
    seed: int = Field(0, description="Seed for weights, data order and dropout.",
                      json_schema_extra=affects(Memory.CHANGES, learning=True,
                                                why="the data order sets which pairs share a padded "
                                                "micro-batch (not on fixed-length synthetic pairs)"))
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when available.",
                                                   json_schema_extra=affects(Memory.CHANGES, learning=True))

    @model_validator(mode="before")
    @classmethod
    def _lora_auto(cls, data: Any) -> Any:
        # ``lora_targets: auto`` in a space file is a string; the field holds names.
        if isinstance(data, dict) and data.get("lora_targets") == "auto":
            data = {**data, "lora_targets": LORA_AUTO}
        return data

    @model_validator(mode="after")
    def _check(self) -> TrainSpec:
        if self.warmup_steps >= self.steps:
            raise ValueError(
                f"train.warmup_steps ({self.warmup_steps}) must be smaller than train.steps "
                f"({self.steps}): at least one step must be measured"
            )
        if "auto" in self.lora_targets and self.lora_targets != LORA_AUTO:
            raise ValueError(f"train.lora_targets {list(self.lora_targets)}: auto stands alone (the family's own "
                             "linear layers), or list module names without it")
        if {"lm_head", "embed_tokens"} & set(self.lora_targets):
            raise ValueError(
                f"train.lora_targets {list(self.lora_targets)}: lm_head and embed_tokens cannot take "
                "adapters (the chunked log-prob head reads the lm_head weight itself); list decoder "
                f"linear layers, e.g. {', '.join(DEFAULT_LORA_TARGETS)}"
            )
        if self.pad_to_multiple_of != "auto" and not 1 <= self.pad_to_multiple_of <= self.max_length:
            raise ValueError(
                f"train.pad_to_multiple_of ({self.pad_to_multiple_of}) must be auto or a whole number "
                f"from 1 (no rounding) to train.max_length ({self.max_length}); 64 suits CUDA"
            )
        if self.label_smoothing and self.loss != "sigmoid":
            raise ValueError(
                f"train.label_smoothing ({self.label_smoothing}) is only used by loss: sigmoid "
                f"(conservative DPO); loss: {self.loss} would ignore it: set label_smoothing: 0 "
                "or loss: sigmoid"
            )
        return self

    def learning_steps_resolved(self) -> int:
        """The steps a learning trial runs (``learning_steps``, null: see DEFAULT_LEARNING_STEPS)."""
        return self.learning_steps if self.learning_steps is not None else max(self.steps, DEFAULT_LEARNING_STEPS)

    def eval_every(self) -> int:
        """Steps between held-out eval points (``eval_steps``; null: a quarter of the steps)."""
        return self.eval_steps or max(1, -(-self.steps // 4))

    def learning_precision_resolved(self) -> Precision:
        """The precision a learning trial runs in (``learning_precision``; auto: bf16 -> bf16-mixed)."""
        if self.learning_precision != "auto":
            return self.learning_precision
        return "bf16-mixed" if self.precision == "bf16" else self.precision


class TrialConfig(_Strict):
    """One fully resolved point of the search: everything a trial worker needs."""

    space_name: str = Field("trial", description="Name of the space the trial comes from.",
                            json_schema_extra=affects(Memory.NONE, learning=False))
    trial_id: str = Field("trial-0000", description="Unique id inside its sweep.",
                          json_schema_extra=affects(Memory.NONE, learning=False))
    model: ModelSpec
    data: DataSpec = Field(json_schema_extra=affects(
        Memory.CHANGES, learning=True, why="sequence lengths and padding (synthetic seeds too: conservative)"))
    train: TrainSpec
    resources: ResourcesSpec = ResourcesSpec()
    micro_batch: int = Field(1, ge=1, description="Pairs per forward/backward on one worker.",
                             json_schema_extra=affects(Memory.GROWS, learning=False,
                                                       why="the loss trajectory through the effective batch only"))
    grad_acc: int = Field(1, ge=1, description="Micro-batches accumulated per optimizer step.",
                          json_schema_extra=affects(Memory.ACCUMULATES, learning=False,
                                                    why="the loss trajectory through the effective batch only"))
    checkpoint_level: CheckpointLevel = Field("none", json_schema_extra=affects(Memory.GROWS, learning=False))
    beta: float = Field(0.1, gt=0, description="DPO beta (strength of the KL anchor).",
                        json_schema_extra=affects(Memory.NONE, learning=True))
    swept_train: tuple[str, ...] = Field(
        (), description=f"The train fields listed under search: ({ResultsDir.RESULTS} columns of their own).",
        json_schema_extra=affects(Memory.NONE, learning=False),
    )

    def effective_batch(self) -> int:
        """Pairs per optimizer step over all workers."""
        return self.micro_batch * self.grad_acc * self.resources.workers_per_trial

    def knobs(self) -> dict[str, Any]:
        """The settings that identify this trial in tables and results.csv, by column: the model,
        seq_len, the four knobs, the resource dimensions and the effective batch
        (:data:`dpo_sweep.core.dimensions.CONFIG_COLUMNS`)."""
        tree = self.model_dump(include={"micro_batch", "checkpoint_level", "grad_acc", "beta", "resources"})
        values = {d.column: value_at(tree, d.path) for d in DIMENSIONS if d.path and d.path[0] in tree}
        return {"model": self.model.label(), "seq_len": self.train.max_length, **values,
                "effective_batch": self.effective_batch()}

    def swept_columns(self) -> dict[str, Any]:
        """results.csv columns of the swept train fields that no fixed column carries already."""
        return {TRAIN_COLUMNS.get(name, name): getattr(self.train, name)
                for name in self.swept_train if name not in CARRIED_TRAIN_FIELDS}


def distinct_models(trials: Iterable[TrialConfig]) -> list[ModelSpec]:
    """The different models of ``trials``, in order of first appearance (equal specs are one)."""
    return list({t.model.model_dump_json(): t.model for t in trials}.values())
