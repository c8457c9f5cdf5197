"""Building one trial: the device's memory settings, the data, the models and the optimizer.

:func:`load_data` and :func:`build_trial` make everything the step loop of
:mod:`dpo_sweep.train.loop` needs, as one :class:`TrialSetup`; nothing here runs a step.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import nn

from dpo_sweep.config import TrainSpec, TrialConfig
from dpo_sweep.errors import DataError
from dpo_sweep.core.flops import DecoderShape
from dpo_sweep.train import knobs, parallel, parity
from dpo_sweep.train.adapters import (AdaptersOff, InBackwardOptimizer, apply_adapter, build_optimizer, reference_view,
                                     refuse_cpu_levers)
from dpo_sweep.train.batching import MicroBatch, collate, micro_batches, worst_case_batches
from dpo_sweep.train.checkpointing import apply_checkpoint_level
from dpo_sweep.train.data import PairDataset
from dpo_sweep.train.lean import apply_lean_ops
from dpo_sweep.train import heldout
from dpo_sweep.train.logprobs import SequenceLogProbs
from dpo_sweep.train.model import BuiltModel, build_model, disable_dropout, freeze_reference
from dpo_sweep.core.order import padded_width, pair_length, usable_pairs
from dpo_sweep.train.reference import ReferenceTables, pairs_read, reference_batches, table_key
from dpo_sweep.train.tokenizer import tokenized_pairs
from dpo_sweep.train.warm_state import WarmState
from dpo_sweep.core.trial_facts import pad_multiple

Logger = Callable[[str], None]


@dataclass(frozen=True)
class TrialData:
    """The pairs of one trial and how many of them the micro-batches of all workers use."""

    pairs: PairDataset
    pad_token_id: int
    usable_pairs: int  # a whole number of effective batches, micro_batch x grad_acc x workers (drop_last)
    held_out: PairDataset | None = None  # data.eval_pairs: the split no trial trains on (train/heldout.py)


@dataclass(frozen=True)
class TrialSetup:
    """What the step loop needs, built once per trial."""

    cfg: TrialConfig
    device: torch.device
    world: int
    rank: int
    data: TrialData
    built: BuiltModel
    policy: nn.Module  # the policy's log-prob module, wrapped for DDP/FSDP when world > 1
    params: tuple[nn.Parameter, ...]
    reference: SequenceLogProbs | None  # reference: live
    ref_table: torch.Tensor | None  # reference: precomputed, [pairs, 2] (chosen, rejected)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    batches: Iterator[MicroBatch]  # this rank's micro-batches, endless
    worst_batches: Iterator[MicroBatch]  # the worst-case step's: the longest pairs (train.worst_case_step)
    shape: DecoderShape  # for the FLOP count (core/flops.py)
    grad_acc_schedule: knobs.GradAccSchedule  # micro-steps per step (train.grad_acc_schedule)
    adaptive_clip: knobs.AdaptiveClip | None  # train.adaptive_clip
    ema: knobs.WeightEma | None  # train.ema_decay
    shapes_run: set[tuple[int, ...]]  # micro-batch shapes this process trained on (WarmState.shapes_run)
    parity: parity.ParityFigures  # the fast paths against the model's own forward, before the first step
    simulated: bool = False  # rank 0 of ``world`` alone, through the fake process group (train/parallel.py)


def configure_device_memory(cfg: TrialConfig, device: torch.device) -> None:
    if device.type != "cuda":
        return
    if "PYTORCH_CUDA_ALLOC_CONF" not in os.environ:
        # Segments that grow in place instead of new fixed blocks: less fragmentation, so the
        # reserved (and NVML) peak stays closer to what is allocated. A user's setting wins.
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    # Always set: the cap is a setting of the process, so a trial without one must lift the cap
    # that an earlier trial in the same process (a warm worker, a test session) left behind.
    fraction = 1.0
    if cfg.resources.gpu_memory_gb:
        total = torch.cuda.get_device_properties(device).total_memory
        fraction = min(1.0, cfg.resources.gpu_memory_gb * 1e9 / total)
    torch.cuda.set_per_process_memory_fraction(fraction, device)


def load_data(cfg: TrialConfig, world: int, say: Logger, since: float, warm: WarmState | None = None) -> TrialData:
    """The trial's tokenized pairs (``warm``'s when it holds them); ``since``: the ``perf_counter``
    its log lines count from."""
    tok, ds = warm.tokenized_pairs(cfg) if warm is not None else tokenized_pairs(cfg)
    ds, held_out = heldout.split(ds, cfg.data)
    usable = usable_pairs(len(ds), cfg.micro_batch, world, grad_acc=cfg.grad_acc)
    if usable == 0:
        raise DataError(f"{ds.source}: {len(ds)} pairs cannot fill one effective batch of micro_batch "
                        f"{cfg.micro_batch} x grad_acc {cfg.grad_acc} x {world} workers; use more pairs "
                        "or a smaller micro_batch or grad_acc")
    say(f"[{cfg.trial_id}] data: {len(ds)} pairs from {ds.source} ({ds.truncated} truncated, "
        f"{ds.dropped} dropped by truncation to max_length={cfg.train.max_length}) "
        f"[{time.perf_counter() - since:.1f} s]")
    if usable < len(ds):
        say(f"[{cfg.trial_id}] {len(ds)} pairs do not divide into micro_batch x grad_acc x workers = "
            f"{cfg.micro_batch * cfg.grad_acc * world}: {len(ds) - usable} left out of each epoch (drop_last)")
    if held_out is not None:
        say(f"[{cfg.trial_id}] held out: {len(held_out)} pairs (data.eval_pairs), never trained on")
    return TrialData(ds, tok.pad_token_id, usable, held_out)


def build_trial(cfg: TrialConfig, device: torch.device, world: int, rank: int, data: TrialData,
                say: Logger, since: float, warm: WarmState | None = None) -> TrialSetup:
    """Models (policy, reference), checkpoint level, parallel wrapper, optimizer and batches;
    ``warm``: the process's reference log-probs from earlier trials (train.reference: precomputed)."""
    train = cfg.train
    refuse_cpu_levers(train, device)
    built = build_model(cfg.model, train.precision, device, seed=train.seed)
    policy = built.model
    if not train.dropout:
        disable_dropout(policy)  # before the adapters: lora_dropout is the user's own setting
    peft_model = apply_adapter(policy, train)  # LoRA/QLoRA: the reference is the adapters-off policy
    # The parity check's expectation: the model's own forward, before any fast path is applied.
    parity_pairs = parity.parity_pairs(policy.get_input_embeddings().weight.shape[0])
    with parity.dropout_off(policy), autocast(cfg, device):
        parity_want = parity.expected(policy, parity_pairs, data.pad_token_id)
    reference = ref_table = None
    if train.reference == "live" and peft_model is None:
        frozen = freeze_reference(copy.deepcopy(policy))  # before any checkpoint patching
        if cfg.model.lean_ops:
            # The same forward arithmetic as the policy's, so both agree exactly at step 1.
            apply_lean_ops(frozen, fused_kernels=built.liger_kernel)
        reference = parallel.shard_reference(cfg, SequenceLogProbs(frozen, train.logp_chunk_tokens), device, world)
    if cfg.model.lean_ops:
        apply_lean_ops(policy, fused_kernels=built.liger_kernel)
    if train.reference == "live" and peft_model is not None:
        reference = AdaptersOff(SequenceLogProbs(policy, train.logp_chunk_tokens), peft_model)
    if train.reference == "precomputed":
        # Before the first update the policy *is* the reference: no copy of the weights needed.
        policy.eval()
        tables = warm.reference_tables if warm is not None else ReferenceTables()
        ref_table = _reference_table(reference_view(SequenceLogProbs(policy, train.logp_chunk_tokens), peft_model),
                                     data, cfg, device, world, rank, say, since, tables)
    apply_checkpoint_level(policy, cfg.checkpoint_level)  # after the model is on its device
    policy.train()
    policy_module = SequenceLogProbs(policy, train.logp_chunk_tokens, router_aux_loss=True)
    parity_figures = check_parity(cfg, policy_module, parity_pairs, parity_want, data.pad_token_id, device)
    policy_logps = parallel.wrap_policy(cfg, policy_module, device, world)
    params = tuple(p for p in policy_logps.parameters() if p.requires_grad)
    optimizer = (InBackwardOptimizer(params, train, device) if train.optimizer_in_backward
                 else build_optimizer(params, train, device))
    say(f"[{cfg.trial_id}] model {cfg.model.label()}: {built.n_params / 1e6:.1f}M params, "
        f"{train.precision}, attention {built.attn_implementation}{', liger' if built.liger_kernel else ''}"
        f"{', lean ops' if cfg.model.lean_ops else ''}, checkpoint {cfg.checkpoint_level}, "
        f"reference {train.reference}, {_lever_words(train, params)}, device {device}, {world} worker(s)"
        f"{' (simulated: rank 0 alone, fake process group)' if parallel.simulating() else ''}"
        f"{', ' + cfg.resources.parallelism if world > 1 else ''}; "
        f"parity with the model's own forward: {parity_figures.words()} [{time.perf_counter() - since:.1f} s]")
    multiple = pad_multiple(train, device.type)  # the padded batches' width multiple (train.pad_to_multiple_of)
    return TrialSetup(
        cfg=cfg, device=device, world=world, rank=rank, data=data, built=built, policy=policy_logps,
        params=params, reference=reference, ref_table=ref_table, optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg)),
        scaler=torch.amp.GradScaler(device.type, enabled=train.precision == "fp16"),
        batches=micro_batches(data.pairs, cfg.micro_batch, world, rank, train.seed, data.pad_token_id,
                              train.padding_side, grad_acc=cfg.grad_acc, group_by_length=train.group_by_length,
                              padding_free=train.padding_free, multiple=multiple),
        # After the steps, one on the longest pairs: the peak a real run meets at its longest batch.
        worst_batches=worst_case_batches(data.pairs, cfg.micro_batch, world, rank, data.pad_token_id,
                                         train.padding_side, grad_acc=cfg.grad_acc, padding_free=train.padding_free,
                                         multiple=multiple),
        shape=DecoderShape.from_config(policy.config),
        grad_acc_schedule=knobs.GradAccSchedule(train.grad_acc_schedule, cfg.grad_acc, train.steps),
        adaptive_clip=knobs.AdaptiveClip(params, train.adaptive_clip_window) if train.adaptive_clip else None,
        ema=knobs.WeightEma(params, train.ema_decay) if train.ema_decay is not None else None,
        shapes_run=warm.shapes_run if warm is not None else set(),
        parity=parity_figures,
        simulated=parallel.simulating(),
    )


