"""The space file's sections besides ``train``: which model, which pairs, which points of the
grid, what each trial runs on and what the frontier weighs. Each field says what it can change
(``json_schema_extra=affects(...)``, :mod:`dpo_sweep.field_effects`). Imported through
:mod:`dpo_sweep.config`, with the train section and the resolved trial."""
from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dpo_sweep import migrate
from dpo_sweep.core.dimensions import Memory
from dpo_sweep.field_effects import affects


ModelPreset = Literal["tiny-llama", "llama-3.2-1b", "llama-3-8b", "qwen2-7b"]
MODEL_PRESETS: tuple[str, ...] = get_args(ModelPreset)


class _Strict(BaseModel):
    """Unknown keys are errors: a typo in a space file must not be silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    """Which model to train: a random-initialised preset, or a real checkpoint."""

    preset: ModelPreset | None = Field(
        None, description="Build a random-initialised model of this shape (no download).",
        json_schema_extra=affects(Memory.CHANGES, learning=True),
    )
    name_or_path: str | None = Field(
        None, description="Local directory or hub id of a real checkpoint and its tokenizer.",
        json_schema_extra=affects(Memory.CHANGES, learning=True),
    )
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None,
        description="Storage dtype of the weights. Default: derived from train.precision "
        "(bf16 -> bfloat16, otherwise float32 master weights).",
        json_schema_extra=affects(Memory.CHANGES, learning=True),
    )
    attn_implementation: Literal["auto", "sdpa", "flash_attention_2", "eager"] = Field(
        "auto", description="auto: the one the checkpoint's config.json names where it can run, else the "
        "fastest the model supports: flash_attention_2 when flash-attn imports on a GPU, then sdpa, then eager. "
        "One the model does not support is refused; eager is refused with checkpoint levels L2/L3 "
        "(see refused_attention).",
        json_schema_extra=affects(Memory.CHANGES, learning=False),
    )
    liger_kernel: Literal["auto", True, False] = Field(
        "auto",
        description="liger-kernel's fused Triton RMSNorm/RoPE (and SwiGLU when lean_ops is off) for "
        "Llama/Qwen2 models. auto: on when CUDA is in use and liger-kernel imports; never on CPU.",
        json_schema_extra=affects(Memory.CHANGES, learning=False),
    )
    lean_ops: bool = Field(
        True,
        description="Memory-lean autograd for RMSNorm and SwiGLU MLPs (same maths, fewer saved "
        "tensors; see dpo_sweep/train/lean.py). false: the stock modules.",
        json_schema_extra=affects(Memory.CHANGES, learning=False),
    )
    trust_remote_code: bool = Field(False, description="Allow custom modelling code from the checkpoint.",
                                    json_schema_extra=affects(Memory.CHANGES, learning=False))

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.preset is None) == (self.name_or_path is None):
            raise ValueError(
                "give exactly one of model.preset (one of: " + ", ".join(MODEL_PRESETS) + ") "
                "or model.name_or_path (a local directory or hub id)"
            )
        return self

    def label(self) -> str:
        """Short name used in results tables."""
        return self.preset or self.name_or_path or "?"


class SyntheticData(_Strict):
    """Deterministic generated preference pairs made of token ids (no text, no download)."""

    pairs: int = Field(256, ge=1, description="Number of preference pairs.")
    prompt_tokens: int = Field(64, ge=1, description="Tokens per prompt.")
    response_tokens: int = Field(64, ge=1, description="Tokens per chosen/rejected response "
                                 "(the median with lengths: lognormal).")
    lengths: Literal["fixed", "lognormal"] = Field(
        "fixed",
        description="fixed: every prompt and response has its length above; lognormal: each "
        "prompt, chosen and rejected length is drawn as round(median x exp(sigma x z)), z ~ N(0, 1), "
        "a long tail as in real preference sets (truncation to train.max_length still applies).",
    )
    sigma: float = Field(
        0.8, gt=0, le=3,
        description="Spread of lognormal lengths (log-space standard deviation); unused with fixed.",
    )
    seed: int = Field(0, description="Seed of the generator.")
    signal: Literal["echo", "vocabulary"] = Field(
        "echo",
        description="What tells the chosen reply from the rejected one. echo: the chosen reply echoes "
        "the prompt (each token one more than the prompt token it follows), the rejected one is random. "
        "vocabulary: the prompt, drawn from ids 0-127 or 128-255, and the chosen reply share a half, the "
        "rejected reply uses the other: no token is better on its own, so only a model that reads the prompt "
        "ranks pairs it never saw; a tiny model learns it in a few dozen steps at a good learning rate "
        "(search_spaces/quality-cpu.yaml).",
    )


class DataSpec(_Strict):
    """Where the preference pairs come from: exactly one of synthetic, path, hf."""

    synthetic: SyntheticData | None = None
    path: str | None = Field(None, description="Local .json, .jsonl or .parquet file of pairs.")
    hf: str | None = Field(None, description="Dataset name for datasets.load_dataset.")
    hf_config: str | None = Field(None, description="Dataset configuration name (optional).")
    split: str = Field("train", description="Split to read from a hf dataset.")
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="Rename columns: {prompt: question, chosen: good, rejected: bad}.",
    )
    max_pairs: int | None = Field(None, ge=1, description="Use at most this many pairs.")
    eval_pairs: int | float | None = Field(
        None, gt=0,
        description="A held-out split no trial trains on: a count of pairs (an integer) or a share of "
        "them (a number below 1), drawn with eval_seed before training. Learning trials score it at "
        "their eval points (train.eval_steps): eval_rewards/accuracies, eval_rewards/margins, eval_loss, "
        "eval_logps/chosen_drift. null: no split (eval_loss is then a held batch of training pairs).",
        json_schema_extra=affects(Memory.NONE, learning=True, why="fewer training pairs"),
    )
    eval_seed: int = Field(0, description="Seed of the held-out draw (data.eval_pairs).",
                           json_schema_extra=affects(Memory.NONE, learning=True))
    min_prompt_tokens: int = Field(
        16, ge=1, description="Truncation never cuts a prompt below this many tokens (its end is kept)."
    )
    min_response_tokens: int = Field(
        8, ge=1,
        description="A pair whose truncated response keeps fewer tokens than this is dropped.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> DataSpec:
        given = [k for k in ("synthetic", "path", "hf") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of data.synthetic, data.path (a .json/.jsonl/.parquet file) or "
                f"data.hf (a dataset name); got {given or 'none'}"
            )
        bad = set(self.columns) - {"prompt", "chosen", "rejected"}
        if bad:
            raise ValueError(f"data.columns keys must be prompt, chosen, rejected; got {sorted(bad)}")
        return self


class SamplerSpec(_Strict):
    """Which points of the search grid become trials."""

    mode: Literal["grid", "random"] = Field(
        "grid", description="grid: every point; random: num_samples points drawn without replacement."
    )
    num_samples: int | None = Field(
        None, ge=1, description="Points drawn in random mode (every point when the grid has fewer)."
    )
    seed: int = Field(0, description="Seed of the random draw (the training seed is train.seed).")

    @model_validator(mode="after")
    def _check(self) -> SamplerSpec:
        if self.mode == "random" and self.num_samples is None:
            raise ValueError("sampler.num_samples: mode random needs the number of points to draw, "
                             "a positive integer")
        if self.mode == "grid" and self.num_samples is not None:
            raise ValueError(f"sampler.num_samples ({self.num_samples}) is only used with mode: random; "
                             "set sampler.mode: random or drop num_samples")
        return self


class ResourcesSpec(_Strict):
    """What each trial runs on."""

    workers_per_trial: int = Field(1, ge=1, description="Ray Train workers (one per GPU) per trial.",
                                   json_schema_extra=affects(Memory.CHANGES, learning=False))
    use_gpu: Literal["auto", True, False] = Field("auto", description="auto: use GPUs when present.",
                                                  json_schema_extra=affects(Memory.CHANGES, learning=False))
    gpu_memory_gb: float | None = Field(
        None, gt=0, description="Cap each worker's allocator to emulate a smaller card (GB = 1e9 B).",
        json_schema_extra=affects(Memory.CHANGES, learning=False),
    )
    cpus_per_worker: float = Field(0.5, gt=0, description="CPUs reserved per Ray Train worker.",
                                   json_schema_extra=affects(Memory.CHANGES, learning=False))
    parallelism: Literal["ddp", "fsdp", "fsdp_grad_op"] = Field(
        "ddp", description="How several workers share a trial: ddp (a replica per worker, gradients "
        "all-reduced), fsdp (FSDP2 full shard: parameters, gradients and optimizer state sharded, "
        "each layer gathered for its forward and again for its backward), fsdp_grad_op (FSDP2 "
        "without resharding after forward, ZeRO-2-like: the gathered layers stay from forward to "
        "backward, one all-gather less per micro-step). Under FSDP2 the live reference is sharded too.",
        json_schema_extra=affects(Memory.CHANGES, learning=False))
    simulate_ranks: Literal["auto", True, False] = Field(
        "auto",
        description="Run a trial of N workers as rank 0 alone on one device through PyTorch's fake "
        "process group (collectives return at once; the rank's shards, gathered layers and "
        "activations are real): its row has ranks_simulated true, the per-GPU peaks, and a step "
        "time modelled from the one-rank compute plus each step's communication over the card's "
        "interconnect. auto: simulate where the cluster has fewer GPUs than a trial's workers.",
        json_schema_extra=affects(Memory.NONE, learning=False,
                                  why="the rank's peak is the same whether its peers are real or simulated"))
    sync_every_micro_step: bool = Field(
        False,
        description="All-reduce gradients on every accumulation micro-step instead of once per "
        "optimizer step (no_sync on the others). Only for measuring what that costs.",
        json_schema_extra=affects(Memory.CHANGES, learning=False),
    )
    warm_workers: bool = Field(
        True,
        description="One-worker trials run in a long-lived Ray actor per concurrent trial (per GPU) "
        "that imports the trainer once and runs trial after trial, its memory released and peak "
        "counters reset in between (sweep/warm_worker.py); false: a fresh Ray Train worker process "
        "per trial. Multi-worker trials always get fresh Ray Train workers.",
        json_schema_extra=affects(Memory.CHANGES, learning=False),
    )


class ObjectivesSpec(_Strict):
    """What the Pareto frontier minimises (or maximises); null leaves an objective out."""

    memory: Literal["min", "max"] | None = Field("min", description="peak_mem_gb.")
    throughput: Literal["min", "max"] | None = Field(
        "max",
        description="tokens_per_s, compared within its measured step-time noise (dpo_sweep/core/noise.py). "
        "Not time per optimizer step: a step of a larger effective batch does more work.",
    )
    loss_std: Literal["min", "max"] | None = Field("min", description="loss_std (stability).")
    # Held-out quality (data.eval_pairs): the learning trial's last eval point.
    eval_reward_accuracy: Literal["min", "max"] | None = Field(
        None, description="eval_rewards/accuracies: the share of held-out pairs whose chosen reply's "
        "implicit reward beats the rejected one's (max). Needs data.eval_pairs.")
    eval_reward_margin: Literal["min", "max"] | None = Field(
        None, description="eval_rewards/margins: the held-out mean reward margin (max). Needs data.eval_pairs.")
    eval_loss: Literal["min", "max"] | None = Field(
        None, description="eval_loss: the held-out DPO loss at the final weights (min). Needs data.eval_pairs.")

    def held_out(self) -> list[str]:
        """The held-out objectives this names (a space without data.eval_pairs refuses them)."""
        return [n for n in ("eval_reward_accuracy", "eval_reward_margin", "eval_loss") if getattr(self, n)]

    @model_validator(mode="before")
    @classmethod
    def _refuse_step_time(cls, data: Any) -> Any:
        # Refused rather than silently mapped: a space file is about to be run, and its author
        # should see what the time axis means (a results dir's copy is read as throughput).
        refusal = migrate.step_time_refusal(data)
        if refusal:
            raise ValueError(refusal)
        return data


class SchedulerSpec(_Strict):
    """``search.scheduler``: an early-stopping scheduler of Ray Tune over the learning trials. Each
    learning trial reports its held-out metric at its eval points (``train.eval_steps``); Ray Tune's
    ``ASHAScheduler`` stops one whose metric at a rung is below the best ``1 / reduction_factor``
    of the trials that reached that rung before it. A stopped trial's configuration is a row of
    status ``stopped`` with ``stopped_step``. Needs ``data.eval_pairs``."""

    name: Literal["asha"] = Field("asha", description="asha: ray.tune.schedulers.ASHAScheduler.")
    metric: Literal["eval_reward_accuracy", "eval_reward_margin", "eval_loss"] = Field(
        "eval_reward_accuracy", description="The held-out metric the rungs compare.")
    mode: Literal["min", "max"] | None = Field(
        None, description="null: max for the accuracy and the margin, min for the loss.")
    grace_period: int = Field(4, ge=1, description="Steps before any trial can be stopped (the first rung).")
    reduction_factor: float = Field(2.0, gt=1, description="Rung spacing and the share kept at each: 1 / this.")
    brackets: int = Field(1, ge=1, description="ASHA's brackets (1: plain successive halving).")

    def resolved_mode(self) -> str:
        return self.mode or ("min" if self.metric == "eval_loss" else "max")


#: ``search.scheduler``: the early stop of the learning trials (:class:`SchedulerSpec`), no dimension.
SCHEDULER_KEY = "scheduler"


def scheduler_of(search: dict[str, Any] | None) -> SchedulerSpec | None:
    """``search.scheduler`` as a :class:`SchedulerSpec` (a bare name: its defaults); None when absent."""
    raw = (search or {}).get(SCHEDULER_KEY)
    if raw is None:
        return None
    return SchedulerSpec.model_validate({"name": raw} if isinstance(raw, str) else raw)
