"""dpo_loss against hand-worked values (tolerance 1e-6, float64)."""
import math

import pytest
import torch

from dpo_sweep.train.loss import dpo_loss

# One pair: policy chosen -10, rejected -12; reference chosen -11, rejected -11.
# h = (pi_c - ref_c) - (pi_r - ref_r) = (1) - (-1) = 2.
PC, PR, RC, RR = (torch.tensor([x], dtype=torch.float64) for x in (-10.0, -12.0, -11.0, -11.0))


def sig(x):
    return 1 / (1 + math.exp(-x))


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_sigmoid(beta):
    losses, rc, rr = dpo_loss(PC, PR, RC, RR, beta)
    torch.testing.assert_close(losses, torch.tensor([-math.log(sig(2 * beta))], dtype=torch.float64))
    torch.testing.assert_close(rc, torch.tensor([beta * 1.0], dtype=torch.float64))
    torch.testing.assert_close(rr, torch.tensor([beta * -1.0], dtype=torch.float64))


def test_sigmoid_label_smoothing():
    # beta 0.1, eps 0.2: -(0.8) log sig(0.2) - 0.2 log sig(-0.2)
    losses, _, _ = dpo_loss(PC, PR, RC, RR, 0.1, "sigmoid", label_smoothing=0.2)
    want = -0.8 * math.log(sig(0.2)) - 0.2 * math.log(sig(-0.2))
    assert abs(losses.item() - want) < 1e-12
    assert abs(want - 0.638_139) < 1e-5  # by hand: 0.8*0.598139 + 0.2*0.798139


def test_ipo_divides_each_log_ratio_by_its_response_tokens():
    """As TRL's DPOTrainer: ((pi_c - ref_c) / n_c - (pi_r - ref_r) / n_r - 1/(2 beta))^2."""
    # Pair 1: chosen ratio +1 over 4 tokens, rejected ratio -1 over 2: 0.25 + 0.5 = 0.75;
    #         (0.75 - 5)^2 = 18.0625 at beta 0.1 (summed log-probs would give (2 - 5)^2 = 9).
    # Pair 2: chosen ratio +1 over 2 tokens, rejected ratio -1 over 8: 0.5 + 0.125 = 0.625;
    #         (0.625 - 5)^2 = 19.140625.
    pc, pr = torch.tensor([-10.0, -8.0], dtype=torch.float64), torch.tensor([-12.0, -9.0], dtype=torch.float64)
    rc, rr = torch.tensor([-11.0, -9.0], dtype=torch.float64), torch.tensor([-11.0, -8.0], dtype=torch.float64)
    losses, rc_rew, rr_rew = dpo_loss(pc, pr, rc, rr, 0.1, "ipo", chosen_tokens=torch.tensor([4, 2]),
                                      rejected_tokens=torch.tensor([2, 8]))
    torch.testing.assert_close(losses, torch.tensor([18.0625, 19.140625], dtype=torch.float64),
                               rtol=0, atol=1e-12)
    # Rewards stay beta x the summed log-ratio, as TRL logs them.
    torch.testing.assert_close(rc_rew, torch.tensor([0.1, 0.1], dtype=torch.float64))
    torch.testing.assert_close(rr_rew, torch.tensor([-0.1, -0.1], dtype=torch.float64))


def test_ipo_needs_token_counts():
    with pytest.raises(ValueError, match="chosen_tokens"):
        dpo_loss(PC, PR, RC, RR, 0.1, "ipo")


@pytest.mark.parametrize("loss_type", ["ipo", "hinge"])
def test_label_smoothing_is_refused_outside_sigmoid(loss_type):
    n = torch.tensor([3])
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(PC, PR, RC, RR, 0.1, loss_type, 0.1, chosen_tokens=n, rejected_tokens=n)


def test_hinge():
    # relu(1 - beta h): beta 0.1 -> 0.8; beta 1 -> relu(-1) = 0
    assert dpo_loss(PC, PR, RC, RR, 0.1, "hinge")[0].item() == pytest.approx(0.8)
    assert dpo_loss(PC, PR, RC, RR, 1.0, "hinge")[0].item() == 0.0


def test_equal_policy_and_reference_gives_log2():
    x = torch.tensor([-5.0, -7.0])
    losses, rc, rr = dpo_loss(x, x + 1, x, x + 1, 0.1)
    torch.testing.assert_close(losses, torch.full((2,), math.log(2)))
    assert torch.all(rc == 0) and torch.all(rr == 0)


def test_gradient_sign_prefers_chosen():
    pc = torch.tensor([-10.0], requires_grad=True)
    pr = torch.tensor([-10.0], requires_grad=True)
    losses, _, _ = dpo_loss(pc, pr, torch.tensor([-10.0]), torch.tensor([-10.0]), 0.1)
    losses.sum().backward()
    # d/d pi_c of -log sig(beta h) at h=0 = -beta/2
    assert pc.grad.item() == pytest.approx(-0.05)
    assert pr.grad.item() == pytest.approx(0.05)


def test_rewards_carry_no_grad():
    pc = torch.tensor([-1.0], requires_grad=True)
    _, rc, _ = dpo_loss(pc, pc, torch.tensor([0.0]), torch.tensor([0.0]), 0.1)
    assert not rc.requires_grad


def test_unknown_loss_type():
    with pytest.raises(ValueError, match="allowed: sigmoid, ipo, hinge"):
        dpo_loss(PC, PR, RC, RR, 0.1, "kto")


def test_trainer_passes_each_sequences_response_tokens(cfg_factory, tmp_path, monkeypatch):
    """The trainer's one dpo_loss call hands ipo the response token counts of every sequence."""
    import json

    from dpo_sweep.train import loop

    pairs = tmp_path / "pairs.jsonl"
    # Byte-level tokenizer: a response of k bytes is k tokens plus its EOS.
    pairs.write_text("\n".join(json.dumps({"prompt": "say something", "chosen": c, "rejected": r})
                               for c, r in (("ab", "abcdef"), ("abcd", "a"))))
    seen = []

    def spy(*args, **kwargs):
        seen.append({k: v.tolist() for k, v in kwargs.items()})
        return dpo_loss(*args, **kwargs)

    monkeypatch.setattr(loop, "dpo_loss", spy)
    out = loop.run_trial(cfg_factory(loss="ipo", micro_batch=2, steps=1, worst_case_step=False,
                                     data={"path": str(pairs)}), log=None)
    assert out.result.status == "ok", out.result.error
    assert len(seen) == 1 and sorted(seen[0]) == ["chosen_tokens", "rejected_tokens"]
    # Per pair (chosen, rejected), in whatever order the pairs were drawn.
    assert sorted(zip(seen[0]["chosen_tokens"], seen[0]["rejected_tokens"])) == [(3, 7), (5, 2)]
