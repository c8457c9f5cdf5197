"""The memory model per GPU of N workers (plan/ranks.py): DDP a replica and its buckets, FSDP2
1/N of the states plus the gathered working set; validate's fewest GPUs that fit."""
from __future__ import annotations

import pytest

from dpo_sweep import cards
from dpo_sweep.core import budget
from dpo_sweep.plan import fit, ranks
from dpo_sweep.plan.memory import predict_peak_gb
from dpo_sweep.plan.shape import model_shape
from testkit import make_cfg

H100 = cards.card("H100")


def _cfg(workers: int, parallelism: str, **kw):
    """Full DPO of the Llama-3-8B shape, bf16-mixed, 2 x 2,048 tokens per pair, effective batch 64."""
    kw = {"micro_batch": 1, "checkpoint_level": "full", "max_length": 2048, "precision": "bf16-mixed",
          "logp_chunk_tokens": 1024, "device": "auto", **kw}
    kw["grad_acc"] = 64 // (kw["micro_batch"] * workers)
    return make_cfg(model={"preset": "llama-3-8b"}, resources={"workers_per_trial": workers,
                                                               "parallelism": parallelism}, **kw)


def test_fsdp_divides_the_states_and_adds_the_gathered_working_set():
    one, eight = predict_peak_gb(_cfg(1, "fsdp")), predict_peak_gb(_cfg(8, "fsdp"))
    for part in ("weights_gb", "grads_gb", "optimizer_gb", "reference_gb"):
        assert getattr(eight, part) == pytest.approx(getattr(one, part) / 8), part
    assert eight.casts_gb == 0.0  # the gathered weights are bf16 already
    s = model_shape(_cfg(8, "fsdp").model)
    gathered = ranks.gathered_parts(_cfg(8, "fsdp"), s, 4, trained_base=True)
    # The root (embeddings + head, bf16) is gathered for the whole step: at least 2.1 GB on every rank.
    assert gathered.backward_start >= 2 * 2 * s.vocab * s.hidden
    grad_op = ranks.gathered_parts(_cfg(8, "fsdp_grad_op"), s, 4, trained_base=True)
    assert grad_op.backward_start - gathered.backward_start == pytest.approx(
        (s.n_layers - 2) * ranks.layer_params(s) * 2)  # every layer kept from forward to backward
    assert predict_peak_gb(_cfg(8, "fsdp_grad_op")).total_gb > eight.total_gb


def test_ddp_keeps_a_replica_and_its_buckets_on_every_gpu():
    one, four = predict_peak_gb(_cfg(1, "ddp")), predict_peak_gb(_cfg(4, "ddp"))
    assert four.weights_gb == one.weights_gb and four.optimizer_gb == one.optimizer_gb
    assert four.grads_gb == pytest.approx(2 * one.grads_gb)  # the gradients and the buckets
    assert four.total_gb > one.total_gb


def test_validate_names_the_fewest_gpus_that_fit():
    planner = fit.FitPlanner(fit.predictor(), budget.DEFAULT_SAFETY_MARGIN)
    n, parallelism, peak = planner.fewest_cards(_cfg(1, "ddp"), H100)  # no DDP count fits: FSDP2's
    assert parallelism == "fsdp" and n == 4 and budget.fits(peak, planner.usable_gb(H100))
    assert planner.fewest_cards(_cfg(8, "fsdp"), H100)[:2] == (4, "fsdp")
    assert predict_peak_gb(_cfg(2, "fsdp")).total_gb > planner.usable_gb(H100)
    assert fit.with_workers(_cfg(1, "ddp"), 3, "fsdp") is None  # 64 pairs do not split over 3


def test_one_fsdp_point_shifts_the_model_rather_than_scaling_its_activations():
    """Rank 0 of 8 simulated ranks on one H100 (reports/examples/multi-gpu-simulated/): mb 1 / none
    peaked at 47.31 GB (NVML), mb 2 / none at 61.76. Calibrated on the first alone, the second's
    prediction is the model shifted by the first's miss, not its activations scaled by it."""
    from dpo_sweep.plan import calibrate as cal

    one, two = _cfg(8, "fsdp", checkpoint_level="none"), _cfg(8, "fsdp", checkpoint_level="none", micro_batch=2)
    est_one, est_two = predict_peak_gb(one), predict_peak_gb(two)
    fit = cal.calibrate([cal.Measurement(one, 47.31)])
    assert cal.predicted(fit, two) == pytest.approx(est_two.total_gb + 47.31 - est_one.total_gb)
    assert cal.predicted(fit, two) != pytest.approx(
        est_two.total_gb + (47.31 - est_one.total_gb) * est_two.activations_gb / est_one.activations_gb, abs=0.1)
