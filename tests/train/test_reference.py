"""The precomputed reference: only the pairs a trial reads, computed once for the sweep's trials."""
import math

import pytest
import torch

from dpo_sweep.train.loop import run_trial
from dpo_sweep.train.reference import ReferenceTables, pairs_read, reference_batches, table_key
from dpo_sweep.train.tokenizer import tokenized_pairs
from dpo_sweep.train.warm_state import WarmState
from tests.train.test_loop import write_ragged_pairs


@pytest.fixture()
def big_file(tmp_path):
    return write_ragged_pairs(tmp_path / "pairs.jsonl", 400)


def reference_cfg(cfg_factory, path, **kw):
    base = dict(micro_batch=2, grad_acc=2, steps=3, reference="precomputed", data={"path": path}, max_length=96)
    return cfg_factory(**{**base, **kw})


def test_a_trial_reads_the_reference_of_its_steps_worst_case_and_held_batch_only(cfg_factory, big_file):
    cfg = reference_cfg(cfg_factory, big_file)
    _, ds = tokenized_pairs(cfg)
    read = pairs_read(cfg, ds, world=1, rank=0)
    # 3 steps x effective batch 4, the worst-case step's 4 longest pairs, the held batch's first 4
    assert 4 < len(read) <= 3 * 4 + 4 + 4 and len(ds) == 400
    assert set(range(4)) <= set(read)
    lines = []
    out = run_trial(cfg, log=lines.append)
    assert out.result.status == "ok", out.result.error
    assert any(f"reference log-probs of the {len(read)} pairs this trial reads" in m for m in lines), lines


def test_every_split_of_one_effective_batch_reads_the_same_pairs_and_later_trials_compute_none(cfg_factory, big_file):
    warm, first, again = WarmState(), [], []  # one warm worker's trials
    run_trial(reference_cfg(cfg_factory, big_file, checkpoint_level="none"), log=first.append, warm=warm)
    out = run_trial(reference_cfg(cfg_factory, big_file, micro_batch=1, grad_acc=4, checkpoint_level="full"),
                    log=again.append, warm=warm)
    assert out.result.status == "ok"
    assert any(", 0 computed," not in m and "computed" in m for m in first if "reference log-probs" in m)
    assert any(": 0 computed," in m for m in again if "reference log-probs" in m), again


def test_kept_values_are_the_ones_a_fresh_trial_computes(cfg_factory, big_file):
    """A trial that takes an earlier trial's reference gives the losses it gives alone."""
    alone = run_trial(reference_cfg(cfg_factory, big_file, micro_batch=1, grad_acc=4), log=None)
    warm = WarmState()
    run_trial(reference_cfg(cfg_factory, big_file, micro_batch=4, grad_acc=1), log=None, warm=warm)
    after = run_trial(reference_cfg(cfg_factory, big_file, micro_batch=1, grad_acc=4), log=None, warm=warm)
    torch.testing.assert_close(torch.tensor([s.loss for s in after.steps]),
                               torch.tensor([s.loss for s in alone.steps]), rtol=1e-5, atol=1e-6)
    assert alone.steps[0].loss == pytest.approx(math.log(2), abs=1e-5)


def test_another_seed_or_precision_is_another_table(cfg_factory, big_file):
    cfg = reference_cfg(cfg_factory, big_file)
    assert table_key(cfg) == table_key(reference_cfg(cfg_factory, big_file, micro_batch=4, grad_acc=1,
                                                     checkpoint_level="L2", lr=0.1))
    assert table_key(cfg) != table_key(reference_cfg(cfg_factory, big_file, seed=1))
    assert table_key(cfg) != table_key(reference_cfg(cfg_factory, big_file, precision="bf16"))


def test_tables_fill_in_only_what_is_missing():
    tables, calls = ReferenceTables(), []

    def compute(idx):
        calls.append(list(idx))
        return torch.tensor([[float(i), -float(i)] for i in idx])

    table, n = tables.table("k", 10, [1, 5], compute)
    assert n == 2 and calls == [[1, 5]] and table[5].tolist() == [5.0, -5.0] and math.isnan(table[0, 0])
    table, n = tables.table("k", 10, [5, 7, 1], compute)
    assert n == 1 and calls[-1] == [7]


def test_reference_batches_fill_a_token_budget_longest_first_never_below_the_micro_batch():
    widths = [2000, 1900, 1000, 900, 800, 100, 90, 80, 70]
    batches = reference_batches(widths, micro_batch=1, chunked_head=True, budget_tokens=8192)
    assert [i for b in batches for i in b] == list(range(len(widths)))  # every pair once, in order
    # two rows per pair at the batch's widest: 2 x 2 x 2000 fits 8192, a third pair would not
    assert batches[0] == [0, 1] and batches[1] == [2, 3, 4, 5] and batches[2] == [6, 7, 8]
    for b in batches:
        assert 2 * len(b) * max(widths[i] for i in b) <= 8192
    # the trial's own micro-batch even past the budget; unchunked logits: the micro-batch only
    assert reference_batches([4000] * 4, micro_batch=2, chunked_head=True, budget_tokens=8192) == [[0, 1], [2, 3]]
    assert reference_batches([10] * 5, micro_batch=2, chunked_head=False) == [[0, 1], [2, 3], [4]]


def test_batched_reference_gives_the_values_of_one_pair_at_a_time(cfg_factory, big_file):
    """Batching the reference pass by tokens changes no loss: a trial whose pairs were computed
    in batches of many pairs (micro_batch 1, chunked head) against one computed pair by pair."""
    cfg = reference_cfg(cfg_factory, big_file, micro_batch=1, grad_acc=4)
    batched = run_trial(cfg, log=None)
    one_by_one = run_trial(reference_cfg(cfg_factory, big_file, micro_batch=1, grad_acc=4, logp_chunk_tokens=0),
                           log=None)
    torch.testing.assert_close(torch.tensor([s.loss for s in batched.steps]),
                               torch.tensor([s.loss for s in one_by_one.steps]), rtol=1e-5, atol=1e-6)
