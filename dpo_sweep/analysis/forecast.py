"""What the real run will cost: the recommended configuration over the user's whole data, for
``--epochs E``, from its measured throughput; and, only as a labelled estimate, on other cards.

* **Tokens**: every pair the sweep read, tokenised and truncated as the trainer does, counted as
  the trainer's ``tokens_per_s`` counts them (the policy forward's real tokens: the prompt twice,
  chosen, rejected; no padding). The preflight counts them once (data.json's ``tokens``, beside
  ``pairs``); nothing is tokenised here.
* **Hours** = ``epochs x tokens / tokens_per_s / 3600``, at the winner's measured median
  throughput; the interval is the same over the row's throughput interval (:mod:`dpo_sweep.core.noise`:
  its p10 and p90 step times). **GPU-hours** = hours x the row's workers. Start-up (model load, the
  reference precompute) and evaluation are not in it.
* **Optimizer steps** = ``ceil(epochs x pairs / effective_batch)``: a last partial batch counted as
  a step (dpo-sweep's own trainer drops it, TRL takes it).
* **Another card** (``--gpu``): the measured step time scaled by the ratio of the two cards' peak
  dense bf16 rates (DPO training is matmul-bound), beside the same scaled by their memory
  bandwidths. Real runs usually land between the two, and neither counts a different achieved
  MFU, so the estimate's expected error is that range: it is printed as an estimate, in a section
  of its own, never in a measured column. It needs the measured card in the catalog
  (environment.json's GPU name); a configuration whose measured peak does not fit the other card
  gets no time, and says so.

Where results.csv or data.json lacks what this needs (an older folder: no ``tokens`` in data.json;
no winner; no throughput), the forecast is None with the reason.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import pandas as pd

from dpo_sweep import cards
from dpo_sweep.core import budget, noise
from dpo_sweep.cards import Card
from dpo_sweep.core.status import TimeSource
from dpo_sweep.results_dir import ResultsDir


@dataclass(frozen=True)
class CardEstimate:
    """The winner on another card: an estimate, never a measurement."""

    card: str
    fits: bool
    usable_gb: float
    step_time_ms_estimate: float | None = None
    step_time_ms_range: tuple[float, float] | None = None  # bf16-rate-scaled and bandwidth-scaled, low to high
    hours_estimate: float | None = None                    # None without a forecast (no token count)
    hours_range: tuple[float, float] | None = None
    gpu_hours_estimate: float | None = None
    scaled_by: str = ""
    bf16_ratio: float | None = None                 # measured card's rate / this card's
    bandwidth_ratio: float | None = None
    expected_error: str = ""
    note: str = ""


@dataclass(frozen=True)
class Forecast:
    """The whole run at the winner's measured throughput."""

    trial_id: str
    pairs: int
    epochs: float
    steps: int
    effective_batch: int
    tokens_per_epoch: int
    tokens_per_s: float
    tokens_per_s_interval: tuple[float, float]
    hours: float
    hours_interval: tuple[float, float]
    gpu_hours: float
    gpu_hours_interval: tuple[float, float]
    workers_per_trial: int
    measured_on: str
    step_time_source: str
    basis: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _number(row: pd.Series, name: str) -> float:
    try:
        value = float(row.get(name))
    except (TypeError, ValueError):
        return math.nan
    return value


def dataset_of(row: pd.Series, datasets: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any] | None, str]:
    """data.json's entry the row trained on (its model's tokenizer and max_length), or (None, why)."""
    if not datasets:
        return None, f"no {ResultsDir.DATA} in the folder (the data's token counts are not known)"
    model, seq_len = str(row.get("model", "")), _number(row, "seq_len")
    matches = [d for d in datasets if str(d.get("model")) == model and _number(pd.Series(d), "max_length") == seq_len]
    if len(datasets) == 1 and not matches:
        matches = list(datasets)
    if len(matches) != 1:
        return None, (f"{len(matches)} data sets of {ResultsDir.DATA} match the winner's model {model} and "
                      f"max_length {seq_len:g}")
    entry = matches[0]
    if not isinstance(entry.get("tokens"), int) or not isinstance(entry.get("pairs"), int):
        return None, (f"{ResultsDir.DATA} has no token count (written by an older dpo-sweep); run the sweep "
                      "again to forecast")
    return entry, ""


