"""The step's metric sums (train/metrics.py): one tensor out and back for the one all-reduce, the
host counts joined by name, and the means worked by hand."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from dpo_sweep.train.metrics import DEVICE_SUMS, HostCounts, StepSums, micro_step_sums


def _sums() -> StepSums:
    return StepSums(loss=1.4, accuracies=1.0, margins=0.5, rewards_chosen=0.3, rewards_rejected=-0.2,
                    logps_chosen=-20.0, logps_rejected=-24.0, logratio=0.4, logratio_sq=0.1,
                    pairs=2, sequences=4, slots=100, tokens=80)


def test_the_sums_go_into_one_tensor_and_back():
    sums = _sums()
    tensor = sums.to_tensor()
    assert tensor.dtype == torch.float64 and tensor.shape == (len(dataclasses.fields(StepSums)),)
    assert StepSums.from_tensor(tensor) == sums


def test_one_process_joins_its_host_counts_to_the_device_sums():
    sums = _sums()
    device_part = sums.to_tensor()[:len(DEVICE_SUMS)]
    counts = HostCounts().plus(pairs=1, slots=60, tokens=50).plus(pairs=1, slots=40, tokens=30)
    assert counts == HostCounts(pairs=2, sequences=4, slots=100, tokens=80)
    assert StepSums.from_tensor(device_part, host=counts) == sums
    # What the all-reduce sums over workers: the device sums, then the counts, in the fields' order.
    joined = torch.cat([device_part, counts.to_tensor(torch.device("cpu"))])
    assert StepSums.from_tensor(joined) == sums


def test_the_device_sums_are_the_fields_before_the_host_counts():
    host = [f.name for f in dataclasses.fields(HostCounts)]
    assert list(DEVICE_SUMS) + host == [f.name for f in dataclasses.fields(StepSums)]
    losses = torch.tensor([0.6, 0.8])
    made = micro_step_sums(losses, torch.tensor([0.2, 0.1]), torch.tensor([-0.1, 0.3]),
                           torch.tensor([-10.0, -10.0, -12.0, -12.0]), torch.tensor([-10.4, -10.0, -12.0, -12.0]),
                           torch.tensor([4, 4, 4, 4]))
    assert made.shape == (len(DEVICE_SUMS),) and made.dtype == torch.float64
    by_name = dict(zip(DEVICE_SUMS, made.tolist()))
    assert by_name["loss"] == pytest.approx(1.4) and by_name["accuracies"] == 1.0
    # float32 inputs: 0.4 / 4 is 0.1 to float32 precision
    assert (by_name["logratio"], by_name["logratio_sq"]) == pytest.approx((0.1, 0.01), rel=1e-5)


def test_the_means_per_pair_and_per_sequence():
    m = _sums().means()
    assert (m.loss, m.reward_accuracy, m.reward_margin) == pytest.approx((0.7, 0.5, 0.25))
    assert (m.rewards_chosen, m.rewards_rejected) == pytest.approx((0.15, -0.1))
    assert (m.logps_chosen, m.logps_rejected) == pytest.approx((-10.0, -12.0))
    assert m.logratio_mean == pytest.approx(0.1)  # also steps.csv's kl
    assert m.logratio_std == pytest.approx(math.sqrt(0.1 / 4 - 0.01))
    assert m.padding_frac == pytest.approx(0.2)
