"""Every family's log-probs are its own forward's: head transforms, hidden states, dropout, router loss.

Checkpoint folders from tests/family_checkpoints.py (each saved as a user saves one), read by the
trainer's own build_model. The head is scaled x200 so that a dropped transform (soft-capping, a
logit scale) moves a sequence's log-prob by nats, far above fp32 rounding.
"""
from __future__ import annotations

import math

import pytest
import torch

from dpo_sweep.config import ModelSpec
from dpo_sweep.train.batching import collate
from dpo_sweep.train.head import HeadTransform, decoder, head_transform
from dpo_sweep.train.logprobs import SequenceLogProbs
from dpo_sweep.train.model import build_model

from family_checkpoints import FAMILIES, save_family_checkpoint
from testkit import ragged_pairs

#: fp32 log-probs summed over <= 9 response tokens: the chunked and plain heads and the model's own
#: forward differ by rounding only (about 1e-5 nats at x200 logits of magnitude ~1e3).
LOGP_TOL = dict(rtol=1e-5, atol=2e-3)


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def folders(family_folder):
    """model_type -> a checkpoint folder with its head scaled x200."""
    return lambda model_type: family_folder(model_type, head_scale=200)


def _model(folder) -> torch.nn.Module:
    return build_model(ModelSpec(name_or_path=str(folder)), "fp32", torch.device("cpu"), seed=0).model.eval()


def own_forward_logps(lm: torch.nn.Module, batch) -> torch.Tensor:
    """Summed response log-probs from the model's own ``forward().logits`` (plain log-softmax)."""
    logits = lm(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                position_ids=batch.position_ids, use_cache=False).logits.float()
    token = logits[:, :-1].log_softmax(-1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    return (token * batch.response_mask[:, 1:]).sum(-1)


def _batch():
    return collate(ragged_pairs(2, seed=1), [0, 1], pad_id=258)


def _args(batch):
    return batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_logps_equal_the_models_own_forward(model_type, folders):
    lm = _model(folders(model_type))
    batch = _batch()
    want = own_forward_logps(lm, batch)
    for chunk in (0, 7):  # plain head, chunked head
        got, _ = SequenceLogProbs(lm, chunk)(*_args(batch))
        torch.testing.assert_close(got, want, **LOGP_TOL, msg=lambda m: f"{model_type} chunk {chunk}: {m}")


# --- the head transform ---------------------------------------------------------------------------


@pytest.mark.parametrize("model_type, extra, want", [
    ("gemma2", {}, HeadTransform(softcap=30.0)),
    ("gemma3_text", {}, HeadTransform()),  # its config's default: no cap
    ("gemma3_text", {"final_logit_softcapping": 20.0}, HeadTransform(softcap=20.0)),
    ("cohere", {}, HeadTransform(scale=0.25)),
    ("granite", {}, HeadTransform(scale=1 / 4.0)),  # logits / logits_scaling
    ("llama", {}, HeadTransform()),
    ("gpt2", {}, HeadTransform()),
])
def test_head_transform_is_read_from_the_model(model_type, extra, want):
    from transformers import AutoModelForCausalLM

    from family_checkpoints import family_config

    cfg = family_config(model_type)
    for key, value in extra.items():
        setattr(cfg, key, value)
    assert head_transform(AutoModelForCausalLM.from_config(cfg)) == want


def test_a_config_attribute_the_forward_does_not_read_is_not_applied():
    # Llama's forward never reads final_logit_softcapping: a stray key in config.json changes nothing.
    from transformers import AutoModelForCausalLM

    from family_checkpoints import family_config

    cfg = family_config("llama")
    cfg.final_logit_softcapping = 5.0
    assert head_transform(AutoModelForCausalLM.from_config(cfg)).identity


@pytest.mark.parametrize("chunk", [1, 5, 100])
def test_chunked_head_gradients_with_a_transform(chunk):
    from dpo_sweep.train.logprobs import chunked_token_logps, naive_token_logps

    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50).double()
    h = (torch.randn(20, 16, dtype=torch.float64) * 5).requires_grad_()
    labels = torch.randint(0, 50, (20,))
    g = torch.randn(20, dtype=torch.float64)
    transform = HeadTransform(scale=0.5, softcap=3.0)
    want = naive_token_logps(h, head, labels, transform)
    (want.double() * g).sum().backward()
    grads = (h.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone())
    h.grad = None
    head.zero_grad()
    got = chunked_token_logps(h, head, labels, chunk, transform)
    (got.double() * g).sum().backward()
    torch.testing.assert_close(got.double(), want.double(), rtol=1e-6, atol=1e-5)
    for a, b in zip((h.grad, head.weight.grad, head.bias.grad), grads):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    # and the cap matters here: without it the values differ
    assert (naive_token_logps(h, head, labels, HeadTransform(scale=0.5)) - want).abs().max() > 0.1


