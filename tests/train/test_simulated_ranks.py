"""Simulated ranks (train/parallel.py): rank 0 of an N-rank FSDP2 trial alone in this process,
through the fake process group, holds the shards the memory model predicts; its trial's row says
it was simulated and its step time is one rank's compute plus the modelled communication."""
import math
import time

import pytest
import torch
import torch.distributed as dist

from dpo_sweep.core import comms
from dpo_sweep.plan.memory import predict_peak_gb
from dpo_sweep.train import loop, parallel
from dpo_sweep.train.setup import build_trial, load_data
from testkit import make_cfg


def _cfg(world: int, parallelism: str, **kw):
    return make_cfg(micro_batch=2, grad_acc=1, steps=2, resources={
        "use_gpu": False, "workers_per_trial": world, "parallelism": parallelism, "simulate_ranks": True}, **kw)


def _local_bytes(tensors) -> int:
    return sum(t.to_local().numel() * t.element_size() if hasattr(t, "to_local") else t.numel() * t.element_size()
               for t in tensors)


@pytest.mark.parametrize("parallelism", ["fsdp", "fsdp_grad_op"])
def test_a_fake_group_rank_holds_the_predicted_shards(parallelism):
    cfg = _cfg(4, parallelism)
    with parallel.simulated_group(cfg) as made:
        assert made and dist.get_world_size() == 4 and dist.get_rank() == 0
        data = load_data(cfg, 4, lambda _m: None, time.perf_counter())
        setup = build_trial(cfg, torch.device("cpu"), 4, 0, data, lambda _m: None, time.perf_counter())
        assert setup.simulated
        batch = next(setup.batches)
        loop._micro_step(setup, batch, True, False, cfg.beta, 1)
        grads = _local_bytes(p.grad for p in setup.params)
        setup.optimizer.step()
        states = _local_bytes(v for st in setup.optimizer.state.values() for k, v in st.items() if k != "step")
        weights = _local_bytes(setup.params)
        reference = _local_bytes(setup.reference.parameters())
    assert not dist.is_initialized()  # the group ends with the trial
    want = predict_peak_gb(cfg, device="cpu")
    n_params = setup.built.n_params
    assert weights == pytest.approx(want.weights_gb * 1e9, rel=1e-9) == n_params * 4 / 4
    assert grads == pytest.approx(want.weights_gb * 1e9, rel=1e-9)  # fp32 gradients, sharded alike
    assert states == pytest.approx(want.optimizer_gb * 1e9, rel=1e-9)
    assert reference == pytest.approx(want.reference_gb * 1e9, rel=1e-9)


def test_ddp_under_the_fake_group_keeps_a_whole_replica_and_steps():
    cfg = _cfg(2, "ddp")
    outcome = loop.run_trial(cfg, log=None, catch_failures=False)
    r = outcome.result
    assert r.status == "ok" and r.ranks_simulated and r.workers_per_trial == 2
    traffic = comms.step_traffic(parallelism="ddp", world=2, params=r.trainable_params, trainable=r.trainable_params,
                                 grad_acc=1, precision="fp32", live_reference=True)
    # One all-reduce of the fp32 gradients: 2 x (N-1)/N x 4 bytes per parameter, over PCIe's default.
    assert traffic.all_reduce == 4 * r.trainable_params
    assert r.comm_ms == pytest.approx(traffic.ms(comms.DEFAULT_INTERCONNECT_GB_S))
    assert r.step_time_ms > r.comm_ms > 0  # one rank's compute plus the communication
    assert math.isfinite(r.tokens_per_s) and r.tokens_per_s > 0


def test_fsdp_traffic_per_micro_step():
    full = comms.step_traffic(parallelism="fsdp", world=4, params=100, trainable=100, grad_acc=3,
                              precision="bf16-mixed", live_reference=True, reference_params=100)
    grad_op = comms.step_traffic(parallelism="fsdp_grad_op", world=4, params=100, trainable=100, grad_acc=3,
                                 precision="bf16-mixed", live_reference=False)
    # bf16 gathers (forward, backward, the reference's forward), fp32 reduce-scatters, 3/4 of each.
    assert full.all_gather == pytest.approx(3 * 0.75 * 2 * (2 * 100 + 100))
    assert full.reduce_scatter == pytest.approx(3 * 0.75 * 4 * 100)
    assert grad_op.all_gather == pytest.approx(3 * 0.75 * 2 * 100)
    assert comms.grows_with_micro_steps("fsdp") and not comms.grows_with_micro_steps("ddp")
