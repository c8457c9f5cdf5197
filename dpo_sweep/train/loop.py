"""One trial: build data and models, run K optimizer steps of DPO, measure, summarise.

Read top to bottom: :func:`run_trial` resolves the device and turns failures into statuses;
:func:`_train` is the story - data, models, reference, checkpoint level, optimizer, the step
loop, the summary. Inside Ray Train (torch.distributed initialised) the same code runs DDP or
FSDP2 across the group; every rank returns the same outcome.

Precision modes (where things live):

=============  =================  ===============  ===================  =========================
precision      weights            gradients        AdamW state          forward / backward maths
=============  =================  ===============  ===================  =========================
fp32           fp32               fp32             fp32                 fp32
bf16           bf16               bf16             bf16                 bf16 (as TRL on a bf16 model)
bf16-mixed     fp32 (master)      fp32             fp32                 bf16 autocast
fp16           fp32 (master)      fp32 (scaled)    fp32                 fp16 autocast + GradScaler
=============  =================  ===============  ===================  =========================

Pure bf16 keeps 8 bits of mantissa: an update smaller than about 2^-8 of a weight's magnitude
(lr x Adam step << |w| / 256) rounds away. At lr 5e-6 and weights of order 1e-2 that is most
updates; use bf16-mixed when the run is meant to learn, bf16 when it is meant to measure.
"""
from __future__ import annotations

import contextlib
import copy
import math
import os
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from dpo_sweep.analysis.results import StepRecord, TrialResult
from dpo_sweep.config import TrialConfig
from dpo_sweep.errors import DataError, UserError
from dpo_sweep.telemetry import StepTimer, dpo_step_flops, make_memory_sampler, mfu, model_flops_per_token
from dpo_sweep.train import metrics
from dpo_sweep.train.metrics import measured_peaks_gb
from dpo_sweep.train.batching import MicroBatch, collate, micro_batches, usable_pairs, worst_case_batches
from dpo_sweep.train.checkpointing import apply_checkpoint_level
from dpo_sweep.train.data import PairDataset, load_pairs
from dpo_sweep.train.lean import apply_lean_ops
from dpo_sweep.train.logprobs import SequenceLogProbs
from dpo_sweep.train.loss import dpo_loss
from dpo_sweep.train.model import build_model, freeze_reference
from dpo_sweep.train.tokenizer import load_tokenizer

#: Fraction of a policy forward that each level re-runs in backward (for the MFU FLOP count):
#: the MLP is about 2/3 of a Llama layer's matmul FLOPs, the attention projections about 1/3.
RECOMPUTE_FRACTION = {"none": 0.0, "L1": 0.62, "L2": 0.95, "L3": 0.95, "full": 1.0}

Logger = Callable[[str], None]


@dataclass(frozen=True)
class TrialOutcome:
    """What a trial returns: its summary row and its per-step rows."""

    result: TrialResult
    steps: tuple[StepRecord, ...]


class InjectedFailure(RuntimeError):
    """Raised by the ``train.fail_at_step`` test hook."""


def resolve_device(cfg: TrialConfig) -> torch.device:
    want = cfg.train.device
    use_gpu = cfg.resources.use_gpu
    if want == "cpu" or use_gpu is False or not torch.cuda.is_available():
        if want == "cuda" or use_gpu is True:
            raise UserError(f"train.device={want} / resources.use_gpu={use_gpu} asks for a GPU, "
                            "but CUDA is not available here; set use_gpu: auto")
        return torch.device("cpu")
    index = int(os.environ.get("LOCAL_RANK", torch.cuda.current_device())) if dist.is_initialized() else 0
    index = min(index, torch.cuda.device_count() - 1)
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _failure_result(cfg: TrialConfig, status: str, err: BaseException) -> TrialResult:
    text = str(err).strip().splitlines()
    msg = f"{type(err).__name__}: {text[0] if text else ''}"
    return TrialResult(trial_id=cfg.trial_id, status=status, **cfg.knobs(), error=msg[:500],
                       loss_type=cfg.train.loss, precision=cfg.train.precision,
                       reference=cfg.train.reference, steps=cfg.train.steps)