def test_decoder_of_a_causal_lm_that_is_its_own_base_model():
    # Llama-4 text: base_model_prefix names no child, so base_model is the CausalLM itself.
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("llama4_text", hidden_size=32, intermediate_size=48, intermediate_size_mlp=48,
                               num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                               vocab_size=300, num_local_experts=2)
    lm = AutoModelForCausalLM.from_config(cfg).eval()
    assert lm.base_model is lm and decoder(lm) is lm.model
    batch = _batch()
    torch.testing.assert_close(SequenceLogProbs(lm, 4)(*_args(batch))[0], own_forward_logps(lm, batch), **LOGP_TOL)


# --- attention implementation ---------------------------------------------------------------------


def test_auto_attention_honours_the_checkpoint_and_what_the_model_supports():
    from dpo_sweep.core.trial_facts import attention

    assert attention("auto", "cpu", False, named="eager") == "eager"  # the checkpoint's own choice
    assert attention("auto", "cpu", False, named="flash_attention_2") == "sdpa"  # cannot run here
    assert attention("auto", "cuda", True, supported=("flash_attention_2", "eager")) == "flash_attention_2"
    assert attention("auto", "cuda", False, supported=("flash_attention_2", "eager")) == "eager"
    assert attention("sdpa", "cpu", False, named="eager") == "sdpa"  # an explicit setting wins


def test_attention_gemma2_builds_eager_and_refuses_sdpa_at_validate(folders, tmp_path):
    from dpo_sweep.errors import UserError
    from dpo_sweep.preflight import check_models

    from testkit import make_cfg

    folder = folders("gemma2")
    built = build_model(ModelSpec(name_or_path=str(folder)), "fp32", torch.device("cpu"), seed=0)
    assert built.attn_implementation == "eager"  # transformers ships no sdpa for Gemma-2
    cfg = make_cfg(model={"name_or_path": str(folder), "attn_implementation": "sdpa"})
    with pytest.raises(UserError, match="attn_implementation: sdpa is refused: Gemma2ForCausalLM"):
        check_models([cfg])
    # a checkpoint whose config.json names eager is built eager
    import json

    llama = folders("llama")
    meta = json.loads((llama / "config.json").read_text())
    named = tmp_path / "named"
    named.mkdir()
    for f in llama.iterdir():
        (named / f.name).write_bytes(f.read_bytes())
    (named / "config.json").write_text(json.dumps({**meta, "attn_implementation": "eager"}))
    assert build_model(ModelSpec(name_or_path=str(named)), "fp32", torch.device("cpu"), seed=0).attn_implementation == "eager"


# --- training semantics: dropout off, the router loss ---------------------------------------------


@pytest.fixture(scope="module")
def dropout_folders(family_folder):
    """model_type -> a checkpoint folder whose config sets every dropout probability to 0.1."""
    return lambda model_type: family_folder(model_type, dropout=0.1)


def _step1_loss(folder, **train) -> float:
    from dpo_sweep.train.loop import run_trial

    from testkit import make_cfg

    cfg = make_cfg(model={"name_or_path": str(folder)}, micro_batch=2, steps=1, max_length=48, worst_case_step=False,
                   evaluate=False, data={"synthetic": {"pairs": 2, "prompt_tokens": 10, "response_tokens": 8}},
                   **train)
    out = run_trial(cfg, log=None, catch_failures=False)
    return out.steps[0].loss


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_step1_loss_is_ln2_with_dropout_in_the_config(model_type, dropout_folders):
    # Policy and reference are the same weights at step 1: any dropout left on moves the loss off ln 2.
    assert _step1_loss(dropout_folders(model_type)) == pytest.approx(math.log(2), abs=1e-6)