def check_parity(cfg: TrialConfig, policy: SequenceLogProbs, pairs: list, want: parity.Expected, pad_id: int,
                 device: torch.device) -> parity.ParityFigures:
    """The trial's fast paths against its model's own forward (:mod:`dpo_sweep.train.parity`), in
    the trial's precision; ParityError (the trial's ``error`` status) when they disagree."""
    with parity.dropout_off(policy.lm), autocast(cfg, device):
        got = parity.measured(policy, pairs, cfg.train.padding_free, pad_id, cfg.train.padding_side)
    figures = parity.compare(want, got)
    tol = parity.tolerance(policy.lm, autocast=cfg.train.precision in ("bf16-mixed", "fp16"))
    if not figures.within(tol):
        model_type = getattr(policy.lm.config, "model_type", type(policy.lm).__name__)
        raise parity.ParityError(parity.refusal(model_type, parity.FastPaths.of(cfg).describe(), figures, tol)
                                 + "; the trial is not run")
    return figures


def _lever_words(train: TrainSpec, params: tuple[nn.Parameter, ...]) -> str:
    """``adapter lora r 16, optimizer adamw, 1,234,567 trainable`` for the build's log line."""
    adapter = train.adapter if train.adapter == "full" else f"{train.adapter} r {train.lora_r}"
    return f"adapter {adapter}, optimizer {train.optimizer}, {sum(p.numel() for p in params):,} trainable"


