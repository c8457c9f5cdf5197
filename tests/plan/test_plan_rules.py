"""The planner's rules: dedupe, ordering, pruning after an OOM and over budget, short
accumulation and step-time extrapolation, learning trials."""
from __future__ import annotations

import pytest

from dpo_sweep.plan import rules
from dpo_sweep.plan.memory import predict_peak_gb
from tests.testkit import make_cfg


def _cfg(i: int, **kw):
    return make_cfg(trial_id=f"t{i:03d}", **kw)


def _peak(cfg) -> float:
    return predict_peak_gb(cfg).total_gb


# --- measurement key and dedupe -------------------------------------------------------------

@pytest.mark.parametrize("change", [
    {"beta": 0.5}, {"loss": "ipo"}, {"label_smoothing": 0.2}, {"lr": 1e-4}, {"lr_schedule": "cosine"},
    {"lr_warmup_steps": 1}, {"weight_decay": 0.1}, {"adam_betas": (0.8, 0.9)}, {"adam_eps": 1e-6},
    {"max_grad_norm": None}, {"steps": 5}, {"seed": 3}, {"grad_acc": 4, "base_grad_acc": 2},
])
def test_knobs_that_cannot_change_memory_share_a_key(change):
    change = dict(change)
    base = _cfg(0, grad_acc=change.pop("base_grad_acc", 1))
    other = _cfg(1, **{"grad_acc": base.grad_acc, **change})
    assert rules.measurement_key(base) == rules.measurement_key(other)


@pytest.mark.parametrize("change", [
    {"micro_batch": 2}, {"checkpoint_level": "L1"}, {"max_length": 32}, {"precision": "bf16"},
    {"reference": "precomputed"}, {"logp_chunk_tokens": 0}, {"padding_side": "left"}, {"grad_acc": 2},
    {"model": {"preset": "tiny-llama", "lean_ops": False}},
    {"model": {"preset": "tiny-llama", "attn_implementation": "eager"}},
    {"resources": {"use_gpu": False, "workers_per_trial": 2}},
    {"data": {"synthetic": {"pairs": 16, "prompt_tokens": 20, "response_tokens": 10}}},
])
def test_knobs_that_can_change_memory_split_the_key(change):
    assert rules.measurement_key(_cfg(0)) != rules.measurement_key(_cfg(1, **change))


def test_seed_splits_the_key_for_real_data_only():
    """With a data file the seed orders the pairs, so it decides which lengths share a padded batch."""
    data = {"path": "pairs.jsonl"}
    assert rules.measurement_key(_cfg(0, data=data)) != rules.measurement_key(_cfg(1, data=data, seed=1))
    assert rules.measurement_key(_cfg(0)) == rules.measurement_key(_cfg(1, seed=1))


def test_seed_splits_the_key_for_long_tailed_synthetic_data():
    """Lognormal synthetic lengths differ pair to pair: the seed's order decides the padding too."""
    data = {"synthetic": {"pairs": 16, "prompt_tokens": 12, "response_tokens": 10, "lengths": "lognormal"}}
    assert rules.measurement_key(_cfg(0, data=data)) != rules.measurement_key(_cfg(1, data=data, seed=1))


def test_dedupe_groups_betas_and_names_the_measuring_trial():
    trials = [_cfg(i, beta=beta, micro_batch=mb) for i, (mb, beta) in
              enumerate((mb, beta) for mb in (1, 2) for beta in (0.1, 0.3, 0.5))]
    groups = rules.dedupe(trials)
    assert [len(g.members) for g in groups] == [3, 3]
    assert [g.measuring.trial_id for g in groups] == ["t000", "t003"]
    measured_by = {k: v for g in groups for k, v in g.measured_by().items()}
    assert measured_by == {"t000": "t000", "t001": "t000", "t002": "t000",
                           "t003": "t003", "t004": "t003", "t005": "t003"}


def test_dedupe_measures_a_grad_acc_class_with_its_shortest_member():
    groups = rules.dedupe([_cfg(0, grad_acc=8), _cfg(1, grad_acc=2), _cfg(2, grad_acc=4), _cfg(3, grad_acc=1)])
    assert [(g.measuring.trial_id, len(g.members)) for g in groups] == [("t001", 3), ("t003", 1)]


