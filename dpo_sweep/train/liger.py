"""Whether a model trains with liger-kernel's fused kernels: one decision for the trainer
(train/model.py builds the model with it) and the memory model (plan/memory.py predicts the
tensors it saves), so that the plan never assumes liger where the trainer will not use it.

Standard library only: the sweep's driver plans without importing torch.
"""
from __future__ import annotations

import importlib.util

#: Model types whose modelling code liger-kernel is patched into (train/model.apply_liger).
LIGER_ARCHS = ("llama", "qwen2")


def liger_installed() -> bool:
    """Whether liger-kernel can be imported here (looked up, not imported)."""
    return importlib.util.find_spec("liger_kernel") is not None


def choose_liger(setting: str | bool, arch: str, on_cuda: bool, installed: bool) -> tuple[bool, str]:
    """(used, refusal) for ``model.liger_kernel`` = ``setting`` on a model of type ``arch``.

    ``auto`` uses it for a :data:`LIGER_ARCHS` model on CUDA with liger-kernel installed, and
    otherwise not; ``false`` never; ``true`` wherever it can, and where it cannot ``used`` is False
    and ``refusal`` says why (the trainer raises it as a UserError)."""
    if setting is False:
        return False, ""
    supported = arch in LIGER_ARCHS
    available = on_cuda and installed
    if setting == "auto":
        return supported and available, ""
    if not available:
        return False, ("model.liger_kernel: true needs a CUDA GPU and the liger-kernel package "
                       "(pip install liger-kernel); use auto or false")
    if not supported:
        return False, f"model.liger_kernel: {arch} models are not patched; use auto or false"
    return True, ""