def autocast(cfg: TrialConfig, device: torch.device) -> contextlib.AbstractContextManager:
    precision = cfg.train.precision
    if precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if precision == "fp16":
        return torch.autocast(device.type, dtype=torch.float16)
    return contextlib.nullcontext()


def lr_factor(cfg: TrialConfig) -> Callable[[int], float]:
    """The learning-rate schedule as LambdaLR's factor of the optimizer steps already taken."""
    train = cfg.train

    def factor(step: int) -> float:
        if step < train.lr_warmup_steps:
            return (step + 1) / (train.lr_warmup_steps + 1)
        if train.lr_schedule == "constant":
            return 1.0
        span = max(1, train.steps - train.lr_warmup_steps)
        frac = min(1.0, (step - train.lr_warmup_steps) / span)
        return 1.0 - frac if train.lr_schedule == "linear" else 0.5 * (1 + math.cos(math.pi * frac))

    return factor


def forward_inputs(batch: MicroBatch, has_padding: bool) -> tuple:
    # No padding: pass no mask, so the attention kernel can take its causal fast path.
    return (batch.input_ids, (batch.attention_mask if has_padding else None), batch.position_ids,
            batch.response_mask, batch.sequence_ids)


def _reference_table(reference: SequenceLogProbs, data: TrialData, cfg: TrialConfig, device: torch.device,
                     world: int, rank: int, say: Logger, since: float, tables: ReferenceTables) -> torch.Tensor:
    """The reference log-probs of the pairs this rank reads (:func:`~dpo_sweep.train.reference.pairs_read`),
    ``[pairs, 2]``, NaN for the rest; computed only for those ``tables`` (earlier trials') lack."""
    ds = data.pairs
    wanted = pairs_read(cfg, ds, world, rank)

    def compute(missing: list[int]) -> torch.Tensor:
        # Longest first: pairs of similar length share a batch, so little of it is padding.
        by_length = sorted(range(len(missing)), key=lambda k: -pair_length(ds.pairs[missing[k]]))
        picked = dataclasses.replace(ds, pairs=type(ds.pairs)(ds.pairs[missing[k]] for k in by_length))
        values = torch.empty(len(missing), 2, dtype=torch.float32)
        values[by_length] = precompute_reference(reference, picked, cfg, device, data.pad_token_id)
        return values

    table, computed = tables.table(table_key(cfg), len(ds), wanted, compute)
    say(f"[{cfg.trial_id}] reference log-probs of the {len(wanted)} pairs this trial reads: {computed} computed, "
        f"{len(wanted) - computed} kept from an earlier trial [{time.perf_counter() - since:.1f} s]")
    return table


