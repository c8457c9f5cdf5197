"""The FLOP count from shapes against torch's FlopCounterMode, which sees every aten op that runs.

One DPO micro-step of the tiny model (reference forward, policy forward, loss, backward) under
each checkpoint level: FlopCounterMode counts the recompute too, because it sees the ops re-run in
backward. Two gaps of FlopCounterMode are filled here, each the same formula torch uses:

* it has no formula for the CPU attention kernel (``_scaled_dot_product_flash_attention_for_cpu``
  and its backward), and its sdpa formula ignores the causal mask (its own comment says so): the
  mapping below counts the causal (query, key) pairs, ``s * (s + 1) / 2``, when ``is_causal``;
* it has no formula for the in-place ``addmm_`` that the chunked head's weight gradient uses.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from dpo_sweep.config import ModelSpec
from dpo_sweep.core.flops import DecoderShape, dpo_step_flops, forward_flops
from dpo_sweep.train.batching import collate, flop_token_counts
from dpo_sweep.train.checkpointing import apply_checkpoint_level
from dpo_sweep.train.data import TokenizedPair
from dpo_sweep.train.lean import apply_lean_ops
from dpo_sweep.train.logprobs import SequenceLogProbs
from dpo_sweep.train.loss import dpo_loss
from dpo_sweep.models.presets import preset_config
from dpo_sweep.train.model import build_model, freeze_reference

aten = torch.ops.aten
CPU = torch.device("cpu")
TOLERANCE = 0.02  # the bound; norms, RoPE, softmax and the loss are not matmuls


def _causal_share(seq_len: int, is_causal: bool) -> float:
    return (seq_len + 1) / (2 * seq_len) if is_causal else 1.0


def _sdpa_cpu(q, k, v, dropout_p=0.0, is_causal=False, *args, out_shape=None, **kwargs) -> float:
    return sdpa_flop_count(q, k, v) * _causal_share(q[2], is_causal)


def _sdpa_cpu_backward(grad, q, k, v, out, lse, dropout_p=0.0, is_causal=False, *args, out_shape=None,
                       **kwargs) -> float:
    return sdpa_backward_flop_count(grad, q, k, v) * _causal_share(q[2], is_causal)


def _addmm_(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


GAPS = {
    aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward,
    aten.addmm_: _addmm_,
}


@pytest.fixture(scope="module")
def tiny():
    policy = build_model(ModelSpec(preset="tiny-llama"), "fp32", CPU, seed=0).model
    return policy, freeze_reference(copy.deepcopy(policy))


def _unpadded_batch():
    # Two pairs of 48 prompt + 40 response tokens: no padding, so sdpa takes its causal kernel.
    pair = TokenizedPair(tuple(range(1, 49)), tuple(range(100, 140)), tuple(range(200, 240)))
    return collate([pair, pair], [0, 1], pad_id=0)


def _counted_micro_step(policy, reference, mb, chunk_tokens: int, live_reference: bool) -> float:
    lp, ref_lp = SequenceLogProbs(policy, chunk_tokens), SequenceLogProbs(reference, chunk_tokens)
    args = (mb.input_ids, None, mb.position_ids, mb.response_mask)
    b = mb.pairs
    if not live_reference:  # the precomputed table: looked up, not counted
        with torch.no_grad():
            ref_logps, _ = ref_lp(*args)
    with FlopCounterMode(display=False, custom_mapping=GAPS) as counter:
        if live_reference:
            with torch.no_grad():
                ref_logps, _ = ref_lp(*args)
        logps, _ = lp(*args)
        losses, _, _ = dpo_loss(logps[:b], logps[b:], ref_logps[:b], ref_logps[b:], 0.1)
        losses.mean().backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("chunk_tokens", [16, 0], ids=["chunked-head", "plain-head"])
@pytest.mark.parametrize("level", ["none", "L1", "L2", "L3", "full"])
def test_step_flops_match_flop_counter(tiny, level, chunk_tokens):
    base, reference = tiny
    policy = copy.deepcopy(base)
    apply_checkpoint_level(policy, level)
    policy.train()
    mb = _unpadded_batch()
    counted = _counted_micro_step(policy, reference, mb, chunk_tokens, live_reference=True)
    formula = dpo_step_flops(shape=DecoderShape.from_config(policy.config),
                             counts=flop_token_counts(mb, chunked_head=chunk_tokens > 0),
                             level=level, reference="live", chunked_head=chunk_tokens > 0, lean_mlp=False)
    assert formula == pytest.approx(counted, rel=TOLERANCE)


@pytest.mark.parametrize("level", ["none", "L1", "L2", "full"])
def test_lean_ops_and_precomputed_reference_match_flop_counter(tiny, level):
    base, reference = tiny
    policy = copy.deepcopy(base)
    apply_lean_ops(policy)  # one autograd function for the MLP: a checkpoint re-runs all of it
    apply_checkpoint_level(policy, level)
    policy.train()
    mb = _unpadded_batch()
    counted = _counted_micro_step(policy, reference, mb, 16, live_reference=False)
    formula = dpo_step_flops(shape=DecoderShape.from_config(policy.config),
                             counts=flop_token_counts(mb, chunked_head=True),
                             level=level, reference="precomputed", chunked_head=True, lean_mlp=True)
    assert formula == pytest.approx(counted, rel=TOLERANCE)


def test_token_counts_of_a_padded_micro_batch():
    # Sequences of 5 + 3 (chosen) and 5 + 1 (rejected) tokens, right-padded to 8.
    mb = collate([TokenizedPair((1,) * 5, (2,) * 3, (3,) * 1)], [0], pad_id=0)
    chunked = flop_token_counts(mb, chunked_head=True)
    assert (chunked.tokens, chunked.causal_pairs, chunked.head_rows) == (8 + 6, 8 * 9 // 2 + 6 * 7 // 2, 3 + 1)
    assert flop_token_counts(mb, chunked_head=False).head_rows == 7 + 5
    assert chunked + chunked == type(chunked)(28, 2 * 57, 8)


def test_mlp_share_of_a_1b_layer_with_grouped_query_attention():
    # The number: with 8 kv heads of 32, the MLP is ~0.83 of a Llama-3.2-1B layer's matmuls.
    shape = DecoderShape.from_config(preset_config("llama-3.2-1b"))
    assert (shape.n_heads, shape.n_kv_heads, shape.head_dim) == (32, 8, 64)
    from dpo_sweep.core.flops import TokenCounts

    fwd = forward_flops(shape, TokenCounts(tokens=1, causal_pairs=0, head_rows=0))
    mlp = fwd.mlp_in + fwd.mlp_down
    assert mlp / fwd.total() == pytest.approx(0.828, abs=0.002)
