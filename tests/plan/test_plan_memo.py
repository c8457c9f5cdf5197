"""The plan's rules remembered by content (dpo_sweep/plan/memo.py): on an expanded space, whose
configurations share their section objects, every remembered key and predicted peak is the one
the rule computes afresh, for every configuration; and the sections are shared, which is what
lets a 100,000-configuration space validate in seconds, not minutes."""
from __future__ import annotations

import pytest

from dpo_sweep import space as space_mod
from dpo_sweep.core.lengths import LengthProfile
from dpo_sweep.plan import rules
from dpo_sweep.plan.memory import predicted_peak_label

RAW = {
    "name": "memo",
    "model": {"preset": "tiny-llama"},
    "data": {"synthetic": {"pairs": 256, "prompt_tokens": 24, "response_tokens": 24}},
    "train": {"steps": 6, "warmup_steps": 2, "max_length": 64, "precision": "fp32", "seed": 0},
    "search": {"micro_batch": [1, 2, 4], "checkpoint_level": ["none", "L1", "full"], "grad_acc": [1, 2, 3],
               "beta": [0.1, 0.2], "lr": [1e-5, 2e-5], "reference": ["live", "precomputed"],
               "workers_per_trial": [1, 2]},
}


@pytest.fixture(scope="module")
def trials():
    return space_mod.parse(RAW).trials


RULES = (rules.measurement_key, rules.memory_family, rules.memory_position, rules.learning_key)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_every_remembered_key_is_the_one_computed_afresh(trials, rule):
    assert len(trials) == 3 * 3 * 3 * 2 * 2 * 2 * 2
    for cfg in trials:
        assert rule(cfg) == rule.uncached(cfg), cfg.trial_id
    # A configuration copied with one knob changed shares the sections and still gets its own key.
    cfg = trials[0]
    for update in ({"micro_batch": 8}, {"grad_acc": 4}, {"checkpoint_level": "L2"}, {"beta": 0.3}):
        other = cfg.model_copy(update=update)
        assert rule(other) == rule.uncached(other), update


def test_keys_tell_apart_what_they_read_and_share_what_they_do_not(trials):
    a = trials[0]
    beta = a.model_copy(update={"beta": a.beta * 2})
    assert rules.measurement_key(beta) == rules.measurement_key(a)  # beta: no memory, no time
    assert rules.learning_key(beta) != rules.learning_key(a)
    acc = a.model_copy(update={"grad_acc": a.grad_acc + 5})
    assert rules.learning_key(acc) != rules.learning_key(a)  # through the effective batch


def test_every_remembered_peak_is_the_one_computed_afresh(trials):
    n = 16  # long-tailed pairs: the worst micro-batch differs with micro_batch
    prompt = tuple(4 + (i * 7) % 23 for i in range(n))
    chosen, rejected = tuple(3 + (i * 5) % 31 for i in range(n)), tuple(2 + (i * 3) % 17 for i in range(n))
    ragged = LengthProfile(prompt, chosen, rejected, tuple(p + max(c, r) for p, c, r in zip(prompt, chosen, rejected)))
    for lengths in (None, ragged):
        for cfg in trials:
            assert predicted_peak_label(cfg, lengths) == predicted_peak_label.uncached(cfg, lengths), cfg.trial_id


def test_the_expanded_trials_share_one_section_object_per_distinct_set_of_overrides(trials):
    assert len({id(t.model) for t in trials}) == 1 and len({id(t.data) for t in trials}) == 1
    assert len({id(t.train) for t in trials}) == 2 * 2  # lr x reference
    assert len({id(t.resources) for t in trials}) == 2  # workers_per_trial
