"""A ``train.trainer: trl`` trial: TRL's ``DPOTrainer`` in the same worker, on what the native trial
of the same configuration gets, measured by the same sampler and step timer.

What is the same as a native trial: the model (built by :func:`~dpo_sweep.train.model.build_model`:
the folder or preset, the weights' dtype, the attention, liger-kernel's patches), the pairs (the
native trial's tokenization and truncation, in the native trial's micro-batch order, then the
worst-case step's longest pairs), the precision (TRL's bf16/fp16 autocast on those weights), the
reference (a frozen copy of the policy, the adapters-off policy for LoRA, or TRL's
``precompute_ref_log_probs``), the LoRA adapters (TRL's ``peft_config``), the padding multiple, the
optimizer settings and the learning-rate schedule over the trial's steps. The DPOConfig is the
export's (:func:`dpo_sweep.trl_export.build`) plus the run's own length, schedule and output.

What is TRL's: the forward and the log-prob head (TRL's fused LM head), its collator, its optimizer
step and its checkpointing (whole layers: level ``full``). So a native and a trl row of one
configuration differ by the trainer only.

The measurement: a :class:`TrainerCallback` resets the memory peak and starts the step timer at
each optimizer step's begin, stops both at its end, and makes the step's row when TRL logs the
step's metrics (``logging_steps=1``). TRL logs sequence-level rewards, not the per-token log ratio,
so ``kl``/``logratio_*`` are NaN in trl rows. An OOM propagates as in the native trainer: the
caller makes it a row.
"""
from __future__ import annotations

import copy
import math
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from dpo_sweep import trl_export, trl_fields
from dpo_sweep.core import stability, trial_facts
from dpo_sweep.config import TrialConfig
from dpo_sweep.core.status import Status
from dpo_sweep.errors import UserError
from dpo_sweep.records import StepRecord, TrialResult, config_columns
from dpo_sweep.telemetry import MemoryPeaks, StepTimer, TrialClock, make_memory_sampler, max_peaks
from dpo_sweep.telemetry.timing import PhaseMarks, micro_and_optimizer_ms
from dpo_sweep.train import metrics
from dpo_sweep.train.data import PairDataset, TokenizedPair
from dpo_sweep.train.faults import FAULTS_ENV, InjectedFault, inject
from dpo_sweep.train.model import build_model, freeze_reference
from dpo_sweep.core.order import batch_width, micro_batch_order, pair_length, worst_case_order
from dpo_sweep.train.setup import Logger, configure_device_memory, load_data
from dpo_sweep.train.warm_state import WarmState

#: The native trial's learning-rate schedules in transformers' names (with and without warm-up).
_SCHEDULES = {("constant", False): "constant", ("constant", True): "constant_with_warmup",
              ("linear", False): "linear", ("linear", True): "linear", ("cosine", False): "cosine",
              ("cosine", True): "cosine"}


@dataclass(frozen=True)
class StepPlan:
    """One optimizer step's pairs, as the native trial would take them."""

    micro_batches: tuple[tuple[int, ...], ...]
    """Pair indices per micro-batch."""
    tokens: int
    """Non-padding tokens of the policy's forward (chosen and rejected sequences)."""
    slots: int
    """Token positions the forward computes, padding included."""
    max_seq_len: int
    worst_case: bool
    shapes: tuple[tuple[int, int], ...] = ()
    """Each micro-batch's padded (rows, width)."""


def step_plans(cfg: TrialConfig, ds: PairDataset, multiple: int) -> list[StepPlan]:
    """The trial's steps: ``steps`` in the native trial's micro-batch order, then (with
    ``worst_case_step``) one step of ``grad_acc`` micro-batches on the longest pairs, the longest
    last (TRL's accumulation is a constant, so not the native worst case's own count)."""
    order = micro_batch_order(len(ds), cfg.micro_batch, 1, 0, cfg.train.seed, grad_acc=cfg.grad_acc)
    steps = [[tuple(next(order)) for _ in range(cfg.grad_acc)] for _ in range(cfg.train.steps)]
    plans = [_plan(ds, s, multiple, worst=False) for s in steps]
    if cfg.train.worst_case_step:
        longest = worst_case_order([pair_length(p) for p in ds.pairs], cfg.micro_batch, 1, 0, grad_acc=cfg.grad_acc)
        micro = [tuple(longest[0])] * max(0, cfg.grad_acc - len(longest)) + [tuple(m) for m in longest]
        plans.append(_plan(ds, micro[-cfg.grad_acc:], multiple, worst=True))
    return plans