@torch.no_grad()
def precompute_reference(reference: SequenceLogProbs, ds: PairDataset, cfg: TrialConfig, device: torch.device,
                         pad_id: int) -> torch.Tensor:
    """Log-probs of every pair of ``ds`` under ``reference``, ``[N, 2]`` (chosen, rejected), in
    the batches of :func:`~dpo_sweep.train.reference.reference_batches` (``ds`` longest first).
    The allocator's cache is emptied after it on CUDA: the steps' peaks are their own."""
    table = torch.zeros(len(ds), 2, dtype=torch.float32)
    multiple = pad_multiple(cfg.train, device.type)  # the steps' widths: the kernels' plans serve both
    widths = [padded_width(pair_length(p), multiple) for p in ds.pairs]
    for idx in reference_batches(widths, cfg.micro_batch, chunked_head=cfg.train.logp_chunk_tokens > 0):
        batch = collate([ds.pairs[i] for i in idx], idx, pad_id, cfg.train.padding_side, multiple)
        has_padding = bool((batch.attention_mask == 0).any())
        batch = batch.to(device)
        with autocast(cfg, device):
            logps, _ = reference(*forward_inputs(batch, has_padding))
        pairs = len(idx)
        table[idx, 0] = logps[:pairs].float().cpu()
        table[idx, 1] = logps[pairs:].float().cpu()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return table
