"""The trainer on long-tailed data: the worst-case step, padding-free packing, grouping by length."""
import pytest
import torch

from dpo_sweep.train.batching import pair_length
from dpo_sweep.train.data import load_pairs
from dpo_sweep.train.faults import InjectedFault
from dpo_sweep.train.loop import run_trial
from dpo_sweep.train.tokenizer import load_tokenizer

LONG_TAILED = {"synthetic": {"pairs": 24, "prompt_tokens": 10, "response_tokens": 8, "lengths": "lognormal",
                             "sigma": 1.0}}


def run(cfg_factory, **kw):
    cfg = cfg_factory(data=LONG_TAILED, max_length=96, **{"micro_batch": 2, "steps": 4, "warmup_steps": 1, **kw})
    out = run_trial(cfg, log=None)
    assert out.result.status == "ok", out.result.error
    return cfg, out


def test_worst_case_step_meets_the_longest_pairs(cfg_factory):
    cfg, out = run(cfg_factory)
    ds = load_pairs(cfg.data, load_tokenizer(cfg.model), cfg.train.max_length)
    longest = max(pair_length(p) for p in ds.pairs)
    *typical, worst = out.steps
    assert worst.worst_case and worst.step == 5 and worst.measured
    assert worst.max_seq_len == longest and all(s.max_seq_len <= longest for s in typical)
    r = out.result
    assert r.peak_mem_gb >= r.peak_mem_typical_gb > 0
    assert r.peak_mem_gb == max(s.peak_mem_gb for s in out.steps[1:])
    # times, throughput, loss statistics and padding come from the typical steps alone
    assert r.measured_steps == 3
    assert r.step_time_ms == sorted(s.step_time_ms for s in typical[1:])[1]
    assert r.loss_mean == pytest.approx(sum(s.loss for s in typical[1:]) / 3)
    assert r.padding_frac == pytest.approx(sum(s.padding_frac for s in typical[1:]) / 3)
    assert 0 < r.padding_frac < 1


def test_worst_case_step_can_be_turned_off(cfg_factory):
    _, out = run(cfg_factory, worst_case_step=False)
    assert [s.step for s in out.steps] == [1, 2, 3, 4] and not any(s.worst_case for s in out.steps)
    assert out.result.peak_mem_gb == out.result.peak_mem_typical_gb


def losses(out):
    return torch.tensor([(s.loss, s.grad_norm, s.logps_chosen, s.reward_margin) for s in out.steps], dtype=torch.float64)


def test_padding_free_trains_as_the_padded_path(cfg_factory):
    _, padded = run(cfg_factory)
    _, packed = run(cfg_factory, padding_free=True)
    torch.testing.assert_close(losses(packed), losses(padded), rtol=1e-4, atol=1e-5)
    assert packed.result.padding_frac == 0 and padded.result.padding_frac > 0.1
    assert [s.max_seq_len for s in packed.steps] == [s.max_seq_len for s in padded.steps]


def test_group_by_length_keeps_splits_equal_and_pads_less(cfg_factory):
    _, plain = run(cfg_factory, micro_batch=2, grad_acc=2)
    _, a = run(cfg_factory, micro_batch=2, grad_acc=2, group_by_length=True)
    _, b = run(cfg_factory, micro_batch=1, grad_acc=4, group_by_length=True)
    # The typical steps: the worst-case step runs each split's own longest micro-batches.
    torch.testing.assert_close(losses(b)[:-1], losses(a)[:-1], rtol=2e-4, atol=2e-5)
    assert a.result.padding_frac < plain.result.padding_frac


@pytest.mark.parametrize("level", ["L2", "full"])
def test_padding_free_under_checkpointing_matches_none(cfg_factory, level):
    """Packed rows carry a block mask into attention: L2 keeps that kernel, full recomputes it."""
    _, none = run(cfg_factory, padding_free=True)
    _, ckpt = run(cfg_factory, padding_free=True, checkpoint_level=level)
    torch.testing.assert_close(losses(ckpt), losses(none), rtol=1e-4, atol=1e-5)


def test_out_of_memory_on_the_worst_case_step_is_an_oom_trial(cfg_factory):
    """The run that fits its typical batches but not its longest one is the run the user must not get."""
    cfg = cfg_factory(data=LONG_TAILED, max_length=96, micro_batch=2, steps=2)
    assert run_trial(cfg, log=None, fault=InjectedFault(3, "oom")).result.status == "oom"


def test_worst_case_step_runs_two_micro_steps_whatever_the_grad_acc(cfg_factory):
    """Two micro-steps hold the gradients and the longest micro-batch together, all a longer
    accumulation adds to the peak; the rest would only cost time on the longest pairs."""
    cfg, out = run(cfg_factory, grad_acc=4)
    *typical, worst = out.steps
    assert worst.worst_case and worst.grad_acc == 2 and all(s.grad_acc == 4 for s in typical)
    assert len(worst.micro_ms.split(",")) == 2
    ds = load_pairs(cfg.data, load_tokenizer(cfg.model), cfg.train.max_length)
    assert worst.max_seq_len == max(pair_length(p) for p in ds.pairs)
    _, single = run(cfg_factory, grad_acc=1)
    assert single.steps[-1].worst_case and single.steps[-1].grad_acc == 1