@pytest.mark.parametrize("model_type", ["llama", "gpt2"])  # attention_dropout read at call time; nn.Dropout modules
def test_train_dropout_true_keeps_the_checkpoints_dropout(model_type, dropout_folders):
    assert abs(_step1_loss(dropout_folders(model_type), dropout=True) - math.log(2)) > 1e-4


@pytest.mark.parametrize("model_type", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_router_aux_loss_as_the_models_own_forward_adds_it(model_type):
    from transformers import AutoModelForCausalLM

    from family_checkpoints import family_config

    cfg = family_config(model_type)
    cfg.output_router_logits = True
    cfg.router_aux_loss_coef = 0.02
    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(cfg)
    batch = _batch()
    lp = SequenceLogProbs(lm, 8, router_aux_loss=True)
    lp(*_args(batch))
    own = lm(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
             use_cache=False, output_router_logits=True)
    torch.testing.assert_close(lp.aux_loss, 0.02 * own.aux_loss)
    assert lp.aux_loss.requires_grad and lp.aux_loss.item() > 0
    # the reference (no router loss asked) and a config that does not ask: none
    assert SequenceLogProbs(lm, 8).router is None
    cfg.output_router_logits = False
    assert SequenceLogProbs(AutoModelForCausalLM.from_config(cfg), 8, router_aux_loss=True).router is None


def test_router_aux_loss_enters_the_step_loss(tmp_path):
    # The step's gradient is the DPO loss's plus the router loss's: a trial with the router loss on
    # ends with other weights than one without (the DPO loss alone is the same at step 1: ln 2).
    import json

    from dpo_sweep.train.loop import run_trial

    from testkit import make_cfg

    folder = save_family_checkpoint("mixtral", tmp_path / "moe")
    meta = json.loads((folder / "config.json").read_text())
    losses = {}
    for asks in (False, True):
        (folder / "config.json").write_text(json.dumps({**meta, "output_router_logits": asks,
                                                        "router_aux_loss_coef": 1.0}))
        cfg = make_cfg(model={"name_or_path": str(folder)}, micro_batch=2, steps=2, max_length=48,
                       worst_case_step=False, evaluate=False, lr=1e-2,
                       data={"synthetic": {"pairs": 4, "prompt_tokens": 10, "response_tokens": 8}})
        losses[asks] = [s.loss for s in run_trial(cfg, log=None, catch_failures=False).steps]
    assert losses[False][0] == pytest.approx(math.log(2), abs=1e-6) == losses[True][0]
    assert abs(losses[True][1] - losses[False][1]) > 1e-5


#: Families whose head transform is not in the checkpoint matrix above: (model_type, config
#: arguments, the transform their forward applies). HyperCLOVA X multiplies by logits_scaling where
#: Granite divides: the operator is read from each forward's source.
_MORE_HEADS = [
    ("falcon_h1", dict(lm_head_multiplier=0.5, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8,
                       mamba_n_groups=1, mamba_chunk_size=16), HeadTransform(scale=0.5)),
    ("granitemoehybrid", dict(logits_scaling=4.0, num_local_experts=2, num_experts_per_tok=1,
                              layer_types=["mamba", "attention"], mamba_d_state=8, mamba_n_heads=4, mamba_d_head=32,
                              mamba_n_groups=1), HeadTransform(scale=0.25)),
    ("hyperclovax", dict(logits_scaling=0.25), HeadTransform(scale=0.25)),
    ("cohere2", dict(logit_scale=0.25), HeadTransform(scale=0.25)),
    ("gemma4_text", dict(final_logit_softcapping=30.0), HeadTransform(softcap=30.0)),
]


@pytest.mark.parametrize("model_type, extra, want", _MORE_HEADS, ids=[c[0] for c in _MORE_HEADS])
def test_more_families_heads_equal_their_own_forward(model_type, extra, want):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(model_type, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, vocab_size=512, head_dim=16,
                               bos_token_id=256, eos_token_id=257, pad_token_id=258, **extra)
    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        lm.get_output_embeddings().weight.mul_(200)
    assert head_transform(lm) == want
    batch = _batch()
    torch.testing.assert_close(SequenceLogProbs(lm, 8)(*_args(batch))[0], own_forward_logps(lm, batch), **LOGP_TOL)
