"""The trainer end to end on the tiny preset: equivalences, reference modes, statuses, precisions."""
import json
import math

import pytest
import torch

from dpo_sweep.records import RESULTS_COLUMNS, STEPS_COLUMNS
from dpo_sweep.train.faults import InjectedFault
from dpo_sweep.train.loop import run_trial
from dpo_sweep.train.metrics import detrended_std


def write_ragged_pairs(path, n: int) -> str:
    """``n`` pairs of different lengths, so micro-batches are padded differently in each split."""
    import random

    rng = random.Random(1)
    words = "the cat sat on a mat and then it ran off to see what the dog did".split()
    rows = []
    for _ in range(n):
        s = lambda a, b: " ".join(rng.choice(words) for _ in range(rng.randint(a, b)))  # noqa: E731
        rows.append({"prompt": s(2, 8), "chosen": s(1, 6), "rejected": s(1, 6)})
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def ragged_file(tmp_path_factory):
    return write_ragged_pairs(tmp_path_factory.mktemp("data") / "pairs.jsonl", 16)


@pytest.fixture(scope="module")
def ragged_file_10(tmp_path_factory):
    """10 pairs: not a multiple of the effective batch 4, so epochs end with pairs left over."""
    return write_ragged_pairs(tmp_path_factory.mktemp("data") / "pairs10.jsonl", 10)


def steps_of(outcome):
    return [(r.loss, r.grad_norm, r.reward_margin, r.logps_chosen) for r in outcome.steps]


def split_runs(cfg_factory, data_file: str, steps: int) -> dict:
    runs = {}
    for mb, ga in ((4, 1), (2, 2), (1, 4)):
        cfg = cfg_factory(micro_batch=mb, grad_acc=ga, steps=steps, data={"path": data_file}, max_length=96)
        out = run_trial(cfg, log=None)
        assert out.result.status == "ok", out.result.error
        # The typical steps: the worst-case step runs each split's own longest micro-batches.
        typical = [(r.loss, r.grad_norm, r.reward_margin, r.logps_chosen) for r in out.steps if not r.worst_case]
        runs[(mb, ga)] = (out, torch.tensor(typical, dtype=torch.float64))
    return runs


def assert_same_updates(runs: dict) -> None:
    _, base = runs[(4, 1)]
    assert base[2, 0] != base[0, 0]  # the weights did move
    for key, (_, got) in runs.items():
        torch.testing.assert_close(got, base, rtol=2e-4, atol=2e-5, msg=str(key))


def test_micro_batch_times_grad_acc_is_one_update(cfg_factory, ragged_file):
    """(4,1), (2,2) and (1,4) see the same 4 pairs per step and must give the same updates:
    step 1's loss and gradient norm, and steps 2-3, which run on the updated weights."""
    assert_same_updates(split_runs(cfg_factory, ragged_file, steps=3))


def test_splits_agree_past_the_first_epoch(cfg_factory, ragged_file_10):
    """10 pairs, effective batch 4: every split uses the same 8 pairs per epoch (2 left out), so
    steps 3-5 (epochs 2 and 3) still see the same pairs and give the same updates."""
    runs = split_runs(cfg_factory, ragged_file_10, steps=5)
    assert_same_updates(runs)
    assert {out.result.pairs_used for out, _ in runs.values()} == {8}


def test_live_and_precomputed_reference_agree(cfg_factory, ragged_file):
    live = run_trial(cfg_factory(micro_batch=2, steps=3, data={"path": ragged_file}, max_length=96), log=None)
    pre = run_trial(cfg_factory(micro_batch=2, steps=3, reference="precomputed", data={"path": ragged_file},
                                max_length=96), log=None)
    torch.testing.assert_close(torch.tensor(steps_of(pre)), torch.tensor(steps_of(live)), rtol=1e-5, atol=1e-5)
    assert pre.result.reference == "precomputed"


def test_first_step_loss_is_log2_and_rewards_zero(cfg_factory):
    out = run_trial(cfg_factory(micro_batch=2, steps=1), log=None)
    first = out.steps[0]
    assert first.loss == pytest.approx(math.log(2), abs=1e-6)
    assert first.rewards_chosen == 0 and first.kl == 0


def test_results_rows_carry_contract_fields(cfg_factory):
    out = run_trial(cfg_factory(micro_batch=2, steps=4, warmup_steps=1), log=None)
    r = out.result
    assert r.status == "ok" and r.steps == 5 and r.measured_steps == 3  # + the worst-case step
    assert r.mem_source == "rss" and r.peak_mem_gb > 0.05
    assert r.step_time_ms > 0 and r.tokens_per_s > 0 and r.effective_batch == 2
    measured_ms = [s.step_time_ms for s in out.steps[1:4]]  # the spread the analysis ranks with
    assert min(measured_ms) <= r.step_time_p10_ms <= r.step_time_ms <= r.step_time_p90_ms <= max(measured_ms)
    assert r.loss_std == pytest.approx(detrended_std([s.loss for s in out.steps[1:4]]))
    assert [s.measured for s in out.steps] == [False, True, True, True, True]
    assert [s.worst_case for s in out.steps] == [False] * 4 + [True]
    for col in ("trial_id", "status", "peak_mem_gb", "step_time_ms", "step_time_p90_ms", "tokens_per_s", "mfu",
                "loss_std", "torch_peak_alloc_gb", "reward_accuracy", "reward_margin", "error"):
        assert col in RESULTS_COLUMNS
    for col in ("trial_id", "step", "loss", "grad_norm", "step_time_ms", "peak_mem_gb", "reward_accuracy",
                "reward_margin", "logps_chosen", "logps_rejected", "kl"):
        assert col in STEPS_COLUMNS


