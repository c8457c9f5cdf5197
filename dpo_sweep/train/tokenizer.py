"""Tokenizers: the built-in byte-level one used by presets, or a checkpoint's own."""
from __future__ import annotations

from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from dpo_sweep.config import ModelSpec, TrialConfig
from dpo_sweep.errors import UserError
from dpo_sweep.train.data import PairDataset, load_pairs
from dpo_sweep.models.pretrained import load_checkpoint_tokenizer

#: Special tokens of the byte-level tokenizer: 256 byte tokens come first, these follow.
BYTE_SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A 259-token byte-level tokenizer built in memory (no files, no download).

    Every UTF-8 byte is one token (ids 0-255), then ``<s>`` (256), ``</s>`` (257), ``<pad>`` (258).
    It has no chat template, so chat data gets the plain rendering of ``data.render_messages``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, **BYTE_SPECIALS)


def load_tokenizer(spec: ModelSpec) -> PreTrainedTokenizerBase:
    """The tokenizer for a model spec: byte-level for presets, the checkpoint's own otherwise."""
    if spec.preset is not None:
        return byte_level_tokenizer()
    tok = load_checkpoint_tokenizer(spec)  # UserError for a missing folder or missing files
    if tok.pad_token_id is None:
        # Padding never reaches the loss (it is masked), so any id will do; EOS is the convention.
        tok.pad_token = tok.eos_token
    if tok.pad_token_id is None:
        raise UserError(f"model.name_or_path: {spec.name_or_path}: the tokenizer has neither a pad nor an "
                        "end-of-sequence token, so batches cannot be padded; set eos_token (or pad_token) "
                        "in its tokenizer_config.json")
    return tok


def tokenized_pairs(cfg: TrialConfig) -> tuple[PreTrainedTokenizerBase, PairDataset]:
    """``cfg``'s tokenizer and its data tokenised at ``train.max_length``, made afresh (a warm
    worker keeps the last ones: :class:`~dpo_sweep.train.warm_state.WarmState`)."""
    tok = load_tokenizer(cfg.model)
    return tok, load_pairs(cfg.data, tok, cfg.train.max_length)
