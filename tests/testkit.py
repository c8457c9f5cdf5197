"""Helpers shared by tests: small trial configs and ragged preference pairs."""
from __future__ import annotations

import random
import socket

from torch.utils._python_dispatch import TorchDispatchMode

from dpo_sweep.config import DataSpec, ModelSpec, ResourcesSpec, TrainSpec, TrialConfig
from dpo_sweep.train.data import TokenizedPair


def make_cfg(*, data: dict | None = None, model: dict | None = None, resources: dict | None = None,
             **kw) -> TrialConfig:
    """A TrialConfig for the tiny preset. ``kw`` sets knobs (micro_batch, grad_acc, beta,
    checkpoint_level) or, for any other name, a train field."""
    knobs = {k: kw.pop(k) for k in ("micro_batch", "grad_acc", "beta", "checkpoint_level", "trial_id") if k in kw}
    train = {"steps": 2, "warmup_steps": 0, "lr": 1e-3, "max_length": 64, "precision": "fp32",
             "device": "cpu", **kw}
    return TrialConfig(
        model=ModelSpec(**(model or {"preset": "tiny-llama"})),
        data=DataSpec(**(data or {"synthetic": {"pairs": 16, "prompt_tokens": 12, "response_tokens": 10}})),
        train=TrainSpec(**train),
        resources=ResourcesSpec(**(resources or {"use_gpu": False})),
        **knobs,
    )


def ragged_pairs(n: int, seed: int = 0) -> list[TokenizedPair]:
    """Pairs of random byte tokens with different prompt and response lengths (forces padding)."""
    rng = random.Random(seed)

    def ids(k: int) -> tuple[int, ...]:
        return tuple(rng.randrange(256) for _ in range(k))

    return [TokenizedPair(ids(rng.randint(3, 12)), ids(rng.randint(2, 9)), ids(rng.randint(2, 9))) for _ in range(n)]


def free_port() -> int:
    """A TCP port nothing listens on right now (for a rendezvous or a Ray node)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AtenOps(TorchDispatchMode):
    """Records the name of every aten (or custom) op dispatched while it is active."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def is_attention_forward(name: str) -> bool:
    return "scaled_dot_product" in name and "backward" not in name


def end_trial(recorder, searcher, trial, reports=(), error: bool = False) -> None:
    """One Tune trial's reports and end, in the order Ray Tune's controller makes the calls: the
    recorder sees each report, the Searcher hears of the end (the plan learns the outcome), then
    the recorder's own end hook (``on_trial_complete``, ``on_trial_error`` when ``error``) writes."""
    for report in reports:
        recorder.on_trial_result(0, [], trial, report)
    searcher.on_trial_complete(trial.trial_id, error=error)
    (recorder.on_trial_error if error else recorder.on_trial_complete)(0, [], trial)
