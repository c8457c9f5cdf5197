"""The memory model's parts on the tiny preset, and its activation term against what autograd saves."""
from __future__ import annotations

import pytest
import torch

from dpo_sweep.plan.memory import GB, element_bytes, model_saved_bytes_per_token, predict_peak_gb
from dpo_sweep.plan.shape import model_shape
from dpo_sweep.train.checkpointing import apply_checkpoint_level
from dpo_sweep.train.lean import apply_lean_ops
from dpo_sweep.train.logprobs import SequenceLogProbs
from dpo_sweep.train.model import build_model
from tests.testkit import make_cfg


@pytest.mark.parametrize("precision,bytes_per_param", [("fp32", 4), ("bf16", 2), ("bf16-mixed", 4)])
def test_weights_term_is_n_params_times_bytes(precision, bytes_per_param):
    cfg = make_cfg(precision=precision)
    n_params = build_model(cfg.model, precision, torch.device("cpu"), seed=0).n_params
    est = predict_peak_gb(cfg)
    assert model_shape(cfg.model).n_params == n_params
    assert est.weights_gb * GB == n_params * bytes_per_param
    assert est.optimizer_gb == 2 * est.weights_gb  # AdamW: two states in the weights' dtype
    assert est.reference_gb == est.weights_gb      # a live reference is a second copy


def test_parts_add_up_to_total():
    for device in ("cuda", "cpu"):
        est = predict_peak_gb(make_cfg(micro_batch=4, grad_acc=2, precision="bf16-mixed"), device=device)
        assert sum(est.parts().values()) == pytest.approx(est.total_gb, rel=1e-12)
    assert predict_peak_gb(make_cfg(), device="cpu").context_gb == 0.0


def test_precomputed_reference_has_no_copy_on_the_device():
    live = predict_peak_gb(make_cfg(reference="live"))
    pre = predict_peak_gb(make_cfg(reference="precomputed"))
    assert pre.reference_gb == 0.0
    assert live.total_gb > pre.total_gb


def test_grad_acc_one_is_lower_and_two_is_the_peak_of_any_longer_accumulation():
    """The H200 shape of the effect: 8B mb 4 L1 peaks at 83.3 GB at grad_acc 1, 98.6 at 2/4/8."""
    peaks = {g: predict_peak_gb(make_cfg(micro_batch=2, checkpoint_level="L1", grad_acc=g)).total_gb
             for g in (1, 2, 4, 8)}
    assert peaks[1] < peaks[2]
    assert peaks[2] == peaks[4] == peaks[8]
    est = predict_peak_gb(make_cfg(micro_batch=2, grad_acc=2))
    assert est.peak_at in ("backward start", "last layer backward") and est.grads_gb == est.weights_gb


def test_levels_keep_fewer_activations_in_order():
    acts = [predict_peak_gb(make_cfg(micro_batch=4, checkpoint_level=lv)).activations_gb
            for lv in ("none", "L1", "L2", "L3", "full")]
    assert acts[0] > acts[1] > acts[2] == acts[3] > acts[4]


def test_activations_are_linear_in_micro_batch_tokens():
    a = [predict_peak_gb(make_cfg(micro_batch=mb, grad_acc=2)).activations_gb for mb in (1, 2, 4)]
    assert a[2] - a[1] == pytest.approx(2 * (a[1] - a[0]), rel=1e-12)


def _saved_bytes_per_token(level: str, lean: bool, pairs: int = 2, seq: int = 64) -> float:
    """Bytes autograd saves in one policy forward (parameters excluded), per token."""
    cfg = make_cfg(checkpoint_level=level, model={"preset": "tiny-llama", "lean_ops": lean})
    model = build_model(cfg.model, "fp32", torch.device("cpu"), seed=0).model
    if lean:
        apply_lean_ops(model)
    apply_checkpoint_level(model, level)
    return saved_bytes_per_token(model.train(), pairs, seq)


def saved_bytes_per_token(model, pairs: int = 2, seq: int = 64) -> float:
    """Bytes autograd saves in one forward of ``model`` (parameters excluded), per token."""
    n = 2 * pairs
    ids = torch.randint(0, 512, (n, seq))
    response = torch.ones(n, seq, dtype=torch.bool)  # every token a response token: the model's worst case
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        SequenceLogProbs(model, 1024)(ids, None, torch.arange(seq).expand(n, seq), response)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(b for ptr, b in storages.items() if ptr not in params) / (n * seq)


@pytest.mark.parametrize("level,lean", [("none", True), ("L1", True), ("full", True), ("none", False)])
def test_activation_term_matches_what_autograd_saves(level, lean):
    """CPU, fp32, sdpa: the per-token activation bytes of the model are what the saved-tensor hooks
    see, within 1 % (the boolean response mask and the head's float32 output are not modelled). L2/L3 keep the
    attention kernel's outputs through the selective-checkpoint cache, which these hooks do not
    see: only the GPU measurements (benchmarks/memory_model_check.py) check those levels."""
    cfg = make_cfg(checkpoint_level=level, model={"preset": "tiny-llama", "lean_ops": lean})
    s, b = model_shape(cfg.model), element_bytes(cfg.model, "fp32")
    predicted = model_saved_bytes_per_token(s, b, level, lean=lean)
    assert _saved_bytes_per_token(level, lean) == pytest.approx(predicted, rel=0.01)


def test_weight_ema_is_a_float32_copy_of_the_trained_weights():
    plain = predict_peak_gb(make_cfg(precision="bf16"))
    ema = predict_peak_gb(make_cfg(precision="bf16", ema_decay=0.99))
    assert ema.ema_gb == pytest.approx(2 * plain.weights_gb)  # 4 bytes per bf16 weight's 2
    assert ema.total_gb > plain.total_gb + ema.ema_gb * 0.99
    assert plain.ema_gb == 0.0


def test_the_memory_model_uses_liger_exactly_where_the_trainer_does(monkeypatch):
    import dataclasses

    from dpo_sweep.config import ModelSpec
    from dpo_sweep.errors import UserError
    from dpo_sweep.plan import memory
    from dpo_sweep.core import trial_facts as liger
    from dpo_sweep.train import model

    cases = [(setting, arch, dev, installed) for setting in ("auto", True, False) for arch in ("llama", "qwen2", "gpt2")
             for dev in ("cuda", "cpu") for installed in (True, False)]
    for setting, arch, dev, installed in cases:
        monkeypatch.setattr(liger, "liger_installed", lambda ok=installed: ok)
        spec = ModelSpec(preset="tiny-llama", liger_kernel=setting)
        planned = liger.planned_liger(spec.liger_kernel, arch, dev)
        try:
            trained = model.resolve_liger(spec, torch.device(dev), arch)
        except UserError:
            continue  # the trial is refused: no run to predict
        assert planned == trained, (setting, arch, dev, installed)
    # The prediction follows: without lean ops liger's SwiGLU saves 3 widths, the stock MLP 4.
    monkeypatch.setattr(liger, "liger_installed", lambda: True)
    cfg = make_cfg(model={"preset": "tiny-llama", "lean_ops": False})
    shape = model_shape(cfg.model)
    on = memory.predict_peak_gb(cfg, device="cuda", shape=shape)
    off = memory.predict_peak_gb(cfg, device="cuda", shape=dataclasses.replace(shape, arch="gpt2"))
    assert off.activations_gb > on.activations_gb
