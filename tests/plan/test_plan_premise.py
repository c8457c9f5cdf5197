"""The premise of "measure each thing once": two trials that differ only in beta do the same work.

On the CPU the deterministic parts can be compared exactly: the steps run, the pairs and tokens
of every step, and the tensors autograd saves (count and bytes - what activation memory is made
of). Peak NVML memory and step time within noise can only be shown on a GPU: CPU RSS and wall
time on a shared machine are too noisy to compare.
"""
from __future__ import annotations

import torch

from dpo_sweep.plan.rules import measurement_key
from dpo_sweep.train.loop import run_trial
from tests.testkit import make_cfg


def _run_counting_saved_tensors(cfg):
    saved = {"tensors": 0, "bytes": 0}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved["tensors"] += 1
        saved["bytes"] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        outcome = run_trial(cfg, log=None)
    return outcome, saved


def test_two_betas_do_the_same_work():
    cfgs = [make_cfg(trial_id=f"b{beta}", beta=beta, micro_batch=2, grad_acc=2, steps=2, checkpoint_level="L1")
            for beta in (0.1, 0.5)]
    assert measurement_key(cfgs[0]) == measurement_key(cfgs[1])
    (a, saved_a), (b, saved_b) = (_run_counting_saved_tensors(c) for c in cfgs)
    assert a.result.status == b.result.status == "ok"
    assert a.steps[-1].loss != b.steps[-1].loss  # beta did change the training
    assert (a.result.steps, a.result.measured_steps, a.result.pairs_used) == \
        (b.result.steps, b.result.measured_steps, b.result.pairs_used)
    tokens = [[r.tokens_per_s * r.step_time_ms for r in run.steps] for run in (a, b)]
    torch.testing.assert_close(torch.tensor(tokens[0]), torch.tensor(tokens[1]), rtol=1e-9, atol=0)
    assert saved_a == saved_b and saved_a["bytes"] > 0
