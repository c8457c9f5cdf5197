"""Chunked log-probs equal the naive full-logits path; padding never changes a log-prob."""

import pytest
import torch
from torch import nn

from dpo_sweep.config import ModelSpec
from dpo_sweep.train.batching import collate
from dpo_sweep.train.data import TokenizedPair
from dpo_sweep.train.logprobs import SequenceLogProbs, chunked_token_logps, naive_token_logps
from dpo_sweep.train.model import build_model

from testkit import ragged_pairs


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
@pytest.mark.parametrize("bias", [False, True])
def test_chunked_matches_naive_values_and_grads(chunk, bias):
    torch.manual_seed(0)
    head = nn.Linear(32, 300, bias=bias).double()
    h = torch.randn(50, 32, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 300, (50,))
    g = torch.randn(50, dtype=torch.float64)

    naive = naive_token_logps(h, head, labels).double()
    (naive * g).sum().backward()
    want = (naive.detach(), h.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone() if bias else None)
    h.grad = None
    head.zero_grad()

    got = chunked_token_logps(h, head, labels, chunk)
    (got.double() * g).sum().backward()
    # Forward values come back in float32, whatever the input dtype.
    torch.testing.assert_close(got.double(), want[0], rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(h.grad, want[1], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(head.weight.grad, want[2], rtol=1e-6, atol=1e-6)
    if bias:
        torch.testing.assert_close(head.bias.grad, want[3], rtol=1e-6, atol=1e-6)


def test_chunked_under_bf16_autocast_close_to_naive():
    torch.manual_seed(0)
    head = nn.Linear(64, 500, bias=False)
    h = torch.randn(40, 64)
    labels = torch.randint(0, 500, (40,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        naive = naive_token_logps(h, head, labels)
        got = chunked_token_logps(h, head, labels, 16)
    torch.testing.assert_close(got, naive.float(), rtol=2e-2, atol=2e-2)


@pytest.fixture(scope="module")
def tiny():
    return build_model(ModelSpec(preset="tiny-llama"), "fp32", torch.device("cpu"), seed=0).model.eval()


def test_sequence_logps_chunked_vs_naive(tiny):
    batch = collate(ragged_pairs(3), [0, 1, 2], pad_id=258)
    args = (batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask)
    a, ca = SequenceLogProbs(tiny, 5)(*args)
    b, cb = SequenceLogProbs(tiny, 0)(*args)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert torch.equal(ca, cb)
    # counts are the response lengths of the pairs (chosen rows first, then rejected)
    pairs = ragged_pairs(3)
    assert ca.tolist() == [len(p.chosen_ids) for p in pairs] + [len(p.rejected_ids) for p in pairs]


def test_left_and_right_padding_give_same_logps(tiny):
    pairs = ragged_pairs(4, seed=3)
    lp = SequenceLogProbs(tiny, 8)
    out = {}
    for side in ("left", "right"):
        b = collate(pairs, list(range(4)), pad_id=258, padding_side=side)
        out[side] = lp(b.input_ids, b.attention_mask, b.position_ids, b.response_mask)[0]
    torch.testing.assert_close(out["left"], out["right"], rtol=1e-5, atol=1e-5)
    # and each equals the log-prob of the pair alone, unpadded
    for i, p in enumerate(pairs):
        single = collate([p], [i], pad_id=258)
        alone = lp(single.input_ids, None, single.position_ids, single.response_mask)[0]
        torch.testing.assert_close(out["right"][[i, 4 + i]], alone, rtol=1e-5, atol=1e-5)


def test_padding_amount_does_not_change_logps(tiny):
    p = TokenizedPair((5, 6, 7, 8), (9, 10, 11), (12, 13))
    long = TokenizedPair(tuple(range(30)), tuple(range(20)), (1,))
    lp = SequenceLogProbs(tiny, 8)
    short = collate([p], [0], 258)
    padded = collate([p, long], [0, 1], 258)
    a = lp(short.input_ids, short.attention_mask, short.position_ids, short.response_mask)[0]
    b = lp(padded.input_ids, padded.attention_mask, padded.position_ids, padded.response_mask)[0]
    torch.testing.assert_close(b[[0, 2]], a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("side", ["right", "left"])
def test_rows_padded_to_a_multiple_give_the_same_logps(tiny, side):
    # train.pad_to_multiple_of: the width is the longest row rounded up; the extra padding changes
    # no log-prob (right or left padded).
    pairs = ragged_pairs(3, seed=5)
    lp = SequenceLogProbs(tiny, 8)
    plain = collate(pairs, [0, 1, 2], pad_id=258, padding_side=side)
    rounded = collate(pairs, [0, 1, 2], pad_id=258, padding_side=side, multiple=16)
    assert plain.input_ids.shape[1] % 16 != 0  # the case rounds something
    assert rounded.input_ids.shape[1] == -(-plain.input_ids.shape[1] // 16) * 16
    assert rounded.tokens() == plain.tokens() and rounded.max_seq_len() == plain.max_seq_len()
    a = lp(plain.input_ids, plain.attention_mask, plain.position_ids, plain.response_mask)[0]
    b = lp(rounded.input_ids, rounded.attention_mask, rounded.position_ids, rounded.response_mask)[0]
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    # rows all of one length: nothing to round, no padding made
    even = collate([TokenizedPair((1,) * 5, (2,) * 4, (3,) * 4)], [0], pad_id=258, multiple=16)
    assert even.input_ids.shape == (2, 9) and bool(even.attention_mask.all())
