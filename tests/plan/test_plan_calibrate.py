"""Calibration of the memory model from measured peaks."""
from __future__ import annotations

import functools

import pytest

from dpo_sweep.plan import calibrate as cal
from dpo_sweep.plan.memory import predict_peak_gb, worst_micro_batch
from dpo_sweep.core.lengths import LengthProfile
from tests.testkit import make_cfg


def _law(cfg) -> float:
    """A known linear law in the tokens of a micro-step (GB)."""
    return 7.5 + 3.0e-6 * predict_peak_gb(cfg).tokens


def test_two_measurements_on_a_line_predict_a_third_exactly():
    measured = [make_cfg(trial_id=f"t{mb}", micro_batch=mb, checkpoint_level="L1", grad_acc=2) for mb in (2, 4)]
    fit = cal.calibrate([cal.Measurement(c, _law(c)) for c in measured])
    third = make_cfg(trial_id="t8", micro_batch=8, checkpoint_level="L1", grad_acc=4, beta=0.3)
    longer = make_cfg(trial_id="t2-128", micro_batch=2, checkpoint_level="L1", grad_acc=2, max_length=128)
    for cfg in (third, longer):
        assert cal.predicted(fit, cfg) == pytest.approx(_law(cfg), rel=1e-12)
    assert cal.predicted(fit, third) != pytest.approx(predict_peak_gb(third).total_gb, rel=1e-3)


def test_one_measurement_scales_the_activation_term():
    one = make_cfg(trial_id="a", micro_batch=4, grad_acc=2)
    est = predict_peak_gb(one)
    scale = 1.25  # the model's activations are 25 % short
    fit = cal.calibrate([cal.Measurement(one, est.total_gb + (scale - 1) * est.activations_gb)])
    other = make_cfg(trial_id="b", micro_batch=8, grad_acc=2)
    other_est = predict_peak_gb(other)
    assert cal.predicted(fit, other) == pytest.approx(other_est.total_gb + (scale - 1) * other_est.activations_gb)


def test_a_level_without_measurements_takes_the_family_error():
    one = make_cfg(trial_id="a", micro_batch=4, grad_acc=2)
    fit = cal.calibrate([cal.Measurement(one, predict_peak_gb(one).total_gb + 0.5)])
    full = make_cfg(trial_id="b", micro_batch=4, grad_acc=2, checkpoint_level="full")
    assert cal.predicted(fit, full) == pytest.approx(predict_peak_gb(full).total_gb + 0.5)
    other_family = make_cfg(trial_id="c", micro_batch=4, grad_acc=2, reference="precomputed")
    assert cal.predicted(fit, other_family) == predict_peak_gb(other_family).total_gb


def test_grad_acc_classes_are_fitted_apart():
    """grad_acc 1 and >= 2 differ by the gradients: a line through one says nothing of the other."""
    pts = [make_cfg(trial_id=f"t{mb}", micro_batch=mb, grad_acc=2) for mb in (2, 4)]
    fit = cal.calibrate([cal.Measurement(c, _law(c)) for c in pts])
    ga1 = make_cfg(trial_id="g1", micro_batch=8, grad_acc=1)
    assert cal.group_key(ga1, predict_peak_gb(ga1)) != cal.group_key(pts[0], predict_peak_gb(pts[0]))
    assert cal.predicted(fit, ga1) != pytest.approx(_law(ga1))


def test_a_line_is_fitted_in_the_real_tokens_of_the_worst_micro_batch():
    """Padding-free rows of a long tail: the ``micro_batch`` longest pairs' real tokens grow slower
    than ``micro_batch``, so a line in ``2 x micro_batch x max_length`` tokens extrapolates wrong."""
    lengths = LengthProfile(prompt=(10,) * 20 + (60, 40, 30, 20), chosen=(8,) * 20 + (200, 90, 40, 25),
                            rejected=(6,) * 20 + (20, 10, 10, 5), widths=(18,) * 20 + (260, 130, 70, 45))
    estimate = functools.partial(predict_peak_gb, lengths=lengths)

    def law(cfg) -> float:  # linear in the worst micro-batch's real tokens
        return 7.5 + 3.0e-6 * worst_micro_batch(cfg, lengths)[0]

    packed = dict(checkpoint_level="L1", grad_acc=2, max_length=512, padding_free=True)
    measured = [make_cfg(trial_id=f"t{mb}", micro_batch=mb, **packed) for mb in (1, 2)]
    fit = cal.calibrate([cal.Measurement(c, law(c)) for c in measured], estimate)
    third = make_cfg(trial_id="t8", micro_batch=8, **packed)
    assert cal.predicted(fit, third, estimate) == pytest.approx(law(third), rel=1e-12)
