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


def test_ipo():
    # (h - 1/(2 beta))^2 = (2 - 5)^2 = 9 at beta 0.1
    losses, _, _ = dpo_loss(PC, PR, RC, RR, 0.1, "ipo")
    assert losses.item() == pytest.approx(9.0)


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
