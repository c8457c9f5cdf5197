"""train.pad_to_multiple_of: a trial's rows are padded to a multiple of it (auto: 64 on CUDA, 1
on the CPU); the extra padding changes what the kernels compute, never the numbers."""
import pytest
import torch

from dpo_sweep.train.batching import collate
from dpo_sweep.train.loop import first_of_its_shape, run_trial
from dpo_sweep.train.warm_state import WarmState

from testkit import make_cfg, ragged_pairs

LONG_TAILED = {"synthetic": {"pairs": 32, "prompt_tokens": 12, "response_tokens": 10, "lengths": "lognormal",
                             "sigma": 0.8}}


@pytest.mark.parametrize("reference", ["live", "precomputed"])
def test_a_trial_padded_to_a_multiple_learns_the_same_as_one_padded_to_its_longest_row(reference):
    kw = dict(micro_batch=2, grad_acc=2, steps=3, reference=reference, data=LONG_TAILED)
    plain = run_trial(make_cfg(**kw), log=None)
    rounded = run_trial(make_cfg(pad_to_multiple_of=16, **kw), log=None)
    assert [s.status for s in (plain.result, rounded.result)] == ["ok", "ok"]
    got = torch.tensor([[s.loss, s.grad_norm, s.logps_chosen, s.logps_rejected] for s in rounded.steps])
    want = torch.tensor([[s.loss, s.grad_norm, s.logps_chosen, s.logps_rejected] for s in plain.steps])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the rows were rounded up: more of each micro-batch is padding, the real tokens are the same
    typical = [(r, p) for r, p in zip(rounded.steps, plain.steps) if not p.worst_case]
    assert len(typical) == 3 and all(r.padding_frac > p.padding_frac for r, p in typical)
    assert [r.max_seq_len for r in rounded.steps] == [p.max_seq_len for p in plain.steps]
    assert rounded.result.tokens_per_s > 0 and plain.result.pairs_used == rounded.result.pairs_used
    assert (plain.result.pad_multiple, rounded.result.pad_multiple) == (1, 16)


def test_the_row_says_which_multiple_its_rows_were_padded_to():
    assert run_trial(make_cfg(micro_batch=2, steps=1, data=LONG_TAILED), log=None).result.pad_multiple == 1  # CPU auto
    assert run_trial(make_cfg(micro_batch=2, steps=1, data=LONG_TAILED, pad_to_multiple_of=16),
                     log=None).result.pad_multiple == 16
    assert run_trial(make_cfg(micro_batch=2, steps=1, data=LONG_TAILED, pad_to_multiple_of=16, padding_free=True),
                     log=None).result.pad_multiple == 1  # packed: no padding at all


def test_only_a_shapes_first_micro_batch_in_the_process_counts_as_new_and_only_on_cuda():
    seen: set = set()
    batch = collate(ragged_pairs(2, seed=1), [0, 1], pad_id=258)
    other = collate(ragged_pairs(2, seed=1), [0, 1], pad_id=258, multiple=32)
    cuda = torch.device("cuda")
    assert [first_of_its_shape(seen, b, cuda) for b in (batch, batch, other, batch, other)] == \
        [True, False, True, False, False]
    assert not first_of_its_shape(set(), batch, torch.device("cpu"))


def test_a_warm_process_keeps_the_shapes_it_trained_on_across_trials():
    warm = WarmState()
    cfg = make_cfg(micro_batch=2, grad_acc=2, steps=2, data=LONG_TAILED)
    first = run_trial(cfg, log=None, warm=warm)
    shapes = set(warm.shapes_run)
    assert shapes and all(len(s) == 2 and s[0] == 4 for s in shapes)  # [2 x micro_batch rows, width]
    assert all(s.micro_new == "0" * s.grad_acc for s in first.steps)  # CPU: no kernel plans to build
    run_trial(cfg.model_copy(update={"checkpoint_level": "L1"}), log=None, warm=warm)
    assert warm.shapes_run == shapes  # the same pairs, the same shapes
