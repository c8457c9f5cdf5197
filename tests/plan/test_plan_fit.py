"""validate --gpu: which configurations fit a card, with how much to spare, and the cheapest lever."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from dpo_sweep import cards, space as space_mod
from dpo_sweep.core import budget
from dpo_sweep.cli import main
from dpo_sweep.plan import fit
from dpo_sweep.plan.memory import predict_peak_gb

ROOT = Path(__file__).resolve().parents[2]
LEVERS = ROOT / "search_spaces/seed-table-llama-3-8b-80gb-levers.yaml"


def _trial(**knobs):
    """The 8B levers space's configuration with these knobs (adapter, optimizer, micro_batch, checkpoint_level)."""
    trials = space_mod.load(LEVERS).trials
    return next(t for t in trials if all((getattr(t.train, k) if k in ("adapter", "optimizer") else getattr(t, k)) == v
                                         for k, v in knobs.items()))


def _peak(cfg):
    return predict_peak_gb(cfg, device="cuda").total_gb


PLANNER = fit.FitPlanner(fit.predictor(), budget.DEFAULT_SAFETY_MARGIN)
H100, T4 = cards.card("H100"), cards.card("T4")


def test_a_fitting_configuration_says_how_much_is_spare_under_the_recommendations_rule():
    cfg = _trial(adapter="lora", optimizer="adamw", micro_batch=4, checkpoint_level="L2")
    f = PLANNER.fit(cfg, H100)
    usable = budget.usable_gb(H100.memory_gb, 0.05)
    assert f.fits and not f.lever and f.peak_gb == _peak(cfg)
    assert f.usable_gb == usable and f.spare_gb == pytest.approx(usable - _peak(cfg))


def test_the_same_maths_lever_comes_before_a_cheaper_state_even_where_8bit_adamw_would_fit():
    cfg = _trial(adapter="full", optimizer="adamw", micro_batch=4, checkpoint_level="L1")
    usable = budget.usable_gb(H100.memory_gb, 0.05)
    eight_bit = cfg.model_copy(update={"train": cfg.train.model_copy(update={"optimizer": "adamw_8bit"})})
    assert _peak(cfg) > usable and _peak(eight_bit) < usable  # both levers would do
    f = PLANNER.fit(cfg, H100)
    l2 = cfg.model_copy(update={"checkpoint_level": "L2"})
    assert not f.fits and f.lever == "checkpoint_level L2" and f.lever_peak_gb == _peak(l2) <= usable


def test_a_smaller_micro_batch_keeps_the_effective_batch():
    cfg = _trial(adapter="full", optimizer="adamw", micro_batch=16, checkpoint_level="L1")
    variants = [v for v in fit.same_maths(cfg) if "micro_batch" in v.label]
    assert variants and all(v.cfg.effective_batch() == cfg.effective_batch() == 256 for v in variants)
    assert [v.cfg.micro_batch for v in variants[:4]] == [8, 4, 2, 1]
    f = PLANNER.fit(cfg, H100)
    assert f.lever.startswith("micro_batch ") or f.lever.startswith("checkpoint_level ")
    assert budget.fits(f.lever_peak_gb, f.usable_gb)


def test_adapters_are_named_only_where_no_same_maths_or_optimizer_variant_fits():
    cfg = _trial(adapter="full", optimizer="adamw", micro_batch=4, checkpoint_level="L2")
    f = PLANNER.fit(cfg, cards.card("A100-40GB"))  # 16 GB of bf16 weights + states: full FT cannot fit 40 GB
    assert f.lever.startswith("adapter lora")
    assert all(not budget.fits(_peak(v.cfg), f.usable_gb) for v in fit.variants(cfg) if not v.label.startswith("adapter"))


def test_nothing_fits_names_the_closest_variant():
    cfg = _trial(adapter="full", optimizer="adamw", micro_batch=16, checkpoint_level="L1")
    small = cards.Card("tiny", 1024, 1.0, 1.0, "test", "1 GB")  # 1 GiB: an 8B model fits in no way
    f = PLANNER.fit(cfg, small)
    assert not f.fits and not f.lever and f.closest.startswith("adapter qlora + checkpoint_level full + micro_batch 1")
    closest = min(_peak(v.cfg) for v in fit.variants(cfg))
    assert f.closest.endswith(f": {closest:.2f} GB")


def test_qlora_and_low_bit_adamw_are_predicted_without_cuda_or_torchao(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["validate", str(LEVERS), "--gpu", "L4,H100"]) == 0
    out = capsys.readouterr().out
    assert "train.adapter: qlora, train.optimizer: adamw_8bit runs on a CUDA GPU only" in out
    assert "(validate predicts it here; only running it needs that)" in out
    trials = space_mod.load(LEVERS).trials
    for card in (cards.card("L4"), cards.card("H100")):
        block = out[out.index(f"\n{card.name}: "):]
        assert f"{card.memory_gb:.2f} GB as the card reports it" in block.splitlines()[1]
        fits = PLANNER.table(trials, card)
        assert f"{sum(f.fits for f in fits)} of {len(trials)} configuration(s) fit as they are" in block
    qlora = next(t for t in trials if t.train.adapter == "qlora")
    line = next(line for line in out[out.index("\nH100: "):].splitlines() if line.startswith(qlora.trial_id))
    assert f"{_peak(qlora):.2f}" in line and " yes " in line


def test_a_bad_safety_margin_exits_2(capsys):
    assert main(["validate", "search_spaces/quickstart.yaml", "--gpu", "L4", "--safety-margin", "1.5"]) == 2
    assert "--safety-margin is 1.5" in capsys.readouterr().err


def test_a_card_without_bf16_says_so_for_a_bf16_space():
    trials = space_mod.load(LEVERS).trials[:2]  # precision: bf16
    text = fit.fit_text(T4, trials, PLANNER.table(trials, T4), 0.05)
    assert "note: the T4 has no bf16 tensor cores" in text
    assert "no bf16 tensor cores" not in fit.fit_text(H100, trials, PLANNER.table(trials, H100), 0.05)


def test_a_card_every_configuration_fits_is_one_line_naming_the_tightest(capsys):
    assert main(["validate", "search_spaces/quickstart.yaml", "--gpu", "H100"]) == 0
    block = capsys.readouterr().out.split("\nH100: ", 1)[1].strip().splitlines()
    trials = space_mod.load("search_spaces/quickstart.yaml").trials
    fits = PLANNER.table(trials, H100)
    tight = min(range(len(fits)), key=lambda i: fits[i].spare_gb)
    assert len(block) == 1, block  # no table of "yes"
    # validate predicts with the data's own lengths: within 0.02 GB of the planner's default here
    said = re.search(rf"all {len(trials)} configuration\(s\) fit, the tightest {trials[tight].trial_id} with "
                     r"([0-9.]+) GB to spare", block[0])
    assert said and abs(float(said.group(1)) - fits[tight].spare_gb) < 0.02, block[0]
