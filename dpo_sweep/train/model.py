"""Models: random-initialised presets built from a config (no download), or real checkpoints."""
from __future__ import annotations

import importlib
import importlib.util
import pickle
import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dpo_sweep.config import ModelSpec
from dpo_sweep.core import trial_facts
from dpo_sweep.models.presets import PRESETS, preset_config
from dpo_sweep.models.pretrained import weights_error

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class BuiltModel:
    model: nn.Module
    attn_implementation: str
    n_params: int
    n_params_non_embedding: int
    liger_kernel: bool = False


def flash_attn_imports() -> bool:
    """Whether flash-attn is installed and imports (a broken build is common; sdpa is always there)."""
    if importlib.util.find_spec("flash_attn") is None:
        return False
    try:
        import flash_attn  # noqa: F401

        return True
    except Exception:
        return False


def resolve_attn_implementation(requested: str, device: torch.device, spec: ModelSpec | None = None) -> str:
    """The attention ``requested`` resolves to on ``device`` (trial_facts.attention) for ``spec``'s
    model (None: one that supports every implementation and names none); flash-attn is imported
    only where ``auto`` on CUDA asks for it. An implementation the model does not support is a UserError."""
    from dpo_sweep.errors import UserError

    from dpo_sweep.models.pretrained import attention_support

    named, supported, model_class = attention_support(spec) if spec is not None else (None, trial_facts.ATTENTIONS, "")
    if refusal := trial_facts.refused_attention_support(requested, supported, model_class):
        raise UserError(refusal)
    wants_flash = requested == "auto" and device.type == "cuda"
    return trial_facts.attention(requested, device.type, flash_attn=wants_flash and flash_attn_imports(),
                                 named=named, supported=supported)


def weight_dtype(spec: ModelSpec, precision: str) -> torch.dtype:
    """Storage dtype of the trained weights: bf16 for pure bf16, else fp32 master weights."""
    if spec.dtype is not None:
        return _DTYPES[spec.dtype]
    return torch.bfloat16 if precision == "bf16" else torch.float32


def count_params(model: nn.Module) -> tuple[int, int]:
    """(all parameters, parameters outside the embedding and the lm_head)."""
    # parameters() yields a tied (shared) tensor once; so does this set of the head's and embedding's.
    embedding = {p for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None
                 for p in m.parameters()}
    total = sum(p.numel() for p in model.parameters())
    return total, total - sum(p.numel() for p in embedding)


def build_model(spec: ModelSpec, precision: str, device: torch.device, seed: int) -> BuiltModel:
    """Build the policy model on ``device`` (weights created there directly, no CPU copy)."""
    from transformers import AutoModelForCausalLM

    dtype = weight_dtype(spec, precision)
    attn = resolve_attn_implementation(spec.attn_implementation, device, spec)
    arch = model_arch(spec)
    liger = resolve_liger(spec, device, arch)
    if liger:
        apply_liger(spec, arch)
    torch.manual_seed(seed)
    if spec.preset is not None:
        cfg = preset_config(spec.preset)
        cfg._attn_implementation = attn
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=attn)
    else:
        try:
            model = AutoModelForCausalLM.from_pretrained(
                spec.name_or_path, dtype=dtype, attn_implementation=attn,
                trust_remote_code=spec.trust_remote_code,
            )
        except torch.OutOfMemoryError:
            raise
        except (pickle.UnpicklingError, OSError, RuntimeError) as err:  # the weights file: unsafe or damaged
            raise weights_error(spec, err) from None
        model = model.to(device)
    model.config.use_cache = False
    total, non_emb = count_params(model)
    return BuiltModel(model=model, attn_implementation=attn, n_params=total, n_params_non_embedding=non_emb,
                      liger_kernel=liger)


def model_arch(spec: ModelSpec) -> str:
    """``llama``, ``qwen2``, ... (the transformers model_type)."""
    if spec.preset is not None:
        return PRESETS[spec.preset]["arch"]
    from dpo_sweep.models.pretrained import load_config

    return load_config(spec).model_type


