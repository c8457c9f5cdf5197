"""Checkpoint levels, per-step peaks and MFU on a CUDA GPU (what the CPU tests can only check by name).

L2/L3 promise that the attention kernel is not re-run in backward: on CPU the kernel is
``_scaled_dot_product_flash_attention_for_cpu``; on an H200 sdpa dispatches to the flash,
efficient or cuDNN kernel, and the selective-checkpoint policy must keep those too.
"""
import math

import pytest
import torch

from testkit import AtenOps, is_attention_forward, make_cfg

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("level, reruns_per_layer", [("none", 0), ("L2", 0), ("L3", 0), ("full", 1)])
def test_cuda_attention_kernel_rerun_only_under_full(level, reruns_per_layer):
    from dpo_sweep.config import ModelSpec
    from dpo_sweep.train.batching import collate
    from dpo_sweep.train.checkpointing import apply_checkpoint_level
    from dpo_sweep.train.data import TokenizedPair
    from dpo_sweep.train.logprobs import SequenceLogProbs
    from dpo_sweep.train.model import build_model

    device = torch.device("cuda")
    model = build_model(ModelSpec(preset="tiny-llama", attn_implementation="sdpa", liger_kernel=False),
                        "bf16", device, seed=0).model
    apply_checkpoint_level(model, level)
    model.train()
    pairs = [TokenizedPair((1,) * 64, (2,) * 32, (3,) * 32)] * 2
    mb = collate(pairs, [0, 1], pad_id=258).to(device)
    logps = SequenceLogProbs(model, 16)(mb.input_ids, None, mb.position_ids, mb.response_mask)[0]
    ops = AtenOps()
    with ops:
        logps.float().sum().backward()
    torch.cuda.synchronize()
    layers = model.config.num_hidden_layers
    forwards = [n for n in ops.names if is_attention_forward(n)]
    assert len(forwards) == reruns_per_layer * layers, (level, sorted(set(forwards)))
    assert sum("scaled_dot_product" in n and "backward" in n for n in ops.names) == layers, sorted(set(ops.names))


def test_step_peaks_are_each_steps_own_and_mfu_is_plausible():
    from dpo_sweep.train.loop import run_trial

    cfg = make_cfg(resources={"use_gpu": True}, model={"preset": "llama-3.2-1b"}, device="cuda", precision="bf16",
                   data={"synthetic": {"pairs": 32, "prompt_tokens": 256, "response_tokens": 255}},
                   micro_batch=4, max_length=512, steps=4, warmup_steps=1)
    out = run_trial(cfg, log=print)
    r = out.result
    assert r.status == "ok", r.error
    measured = [s.peak_mem_gb for s in out.steps if s.measured]
    assert r.peak_mem_gb == pytest.approx(max(measured))
    # The model build and the reference copy are not in a step's own peak: the steps' peaks sit
    # within a few percent of each other (a running max since the start would be flat or rising).
    assert max(measured) - min(measured) < 0.05 * max(measured)
    assert 0.05 < r.mfu < 1.0 and math.isfinite(r.mfu), r.mfu


def test_oom_row_keeps_the_peak_up_to_the_failure():
    from dpo_sweep.train.loop import run_trial

    cfg = make_cfg(resources={"use_gpu": True, "gpu_memory_gb": 6.0}, model={"preset": "llama-3.2-1b"},
                   device="cuda", precision="bf16",
                   data={"synthetic": {"pairs": 64, "prompt_tokens": 512, "response_tokens": 511}},
                   micro_batch=16, max_length=1024, steps=2, warmup_steps=0)
    try:
        out = run_trial(cfg, log=None)
    finally:  # the cap is the process's: lift it for the tests that follow in this process
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert out.result.status == "oom", out.result.error
    assert math.isfinite(out.result.peak_mem_gb) and out.result.peak_mem_gb > 1.0, out.result.peak_mem_gb