def gpu_name(environment: Mapping[str, Any] | None) -> str | None:
    """environment.json's GPU name (``gpu_name``, else the first of ``gpus``); None on the CPU."""
    if not environment:
        return None
    name = environment.get("gpu_name")
    gpus = environment.get("gpus")
    if not name and isinstance(gpus, list) and gpus and isinstance(gpus[0], Mapping):
        name = gpus[0].get("name")
    return str(name) if name else None


def _hours(tokens_total: float, tokens_per_s: float) -> float:
    return tokens_total / tokens_per_s / 3600.0


def forecast(row: pd.Series | None, datasets: Sequence[Mapping[str, Any]], epochs: float = 1.0,
             environment: Mapping[str, Any] | None = None) -> tuple[Forecast | None, str]:
    """(the forecast, "") for the recommended row ``row``, or (None, why not)."""
    if not (epochs > 0 and math.isfinite(epochs)):
        raise ValueError(f"epochs must be a positive number, got {epochs}")
    if row is None:
        return None, "nothing was recommended"
    tps = _number(row, "tokens_per_s")
    if not (tps > 0 and math.isfinite(tps)):
        return None, "the recommended row has no measured tokens_per_s"
    entry, why = dataset_of(row, datasets)
    if entry is None:
        return None, why
    pairs, tokens = int(entry["pairs"]), int(entry["tokens"])
    effective = int(_number(row, "effective_batch")) if _number(row, "effective_batch") > 0 else 0
    if effective <= 0:
        return None, "the recommended row has no effective_batch"
    workers = int(_number(row, "workers_per_trial")) if _number(row, "workers_per_trial") >= 1 else 1
    low, high = (float(v[0]) for v in noise.throughput_interval(pd.DataFrame([row])))
    total = epochs * tokens
    hours = _hours(total, tps)
    hours_interval = (_hours(total, high), _hours(total, low))
    device = gpu_name(environment)
    source = str(row.get("step_time_source") or TimeSource.MEASURED)
    measured_on = device or "the CPU"
    basis = (f"{tps:,.0f} tokens/s ({source} on {measured_on}, the p10-p90 step times give the interval) over "
             f"the {tokens:,} tokens of all {pairs:,} pairs (prompt twice, chosen, rejected, after truncation to "
             f"max_length) x {epochs:g} epoch(s); start-up and evaluation not included"
             + (f"; data.max_pairs {entry['max_pairs']} limited the sweep to the file's first pairs: the "
                "forecast covers those only" if entry.get("max_pairs") == pairs else ""))
    fc = Forecast(
        trial_id=str(row.get("trial_id")), pairs=pairs, epochs=epochs,
        steps=math.ceil(epochs * pairs / effective), effective_batch=effective, tokens_per_epoch=tokens,
        tokens_per_s=tps, tokens_per_s_interval=(low, high), hours=hours, hours_interval=hours_interval,
        gpu_hours=hours * workers, gpu_hours_interval=(hours_interval[0] * workers, hours_interval[1] * workers),
        workers_per_trial=workers, measured_on=measured_on, step_time_source=source, basis=basis)
    return fc, ""