def prepare_imports(spec: ModelSpec) -> None:
    """Import what building ``spec``'s model will (transformers' modelling module, liger-kernel on
    CUDA) ahead of the first trial that needs it: a warm worker does this while it waits."""
    _modelling_module(model_arch(spec))
    if torch.cuda.is_available():
        torch.cuda.init()
        if importlib.util.find_spec("liger_kernel") is not None:
            importlib.import_module("liger_kernel.transformers")


def _modelling_module(arch: str) -> Any:
    """transformers' modelling module of a model type (``llama`` -> ``...llama.modeling_llama``)."""
    return importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")


def resolve_liger(spec: ModelSpec, device: torch.device, arch: str | None = None) -> bool:
    """Whether liger-kernel is used (trial_facts.choose_liger, the memory model's rule too); a
    ``true`` that cannot be honoured is a UserError. ``arch``: the model type when the caller has
    it (it costs a config read for a checkpoint)."""
    from dpo_sweep.errors import UserError

    if spec.liger_kernel is False:  # decided without reading a checkpoint's config for its arch
        return False
    used, refusal = trial_facts.choose_liger(spec.liger_kernel, arch or model_arch(spec), device.type == "cuda",
                                             trial_facts.liger_installed())
    if refusal:
        raise UserError(refusal)
    return used


def apply_liger(spec: ModelSpec, arch: str) -> None:
    """Patch liger-kernel's fused RMSNorm and RoPE (and SwiGLU) into the modelling code (GPU only).

    The fused cross-entropy of liger is not used: our chunked log-prob head does that job. With
    ``lean_ops`` on, the MLP stays ours (:mod:`dpo_sweep.train.lean` saves gate and up only;
    liger's SwiGLU also keeps the product for the down projection). The patch replaces classes
    in transformers' modelling modules for the whole process: build models after it.
    """
    from liger_kernel.transformers import apply_liger_kernel_to_llama, apply_liger_kernel_to_qwen2

    module = _modelling_module(arch)
    _UNPATCHED.setdefault(module.__name__, dict(vars(module)))
    patch = apply_liger_kernel_to_qwen2 if arch == "qwen2" else apply_liger_kernel_to_llama
    patch(rope=True, swiglu=not spec.lean_ops, rms_norm=True, cross_entropy=False,
          fused_linear_cross_entropy=False)


#: Modelling module -> its namespace before :func:`apply_liger` patched it.
_UNPATCHED: dict[str, dict[str, object]] = {}


def undo_liger() -> None:
    """Put the modelling modules that :func:`apply_liger` patched back as they were. A process
    that runs trial after trial (a warm worker) calls it after each: the next trial may be one
    without liger, and must build and run the stock modules."""
    for name, namespace in _UNPATCHED.items():
        module = sys.modules[name]
        for key in set(vars(module)) - set(namespace):
            delattr(module, key)
        for key, value in namespace.items():
            setattr(module, key, value)
    _UNPATCHED.clear()


#: Words in the name of a module attribute or config key that holds a dropout probability
#: (``attention_dropout``, ``hidden_dropout``, GPT-2's ``attn_pdrop``, ...).
_DROPOUT_WORDS = ("dropout", "pdrop")


def disable_dropout(model: nn.Module) -> list[tuple[object, str, float]]:
    """Every dropout of ``model`` off, in training mode too (TRL's ``disable_dropout``): each
    ``nn.Dropout``'s p, and the float probabilities attention functions read at call time from
    their module (``self.attention_dropout``) or from the config, set to 0. Returns what it
    changed, ``(owner, attribute, value before)``, for a caller that puts it back."""
    configs = {id(c): c for m in model.modules() if (c := getattr(m, "config", None)) is not None}
    changed: list[tuple[object, str, float]] = []
    for owner in [*model.modules(), *configs.values()]:
        keys = ["p"] if isinstance(owner, nn.Dropout) else [
            key for key in vars(owner) if any(word in key for word in _DROPOUT_WORDS)]
        for key in keys:
            value = getattr(owner, key)
            if isinstance(value, float) and value > 0:
                changed.append((owner, key, value))
                setattr(owner, key, 0.0)
    return changed


def freeze_reference(model: nn.Module) -> nn.Module:
    """Make a model a frozen reference: eval mode (no dropout), no gradients."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model
