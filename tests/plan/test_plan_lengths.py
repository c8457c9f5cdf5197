"""The memory model sizes the longest micro-batch of the data's own lengths, not max_length."""
import pytest

from dpo_sweep.plan.memory import (GB, element_bytes, first_backward_bytes_per_token, layer_saved_bytes_per_token,
                                   predict_peak_gb, worst_micro_batch, worst_micro_batch_padded)
from dpo_sweep.plan.shape import model_shape
from dpo_sweep.core.lengths import LengthProfile
from tests.testkit import make_cfg


def profile(pairs):
    """(prompt, chosen, rejected) per pair."""
    p, c, r = zip(*pairs)
    return LengthProfile(p, c, r, tuple(a + max(b, d) for a, b, d in pairs))


LONG_TAILED = profile([(10, 8, 6)] * 30 + [(40, 30, 12), (20, 100, 9)])  # widths 18.., 70, 120


def test_on_cuda_the_worst_micro_batch_is_as_wide_as_its_rows_rounded_up():
    # train.pad_to_multiple_of auto: 64 on CUDA (at most max_length), 1 on the CPU.
    cpu = make_cfg(micro_batch=2, max_length=256)
    gpu = make_cfg(micro_batch=2, max_length=256, device="auto", resources={"use_gpu": "auto"})
    assert worst_micro_batch(cpu, LONG_TAILED) == (2 * 2 * 120, 120)
    assert worst_micro_batch(gpu, LONG_TAILED) == (2 * 2 * 128, 128)
    assert worst_micro_batch(cpu, LONG_TAILED, device="cuda") == (2 * 2 * 128, 128)
    assert worst_micro_batch(make_cfg(micro_batch=2, max_length=256, pad_to_multiple_of=48), LONG_TAILED) == \
        (2 * 2 * 144, 144)
    # rows all of one length have no padding to round: unpadded, no mask (fixed-length pairs keep
    # their one shape and the kernels' causal path)
    even = profile([(60, 40, 40)] * 4)
    assert worst_micro_batch(gpu, even) == (2 * 2 * 100, 100) and not worst_micro_batch_padded(gpu, even)
    assert worst_micro_batch(make_cfg(micro_batch=2, max_length=200), None, device="cuda") == (2 * 2 * 200, 200)
    # packed rows are never rounded
    packed = make_cfg(micro_batch=2, max_length=256, padding_free=True)
    assert worst_micro_batch(packed, LONG_TAILED, device="cuda") == worst_micro_batch(packed, LONG_TAILED)


def test_worst_micro_batch_is_the_longest_pairs():
    cfg = make_cfg(micro_batch=2, max_length=256)
    assert worst_micro_batch(cfg, None) == (2 * 2 * 256, 256)
    assert worst_micro_batch(cfg, LONG_TAILED) == (2 * 2 * 120, 120)  # padded to the longest width
    packed = make_cfg(micro_batch=2, max_length=256, padding_free=True)
    assert worst_micro_batch(packed, LONG_TAILED) == ((2 * 20 + 109) + (2 * 40 + 42),) * 2
    # packed, the pairs with the most tokens, not the widest padded ones
    wide_but_short = profile([(2, 60, 1), (30, 20, 20), (30, 20, 19), (1, 1, 1)])  # widths 62, 50, 50, 2
    assert worst_micro_batch(make_cfg(micro_batch=1, max_length=256), wide_but_short) == (2 * 62, 62)
    assert worst_micro_batch(make_cfg(micro_batch=1, max_length=256, padding_free=True),
                             wide_but_short) == (100, 100)


def test_prediction_follows_the_data_lengths():
    cfg = make_cfg(micro_batch=8, max_length=256)
    at_max = predict_peak_gb(cfg)
    full = profile([(128, 128, 128)] * 16)  # every row as long as max_length: no padding, the old prediction
    assert predict_peak_gb(cfg, lengths=full) == at_max
    tailed = predict_peak_gb(cfg, lengths=LONG_TAILED)
    assert tailed.activations_gb < at_max.activations_gb
    packed = predict_peak_gb(make_cfg(micro_batch=8, max_length=256, padding_free=True), lengths=LONG_TAILED)
    assert packed.activations_gb < tailed.activations_gb


def test_a_padded_micro_batch_is_the_one_with_a_short_row():
    cfg = make_cfg(micro_batch=2, max_length=256)
    assert worst_micro_batch_padded(cfg, LONG_TAILED)  # (20, 100, 9): its rejected row is padded to 120
    assert not worst_micro_batch_padded(cfg, profile([(5, 7, 7)] * 4))  # every row as long as the width
    assert not worst_micro_batch_padded(cfg, None)  # unknown lengths: every row at max_length
    assert not worst_micro_batch_padded(make_cfg(micro_batch=2, max_length=256, padding_free=True), LONG_TAILED)


def test_padding_gives_sdpa_a_mask_repeated_kv_and_a_bias_per_layer():
    # The same widths, with and without a short row: the difference is k and v at every head's
    # size instead of the GQA size, plus a T x T bias per row in each layer (transformers'
    # use_gqa_in_sdpa; measured: a Mistral shape at mb 4 on 2,048 tokens, 5.2 GB of 6.7 missing).
    model = {"preset": "tiny-llama", "attn_implementation": "sdpa"}
    cfg = make_cfg(micro_batch=2, max_length=256, model=model, pad_to_multiple_of=1)  # widths as they are
    s, b = model_shape(cfg.model), element_bytes(cfg.model, cfg.train.precision)
    assert s.kv_dim < s.q_dim  # the tiny preset is GQA
    unpadded = profile([(60, 60, 60)] * 4)
    padded = profile([(60, 60, 59)] * 4)
    tokens, width = 2 * 2 * 120, 120
    got = predict_peak_gb(cfg, lengths=padded, device="cuda").activations_gb - \
        predict_peak_gb(cfg, lengths=unpadded, device="cuda").activations_gb
    per_layer = b.activation * (2 * (s.q_dim - s.kv_dim) + width)
    assert got * GB == pytest.approx(tokens * s.n_layers * per_layer, rel=1e-9)
    assert layer_saved_bytes_per_token(s, b, "none", masked=True, seq_len=width) - \
        layer_saved_bytes_per_token(s, b, "none", masked=False, seq_len=width) == per_layer
    # flash-attn takes the padding as varlen lengths: no mask, nothing repeated
    assert layer_saved_bytes_per_token(s, b, "none", attn="flash_attention_2", masked=True) == \
        layer_saved_bytes_per_token(s, b, "none", attn="flash_attention_2", masked=False)


@pytest.mark.parametrize("level", ["none", "L1", "L2", "full"])
def test_the_last_layer_backward_holds_every_activation_its_recompute_and_its_mlp_gradients(level):
    # A long micro-batch at a level that saves little: the last decoder layer's backward is the
    # peak (Mistral 3B, mb 4 full, 16k tokens: 2.8 GB above the backward start).
    s = model_shape(make_cfg().model)
    b = element_bytes(make_cfg().model, "fp32")
    recompute = layer_saved_bytes_per_token(s, b, "none") - layer_saved_bytes_per_token(s, b, level)
    stock = first_backward_bytes_per_token(s, b, level, liger=False)
    assert stock == recompute + 4 * b.activation * s.intermediate + 2 * b.residual * s.hidden
    assert (recompute > 0) == (level != "none")
    cfg = make_cfg(micro_batch=64, max_length=256, checkpoint_level="full", grad_acc=2, logp_chunk_tokens=64)
    est = predict_peak_gb(cfg, device="cuda")
    assert est.peak_at == "last layer backward"
