"""Which configurations fit a card, with how much to spare, and the cheapest lever that makes a
configuration that does not fit, fit: ``dpo-sweep validate SPACE --gpu NAME[,NAME...]``.

Every number here is the memory model's prediction (:func:`~dpo_sweep.plan.memory.predict_peak_gb`,
on CUDA: the NVML peak a card bounds, its CUDA context included), decided by the rule the
recommendation uses (:mod:`dpo_sweep.core.budget`): a peak fits when it is at most the card's reported
memory less the safety margin, both to 0.01 GB. Nothing runs and nothing needs a GPU: QLoRA and
the low-bit AdamW are predicted here like any other lever; only running them needs CUDA.

The levers, cheapest first (the first variant that fits is the answer):

1. the same maths, recomputed: a higher checkpoint level (none < L1 < L2 < L3 < full), the lowest
   that fits; then a smaller micro-batch with more grad_acc at the same effective batch (the
   largest that fits); then both (the lowest level, then the largest micro-batch);
2. a change of the optimizer's state: 8-bit AdamW (``optimizer: adamw_8bit``) instead of AdamW,
   with the same-maths variants above in the same order;
3. a change of what is trained: LoRA (``adapter: lora``), then QLoRA (an NF4 base), each with
   the same-maths variants.

So a lever that changes the update (8-bit states, adapters) is named only where no same-maths
variant fits. A configuration that nothing fits says which variant came closest.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

from dpo_sweep.core import budget, trial_facts
from dpo_sweep.core.dimensions import KNOBS, LEVER_COLUMNS, Memory
from dpo_sweep.core.levels import Level
from dpo_sweep.cards import Card
from dpo_sweep.config import CHECKPOINT_LEVELS, TrialConfig
from dpo_sweep.plan.memory import predict_peak_gb
from dpo_sweep.core.lengths import LengthProfile

#: Predicts a configuration's NVML peak (GB) on a card; raises OSError / ValueError / KeyError
#: where the model's config cannot be read here.
Predict = Callable[[TrialConfig], float]


@dataclass(frozen=True)
class Variant:
    """A configuration changed by zero or more levers; ``label`` says how ("" unchanged)."""

    cfg: TrialConfig
    label: str


@dataclass(frozen=True)
class Fit:
    """One configuration on one card."""

    trial_id: str
    peak_gb: float | None       # predicted; None where the model's config cannot be read here
    usable_gb: float            # the card's reported memory less the safety margin
    fits: bool
    lever: str = ""             # the cheapest lever that makes it fit ("" when it fits or nothing does)
    lever_peak_gb: float | None = None
    closest: str = ""           # nothing fits: the variant that came closest, with its peak

    @property
    def spare_gb(self) -> float | None:
        """usable - peak: what is left (negative: by how much it is over)."""
        return None if self.peak_gb is None else self.usable_gb - self.peak_gb


def _with(cfg: TrialConfig, **train: object) -> TrialConfig:
    return cfg.model_copy(update={"train": cfg.train.model_copy(update=train)}) if train else cfg


def _levels_above(cfg: TrialConfig) -> list[str]:
    mine = Level(cfg.checkpoint_level).memory_rank
    return [lv for lv in CHECKPOINT_LEVELS if Level(lv).memory_rank > mine
            and trial_facts.refused_attention(lv, cfg.model.attn_implementation) is None]


def _smaller_micro_batches(cfg: TrialConfig) -> list[int]:
    """Divisors of the micro-batch below it, largest first: each keeps the effective batch exact."""
    return [mb for mb in range(cfg.micro_batch - 1, 0, -1) if cfg.micro_batch % mb == 0]


def same_maths(cfg: TrialConfig) -> Iterator[Variant]:
    """``cfg`` and its variants that compute the same update, cheapest first (the module doc)."""
    yield Variant(cfg, "")
    for level in _levels_above(cfg):
        yield Variant(cfg.model_copy(update={"checkpoint_level": level}), f"checkpoint_level {level}")

    def smaller(base: TrialConfig, mb: int) -> TrialConfig:
        return base.model_copy(update={"micro_batch": mb, "grad_acc": base.grad_acc * (base.micro_batch // mb)})

    def mb_label(c: TrialConfig) -> str:
        return f"micro_batch {c.micro_batch} x grad_acc {c.grad_acc} (effective batch {c.effective_batch()} kept)"

    for mb in _smaller_micro_batches(cfg):
        c = smaller(cfg, mb)
        yield Variant(c, mb_label(c))
    for level in _levels_above(cfg):
        for mb in _smaller_micro_batches(cfg):
            c = smaller(cfg.model_copy(update={"checkpoint_level": level}), mb)
            yield Variant(c, f"checkpoint_level {level} + {mb_label(c)}")


def _join(*parts: str) -> str:
    return " + ".join(p for p in parts if p)


def variants(cfg: TrialConfig) -> Iterator[Variant]:
    """Every lever variant of ``cfg`` in the module doc's order, ``cfg`` itself first."""
    rungs: list[tuple[str, dict[str, object]]] = [("", {})]
    if cfg.train.optimizer == "adamw":
        rungs.append(("optimizer adamw_8bit", {"optimizer": "adamw_8bit"}))
    if cfg.train.adapter == "full":
        rungs.append(("adapter lora", {"adapter": "lora"}))
    if cfg.train.adapter in ("full", "lora"):
        rungs.append(("adapter qlora", {"adapter": "qlora"}))
    for rung_label, change in rungs:
        for v in same_maths(_with(cfg, **change)):
            yield Variant(v.cfg, _join(rung_label, v.label))