def _plan(ds: PairDataset, micro: list[tuple[int, ...]], multiple: int, worst: bool) -> StepPlan:
    tokens = slots = longest = 0
    shapes = []
    for idx in micro:
        pairs = [ds.pairs[i] for i in idx]
        rows = [len(p.prompt_ids) + len(r) for p in pairs for r in (p.chosen_ids, p.rejected_ids)]
        width = batch_width(rows, multiple)
        tokens += sum(rows)
        slots += len(rows) * width
        longest = max(longest, max(rows))
        shapes.append((len(rows), width))
    return StepPlan(tuple(micro), tokens, slots, longest, worst, tuple(shapes))


def _row(p: TokenizedPair) -> dict[str, list[int]]:
    """A pair as TRL's collator reads it; responses already end in the end-of-sequence token."""
    return {"prompt_ids": list(p.prompt_ids), "chosen_ids": list(p.chosen_ids), "rejected_ids": list(p.rejected_ids)}


def dpo_config_kwargs(cfg: TrialConfig, device: torch.device, multiple: int, out_dir: str,
                      fields: trl_fields.TrlFields, max_steps: int) -> dict[str, Any]:
    """DPOConfig's keyword arguments for the trial: the export's, less ``model_init_kwargs`` (the
    model is built here), plus the run's length, schedule, output and logging."""
    model = cfg.model.model_dump(mode="json")
    kwargs = dict(trl_export.build(cfg, model, multiple, fields).dpo_config)
    kwargs.pop("model_init_kwargs", None)
    t = cfg.train
    kwargs.update(
        max_steps=max_steps, lr_scheduler_type=_SCHEDULES[(t.lr_schedule, t.lr_warmup_steps > 0)],
        warmup_steps=t.lr_warmup_steps, output_dir=out_dir, report_to="none", logging_steps=1,
        logging_nan_inf_filter=False,  # a non-finite loss is the trial's verdict, not a value to smooth over
        save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, use_cpu=device.type == "cpu",
        per_device_eval_batch_size=cfg.micro_batch, precompute_ref_batch_size=cfg.micro_batch,
    )
    return kwargs


@dataclass
class _Steps:
    """What the callback and the trainer's micro-steps collect, step by step."""

    device: torch.device
    records: list[StepRecord] = field(default_factory=list)
    peaks: list[MemoryPeaks] = field(default_factory=list)
    pending: tuple[float, MemoryPeaks, list[float]] | None = None
    phases: PhaseMarks | None = None  # this step's: its begin, each micro-step's end, the optimizer's end
    shapes_run: set[tuple[int, int]] = field(default_factory=set)
    status: str = Status.OK
    error: str = ""

    def micro_step_done(self) -> None:
        if self.phases is not None:
            self.phases.mark()


def _callback(cfg: TrialConfig, plans: list[StepPlan], timer: StepTimer, sampler: Any, clock: TrialClock,
              on_step: Callable[[StepRecord], None], say: Logger, steps: _Steps,
              fault: InjectedFault | None = None) -> Any:
    from transformers import TrainerCallback

    class Measure(TrainerCallback):
        """Step timer and memory peak around each optimizer step; the step's row at its log."""

        def on_step_begin(self, args, state, control, **kwargs):
            _inject(fault, state.global_step + 1)
            sampler.reset_peak()  # this step's own peak
            timer.start_step()
            clock.step_started()
            steps.phases = PhaseMarks(steps.device)  # no sync of its own: read after the timer's
            steps.phases.mark()

        def on_step_end(self, args, state, control, **kwargs):
            plan = plans[state.global_step - 1]
            steps.phases.mark()  # the optimizer step and zero_grad done
            ms = timer.end_step(counted=not plan.worst_case)  # a device sync: the step is done
            clock.step_ended()
            steps.pending = (ms, sampler.peaks(), steps.phases.durations_ms())
            steps.phases = None

        def on_log(self, args, state, control, logs=None, **kwargs):
            if steps.pending is None or logs is None or "loss" not in logs:
                return
            ms, peaks, durations = steps.pending
            steps.pending = None
            plan = plans[state.global_step - 1]
            new = [_first_of_its_shape(steps, shape) for shape in plan.shapes]
            record = _record(cfg, state.global_step, plan, logs, ms, peaks, durations, new)
            steps.records.append(record)
            steps.peaks.append(peaks)
            on_step(record)
            say(f"[{cfg.trial_id}] step {record.step}/{len(plans)} loss {record.loss:.4f} grad_norm "
                f"{record.grad_norm:.3f} acc {record.reward_accuracy:.2f} {ms:.0f} ms "
                f"{record.tokens_per_s:,.0f} tok/s peak {record.peak_mem_gb:.2f} GB (trl)"
                + ("" if record.measured else " (warm-up)") + (" (worst case: longest pairs)" if plan.worst_case else ""))
            if not math.isfinite(record.loss) or not math.isfinite(record.grad_norm):
                steps.status, steps.error = Status.DIVERGED, f"non-finite loss or grad_norm at step {record.step}"
                say(f"[{cfg.trial_id}] diverged: {steps.error}; stopping")
                control.should_training_stop = True

    return Measure()


