"""Every checkpoint level gives the same loss and gradients as none (fp32, fixed seed)."""
import copy
import pytest
import torch

from dpo_sweep.config import ModelSpec
from dpo_sweep.train.batching import collate
from dpo_sweep.train.checkpointing import apply_checkpoint_level
from dpo_sweep.train.data import TokenizedPair
from dpo_sweep.train.logprobs import SequenceLogProbs
from dpo_sweep.train.loss import dpo_loss
from dpo_sweep.train.lean import apply_lean_ops
from dpo_sweep.train.model import build_model, freeze_reference
from testkit import ragged_pairs

CPU = torch.device("cpu")


def loss_and_grads(model, ref, batch, pad: bool, chunk: int = 16):
    lp, rlp = SequenceLogProbs(model, chunk), SequenceLogProbs(ref, chunk)
    args = (batch.input_ids, batch.attention_mask if pad else None, batch.position_ids, batch.response_mask)
    logps, _ = lp(*args)
    with torch.no_grad():
        ref_logps, _ = rlp(*args)
    b = batch.pairs
    losses, _, _ = dpo_loss(logps[:b], logps[b:], ref_logps[:b], ref_logps[b:], 0.1)
    loss = losses.mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.fixture(scope="module")
def models():
    base = build_model(ModelSpec(preset="tiny-llama"), "fp32", CPU, seed=0).model
    # Perturb the policy so it differs from the reference (non-zero DPO gradients everywhere).
    policy = copy.deepcopy(base)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return policy, freeze_reference(base)


@pytest.mark.parametrize("lean", [False, True], ids=["stock", "lean"])
@pytest.mark.parametrize("pad", [True, False], ids=["padded", "unpadded"])
@pytest.mark.parametrize("level", ["L1", "L2", "L3", "full"])
def test_level_matches_none(models, level, pad, lean):
    policy, ref = models
    pairs = ragged_pairs(4) if pad else [TokenizedPair((1,) * 8, (2,) * 6, (3,) * 6)] * 2
    batch = collate(pairs, list(range(len(pairs))), pad_id=258)
    want_loss, want_grads = loss_and_grads(copy.deepcopy(policy).train(), ref, batch, pad)
    m = copy.deepcopy(policy)
    if lean:
        apply_lean_ops(m)
    apply_checkpoint_level(m, level)
    m.train()
    got_loss, got_grads = loss_and_grads(m, ref, batch, pad)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-6, atol=1e-7)
    assert got_grads.keys() == want_grads.keys() and len(got_grads) == len(list(policy.parameters()))
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], rtol=1e-5, atol=1e-7, msg=name)


def test_levels_really_recompute(models):
    """Guard against a level silently doing nothing: count forward calls of one MLP."""
    policy, ref = models
    batch = collate(ragged_pairs(2), [0, 1], pad_id=258)
    for level, mlp_calls in (("none", 1), ("L1", 2), ("L2", 2), ("full", 2)):
        m = copy.deepcopy(policy)
        apply_checkpoint_level(m, level)
        m.train()
        calls = []
        mlp = m.model.layers[0].mlp
        mlp.gate_proj.register_forward_pre_hook(lambda *a: calls.append(1))
        loss_and_grads(m, ref, batch, pad=True)
        assert len(calls) == mlp_calls, level


def test_l2_keeps_attention_kernel_but_recomputes_projections(models):
    policy, ref = models
    batch = collate(ragged_pairs(2), [0, 1], pad_id=258)
    m = copy.deepcopy(policy)
    apply_checkpoint_level(m, "L2")
    m.train()
    q_calls = []
    m.model.layers[0].self_attn.q_proj.register_forward_hook(lambda *a: q_calls.append(1))
    kernel_calls = []
    import torch.nn.functional as F
    orig = F.scaled_dot_product_attention

    def counting(*a, **k):
        kernel_calls.append(1)
        return orig(*a, **k)

    F.scaled_dot_product_attention = counting
    try:
        loss_and_grads(m, ref, batch, pad=True)
    finally:
        F.scaled_dot_product_attention = orig
    assert len(q_calls) == 2  # forward + recompute
    # policy: 4 layers x (forward + recompute replayed from the kept output) = 8 Python calls,
    # of which the recompute ones return the saved output; reference: 4 more.
    assert len(kernel_calls) == 4 * 2 + 4


def test_l4_and_unknown_refused():
    from dpo_sweep.errors import SpaceError
    from dpo_sweep.space import _check_levels

    with pytest.raises(SpaceError, match="L4 is refused.*use L3 or full"):
        _check_levels(["L4"])
    with pytest.raises(SpaceError, match="allowed: none, L1, L2, L3, full"):
        _check_levels(["L9"])