def card_estimates(row: pd.Series | None, fc: Forecast | None, environment: Mapping[str, Any] | None,
                   others: Sequence[Card], safety_margin: float = budget.DEFAULT_SAFETY_MARGIN
                   ) -> tuple[CardEstimate, ...]:
    """The recommended row on each of ``others`` (module doc): its step time scaled, and the
    run's hours too where ``fc`` is (a folder without token counts still gets the step time)."""
    if row is None or not others:
        return ()
    device = gpu_name(environment)
    measured = cards.of_device(device)
    step_ms, peak = _number(row, "step_time_ms"), _number(row, "peak_mem_gb")
    estimates = []
    for other in others:
        usable = budget.usable_gb(other.memory_gb, safety_margin)
        fits = budget.fits(peak, usable)
        if measured is None:
            why = (f"measured on {device}, which the card catalog does not hold" if device
                   else "measured on the CPU: no GPU rate to scale from")
            estimates.append(CardEstimate(other.name, fits, usable, note=f"no estimate: {why}"))
            continue
        if not fits:
            estimates.append(CardEstimate(other.name, False, usable, note=(
                f"does not fit: measured peak {peak:.2f} GB > usable {usable:.2f} GB "
                f"(dpo-sweep validate SPACE --gpu {other.name} names the lever that fits)")))
            continue
        compute = measured.bf16_tflops / other.bf16_tflops  # > 1: the other card is slower
        bandwidth = measured.bandwidth_gb_s / other.bandwidth_gb_s
        lo, hi = sorted((compute, bandwidth))
        hours = None if fc is None else fc.hours * compute
        estimates.append(CardEstimate(
            other.name, True, usable, step_time_ms_estimate=step_ms * compute,
            step_time_ms_range=(step_ms * lo, step_ms * hi), hours_estimate=hours,
            hours_range=None if fc is None else (fc.hours * lo, fc.hours * hi),
            gpu_hours_estimate=None if fc is None else hours * fc.workers_per_trial,
            scaled_by=f"peak dense bf16 rate ({measured.name} {measured.bf16_tflops:g} / {other.name} "
                      f"{other.bf16_tflops:g} TFLOP/s)",
            bf16_ratio=compute, bandwidth_ratio=bandwidth,
            expected_error=(f"x{lo:.2f} to x{hi:.2f} of the measured time: scaled by bf16 rate and by memory "
                            f"bandwidth ({measured.bandwidth_gb_s:g} / {other.bandwidth_gb_s:g} GB/s); achieved "
                            "MFU differs between cards, so the truth can fall outside it"),
            note="" if other.bf16 else f"{other.name} has no bf16 tensor cores: its fp16 rate is used"))
    return tuple(estimates)


def json_entry(fc: Forecast | None, reason: str, estimates: Sequence[CardEstimate] = ()) -> dict[str, Any]:
    """recommendation.json's keys: ``forecast`` (None when there is none), ``forecast_reason`` and
    ``estimates_on_other_cards`` (``--gpu``: estimates, never measurements; [] without it)."""
    return {"forecast": fc.to_json() if fc is not None else None, "forecast_reason": reason,
            "estimates_on_other_cards": [asdict(e) for e in estimates]}


def _h(hours: float) -> str:
    """Hours in the unit that shows them: h, min, or s for a run of under a minute."""
    if hours >= 0.1:
        return f"{hours:.2f} h"
    return f"{hours * 60:.1f} min" if hours * 60 >= 1 else f"{hours * 3600:.0f} s"


def _gpu_hours(value: float) -> str:
    return f"{value:.2f}" if value >= 0.01 else f"{value:.1g}"


def lines(fc: Forecast | None, reason: str, estimates: Sequence[CardEstimate] = ()) -> list[str]:
    """The forecast for the console and the report, one statement a line, the estimates on other
    cards after it."""
    return _forecast_lines(fc, reason) + [_estimate_line(e) for e in estimates]


def _forecast_lines(fc: Forecast | None, reason: str) -> list[str]:
    if fc is None:
        return [f"forecast: none ({reason})"]
    lo, hi = fc.hours_interval
    return [f"forecast for the whole run ({fc.trial_id}, {fc.epochs:g} epoch(s) of {fc.pairs:,} pairs): "
           f"{fc.steps:,} optimizer steps at effective batch {fc.effective_batch}, {_h(fc.hours)} "
           f"(p10-p90: {_h(lo)} to {_h(hi)}), {_gpu_hours(fc.gpu_hours)} GPU-hours ({fc.workers_per_trial} worker(s) x hours)",
           f"  from {fc.basis}"]


def _estimate_line(e: CardEstimate) -> str:
    if e.step_time_ms_estimate is None:
        return f"  estimate on {e.card}: {e.note}"
    hours = "" if e.hours_estimate is None else f"{_h(e.hours_estimate)} for the run, "
    return (f"  estimate on {e.card} (not measured): {hours}{e.step_time_ms_estimate:,.0f} ms/step, scaled by "
            f"{e.scaled_by}; expected error: {e.expected_error}" + (f"; {e.note}" if e.note else ""))