def _first_of_its_shape(steps: _Steps, shape: tuple[int, int]) -> bool:
    """As the native trainer's ``first_of_its_shape``: on CUDA, whether a micro-batch's shape is
    new in this process (its micro-step built kernel plans); never on the CPU."""
    new = shape not in steps.shapes_run
    steps.shapes_run.add(shape)
    return new and steps.device.type == "cuda"


def _record(cfg: TrialConfig, step: int, plan: StepPlan, logs: dict[str, float], ms: float,
            peaks: MemoryPeaks, durations: list[float], new: list[bool]) -> StepRecord:
    def get(key: str) -> float:
        value = logs.get(key)
        return float(value) if value is not None else math.nan

    # one duration per micro-step, then the optimizer's: what the planner extrapolates grad_acc from
    timed = len(durations) == len(plan.micro_batches) + 1
    micro_step_ms, optimizer_ms = micro_and_optimizer_ms(durations, new=new) if timed else (math.nan, math.nan)

    return StepRecord(
        trial_id=cfg.trial_id, step=step, loss=get("loss"), grad_norm=get("grad_norm"), step_time_ms=ms,
        peak_mem_gb=peaks.peak_gb, reward_accuracy=get("rewards/accuracies"), reward_margin=get("rewards/margins"),
        logps_chosen=get("logps/chosen"), logps_rejected=get("logps/rejected"), kl=math.nan,
        rewards_chosen=get("rewards/chosen"), rewards_rejected=get("rewards/rejected"),
        tokens_per_s=plan.tokens / (ms / 1e3), lr=get("learning_rate"), measured=step > cfg.train.warmup_steps,
        max_seq_len=plan.max_seq_len, padding_frac=1.0 - plan.tokens / plan.slots if plan.slots else math.nan,
        worst_case=plan.worst_case, beta=cfg.beta, grad_acc=cfg.grad_acc, micro_step_ms=micro_step_ms,
        optimizer_ms=optimizer_ms, micro_ms=",".join(f"{d:.3f}" for d in durations[:-1]) if timed else "",
        micro_new="".join("1" if n else "0" for n in new) if timed else "")


def _inject(fault: InjectedFault | None, step: int) -> None:
    """An injected fault (tests only: :mod:`~dpo_sweep.train.faults`) at the start of ``step``: an
    error or an OOM."""
    if fault is not None and fault.kind == "nan" and fault.due(step):
        raise UserError(f"{FAULTS_ENV}: kind nan is not injected into a trl trial (TRL computes its own loss)")
    inject(fault, step)


def _trainer_class(micro_step_done: Callable[[], None]) -> type:
    """DPOTrainer reading the pairs as given, in the order given, marking each micro-step's end."""
    from torch.utils.data import SequentialSampler
    from trl import DPOTrainer

    class PreTokenizedDPOTrainer(DPOTrainer):
        def training_step(self, *args, **kwargs):
            loss = super().training_step(*args, **kwargs)
            micro_step_done()  # forward and backward of one micro-batch (an event on CUDA: no sync)
            return loss

        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            return dataset  # the native trial's tokenization and truncation, already applied

        def _get_train_sampler(self, *args, **kwargs):
            return SequentialSampler(self.train_dataset)  # the native trial's micro-batch order

    return PreTokenizedDPOTrainer


