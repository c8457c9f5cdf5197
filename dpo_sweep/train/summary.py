"""A trial's results.csv row from its optimizer steps: :class:`StepOutput` (what
:func:`~dpo_sweep.train.loop.train_step` returns for each step) and :func:`summarise` (medians and
means over the measured steps, peaks, MFU, the trial's facts), after the loop's last step."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dpo_sweep import cards
from dpo_sweep.core import comms, trial_facts
from dpo_sweep.config import LORA_AUTO, TrialConfig
from dpo_sweep.records import StepRecord, TrialResult, config_columns
from dpo_sweep.core.flops import TokenCounts, dpo_step_flops, mfu
from dpo_sweep.telemetry import MemoryPeaks, StepTimer, TrialClock, max_peaks
from dpo_sweep.core.flops import NO_TOKENS
from dpo_sweep.train import metrics
from dpo_sweep.train.setup import TrialSetup


@dataclass(frozen=True)
class StepOutput:
    """One optimizer step: its row, the exact count of policy tokens it trained on (all workers),
    the token counts the FLOP count needs (this worker's: core.flops.TokenCounts) and the
    step's own memory peaks (the row's ``peak_mem_gb`` is their max over workers)."""

    record: StepRecord
    tokens: int
    flop_counts: TokenCounts
    peaks: MemoryPeaks


def _sum_over_workers(setup: TrialSetup, counts: TokenCounts) -> TokenCounts:
    """Token counts summed over the process group (once per trial, after the last step)."""
    if setup.world == 1:
        return counts
    total = torch.tensor(dataclasses.astuple(counts), dtype=torch.int64, device=setup.device)
    dist.all_reduce(total)
    if setup.simulated:  # rank 0's alone: every rank is taken to train on as many tokens
        total *= setup.world
    return TokenCounts(*(int(v) for v in total.tolist()))


def _lean_mlp_used(cfg: TrialConfig) -> bool:
    """Whether lean ops' MLP runs: not on an MLP with adapters, nor on QLoRA's NF4 weights (lean.py)."""
    if not cfg.model.lean_ops or cfg.train.adapter == "full":
        return cfg.model.lean_ops
    # auto adapts the MLP's linears wherever lean ops' MLP could run (a Llama SwiGLU).
    targets = set(cfg.train.lora_targets)
    mlp_adapted = cfg.train.lora_targets == LORA_AUTO or bool({"gate_proj", "up_proj", "down_proj"} & targets)
    return cfg.train.adapter == "lora" and not mlp_adapted


def summarise(setup: TrialSetup, steps: list[StepOutput], timer: StepTimer, clock: TrialClock, *,
              status: str, error: str, mem_source: str, signals: dict[str, float | int | str | None]) -> TrialResult:
    """The trial's results.csv row from its steps (medians and means over the measured ones);
    ``signals``: the stability columns (dpo_sweep/core/stability.py) and ``eval_loss``."""
    cfg, device = setup.cfg, setup.device
    records = [out.record for out in steps]
    # Peaks over the measured steps, the worst-case step included (peak_mem_gb: what a real run
    # meets at its longest batch); a trial that stopped in its warm-up still says what it took.
    measured_any = [out for out in steps if out.record.measured]
    trial_peaks = max_peaks([out.peaks for out in measured_any] or [out.peaks for out in steps])
    # Everything else over the typical measured steps (the timer leaves the worst case out too).
    measured = [out for out in measured_any if not out.record.worst_case]
    measured_records = [out.record for out in measured]
    typical_peak_gb = max_peaks([out.peaks for out in measured]).peak_gb if measured else trial_peaks.peak_gb
    step_time_ms = timer.median_ms()  # the same measured steps as step_time_p90_ms below
    counts = _sum_over_workers(setup, sum((out.flop_counts for out in measured), NO_TOKENS))
    flops = dpo_step_flops(shape=setup.shape, counts=counts, level=cfg.checkpoint_level,
                           reference=cfg.train.reference, chunked_head=cfg.train.logp_chunk_tokens > 0,
                           lean_mlp=_lean_mlp_used(cfg), frozen_base=cfg.train.adapter != "full") / max(1, len(measured))
    gpu_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    comm = modelled_comm(setup, gpu_name)
    compute_ms = step_time_ms
    if comm is not None:  # simulated ranks: one rank's compute plus the step's communication
        step_time_ms += comm
    return TrialResult(
        **config_columns(cfg), status=status,
        peak_mem_gb=trial_peaks.peak_gb, torch_peak_alloc_gb=trial_peaks.torch_alloc_gb,
        torch_peak_reserved_gb=trial_peaks.torch_reserved_gb, peak_mem_typical_gb=typical_peak_gb,
        padding_frac=metrics.mean([r.padding_frac for r in measured_records]),
        step_time_ms=step_time_ms, step_time_p10_ms=timer.p10_ms() + (step_time_ms - compute_ms),
        step_time_p90_ms=timer.p90_ms() + (step_time_ms - compute_ms),
        tokens_per_s=metrics.median([r.tokens_per_s for r in measured_records]) * compute_ms / step_time_ms,
        mfu=mfu(flops, step_time_ms / 1e3, cards.mfu_peak_flops(gpu_name), setup.world) if measured else math.nan,
        loss_mean=metrics.mean([r.loss for r in measured_records]),
        loss_std=metrics.detrended_std([r.loss for r in measured_records]),
        grad_norm_mean=metrics.mean([r.grad_norm for r in measured_records]),
        reward_accuracy=metrics.mean([r.reward_accuracy for r in measured_records]),
        reward_margin=metrics.mean([r.reward_margin for r in measured_records]),
        error=error, mem_source=mem_source, loss_type=cfg.train.loss, precision=cfg.train.precision,
        reference=cfg.train.reference, attn_implementation=setup.built.attn_implementation,
        liger_kernel=setup.built.liger_kernel, lean_ops=cfg.model.lean_ops,
        pad_multiple=trial_facts.pad_multiple(cfg.train, device.type), logp_parity=setup.parity.logp_diff,
        adapter=cfg.train.adapter,
        optimizer=cfg.train.optimizer, trainer=cfg.train.trainer,
        trainable_params=sum(p.numel() for p in setup.params), device=str(device),
        steps=len(records), measured_steps=len(measured), pairs_used=setup.data.usable_pairs,
        pairs_dropped=setup.data.pairs.dropped, startup_s=clock.startup_s(), measure_s=clock.measure_s(),
        **clock.startup_split(),
        **signals,
        ranks_simulated=setup.simulated,
        **({"comm_ms": comm} if comm is not None else {}),
    )


def modelled_comm(setup: TrialSetup, gpu_name: str | None) -> float | None:
    """A simulated trial's communication per optimizer step, ms (core/comms.py) over its
    card's GPU-to-GPU bandwidth (the catalog's; unknown: PCIe Gen4's); None when not simulated."""
    if not setup.simulated:
        return None
    cfg = setup.cfg
    card = cards.of_device(gpu_name)
    bandwidth = card.interconnect_gb_s if card is not None else comms.DEFAULT_INTERCONNECT_GB_S
    traffic = comms.step_traffic(
        parallelism=cfg.resources.parallelism, world=setup.world, params=setup.built.n_params,
        trainable=sum(p.numel() for p in setup.params), grad_acc=cfg.grad_acc, precision=cfg.train.precision,
        live_reference=cfg.train.reference == "live", reference_params=setup.built.n_params,
        sync_every_micro_step=cfg.resources.sync_every_micro_step)
    return traffic.ms(bandwidth)
