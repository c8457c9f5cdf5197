"""What a ``train.trainer: trl`` trial holds beyond or instead of a native one, for the memory model
(plan/memory.py, which asks here when ``train.trainer`` is ``trl``).

A trl trial (train/trl_trainer.py) builds the same model and runs the same micro-batches; what
differs is TRL 1.16's:

* **no lean ops**: the stock RMSNorm and MLP modules (``lean_ops`` is the native trainer's), so
  each layer saves what the stock autograd saves (memory.py's ``lean=False``);
* **the log-prob head**: ``trl.trainer.utils.add_fused_lm_head`` projects the hidden states through
  the lm_head in tiles of at most :data:`TOKEN_TILE` tokens x :data:`VOCAB_TILE` vocabulary entries
  (``trl/kernels/chunked_logprob.py``) and never holds the full logits. Its backward allocates
  the hidden states' gradient and the lm_head weight's gradient in float32
  (``torch.zeros(..., dtype=torch.float32)``: "always accumulate in fp32") beside one tile buffer,
  then hands them to autograd, which adds the weight's gradient in the weights' dtype;
* **the reference**: as in the native trainer (a copy of the policy, the adapters-off policy for
  LoRA, nothing with ``precompute_ref_log_probs``); its no-grad forward holds one tile.

Every token of the micro-batch is counted as scored (the worst case: TRL scores response tokens
only on a Triton device).
"""
from __future__ import annotations

#: Tokens per projection tile of TRL's fused head (``TOKEN_CHUNK_SIZE`` in trl/kernels/chunked_logprob.py).
TOKEN_TILE = 4096
#: Vocabulary entries per tile (``_CHUNKED_LOGPROB_CHUNK_SIZE`` in trl/trainer/utils.py).
VOCAB_TILE = 32768
#: float32 per-token outputs of the fused head that DPOTrainer asks for and autograd keeps
#: (log-probs, log-sum-exp, entropy, mean logits, top-1).
_PER_TOKEN_OUTPUTS = 5


def fused_head_tile_bytes(tokens: int, vocab: int, activation_bytes: int) -> float:
    """One projection tile, in the compute dtype: the forward's and the backward's buffer."""
    return min(tokens, TOKEN_TILE) * min(vocab, VOCAB_TILE) * activation_bytes


def fused_head_backward_bytes(tokens: int, hidden: int, vocab: int, activation_bytes: int,
                              weight_bytes: int) -> float:
    """The fused head's backward transient: the hidden states' and the lm_head weight's float32
    gradients, one tile, the per-token outputs, and the weight's gradient in its own dtype (the
    caller removes it where the lm_head is frozen, as for the native head)."""
    return (4.0 * tokens * hidden + 4.0 * vocab * hidden + fused_head_tile_bytes(tokens, vocab, activation_bytes)
            + 4.0 * _PER_TOKEN_OUTPUTS * tokens + weight_bytes * vocab * hidden)


def fused_head_forward_bytes(tokens: int, vocab: int, activation_bytes: int) -> float:
    """A no-grad forward's head (the reference's): one tile and the per-token outputs."""
    return fused_head_tile_bytes(tokens, vocab, activation_bytes) + 4.0 * _PER_TOKEN_OUTPUTS * tokens