# --- order --------------------------------------------------------------------------------

def test_order_is_cheapest_predicted_first_with_ties_in_input_order():
    trials = [_cfg(i) for i in range(5)]
    peaks = {"t000": 30.0, "t001": 10.0, "t002": 20.0, "t003": 10.0, "t004": 5.0}
    ordered = rules.order(trials, lambda c: peaks[c.trial_id])
    assert [c.trial_id for c in ordered] == ["t004", "t001", "t003", "t002", "t000"]
    assert [c.trial_id for c in rules.order(trials[::-1], lambda c: peaks[c.trial_id])] == [
        "t004", "t003", "t001", "t002", "t000"]


def test_order_with_the_memory_model():
    trials = [_cfg(0, micro_batch=8), _cfg(1, micro_batch=2, beta=0.5), _cfg(2, micro_batch=2),
              _cfg(3, micro_batch=4, checkpoint_level="full"), _cfg(4, micro_batch=4)]
    ordered = rules.order(trials, _peak)
    assert [_peak(c) for c in ordered] == sorted(_peak(c) for c in trials)
    ids = [c.trial_id for c in ordered]
    assert ids.index("t001") + 1 == ids.index("t002")  # equal predictions (beta) stay in input order
    assert ids[-1] == "t000"


# --- pruning --------------------------------------------------------------------------------

def test_dominates_in_memory():
    oom = _cfg(0, micro_batch=4, checkpoint_level="L1", grad_acc=2)
    assert rules.dominates_in_memory(_cfg(1, micro_batch=8, checkpoint_level="L1", grad_acc=2), oom)
    assert rules.dominates_in_memory(_cfg(1, micro_batch=4, checkpoint_level="none", grad_acc=4), oom)
    assert rules.dominates_in_memory(_cfg(1, micro_batch=4, checkpoint_level="L1", grad_acc=2, max_length=128), oom)
    assert rules.dominates_in_memory(_cfg(1, micro_batch=4, checkpoint_level="L1", grad_acc=2, beta=0.9), oom)
    assert not rules.dominates_in_memory(_cfg(1, micro_batch=8, checkpoint_level="L2", grad_acc=2), oom)
    assert not rules.dominates_in_memory(_cfg(1, micro_batch=2, checkpoint_level="none", grad_acc=2), oom)
    assert not rules.dominates_in_memory(_cfg(1, micro_batch=8, checkpoint_level="L1", grad_acc=1), oom)
    assert not rules.dominates_in_memory(_cfg(1, micro_batch=8, checkpoint_level="L1", grad_acc=2,
                                              reference="precomputed"), oom)


def test_prune_after_oom_names_the_trial_and_agrees_with_the_model():
    oom = _cfg(0, micro_batch=4, checkpoint_level="L1", grad_acc=2)
    pending = [_cfg(i + 1, micro_batch=mb, checkpoint_level=lv, grad_acc=2)
               for i, (mb, lv) in enumerate((mb, lv) for mb in (2, 4, 8) for lv in ("none", "L1", "L2", "full"))]
    pruned = rules.prune_after_oom(oom, [oom, *pending])
    assert sorted((c.micro_batch, c.checkpoint_level) for c, _ in pruned) == [
        (4, "L1"), (4, "none"), (8, "L1"), (8, "none")]
    assert all("t000" in why and why.startswith("pruned:") for _, why in pruned)
    assert all(_peak(c) >= _peak(oom) for c, _ in pruned)  # the model agrees: none needs less


def test_prune_over_budget_only_past_the_margin():
    assert rules.prune_over_budget(_cfg(0), 84.0, 80.0) is None  # 5 % over: inside the margin
    why = rules.prune_over_budget(_cfg(0), 84.1, 80.0)
    assert why is not None and "80.0 GB budget" in why and "84.10 GB" in why and "5%" in why
    assert rules.prune_over_budget(_cfg(0), 84.1, 80.0, margin=0.10) is None


