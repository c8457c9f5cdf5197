"""Long-tailed lengths: synthetic lognormal data, batches grouped by length, the worst-case step."""
import statistics

import pytest

from dpo_sweep.config import DataSpec
from dpo_sweep.train.batching import (collate, micro_batch_order, pair_length, worst_case_order)
from dpo_sweep.train.data import load_pairs
from dpo_sweep.train.tokenizer import byte_level_tokenizer


@pytest.fixture(scope="module")
def tok():
    return byte_level_tokenizer()


def lognormal(pairs=400, **kw) -> DataSpec:
    return DataSpec(synthetic={"pairs": pairs, "prompt_tokens": 40, "response_tokens": 30,
                               "lengths": "lognormal", "sigma": 0.8, **kw}, min_prompt_tokens=4)


def test_lognormal_lengths_are_long_tailed_deterministic_and_truncated(tok):
    a, b = load_pairs(lognormal(), tok, 256), load_pairs(lognormal(), tok, 256)
    assert a == b
    responses = [len(p.chosen_ids) - 1 for p in a.pairs if len(p.chosen_ids) + len(p.prompt_ids) < 256]
    # lognormal: the median near the given 30, the mean above it, a tail far beyond it
    assert 24 <= statistics.median(responses) <= 36
    assert statistics.mean(responses) > statistics.median(responses)
    assert max(responses) > 3 * 30
    assert a.truncated > 0 and max(pair_length(p) for p in a.pairs) == 256
    assert load_pairs(lognormal(seed=1), tok, 256) != a


def test_fixed_lengths_are_unchanged(tok):
    spec = DataSpec(synthetic={"pairs": 3, "prompt_tokens": 5, "response_tokens": 4, "seed": 2})
    ds = load_pairs(spec, tok, 64)
    assert {pair_length(p) for p in ds.pairs} == {1 + 5 + 4 + 1}
    assert ds.truncated == 0


def step_pairs(n, mb, ga, world, lengths, steps):
    its = [micro_batch_order(n, mb, world, rank=r, seed=0, grad_acc=ga, lengths=lengths) for r in range(world)]
    return [[i for _ in range(ga) for it in its for i in next(it)] for _ in range(steps)]


def test_group_by_length_keeps_every_split_on_the_same_pairs(tok):
    lengths = [pair_length(p) for p in load_pairs(lognormal(pairs=37), tok, 256).pairs]
    splits = [(8, 1, 1), (4, 2, 1), (1, 8, 1), (2, 2, 2), (1, 2, 4)]
    want = step_pairs(37, *splits[0], lengths, steps=9)  # 4 steps per epoch: past two epochs
    for split in splits[1:]:
        got = step_pairs(37, *split, lengths, steps=9)
        assert [sorted(s) for s in got] == [sorted(s) for s in want], split
    # the same pairs per epoch as without grouping: grouping reorders, it drops nothing more
    plain = step_pairs(37, 8, 1, 1, None, steps=4)
    assert sorted(i for s in plain for i in s) == sorted(i for s in want[:4] for i in s)


def padding_share(ds, order_lengths, steps=20, mb=4):
    it = micro_batch_order(len(ds), mb, 1, rank=0, seed=0, grad_acc=1, lengths=order_lengths)
    batches = [collate([ds.pairs[i] for i in idx], idx, pad_id=0) for idx in (next(it) for _ in range(steps))]
    return 1 - sum(b.tokens() for b in batches) / sum(b.slots() for b in batches)


def test_group_by_length_cuts_padding(tok):
    ds = load_pairs(lognormal(), tok, 256)
    lengths = [pair_length(p) for p in ds.pairs]
    plain, grouped = padding_share(ds, None), padding_share(ds, lengths)
    assert grouped < plain / 2, (plain, grouped)


def test_worst_case_step_holds_the_longest_pairs():
    lengths = [5, 40, 7, 33, 40, 2, 19, 28]
    # effective batch 4 as mb 2 x ga 1 x 2 workers: rank 0 takes the two longest
    assert worst_case_order(lengths, 2, 2, 0, grad_acc=1) == [[1, 4]]
    assert worst_case_order(lengths, 2, 2, 1, grad_acc=1) == [[3, 7]]
    # the longest last: it runs while the gradients of the step's earlier micro-batch are alive; two
    # micro-steps whatever the grad_acc (order.WORST_CASE_MICRO_STEPS: what more would add is time)
    assert worst_case_order(lengths, 1, 1, 0, grad_acc=3) == [[4], [1]]
    assert worst_case_order(lengths, 2, 1, 0, grad_acc=2) == [[3, 7], [1, 4]]
    assert worst_case_order(lengths, 2, 1, 0, grad_acc=8) == [[3, 7], [1, 4]]


def test_padding_free_worst_case_step_holds_the_most_packed_tokens():
    # pair 0 is the widest padded (prompt 2 + response 30) but packs 2*2 + 30 + 1 = 35 tokens;
    # pair 1 packs 2*20 + 12 + 12 = 64 in a padded width of 32
    widths, packed = [32, 32, 10], [35, 64, 20]
    assert worst_case_order(widths, 1, 1, 0, grad_acc=1) == [[0]]
    assert worst_case_order(widths, 1, 1, 0, grad_acc=1, packed=packed) == [[1]]
