"""The memory model sizes the longest micro-batch of the data's own lengths, not max_length."""
from dpo_sweep.plan.memory import predict_peak_gb, worst_micro_batch
from dpo_sweep.train.lengths import LengthProfile
from tests.testkit import make_cfg


def profile(pairs):
    """(prompt, chosen, rejected) per pair."""
    p, c, r = zip(*pairs)
    return LengthProfile(p, c, r, tuple(a + max(b, d) for a, b, d in pairs))


LONG_TAILED = profile([(10, 8, 6)] * 30 + [(40, 30, 12), (20, 100, 9)])  # widths 18.., 70, 120


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
    full = profile([(128, 128, 100)] * 16)  # every pair as wide as max_length: the old prediction
    assert predict_peak_gb(cfg, lengths=full) == at_max
    tailed = predict_peak_gb(cfg, lengths=LONG_TAILED)
    assert tailed.activations_gb < at_max.activations_gb
    packed = predict_peak_gb(make_cfg(micro_batch=8, max_length=256, padding_free=True), lengths=LONG_TAILED)
    assert packed.activations_gb < tailed.activations_gb
