"""Padding-free packing: log-probs and gradients equal the padded path (fp32)."""

import pytest
import torch

from dpo_sweep.config import ModelSpec
from dpo_sweep.train.batching import collate, pack
from dpo_sweep.train.data import TokenizedPair
from dpo_sweep.train.logprobs import SequenceLogProbs
from dpo_sweep.train.model import build_model

from testkit import ragged_pairs


def _tiny(attn: str):
    spec = ModelSpec(preset="tiny-llama", attn_implementation=attn)
    return build_model(spec, "fp32", torch.device("cpu"), seed=0).model


def _logps_and_grads(lm, batch, has_mask: bool):
    lm.zero_grad(set_to_none=True)
    lp = SequenceLogProbs(lm, 8)
    logps, counts = lp(batch.input_ids, batch.attention_mask if has_mask else None, batch.position_ids,
                       batch.response_mask, batch.sequence_ids)
    # Weights per sequence so the gradient check sees every sequence separately.
    (logps * torch.linspace(0.5, 1.5, logps.shape[0])).sum().backward()
    grads = {n: p.grad.clone() for n, p in lm.named_parameters() if p.grad is not None}
    return logps.detach(), counts, grads


def test_pack_layout():
    p = [TokenizedPair((1, 2), (3,), (4, 5)), TokenizedPair((6,), (7, 8), (9,))]
    b = pack(p, [4, 7])
    assert b.input_ids.tolist() == [[1, 2, 3, 6, 7, 8, 1, 2, 4, 5, 6, 9]]
    assert b.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 0, 1]]
    assert b.sequence_ids.tolist() == [[0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 3, 3]]
    assert b.response_mask.int().tolist() == [[0, 0, 1, 0, 1, 1, 0, 0, 1, 1, 0, 1]]
    assert (b.pairs, b.tokens(), b.slots(), b.max_seq_len()) == (2, 12, 12, 4)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logps_and_grads_equal_padded(attn):
    lm = _tiny(attn)
    pairs = ragged_pairs(4, seed=5)
    padded = _logps_and_grads(lm, collate(pairs, list(range(4)), pad_id=258), has_mask=True)
    packed = _logps_and_grads(lm, pack(pairs, list(range(4))), has_mask=False)
    torch.testing.assert_close(packed[0], padded[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(packed[1], padded[1])
    assert packed[2].keys() == padded[2].keys()
    for name, g in padded[2].items():
        torch.testing.assert_close(packed[2][name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_response_at_sequence_start_is_not_a_target():
    # An empty prompt: the response's first token has nothing before it in the padded row either.
    lm = _tiny("sdpa").eval()
    pairs = [TokenizedPair((), (3, 4, 5), (6, 7)), TokenizedPair((8, 9), (10,), (11, 12))]
    with torch.no_grad():
        padded = SequenceLogProbs(lm, 8)(*_args(collate(pairs, [0, 1], pad_id=258), True))
        packed = SequenceLogProbs(lm, 8)(*_args(pack(pairs, [0, 1]), False))
    torch.testing.assert_close(packed[0], padded[0], rtol=1e-5, atol=1e-5)
    assert packed[1].tolist() == padded[1].tolist() == [2, 1, 1, 2]


def _args(b, has_mask):
    return b.input_ids, b.attention_mask if has_mask else None, b.position_ids, b.response_mask, b.sequence_ids
