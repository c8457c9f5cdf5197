"""The presets: public models' shapes by name (``model.preset``), built with random weights. Memory
and time do not depend on the weights' values, so a random-initialised model of the same shape
measures the same as the real one."""
from __future__ import annotations

from typing import Any

#: Each preset's architecture (``arch``) and its transformers config's fields.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny-llama": dict(
        arch="llama", hidden_size=128, intermediate_size=352, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=512, max_position_embeddings=2048,
        tie_word_embeddings=False, rope_theta=10000.0,
    ),
    "llama-3.2-1b": dict(
        arch="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, vocab_size=128256,
        max_position_embeddings=131072, tie_word_embeddings=True, rope_theta=500000.0,
        rms_norm_eps=1e-5,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    ),
    "llama-3-8b": dict(
        arch="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
        max_position_embeddings=8192, tie_word_embeddings=False, rope_theta=500000.0, rms_norm_eps=1e-5,
    ),
    "qwen2-7b": dict(
        arch="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
        max_position_embeddings=32768, tie_word_embeddings=False, rope_theta=1000000.0, rms_norm_eps=1e-6,
    ),
}


def preset_config(name: str) -> Any:
    """The transformers config of a preset."""
    from transformers import LlamaConfig, Qwen2Config

    kw = dict(PRESETS[name])
    arch = kw.pop("arch")
    rope_scaling = kw.pop("rope_scaling", None)
    cfg = (LlamaConfig if arch == "llama" else Qwen2Config)(**kw)
    if rope_scaling is not None:
        # transformers 5 keeps rope settings in rope_parameters (rope_scaling before that).
        params = dict(getattr(cfg, "rope_parameters", None) or {})
        params.update(rope_scaling, rope_theta=kw["rope_theta"])
        if hasattr(cfg, "rope_parameters"):
            cfg.rope_parameters = params
        else:
            cfg.rope_scaling = rope_scaling
    return cfg
