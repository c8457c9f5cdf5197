"""What a trial's row counts: one definition of startup_s / measure_s, exact token counts."""
from __future__ import annotations

import time

import pytest

from dpo_sweep.telemetry import TrialClock
from dpo_sweep.train import summary
from dpo_sweep.train.loop import run_trial


def test_trial_clock_startup_and_measure():
    ticks = iter([109.9, 110.0, 111.0]).__next__
    clock = TrialClock(started_at=100.0, clock=ticks)
    clock.step_started()  # the first step begins at 109.9 ...
    clock.step_ended()    # ... and ends at 110.0
    assert clock.startup_s() == pytest.approx(9.9)
    clock.step_started()  # a later step start changes nothing
    clock.step_ended()
    assert clock.startup_s() == pytest.approx(9.9)
    assert clock.measure_s() == pytest.approx(1.1)


def test_startup_counts_from_the_callers_start_and_measure_covers_every_step(cfg_factory):
    """The sweep's definition for every row: start-up from the trial's start (what the caller
    passes) to the first optimizer step, measurement over all steps, warm-up included."""
    clock = TrialClock(started_at=time.time() - 5.0)
    before = time.time()
    out = run_trial(cfg_factory(steps=3, warmup_steps=2, worst_case_step=False), log=None, clock=clock)
    wall_s = time.time() - before
    r = out.result
    assert r.status == "ok" and len(out.steps) == 3
    assert 5.0 <= r.startup_s <= 5.0 + wall_s
    assert sum(s.step_time_ms for s in out.steps) / 1e3 <= r.measure_s <= wall_s


def test_the_flop_count_gets_the_exact_token_count(cfg_factory, monkeypatch, tmp_path):
    """Padded micro-batches of different lengths: the FLOP count gets the exact non-padding token
    total of the measured steps (then divides the FLOPs per step), not a rate turned back."""
    import json
    import random

    rng = random.Random(3)
    words = "the cat sat on a mat and then it ran off to see what the dog did".split()
    text = lambda a, b: " ".join(rng.choice(words) for _ in range(rng.randint(a, b)))  # noqa: E731
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": text(2, 8), "chosen": text(1, 6), "rejected": text(1, 6)})
                              for _ in range(24)))
    seen: list[int] = []
    real = summary.dpo_step_flops

    def spy(**kw):
        seen.append(kw["counts"].tokens)
        return real(**kw)

    monkeypatch.setattr(summary, "dpo_step_flops", spy)
    out = run_trial(cfg_factory(micro_batch=3, grad_acc=2, worst_case_step=False, steps=5, warmup_steps=1, data={"path": str(path)},
                                max_length=96), log=None)
    assert out.result.status == "ok", out.result.error
    exact = [round(s.tokens_per_s * s.step_time_ms / 1e3) for s in out.steps if s.measured]
    assert len(set(exact)) > 1  # the steps really differ in length
    assert seen == [sum(exact)]  # the measured steps' exact total (the FLOPs are then per step)


def test_a_trial_without_a_memory_cap_lifts_an_earlier_trials_cap(cfg_factory, monkeypatch):
    """resources.gpu_memory_gb caps the process's CUDA allocator; the next trial in the same
    process (a warm worker, a test session) must not inherit the cap."""
    import torch

    from dpo_sweep.train import setup

    fractions = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: fractions.append(f))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: type("P", (), {"total_memory": 100e9})())
    monkeypatch.setattr(torch.cuda.memory, "_set_allocator_settings", lambda s: None)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "")  # leave the allocator settings alone here
    cuda = torch.device("cuda", 0)
    setup.configure_device_memory(cfg_factory(resources={"use_gpu": False, "gpu_memory_gb": 40.0}), cuda)
    setup.configure_device_memory(cfg_factory(), cuda)
    assert fractions == [0.4, 1.0]