def test_a_memory_cap_bounds_the_allocator_and_a_card_the_nvml_peak():
    capped = _cfg(0, resources={"use_gpu": False, "gpu_memory_gb": 80})
    card = _cfg(1)
    for cfg in (capped, card):
        est = predict_peak_gb(cfg)
        assert est.context_gb > 1.0
        expected = est.total_gb - est.context_gb if cfg is capped else est.total_gb
        assert rules.budgeted_gb(cfg, est) == expected


# --- short accumulation and step time ----------------------------------------------------------

def test_short_grad_acc():
    assert [rules.short_grad_acc(_cfg(0, grad_acc=g)) for g in (1, 2, 3, 64)] == [1, 2, 2, 2]


def test_step_time_extrapolates_linearly_from_a_short_trial():
    t_opt, t_micro = 120.0, 900.0  # ms: the 8B mb-4 micro-step on the H200 is ~0.9 s
    steps = [[t_micro * (1 + e), t_micro * (1 - e)] for e in (0.01, -0.02, 0.0)]
    step_ms = [t_opt + sum(m) for m in steps]
    fit = rules.fit_step_time(step_ms, steps)
    assert fit == rules.StepTimeModel(t_opt_ms=pytest.approx(t_opt), t_micro_ms=pytest.approx(t_micro))
    assert rules.extrapolate_step_ms(fit.t_opt_ms, fit.t_micro_ms, 64) == pytest.approx(t_opt + 64 * t_micro)
    assert rules.extrapolate_step_ms(10.0, 2.5, 4) == 20.0
    with pytest.raises(ValueError, match="micro-step"):
        rules.fit_step_time([1.0], [[]])


# --- learning trials -------------------------------------------------------------------------

def test_learning_key_ignores_the_split_and_level_but_not_the_learning_setup():
    base = _cfg(0, micro_batch=2, grad_acc=4)
    same = [_cfg(1, micro_batch=4, grad_acc=2), _cfg(2, micro_batch=8, grad_acc=1, checkpoint_level="full"),
            _cfg(3, micro_batch=2, grad_acc=4, logp_chunk_tokens=0)]
    differ = [_cfg(4, micro_batch=2, grad_acc=2), _cfg(5, micro_batch=2, grad_acc=4, beta=0.3),
              _cfg(6, micro_batch=2, grad_acc=4, lr=1e-4), _cfg(7, micro_batch=2, grad_acc=4, loss="hinge"),
              _cfg(8, micro_batch=2, grad_acc=4, precision="bf16"), _cfg(9, micro_batch=2, grad_acc=4, seed=1),
              _cfg(10, micro_batch=2, grad_acc=4, steps=3), _cfg(11, micro_batch=2, grad_acc=4, lr_schedule="linear"),
              _cfg(12, micro_batch=2, grad_acc=4, dropout=True)]
    assert all(rules.learning_key(c) == rules.learning_key(base) for c in same)
    assert all(rules.learning_key(c) != rules.learning_key(base) for c in differ)


def test_pick_learning_trial_is_the_largest_micro_batch_that_fits():
    group = [_cfg(0, micro_batch=2, grad_acc=8), _cfg(1, micro_batch=8, grad_acc=2, checkpoint_level="L1"),
             _cfg(2, micro_batch=8, grad_acc=2), _cfg(3, micro_batch=16, grad_acc=1)]
    budget = _peak(group[2])  # mb 16 does not fit, mb 8 none just does
    assert rules.pick_learning_trial(group, _peak, budget).trial_id == "t002"
    assert rules.pick_learning_trial(group, _peak, _peak(group[1])).trial_id == "t001"
    assert rules.pick_learning_trial(group, _peak, 0.0) is None
    fastest = rules.pick_learning_trial(group, _peak, budget, step_ms=lambda c: 100.0 * c.grad_acc + c.micro_batch)
    assert fastest.trial_id in ("t001", "t002") and fastest.grad_acc == 2


@pytest.mark.parametrize("knob", [{"beta_schedule": "seed"}, {"adaptive_clip": True},
                                  {"adaptive_clip_window": 5}, {"ema_decay": 0.99},
                                  {"grad_acc_schedule": "seed"}])
