"""One trial: build data and models, run K optimizer steps of DPO, measure, summarise.

Read top to bottom: :func:`run_trial` resolves the device and turns failures into statuses;
:func:`_train` is the story - build (:mod:`dpo_sweep.train.setup`: data, models, reference,
checkpoint level, optimizer), then :func:`train_step` for each optimizer step, then
:func:`~dpo_sweep.train.summary.summarise` into the trial's row. Inside Ray Train (torch.distributed initialised) the same code runs DDP or
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

import dataclasses
import math
import os
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from dpo_sweep.core import stability, trial_facts
from dpo_sweep.config import TrialConfig
from dpo_sweep.core.held_out import HELD_OUT_FIELDS
from dpo_sweep.core.status import Status
from dpo_sweep.errors import UserError
from dpo_sweep.records import StepRecord, TrialResult, error_text, failed_result
from dpo_sweep.telemetry import MemorySampler, StepTimer, TrialClock, failure_peak_gb, make_memory_sampler
from dpo_sweep.core.flops import NO_TOKENS
from dpo_sweep.telemetry.timing import PhaseMarks, micro_and_optimizer_ms
from dpo_sweep.train import evaluation, heldout, knobs, metrics, parallel
from dpo_sweep.train.adapters import InBackwardOptimizer
from dpo_sweep.train.batching import MicroBatch, flop_token_counts
from dpo_sweep.train.faults import InjectedFault, inject
from dpo_sweep.train.loss import dpo_loss
from dpo_sweep.core.order import worst_case_micro_steps
from dpo_sweep.train.reference import missing_rows
from dpo_sweep.train.setup import (
    Logger,
    TrialSetup,
    autocast,
    build_trial,
    configure_device_memory,
    forward_inputs,
    load_data,
    precompute_reference,
)
from dpo_sweep.train.summary import StepOutput, summarise
from dpo_sweep.train.warm_state import WarmState

@dataclass(frozen=True)
class TrialOutcome:
    """What a trial returns: its summary row and its per-step rows."""

    result: TrialResult
    steps: tuple[StepRecord, ...]


def resolve_device(cfg: TrialConfig) -> torch.device:
    if trial_facts.device_type(cfg.train, cfg.resources, torch.cuda.is_available()) == "cpu":
        return torch.device("cpu")
    index = int(os.environ.get("LOCAL_RANK", torch.cuda.current_device())) if dist.is_initialized() else 0
    index = min(index, torch.cuda.device_count() - 1)
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def run_trial(cfg: TrialConfig, *, on_step: Callable[[StepRecord], None] | None = None,
              log: Logger | None = print, catch_failures: bool = True,
              clock: TrialClock | None = None, warm: WarmState | None = None,
              fault: InjectedFault | None = None) -> TrialOutcome:
    """Run one trial on this process's device (and its process group, if any).

    With ``catch_failures`` an OOM becomes status ``oom`` and any other exception ``error``;
    without it they propagate (Ray Train then reports them). Bad input (:class:`UserError`)
    always propagates. A NaN/inf loss is status ``diverged`` either way. ``clock``: where the
    trial's ``startup_s`` counts from (a sweep passes the Tune trial's start); by default here.
    ``warm``: what this process keeps from its earlier trials (a warm worker's); None: nothing.
    ``fault``: a fault to inject (tests only: :mod:`~dpo_sweep.train.faults`).
    """
    say = log or (lambda _msg: None)
    clock = clock or TrialClock()
    device = resolve_device(cfg)
    report = on_step or (lambda _r: None)
    done: list[StepRecord] = []  # the steps that ran: a failure's row and steps.csv keep them

    def keep(record: StepRecord) -> None:
        done.append(record)
        report(record)

    try:
        with parallel.simulated_group(cfg):
            return _run(cfg, device, clock, keep, say, warm, fault)
    except UserError:
        raise
    except torch.OutOfMemoryError as err:
        if not catch_failures:
            raise
        say(f"[{cfg.trial_id}] out of memory: {str(err).splitlines()[0] if str(err) else ''}")
        return TrialOutcome(_failed(cfg, Status.OOM, err, done), tuple(done))
    except Exception as err:  # noqa: BLE001 - a trial's failure is a result, not a crash
        if not catch_failures:
            raise
        say(f"[{cfg.trial_id}] error: {type(err).__name__}: {err}")
        return TrialOutcome(_failed(cfg, Status.ERROR, err, done), tuple(done))
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _run(cfg: TrialConfig, device: torch.device, clock: TrialClock, keep: Callable[[StepRecord], None],
         say: Logger, warm: WarmState | None, fault: InjectedFault | None) -> TrialOutcome:
    if cfg.train.trainer == "trl":
        from dpo_sweep.train import trl_trainer  # TRL's import (seconds) only where a trial uses it

        return TrialOutcome(*trl_trainer.train(cfg, device, clock, keep, say, warm, fault))
    return _train(cfg, device, clock, keep, say, warm, fault)


def _failed(cfg: TrialConfig, status: str, err: BaseException, done: list[StepRecord]) -> TrialResult:
    """The row of a trial that raised: its peak is the peak up to the failure (the steps that ran,
    and the failing step's so far, which the memory sampler attached to the exception)."""
    return failed_result(cfg, status, error_text(err), done, failing_peak_gb=failure_peak_gb(err))


def _train(cfg: TrialConfig, device: torch.device, clock: TrialClock,
           on_step: Callable[[StepRecord], None], say: Logger, warm: WarmState | None,
           fault: InjectedFault | None) -> TrialOutcome:
    since = time.perf_counter()
    world, rank = _world()
    say = say if rank == 0 else (lambda _m: None)
    configure_device_memory(cfg, device)
    data = load_data(cfg, world, say, since, warm)
    clock.mark("data")
    sampler = make_memory_sampler(device)
    # `with`: an exception of the body (an OOM) wins over one of the sampler thread.
    with sampler:
        setup = build_trial(cfg, device, world, rank, data, say, since, warm)
        clock.mark("model")
        timer = StepTimer(device, cfg.train.warmup_steps)
        steps: list[StepOutput] = []
        status, error = Status.OK, ""
        held_out = _held_out_reference(setup)
        for step in range(1, cfg.train.steps + 1 + cfg.train.worst_case_step):
            sampler.reset_peak()  # this step's own peak (not the model build's or earlier steps')
            out = train_step(setup, step, timer, sampler, clock, fault)
            if held_out is not None and step <= cfg.train.steps and heldout.is_eval_step(step, cfg.train):
                # After the step's timer ended: scoring the split is no part of its time.
                score = _score_held_out(setup, held_out, out.record.beta)
                out = dataclasses.replace(out, record=dataclasses.replace(out.record, **score))
            steps.append(out)
            on_step(out.record)
            say(_step_line(cfg, out.record))
            # A simulated rank's peers' shards are uninitialised memory: its losses are no signal.
            error = "" if setup.simulated else divergence(out.record, cfg.train.precision)
            if error:
                status = Status.DIVERGED
                say(f"[{cfg.trial_id}] diverged: {error}; stopping")
                break
    sampler.close()
    if setup.ema is not None:
        setup.ema.copy_to_params()  # the EMA weights are the trial's final weights
    records = [out.record for out in steps if not out.record.worst_case]  # the learning signals: typical steps
    eval_loss = math.nan if status != Status.OK or not cfg.train.evaluate or held_out is not None else evaluation.held_batch_loss(
        lambda model, held: precompute_reference(model, held, cfg, device, setup.data.pad_token_id),
        setup.policy, setup.reference, setup.ref_table, setup.data.pairs, cfg.effective_batch(),
        records[-1].beta, cfg.train)
    scored = [r for r in records if math.isfinite(r.eval_reward_accuracy)]
    if held_out is not None:  # the last eval point's; eval_loss: the held-out split's, not a held batch
        last = scored[-1] if scored else None
        eval_loss = last.eval_loss if last is not None and status == Status.OK else math.nan
    signals = stability.signals(*([getattr(r, k) for r in records] for k in (
        "loss", "grad_norm", "logratio_std", "reward_accuracy", "reward_margin")), precision=cfg.train.precision)
    result = summarise(setup, steps, timer, clock, status=status, error=error, mem_source=sampler.source,
                       signals={**signals, "eval_loss": eval_loss})
    if held_out is not None:
        last = {f: getattr(scored[-1], f) if scored else math.nan for f in HELD_OUT_FIELDS if f != "eval_loss"}
        result = dataclasses.replace(result, **last, eval_pairs=len(setup.data.held_out))
    return TrialOutcome(result, tuple(out.record for out in steps))


def _held_out_reference(setup: TrialSetup) -> torch.Tensor | None:
    """The reference's log-probs of the held-out split, before the first step (None without a
    split, or in a trial that only measures: ``train.evaluate`` off). Without a live reference the
    policy before its first update is the reference (a precomputed table is made from it too)."""
    cfg = setup.cfg
    if setup.data.held_out is None or not cfg.train.evaluate:
        return None
    return _logps(setup, setup.reference if setup.reference is not None else setup.policy)


def _logps(setup: TrialSetup, model: nn.Module) -> torch.Tensor:
    was_training = model.training
    model.eval()
    with torch.no_grad():
        table = precompute_reference(model, setup.data.held_out, setup.cfg, setup.device, setup.data.pad_token_id)
    model.train(was_training)
    return table


def _score_held_out(setup: TrialSetup, ref_logps: torch.Tensor, beta: float) -> dict[str, float]:
    """The policy's weights of this step on the held-out split (with train.ema_decay: the trained
    weights, not their average)."""
    return heldout.score(_logps(setup, setup.policy), ref_logps, setup.data.held_out, beta, setup.cfg.train)


# --- One optimizer step -----------------------------------------------------------------------


def train_step(setup: TrialSetup, step: int, timer: StepTimer, sampler: MemorySampler,
               clock: TrialClock, fault: InjectedFault | None = None) -> StepOutput:
    """``grad_acc`` micro-batches forward and backward, one optimizer update, the step's metrics
    reduced over workers, and its row (``fault``: injected at its step, tests only)."""
    cfg = setup.cfg
    timer.start_step()
    clock.step_started()
    poison = inject(fault, step, setup.rank)
    worst = step > cfg.train.steps  # the worst-case step, after the steps: the longest pairs
    # cfg.grad_acc unless train.grad_acc_schedule; the worst case: its own few (order.worst_case_micro_steps)
    grad_acc = worst_case_micro_steps(cfg.grad_acc) if worst else setup.grad_acc_schedule.for_step(step)
    beta = knobs.seed_beta(step, cfg.train.steps, cfg.beta) if cfg.train.beta_schedule == "seed" else cfg.beta
    device_sums = torch.zeros(len(metrics.DEVICE_SUMS), dtype=torch.float64, device=setup.device)
    host_counts = metrics.HostCounts()  # known without the device
    max_seq_len = 0
    flop_counts = NO_TOKENS
    phases = PhaseMarks(setup.device)  # no sync of its own: read after the timer's end-of-step sync
    phases.mark()
    new_shapes = []  # per micro-step: its shape's first in this process (CUDA: kernel plans built)
    for micro in range(grad_acc):
        batch = next(setup.worst_batches if worst else setup.batches)
        new_shapes.append(first_of_its_shape(setup.shapes_run, batch, setup.device))
        max_seq_len = max(max_seq_len, batch.max_seq_len())
        flop_counts += flop_token_counts(batch, chunked_head=cfg.train.logp_chunk_tokens > 0)
        sync = micro == grad_acc - 1 or cfg.resources.sync_every_micro_step
        device_sums += _micro_step(setup, batch, sync, poison, beta, grad_acc)
        host_counts = host_counts.plus(batch.pairs, batch.slots(), batch.tokens())
        phases.mark()
    grad_norm = _optimizer_step(setup)
    phases.mark()
    sums = _all_reduce_sums(setup, device_sums, host_counts)
    step_time_ms = timer.end_step(counted=not worst)  # the worst case is not a typical step
    durations_ms = phases.durations_ms()
    micro_step_ms, optimizer_ms = micro_and_optimizer_ms(durations_ms, last_syncs=setup.world > 1, new=new_shapes)
    clock.step_ended()
    # One host sync per step, after the step is done; one process has its counts already.
    totals = metrics.StepSums.from_tensor(sums, host=host_counts if setup.world == 1 else None)
    tokens = int(totals.tokens)
    peaks = sampler.peaks()
    peaks = dataclasses.replace(peaks, peak_gb=_max_over_workers(setup, peaks.peak_gb))
    means = totals.means()
    record = StepRecord(
        trial_id=cfg.trial_id, step=step, loss=means.loss,
        grad_norm=float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm),
        step_time_ms=step_time_ms, peak_mem_gb=peaks.peak_gb,
        reward_accuracy=means.reward_accuracy, reward_margin=means.reward_margin,
        logps_chosen=means.logps_chosen, logps_rejected=means.logps_rejected,
        # steps.csv has both columns (kl: the contract's name; logratio_mean: the stability
        # signal's): one value under two names.
        kl=means.logratio_mean, logratio_mean=means.logratio_mean, logratio_std=means.logratio_std,
        rewards_chosen=means.rewards_chosen, rewards_rejected=means.rewards_rejected,
        tokens_per_s=tokens / (step_time_ms / 1e3), lr=float(setup.scheduler.get_last_lr()[0]),
        measured=step > cfg.train.warmup_steps, micro_step_ms=micro_step_ms, optimizer_ms=optimizer_ms,
        beta=beta, grad_acc=grad_acc, micro_ms=",".join(f"{ms:.3f}" for ms in durations_ms[:-1]),
        micro_new="".join("1" if n else "0" for n in new_shapes),
        max_seq_len=int(_max_over_workers(setup, max_seq_len)), padding_frac=means.padding_frac,
        worst_case=worst,
    )
    if not worst:
        setup.grad_acc_schedule.observe(record.kl)
    return StepOutput(record, tokens, flop_counts, peaks)


def first_of_its_shape(shapes_run: set[tuple[int, ...]], batch: MicroBatch, device: torch.device) -> bool:
    """Whether ``batch`` is the first micro-batch of its shape this process trains on (then
    recorded in ``shapes_run``), on CUDA: there its micro-step also builds the kernel plans a long
    run builds once. On the CPU, never (nothing of the kind)."""
    shape = tuple(batch.input_ids.shape)
    new = shape not in shapes_run
    shapes_run.add(shape)
    return new and device.type == "cuda"


def _micro_step(setup: TrialSetup, cpu_batch: MicroBatch, sync: bool, poison: bool, beta: float,
                grad_acc: int) -> torch.Tensor:
    """Forward and backward of one micro-batch of a step of ``grad_acc``; its contribution to the
    step's device sums. ``beta``: this step's (train.beta_schedule)."""
    cfg = setup.cfg
    has_padding = bool((cpu_batch.attention_mask == 0).any())
    batch = cpu_batch.to(setup.device)
    pairs = batch.pairs
    with parallel.no_sync(setup.policy, sync=sync), autocast(cfg, setup.device):
        if setup.ref_table is not None:
            if missing := missing_rows(setup.ref_table, cpu_batch.index):  # a CPU look-up: no sync
                raise RuntimeError(f"no precomputed reference for pairs {missing[:8]} (train/reference.pairs_read "
                                   "must list every pair a trial reads)")
            ref_logps = setup.ref_table[cpu_batch.index].t().reshape(-1).to(setup.device, non_blocking=True)
        else:
            # The reference runs first, while no policy activation is alive yet: its
            # transient buffers then never add to the step's peak.
            with torch.no_grad():
                ref_logps, _ = setup.reference(*forward_inputs(batch, has_padding))
            if hasattr(setup.reference, "reshard"):  # FSDP2 keeps a root's weights gathered after its forward
                setup.reference.reshard()
        logps, token_counts = setup.policy(*forward_inputs(batch, has_padding))
        losses, chosen_rewards, rejected_rewards = dpo_loss(
            logps[:pairs], logps[pairs:], ref_logps[:pairs], ref_logps[pairs:], beta, cfg.train.loss,
            cfg.train.label_smoothing, chosen_tokens=token_counts[:pairs], rejected_tokens=token_counts[pairs:])
        if poison:
            losses = losses * float("nan")
        # Mean over the effective batch: micro_batch x grad_acc pairs here, and DDP/FSDP
        # average over workers, so any split of the same pairs gives the same update.
        loss = losses.sum() / (pairs * grad_acc)
        if (aux := getattr(setup.policy, "module", setup.policy).aux_loss) is not None:
            # An MoE's weighted router loss, per micro-batch as TRL adds it to the batch's mean loss.
            loss = loss + aux / grad_acc
    setup.scaler.scale(loss).backward()
    return metrics.micro_step_sums(losses, chosen_rewards, rejected_rewards, logps, ref_logps.float(), token_counts)


def _optimizer_step(setup: TrialSetup) -> torch.Tensor:
    """Unscale, clip, update, advance the schedule; the gradient norm before clipping."""
    setup.scaler.unscale_(setup.optimizer)
    if setup.adaptive_clip is not None:
        setup.adaptive_clip.clip_()  # per parameter, before the total-norm clip
    max_norm = setup.cfg.train.max_grad_norm
    if isinstance(setup.optimizer, InBackwardOptimizer):  # stepped in backward; no clip (refused)
        grad_norm = setup.optimizer.take_grad_norm()
    else:
        grad_norm = torch.nn.utils.clip_grad_norm_(setup.params, max_norm if max_norm is not None else float("inf"))
    setup.scaler.step(setup.optimizer)
    setup.scaler.update()
    if setup.ema is not None:
        setup.ema.update()
    setup.optimizer.zero_grad(set_to_none=True)
    setup.scheduler.step()
    return grad_norm


def _all_reduce_sums(setup: TrialSetup, device_sums: torch.Tensor, counts: metrics.HostCounts) -> torch.Tensor:
    """The step's sums over all workers, :class:`~dpo_sweep.train.metrics.StepSums`' layout (the
    host counts join the device sums: one all-reduce, not two); one process: the device sums."""
    if setup.world == 1:
        return device_sums
    sums = torch.cat([device_sums, counts.to_tensor(setup.device)])
    dist.all_reduce(sums)
    # The fake group's all-reduce leaves rank 0's own: every rank is taken to read as much.
    return sums * setup.world if setup.simulated else sums


def _max_over_workers(setup: TrialSetup, value: float) -> float:
    if setup.world == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=setup.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor)


def divergence(record: StepRecord, precision: str) -> str:
    """Why the trial must stop at this step ("" when it need not): a non-finite loss, or a
    non-finite gradient norm except under fp16, whose scaler skips such a step by design."""
    if not math.isfinite(record.loss):
        return f"non-finite loss at step {record.step}"
    if not math.isfinite(record.grad_norm) and not stability.skipped_step(record.grad_norm, precision):
        return f"non-finite grad_norm at step {record.step}"
    return ""


def _step_line(cfg: TrialConfig, rec: StepRecord) -> str:
    total = cfg.train.steps + int(bool(cfg.train.worst_case_step))  # the worst-case step counts too
    return (f"[{cfg.trial_id}] step {rec.step}/{total} loss {rec.loss:.4f} grad_norm {rec.grad_norm:.3f} "
            f"acc {rec.reward_accuracy:.2f} margin {rec.reward_margin:+.4f} kl {rec.kl:+.5f} "
            f"{rec.step_time_ms:.0f} ms {rec.tokens_per_s:,.0f} tok/s peak {rec.peak_mem_gb:.2f} GB"
            + ("" if rec.measured else " (warm-up)") + (" (worst case: longest pairs)" if rec.worst_case else ""))