def predictor(lengths: Mapping[str, LengthProfile | None] | None = None) -> Predict:
    """The NVML peak on a card (CUDA), with each trial's data lengths (by trial id) where known."""
    def predict(cfg: TrialConfig) -> float:
        return predict_peak_gb(cfg, device="cuda", lengths=(lengths or {}).get(cfg.trial_id)).total_gb
    return predict


class FitPlanner:
    """Fits of configurations on cards; each variant's peak is predicted once, whatever the cards."""

    def __init__(self, predict: Predict, safety_margin: float) -> None:
        self._predict = predict
        self.safety_margin = safety_margin
        self._peaks: dict[tuple[str, str], float] = {}

    def _peak(self, trial_id: str, v: Variant) -> float:
        key = (trial_id, v.label)
        if key not in self._peaks:
            self._peaks[key] = self._predict(v.cfg)
        return self._peaks[key]

    def usable_gb(self, card: Card) -> float:
        return budget.usable_gb(card.memory_gb, self.safety_margin)

    def fit(self, cfg: TrialConfig, card: Card) -> Fit:
        usable = self.usable_gb(card)
        try:
            peak = self._peak(cfg.trial_id, Variant(cfg, ""))
        except (OSError, ValueError, KeyError):
            return Fit(cfg.trial_id, None, usable, False, closest="the model's config cannot be read here")
        if budget.fits(peak, usable):
            return Fit(cfg.trial_id, peak, usable, True)
        best: tuple[float, str] = (peak, "as it is")
        for v in variants(cfg):
            if not v.label:
                continue
            p = self._peak(cfg.trial_id, v)
            if budget.fits(p, usable):
                return Fit(cfg.trial_id, peak, usable, False, lever=v.label, lever_peak_gb=p)
            best = min(best, (p, v.label))
        return Fit(cfg.trial_id, peak, usable, False, closest=f"{best[1]}: {best[0]:.2f} GB")

    def table(self, trials: Sequence[TrialConfig], card: Card) -> list[Fit]:
        return [self.fit(t, card) for t in trials]

    def fewest_cards(self, cfg: TrialConfig, card: Card) -> tuple[int, str, float] | None:
        """The fewest ``card``s on which ``cfg`` fits as it is but for its workers (the effective
        batch kept: grad_acc follows), under its own parallelism, else under FSDP2 full shard:
        (workers, parallelism, per-GPU peak); None where none of up to 64 fits."""
        usable = self.usable_gb(card)
        own = cfg.resources.parallelism
        for parallelism in dict.fromkeys((own, "fsdp")):
            for n in WORKER_COUNTS:
                c = with_workers(cfg, n, parallelism)
                if c is None:
                    continue
                try:
                    peak = self._peak(cfg.trial_id, Variant(c, f"{n} x {parallelism}"))
                except (OSError, ValueError, KeyError):
                    return None
                if budget.fits(peak, usable):
                    return n, parallelism, peak
        return None