def test_stability_knobs_are_part_of_the_learning_setup(knob):
    base = _cfg(0, micro_batch=2, grad_acc=4)
    assert rules.learning_key(_cfg(1, micro_batch=2, grad_acc=4, **knob)) != rules.learning_key(base)


@pytest.mark.parametrize("space_file", ["search_spaces/seed-table-llama-3-8b-80gb.yaml",
                                        "search_spaces/llama-3.2-1b-h200.yaml"])
def test_the_model_orders_levels_as_the_pruning_rule_does(space_file):
    # 8B mb 1 G 1 peaks at the end of backward; there `none` still holds the first layer's
    # tensors that `full` rebuilds: the model predicted none 67.62 < L1 67.74 < full 67.85 GB.
    from dpo_sweep import space as space_mod

    base = space_mod.load(space_file).trials[0]
    for mb in (1, 2, 4, 8):
        for grad_acc in (1, 2):
            cfgs = [base.model_copy(update={"trial_id": f"t{k}", "micro_batch": mb, "checkpoint_level": lv,
                                            "grad_acc": grad_acc})
                    for k, lv in enumerate(("none", "L1", "L2", "L3", "full"))]
            peaks = [_peak(c) for c in cfgs]
            assert peaks == sorted(peaks, reverse=True), (mb, grad_acc, peaks)
            for weak, strong in zip(cfgs, cfgs[1:]):  # and the rule says the same of each pair
                assert rules.dominates_in_memory(weak, strong)


def test_a_measure_trial_times_enough_micro_steps_on_varied_lengths():
    from dpo_sweep.plan.rules import MIN_TIMED_MICRO_STEPS, measure_grad_acc

    varied = {"synthetic": {"pairs": 64, "prompt_tokens": 12, "response_tokens": 10, "lengths": "lognormal"}}
    # 4 measured steps x 6 micro-steps >= 24; never more than the configuration's own grad_acc
    assert measure_grad_acc(make_cfg(grad_acc=32, steps=6, warmup_steps=2, data=varied)) == 6 == MIN_TIMED_MICRO_STEPS // 4
    assert measure_grad_acc(make_cfg(grad_acc=4, steps=6, warmup_steps=2, data=varied)) == 4
    assert measure_grad_acc(make_cfg(grad_acc=32, steps=14, warmup_steps=2, data=varied)) == 2
    assert measure_grad_acc(make_cfg(grad_acc=1, steps=6, warmup_steps=2, data=varied)) == 1
    fixed = {"synthetic": {"pairs": 64, "prompt_tokens": 12, "response_tokens": 10}}
    assert measure_grad_acc(make_cfg(grad_acc=32, steps=6, warmup_steps=2, data=fixed)) == 2


def test_with_several_workers_a_measure_trial_times_an_accumulating_micro_step_without_the_all_reduce():
    from dpo_sweep.plan.rows import fitted_step_ms
    from dpo_sweep.plan.rules import measure_grad_acc
    from dpo_sweep.records import StepRecord
    from dpo_sweep.telemetry.timing import micro_and_optimizer_ms

    ddp = make_cfg(grad_acc=64, resources={"use_gpu": False, "workers_per_trial": 2})
    assert measure_grad_acc(ddp) == 3 and measure_grad_acc(make_cfg(grad_acc=64)) == 2
    # a DDP step of 3 micro-steps: the first after zero_grad 95 ms, one accumulating 100 ms, the
    # synchronising last 160 ms (60 ms of all-reduce), optimizer 20 ms
    micro, opt = micro_and_optimizer_ms([95.0, 100.0, 160.0, 20.0], last_syncs=True)
    steps = [StepRecord(trial_id="t", step=s, loss=0.6, grad_norm=1.0, step_time_ms=375.0, peak_mem_gb=1.0,
                        reward_accuracy=0.5, reward_margin=0.0, logps_chosen=-1.0, logps_rejected=-1.0, kl=0.0,
                        micro_step_ms=micro, optimizer_ms=opt) for s in (1, 2, 3)]
    # at grad_acc 64: 95 + 62 x 100 + 160 + 20 = 6,475 ms: one all-reduce, not 63
    assert fitted_step_ms(steps, 3, 64) == 6475.0