def run_trial(cfg: TrialConfig, *, on_step: Callable[[StepRecord], None] | None = None,
              log: Logger | None = print, catch_failures: bool = True) -> TrialOutcome:
    """Run one trial on this process's device (and its process group, if any).

    With ``catch_failures`` an OOM becomes status ``oom`` and any other exception ``error``;
    without it they propagate (Ray Train then reports them). Bad input (:class:`UserError`)
    always propagates. A NaN/inf loss is status ``diverged`` either way.
    """
    say = log or (lambda _msg: None)
    device = resolve_device(cfg)
    try:
        return _train(cfg, device, on_step or (lambda _r: None), say)
    except UserError:
        raise
    except torch.OutOfMemoryError as err:
        if not catch_failures:
            raise
        say(f"[{cfg.trial_id}] out of memory: {str(err).splitlines()[0] if str(err) else ''}")
        return TrialOutcome(_failure_result(cfg, "oom", err), ())
    except Exception as err:  # noqa: BLE001 - a trial's failure is a result, not a crash
        if not catch_failures:
            raise
        say(f"[{cfg.trial_id}] error: {type(err).__name__}: {err}")
        return TrialOutcome(_failure_result(cfg, "error", err), ())
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _autocast(cfg: TrialConfig, device: torch.device) -> contextlib.AbstractContextManager:
    p = cfg.train.precision
    if p == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if p == "fp16":
        return torch.autocast(device.type, dtype=torch.float16)
    return contextlib.nullcontext()


def _lr_lambda(cfg: TrialConfig) -> Callable[[int], float]:
    t = cfg.train

    def factor(step: int) -> float:  # step counts optimizer steps already taken
        if step < t.lr_warmup_steps:
            return (step + 1) / (t.lr_warmup_steps + 1)
        if t.lr_schedule == "constant":
            return 1.0
        span = max(1, t.steps - t.lr_warmup_steps)
        frac = min(1.0, (step - t.lr_warmup_steps) / span)
        return 1.0 - frac if t.lr_schedule == "linear" else 0.5 * (1 + math.cos(math.pi * frac))

    return factor


def _forward_inputs(mb: MicroBatch, has_padding: bool) -> tuple:
    # No padding: pass no mask, so the attention kernel can take its causal fast path.
    return (mb.input_ids, (mb.attention_mask if has_padding else None), mb.position_ids, mb.response_mask,
            mb.sequence_ids)


@torch.no_grad()
def precompute_reference(ref: SequenceLogProbs, ds: PairDataset, cfg: TrialConfig, device: torch.device,
                         pad_id: int) -> torch.Tensor:
    """Reference log-probs of every pair, ``[N, 2]`` (chosen, rejected), computed once."""
    table = torch.zeros(len(ds), 2, dtype=torch.float32)
    bs = cfg.micro_batch
    for start in range(0, len(ds), bs):
        idx = list(range(start, min(start + bs, len(ds))))
        mb = collate([ds.pairs[i] for i in idx], idx, pad_id, cfg.train.padding_side)
        pad = bool((mb.attention_mask == 0).any())
        mb = mb.to(device)
        with _autocast(cfg, device):
            logps, _ = ref(*_forward_inputs(mb, pad))
        b = len(idx)
        table[start:start + b, 0] = logps[:b].float().cpu()
        table[start:start + b, 1] = logps[b:].float().cpu()
    return table


def _wrap_parallel(cfg: TrialConfig, lp: SequenceLogProbs, device: torch.device, world: int) -> nn.Module:
    if world == 1:
        return lp
    if cfg.resources.parallelism == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if cfg.train.precision == "bf16-mixed" else MixedPrecisionPolicy())
        from dpo_sweep.train.checkpointing import decoder_layers

        for layer in decoder_layers(lp.lm):
            fully_shard(layer, mp_policy=mp)
        fully_shard(lp, mp_policy=mp)
        return lp
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(lp, device_ids=[device.index] if device.type == "cuda" else None)