#: The worker counts :meth:`FitPlanner.fewest_cards` tries.
WORKER_COUNTS = (1, 2, 4, 8, 16, 32, 64)


def with_workers(cfg: TrialConfig, workers: int, parallelism: str) -> TrialConfig | None:
    """``cfg`` on ``workers`` workers under ``parallelism`` at its effective batch (grad_acc =
    effective batch / (micro_batch x workers)); None where that does not divide."""
    pairs = cfg.effective_batch()
    if pairs % (cfg.micro_batch * workers):
        return None
    resources = cfg.resources.model_copy(update={"workers_per_trial": workers, "parallelism": parallelism})
    return cfg.model_copy(update={"resources": resources, "grad_acc": pairs // (cfg.micro_batch * workers)})


def _gb(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _fewest(found: tuple[int, str, float] | None) -> str:
    if found is None:
        return "none up to 64"
    n, parallelism, peak = found
    return f"{n} ({parallelism}, {peak:.2f} GB each)"


def fit_text(card: Card, trials: Sequence[TrialConfig], fits: Sequence[Fit], safety_margin: float,
             fewest: Sequence[tuple[int, str, float] | None] | None = None) -> str:
    """One card's fit table, as ``validate`` prints it (``fewest``: each trial's
    :meth:`FitPlanner.fewest_cards`, a column of its own); where every configuration fits, one
    line naming the tightest instead of a table of "yes"."""
    usable = fits[0].usable_gb if fits else budget.usable_gb(card.memory_gb, safety_margin)
    n_fit = sum(f.fits for f in fits)
    head = (f"{card.name}: {card.memory_gb:.2f} GB as the card reports it ({card.marketed}), usable "
            f"{usable:.2f} GB after a {100 * safety_margin:g}% safety margin; ")
    notes = []
    if not card.bf16 and any(t.train.precision.startswith("bf16") for t in trials):
        notes.append(f"note: the {card.name} has no bf16 tensor cores: bf16 matmuls run far below its "
                     f"{card.bf16_tflops:g} TFLOP/s fp16 rate there; these peaks hold, the speed does not "
                     "(train.precision: fp16 suits it)")
    if fits and n_fit == len(fits):
        tight = min(range(len(fits)), key=lambda i: fits[i].spare_gb)
        return "\n".join([head + f"all {n_fit} configuration(s) fit, the tightest {trials[tight].trial_id} with "
                          f"{fits[tight].spare_gb:.2f} GB to spare (predicted peak {fits[tight].peak_gb:.2f} GB per GPU; "
                          "GB = 1e9 bytes)", *notes])
    head += f"{n_fit} of {len(fits)} configuration(s) fit as they are (predicted peaks, GB = 1e9 bytes)"
    memory_knobs = [d.column for d in KNOBS if d.memory is not Memory.NONE]  # beta changes no peak
    header = ["trial_id", "workers", "parallelism", *memory_knobs, *LEVER_COLUMNS, "predicted peak per GPU (GB)",
              "fits", "spare (GB)", "fewest GPUs that fit", "cheapest lever that fits (its predicted peak)"]
    rows = []
    for i, (t, f) in enumerate(zip(trials, fits)):
        if f.fits:
            verdict, lever = "yes", ""
        elif f.lever:
            verdict, lever = "no", f"{f.lever} ({f.lever_peak_gb:.2f} GB)"
        else:
            verdict, lever = ("-" if f.peak_gb is None else "no"), f"none fits (closest: {f.closest})"
        knobs = t.knobs()
        rows.append([t.trial_id, str(t.resources.workers_per_trial), t.resources.parallelism,
                     *(str(knobs[c]) for c in memory_knobs), *(str(getattr(t.train, c)) for c in LEVER_COLUMNS),
                     _gb(f.peak_gb), verdict, _gb(f.spare_gb), _fewest(fewest[i]) if fewest is not None else "-", lever])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = [head, *notes]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)