def test_nan_loss_marks_diverged_and_stops(cfg_factory):
    out = run_trial(cfg_factory(steps=5), log=None, fault=InjectedFault(2, "nan"))
    assert out.result.status == "diverged"
    assert len(out.steps) == 2 and "step 2" in out.result.error


def test_oom_and_error_are_results_or_raise(cfg_factory):
    oom = run_trial(cfg_factory(steps=3), log=None, fault=InjectedFault(2, "oom"))
    assert oom.result.status == "oom" and "OutOfMemoryError" in oom.result.error
    err = run_trial(cfg_factory(steps=3), log=None, fault=InjectedFault(1, "error"))
    assert err.result.status == "error" and "injected" in err.result.error
    with pytest.raises(torch.OutOfMemoryError):
        run_trial(cfg_factory(steps=3), log=None, catch_failures=False, fault=InjectedFault(1, "oom"))


@pytest.mark.parametrize("precision", ["bf16", "bf16-mixed", "fp16"])
def test_precisions_run_and_stay_near_fp32(cfg_factory, precision):
    ref = run_trial(cfg_factory(micro_batch=2, steps=2), log=None)
    out = run_trial(cfg_factory(micro_batch=2, steps=2, precision=precision), log=None)
    assert out.result.status == "ok" and out.result.precision == precision
    assert out.steps[0].loss == pytest.approx(math.log(2), abs=1e-3)
    assert out.steps[1].loss == pytest.approx(ref.steps[1].loss, abs=0.02)


def test_pure_bf16_keeps_weights_in_bf16(cfg_factory, monkeypatch):
    seen = {}
    import dpo_sweep.train.setup as trial_setup

    real = trial_setup.apply_checkpoint_level

    def spy(model, level):
        seen["dtype"] = {p.dtype for p in model.parameters()}
        return real(model, level)

    monkeypatch.setattr(trial_setup, "apply_checkpoint_level", spy)
    run_trial(cfg_factory(steps=1, precision="bf16"), log=None)
    assert seen["dtype"] == {torch.bfloat16}
    run_trial(cfg_factory(steps=1, precision="bf16-mixed"), log=None)
    assert seen["dtype"] == {torch.float32}


def test_detrended_std():
    assert detrended_std([1.0, 0.9, 0.8, 0.7]) == pytest.approx(0.0, abs=1e-12)
    assert math.isnan(detrended_std([1.0, 2.0]))
    # residuals of [0, 1, 0, 1] around their fit y = 0.2 + 0.2x: (-0.2, 0.6, -0.6, 0.2); ss = 0.8
    assert detrended_std([0.0, 1.0, 0.0, 1.0]) == pytest.approx(math.sqrt(0.8 / 2))


def test_loss_learns_synthetic_preference(cfg_factory):
    out = run_trial(cfg_factory(micro_batch=4, steps=12, lr=2e-3), log=None)
    assert out.steps[-1].reward_accuracy >= 0.75 and out.steps[-1].loss < out.steps[0].loss


def test_count_params_counts_a_tied_head_once_and_never_as_body():
    from dpo_sweep.config import ModelSpec
    from dpo_sweep.train.model import build_model, count_params

    model = build_model(ModelSpec(preset="tiny-llama"), "fp32", torch.device("cpu"), seed=0).model
    head = model.lm_head.weight.numel()
    total, body = count_params(model)
    assert total == sum(p.numel() for p in model.parameters())
    assert body == total - head - model.model.embed_tokens.weight.numel()
    model.lm_head.weight = model.model.embed_tokens.weight  # tie
    assert count_params(model) == (total - head, body)


def test_without_evaluate_the_trial_skips_the_held_batch(cfg_factory, monkeypatch):
    from dpo_sweep.train import evaluation

    calls = []
    real = evaluation.held_batch_loss
    monkeypatch.setattr(evaluation, "held_batch_loss", lambda *a, **k: calls.append(1) or real(*a, **k))
    on = run_trial(cfg_factory(micro_batch=2, steps=2), log=None).result
    off = run_trial(cfg_factory(micro_batch=2, steps=2, evaluate=False), log=None).result
    assert len(calls) == 1 and math.isfinite(on.eval_loss) and math.isnan(off.eval_loss)
    assert (off.status, off.loss_mean) == ("ok", on.loss_mean)  # the steps themselves are the same