def _no_sync(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Skip the gradient all-reduce on accumulation micro-steps (one all-reduce per optimizer
    step, overlapped with the last micro-step's backward)."""
    if hasattr(model, "no_sync"):
        return contextlib.nullcontext() if sync else model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(sync)
    return contextlib.nullcontext()


def _inject(cfg: TrialConfig, step: int, rank: int) -> bool:
    """The fail_at_step test hook: raise here, or return True to poison this step's loss."""
    t = cfg.train
    if t.fail_at_step != step or (t.fail_rank is not None and t.fail_rank != rank):
        return False
    if t.fail_kind == "oom":
        raise torch.OutOfMemoryError(f"injected OOM at step {step} (train.fail_at_step test hook)")
    if t.fail_kind == "error":
        raise InjectedFailure(f"injected failure at step {step} (train.fail_at_step test hook)")
    return True


def _train(cfg: TrialConfig, device: torch.device, on_step: Callable[[StepRecord], None], say: Logger) -> TrialOutcome:
    t_start = time.perf_counter()
    t = cfg.train
    world, rank = _world()
    say = say if rank == 0 else (lambda _m: None)
    if device.type == "cuda" and "PYTORCH_CUDA_ALLOC_CONF" not in os.environ:
        # Segments that grow in place instead of new fixed blocks: less fragmentation, so the
        # reserved (and NVML) peak stays closer to what is allocated. A user's setting wins.
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    if device.type == "cuda" and cfg.resources.gpu_memory_gb:
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cfg.resources.gpu_memory_gb * 1e9 / total), device)

    # --- data -------------------------------------------------------------------------------
    tok = load_tokenizer(cfg.model)
    ds = load_pairs(cfg.data, tok, t.max_length)
    per = cfg.micro_batch * cfg.grad_acc * world
    usable = usable_pairs(len(ds), cfg.micro_batch, world, grad_acc=cfg.grad_acc)
    if usable == 0:
        raise DataError(f"{ds.source}: {len(ds)} pairs cannot fill one effective batch of micro_batch "
                        f"{cfg.micro_batch} x grad_acc {cfg.grad_acc} x {world} workers; use more pairs "
                        "or a smaller micro_batch or grad_acc")
    say(f"[{cfg.trial_id}] data: {len(ds)} pairs from {ds.source} ({ds.truncated} truncated, "
        f"{ds.dropped} dropped by truncation to max_length={t.max_length}) "
        f"[{time.perf_counter() - t_start:.1f} s]")
    if usable < len(ds):
        say(f"[{cfg.trial_id}] {len(ds)} pairs do not divide into micro_batch x grad_acc x workers = {per}: "
            f"{len(ds) - usable} left out of each epoch (drop_last)")

    # --- models -------------------------------------------------------------------------------
    sampler = make_memory_sampler(device)
    # `with`: an exception of the body (an OOM) wins over one of the sampler thread.
    with sampler:
        built = build_model(cfg.model, t.precision, device, seed=t.seed)
        policy = built.model
        ref_lp = ref_table = None
        if t.reference == "live":
            reference = freeze_reference(copy.deepcopy(policy))  # before any checkpoint patching
            if cfg.model.lean_ops:
                # The same forward arithmetic as the policy's, so both agree exactly at step 1.
                apply_lean_ops(reference, fused_kernels=built.liger_kernel)
            ref_lp = SequenceLogProbs(reference, t.logp_chunk_tokens)
        if cfg.model.lean_ops:
            apply_lean_ops(policy, fused_kernels=built.liger_kernel)
        if t.reference == "precomputed":
            # Before the first update the policy *is* the reference: no copy of the weights needed.
            policy.eval()
            ref_table = precompute_reference(SequenceLogProbs(policy, t.logp_chunk_tokens), ds, cfg, device,
                                             tok.pad_token_id)
        apply_checkpoint_level(policy, cfg.checkpoint_level)  # after the model is on its device
        policy.train()
        lp = _wrap_parallel(cfg, SequenceLogProbs(policy, t.logp_chunk_tokens), device, world)
        params = [p for p in lp.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=t.lr, betas=t.adam_betas, eps=t.adam_eps,
                                weight_decay=t.weight_decay, fused=device.type == "cuda")
        sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg))
        scaler = torch.amp.GradScaler(device.type, enabled=t.precision == "fp16")
        fwd_flops = model_flops_per_token(built.n_params_non_embedding, policy.config.num_hidden_layers,
                                          policy.config.hidden_size, t.max_length)
        say(f"[{cfg.trial_id}] model {cfg.model.label()}: {built.n_params / 1e6:.1f}M params, "
            f"{t.precision}, attention {built.attn_implementation}{', liger' if built.liger_kernel else ''}"
            f"{', lean ops' if cfg.model.lean_ops else ''}, checkpoint {cfg.checkpoint_level}, "
            f"reference {t.reference}, device {device}, {world} worker(s) [{time.perf_counter() - t_start:.1f} s]")

        batches = micro_batches(ds, cfg.micro_batch, world, rank, t.seed, tok.pad_token_id, t.padding_side,
                               grad_acc=cfg.grad_acc, group_by_length=t.group_by_length,
                               padding_free=t.padding_free)
        # After the steps, one on the longest pairs: the peak a real run meets at its longest batch.
        worst_batches = worst_case_batches(ds, cfg.micro_batch, world, rank, tok.pad_token_id, t.padding_side,
                                           grad_acc=cfg.grad_acc, padding_free=t.padding_free)
        timer = StepTimer(device, t.warmup_steps)
        records: list[StepRecord] = []
        status = "ok"
        error = ""
        t_measure = time.perf_counter()
        for step in range(1, t.steps + 1 + t.worst_case_step):
            worst = step > t.steps
            if step == t.warmup_steps + 1:
                sampler.reset_peak()  # the measured phase starts: peaks from here on
                t_measure = time.perf_counter()
            timer.start_step()
            poison = _inject(cfg, step, rank)
            sums = torch.zeros(len(metrics.DEVICE_SUMS), dtype=torch.float64, device=device)
            host = [0.0] * len(metrics.HOST_SUMS)  # pairs, sequences, slots, tokens
            max_seq_len = 0
            for micro in range(cfg.grad_acc):
                cpu_mb = next(worst_batches if worst else batches)
                max_seq_len = max(max_seq_len, cpu_mb.max_seq_len())
                pad = bool((cpu_mb.attention_mask == 0).any())
                tokens = cpu_mb.tokens()
                mb = cpu_mb.to(device)
                b = mb.pairs
                sync = micro == cfg.grad_acc - 1 or cfg.resources.sync_every_micro_step
                with _no_sync(lp, sync=sync), _autocast(cfg, device):
                    if ref_table is not None:
                        ref_logps = ref_table[cpu_mb.index].t().reshape(-1).to(device, non_blocking=True)
                    else:
                        # The reference runs first, while no policy activation is alive yet: its
                        # transient buffers then never add to the step's peak.
                        with torch.no_grad():
                            ref_logps, _ = ref_lp(*_forward_inputs(mb, pad))
                    logps, counts = lp(*_forward_inputs(mb, pad))
                    losses, rew_c, rew_r = dpo_loss(logps[:b], logps[b:], ref_logps[:b], ref_logps[b:],
                                                    cfg.beta, t.loss, t.label_smoothing,
                                                    chosen_tokens=counts[:b], rejected_tokens=counts[b:])
                    if poison:
                        losses = losses * float("nan")
                    # Mean over the effective batch: micro_batch x grad_acc pairs here, and DDP/FSDP
                    # average over workers, so any split of the same pairs gives the same update.
                    loss = losses.sum() / (b * cfg.grad_acc)
                scaler.scale(loss).backward()
                sums += metrics.micro_step_sums(losses, rew_c, rew_r, logps, ref_logps.float(), counts)
                host = [host[0] + b, host[1] + 2 * b, host[2] + cpu_mb.slots(), host[3] + tokens]
            scaler.unscale_(opt)
            max_norm = t.max_grad_norm if t.max_grad_norm is not None else float("inf")
            grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            sched.step()
            if world > 1:
                sums = torch.cat([sums, torch.tensor(host, dtype=torch.float64).to(device)])
                dist.all_reduce(sums)
            step_ms = timer.end_step(counted=not worst)
            values = sums.tolist()  # one host sync per step, after the step is done
            if world == 1:
                values += host
            gn = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
            peak = sampler.peak_gb()
            if world > 1:
                peak_t = torch.tensor([peak, max_seq_len], dtype=torch.float64, device=device)
                dist.all_reduce(peak_t, op=dist.ReduceOp.MAX)
                peak, max_seq_len = float(peak_t[0]), int(peak_t[1])
            m = metrics.step_means(values)
            rec = StepRecord(
                trial_id=cfg.trial_id, step=step, loss=m["loss"], grad_norm=gn, step_time_ms=step_ms,
                peak_mem_gb=peak, reward_accuracy=m["rewards/accuracies"],
                reward_margin=m["rewards/margins"], logps_chosen=m["logps/chosen"],
                logps_rejected=m["logps/rejected"], kl=m["kl"], rewards_chosen=m["rewards/chosen"],
                rewards_rejected=m["rewards/rejected"], tokens_per_s=values[-1] / (step_ms / 1e3),
                lr=sched.get_last_lr()[0], measured=step > t.warmup_steps,
                max_seq_len=max_seq_len, padding_frac=m["padding_frac"], worst_case=worst,
            )
            records.append(rec)
            on_step(rec)
            say(f"[{cfg.trial_id}] step {'worst' if worst else step}/{t.steps} loss {rec.loss:.4f} grad_norm {gn:.3f} "
                f"acc {rec.reward_accuracy:.2f} margin {rec.reward_margin:+.4f} kl {rec.kl:+.5f} "
                f"{step_ms:.0f} ms {rec.tokens_per_s:,.0f} tok/s peak {peak:.2f} GB"
                + ("" if rec.measured else " (warm-up)") + (" (worst case: longest pairs)" if worst else ""))
            non_finite_grad = not math.isfinite(gn) and t.precision != "fp16"  # fp16: scaler skips it
            if not math.isfinite(rec.loss) or non_finite_grad:
                status = "diverged"
                error = f"non-finite {'loss' if not math.isfinite(rec.loss) else 'grad_norm'} at step {step}"
                say(f"[{cfg.trial_id}] diverged: {error}; stopping")
                break
        t_end = time.perf_counter()
        alloc_gb, reserved_gb = sampler.torch_peaks_gb()
    sampler.close()

    peaks = measured_peaks_gb(records)
    measured = [r for r in records if r.measured and not r.worst_case]  # typical batches
    step_ms = timer.median_ms()  # the same measured steps as step_time_p90_ms below
    tokens = metrics.mean([r.tokens_per_s * r.step_time_ms / 1e3 for r in measured])
    flops = dpo_step_flops(fwd_flops_per_token=fwd_flops, policy_tokens=int(tokens) if math.isfinite(tokens) else 0,
                           reference=t.reference,
                           recompute_fraction=RECOMPUTE_FRACTION[cfg.checkpoint_level])
    gpu_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    result = TrialResult(
        trial_id=cfg.trial_id, status=status, **cfg.knobs(),
        peak_mem_gb=peaks.worst_gb, peak_mem_typical_gb=peaks.typical_gb,
        padding_frac=metrics.mean([r.padding_frac for r in measured]),
        torch_peak_alloc_gb=alloc_gb, torch_peak_reserved_gb=reserved_gb,
        step_time_ms=step_ms,
        step_time_p10_ms=timer.p10_ms(), step_time_p90_ms=timer.p90_ms(),
        tokens_per_s=metrics.median([r.tokens_per_s for r in measured]),
        mfu=mfu(flops, step_ms / 1e3, gpu_name, world) if measured else math.nan,
        loss_mean=metrics.mean([r.loss for r in measured]),
        loss_std=metrics.detrended_std([r.loss for r in measured]),
        grad_norm_mean=metrics.mean([r.grad_norm for r in measured]),
        reward_accuracy=metrics.mean([r.reward_accuracy for r in measured]),
        reward_margin=metrics.mean([r.reward_margin for r in measured]),
        error=error, mem_source=sampler.source, loss_type=t.loss, precision=t.precision,
        reference=t.reference, attn_implementation=built.attn_implementation, liger_kernel=built.liger_kernel,
        lean_ops=cfg.model.lean_ops, device=str(device),
        steps=len(records), measured_steps=len(measured), pairs_used=usable, pairs_dropped=ds.dropped,
        startup_s=t_measure - t_start, measure_s=t_end - t_measure,
    )
    return TrialOutcome(result, tuple(records))
