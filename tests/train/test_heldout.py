"""The held-out split (data.eval_pairs) and its scores, without a model."""
from __future__ import annotations

import pytest
import torch

from dpo_sweep import space as space_mod
from dpo_sweep.config import DataSpec, TrainSpec, scheduler_of
from dpo_sweep.errors import DataError, SpaceError
from dpo_sweep.records import RESULTS_COLUMNS, STEPS_COLUMNS
from dpo_sweep.train import heldout
from dpo_sweep.train.data import synthetic_pairs


def _data(**kw) -> DataSpec:
    return DataSpec(synthetic={"pairs": 40, "prompt_tokens": 4, "response_tokens": 4, "signal": "vocabulary"}, **kw)


def test_the_split_is_seeded_disjoint_and_keeps_the_rest_for_training():
    spec = _data(eval_pairs=0.25)
    ds = synthetic_pairs(spec, 64, None, 2)
    train, held = heldout.split(ds, spec)
    again_train, again_held = heldout.split(ds, spec)
    assert len(held) == 10 and len(train) == 30 and held.pairs == again_held.pairs
    assert not set(train.pairs) & set(held.pairs)
    other = heldout.split(ds, _data(eval_pairs=0.25, eval_seed=1))[1]
    assert other.pairs != held.pairs
    assert heldout.split(ds, _data())[1] is None
    with pytest.raises(DataError, match="data.eval_pairs"):
        heldout.split(ds, _data(eval_pairs=40))


def test_vocabulary_pairs_prefer_the_prompt_s_half():
    ds = synthetic_pairs(_data(), 64, None, 2)
    halves = {(p.prompt_ids[0] >= 128, p.chosen_ids[0] >= 128, p.rejected_ids[0] >= 128) for p in ds.pairs}
    assert halves == {(False, False, True), (True, True, False)}


def test_scores_count_a_pair_right_only_when_chosen_s_reward_is_above():
    ds = synthetic_pairs(_data(), 64, None, 2)
    ds = ds.__class__(ds.pairs[:4], ds.source)
    ref = torch.zeros(4, 2)
    policy = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0], [0.0, 0.0]])
    score = heldout.score(policy, ref, ds, beta=0.5, train=TrainSpec())
    assert score["eval_reward_accuracy"] == 0.5  # a tie is not right (as TRL counts it)
    torch.testing.assert_close(score["eval_reward_margin"], 0.5 * (1 - 1 + 2 + 0) / 4)
    torch.testing.assert_close(score["eval_chosen_drift"], (1 + 0 + 2 + 0) / 4)


def test_eval_points_and_trl_column_names():
    train = TrainSpec(steps=10)
    assert [s for s in range(1, 11) if heldout.is_eval_step(s, train)] == [3, 6, 9, 10]
    for column in ("eval_rewards/accuracies", "eval_rewards/margins", "eval_logps/chosen_drift", "eval_loss"):
        assert column in RESULTS_COLUMNS and column in STEPS_COLUMNS


def test_held_out_objectives_and_asha_need_a_split(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nmodel: {preset: tiny-llama}\ndata: {synthetic: {pairs: 16}}\n"
                    "search: {scheduler: {name: asha}}\nobjectives: {eval_reward_accuracy: max}\n")
    with pytest.raises(SpaceError, match="set data.eval_pairs"):
        space_mod.load(path)
    path.write_text(path.read_text().replace("pairs: 16}", "pairs: 16}, eval_pairs: 4"))
    sp = space_mod.load(path)
    assert scheduler_of(sp.spec.search).resolved_mode() == "max" and len(sp.trials) == 1