def train(cfg: TrialConfig, device: torch.device, clock: TrialClock, on_step: Callable[[StepRecord], None],
          say: Logger, warm: WarmState | None,
          fault: InjectedFault | None = None) -> tuple[TrialResult, tuple[StepRecord, ...]]:
    """The trial's steps under TRL: its row and its steps' rows (``fault``: tests only)."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers.trainer_callback import PrinterCallback
    from trl import DPOConfig

    from dpo_sweep.train.tokenizer import load_tokenizer

    refusal = trl_fields.trainer_refusal()
    if refusal:
        raise UserError(refusal)
    since = time.perf_counter()
    configure_device_memory(cfg, device)
    data = load_data(cfg, 1, say, since, warm)
    multiple = trial_facts.pad_multiple(cfg.train, device.type)
    plans = step_plans(cfg, data.pairs, multiple)
    rows = [_row(data.pairs.pairs[i]) for plan in plans for micro in plan.micro_batches for i in micro]
    held = [_row(p) for p in data.pairs.pairs[:cfg.effective_batch()]]
    clock.mark("data")
    fields = trl_fields.from_installed()
    sampler = make_memory_sampler(device)
    steps = _Steps(device)
    with sampler, tempfile.TemporaryDirectory(prefix="dpo-sweep-trl-") as out_dir:
        # lean_ops is the native trainer's; liger-kernel only where the TRL export can say so
        # (use_liger_kernel not deprecated): a trl row is what its export reproduces
        liger = cfg.model.liger_kernel if fields.knows("use_liger_kernel") else False
        built = build_model(cfg.model.model_copy(update={"lean_ops": False, "liger_kernel": liger}),
                            cfg.train.precision, device, seed=cfg.train.seed)
        peft = trl_export.peft_config(cfg)
        live_copy = cfg.train.reference == "live" and peft is None
        ref_model = freeze_reference(copy.deepcopy(built.model)) if live_copy else None
        args = DPOConfig(**dpo_config_kwargs(cfg, device, multiple, out_dir, fields, len(plans)))
        trainer = _trainer_class(steps.micro_step_done)(
            model=built.model, ref_model=ref_model, args=args, train_dataset=Dataset.from_list(rows),
            eval_dataset=Dataset.from_list(held) if cfg.train.evaluate else None,
            processing_class=load_tokenizer(cfg.model), peft_config=LoraConfig(**peft) if peft else None)
        clock.mark("model")
        say(f"[{cfg.trial_id}] model {cfg.model.label()}: TRL {fields.version} DPOTrainer, {cfg.train.precision}, "
            f"attention {built.attn_implementation}, checkpoint {cfg.checkpoint_level}, reference "
            f"{cfg.train.reference}, adapter {cfg.train.adapter}, device {device.type} "
            f"[{time.perf_counter() - since:.1f} s]")
        timer = StepTimer(device, cfg.train.warmup_steps)
        trainer.remove_callback(PrinterCallback)  # its dict per log: the step line below says it once
        trainer.add_callback(_callback(cfg, plans, timer, sampler, clock, on_step, say, steps, fault))
        trainer.train()
        eval_loss = (float(trainer.evaluate()["eval_loss"]) if cfg.train.evaluate and steps.status == Status.OK
                     else math.nan)
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    sampler.close()
    result = _summarise(cfg, device, steps, timer, clock, sampler.source, data.pairs, data.usable_pairs,
                        built, trainable, eval_loss)
    return result, tuple(steps.records)


def _summarise(cfg: TrialConfig, device: torch.device, steps: _Steps, timer: StepTimer, clock: TrialClock,
               mem_source: str, ds: PairDataset, usable: int, built: Any, trainable: int,
               eval_loss: float) -> TrialResult:
    """The trial's row, as :func:`dpo_sweep.train.loop.summarise` makes a native one."""
    records = steps.records
    measured_any = [i for i, r in enumerate(records) if r.measured] or list(range(len(records)))
    trial_peaks = max_peaks([steps.peaks[i] for i in measured_any])
    measured = [records[i] for i in measured_any if records[i].measured and not records[i].worst_case]
    typical = [steps.peaks[i] for i in measured_any if records[i].measured and not records[i].worst_case]
    typical_records = [r for r in records if not r.worst_case]
    signals = stability.signals(*([getattr(r, k) for r in typical_records] for k in (
        "loss", "grad_norm", "logratio_std", "reward_accuracy", "reward_margin")), precision=cfg.train.precision)
    return TrialResult(
        **config_columns(cfg), status=steps.status,
        peak_mem_gb=trial_peaks.peak_gb, torch_peak_alloc_gb=trial_peaks.torch_alloc_gb,
        torch_peak_reserved_gb=trial_peaks.torch_reserved_gb,
        peak_mem_typical_gb=max_peaks(typical).peak_gb if typical else trial_peaks.peak_gb,
        padding_frac=metrics.mean([r.padding_frac for r in measured]),
        step_time_ms=timer.median_ms(), step_time_p10_ms=timer.p10_ms(), step_time_p90_ms=timer.p90_ms(),
        tokens_per_s=metrics.median([r.tokens_per_s for r in measured]),
        loss_mean=metrics.mean([r.loss for r in measured]),
        loss_std=metrics.detrended_std([r.loss for r in measured]),
        grad_norm_mean=metrics.mean([r.grad_norm for r in measured]),
        reward_accuracy=metrics.mean([r.reward_accuracy for r in measured]),
        reward_margin=metrics.mean([r.reward_margin for r in measured]),
        error=steps.error, mem_source=mem_source, loss_type=cfg.train.loss, precision=cfg.train.precision,
        reference=cfg.train.reference, attn_implementation=built.attn_implementation,
        liger_kernel=built.liger_kernel, lean_ops=False, pad_multiple=trial_facts.pad_multiple(cfg.train, device.type),
        adapter=cfg.train.adapter, optimizer=cfg.train.optimizer, trainer="trl", trainable_params=trainable,
        device=str(device), steps=len(records), measured_steps=len(measured), pairs_used=usable,
        pairs_dropped=ds.dropped, startup_s=clock.startup_s(), measure_s=clock.measure_s(), **clock.startup_split(),
        **signals, eval_loss=eval_loss,
    )
