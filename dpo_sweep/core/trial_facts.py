"""Where a trial runs and with what: its device, attention implementation, liger-kernel and
whether its checkpoint level goes with its attention, each decided by one function here (what a
level recomputes is the level's own: core/levels.py).

The trainer (train/loop.py, train/model.py, train/checkpointing.py), the memory model
(plan/memory.py, plan/rules.py) and the preflight (preflight.py) ask here, each with what its
process sees of the machine: the trainer what torch sees on the worker; the planner, which runs
on the sweep's driver without torch, the GPU the config asks for; the preflight this machine's
GPU. So the plan never assumes a kernel, or a device, that the trainer will not use.

Standard library only: the sweep's driver plans without importing torch.
"""
from __future__ import annotations

import functools
import importlib.util
from typing import TYPE_CHECKING, Literal

from dpo_sweep.refusals import cuda_levers
from dpo_sweep.core.levels import Level
from dpo_sweep.errors import UserError

if TYPE_CHECKING:
    from dpo_sweep.config import ResourcesSpec, TrainSpec, TrialConfig

Device = Literal["cpu", "cuda"]

# --- device -------------------------------------------------------------------------------------


def wants_cpu(train: TrainSpec, resources: ResourcesSpec) -> bool:
    """Whether the config keeps the trial on the CPU (``train.device: cpu`` or ``resources.use_gpu: false``)."""
    return train.device == "cpu" or resources.use_gpu is False


def runs_on_cuda(train: TrainSpec, resources: ResourcesSpec, cuda_available: bool) -> bool:
    """Whether the trial runs on CUDA on a machine where CUDA is (or is not) available."""
    return cuda_available and not wants_cpu(train, resources)


def device_type(train: TrainSpec, resources: ResourcesSpec, cuda_available: bool) -> Device:
    """Where the trainer runs the trial (:func:`runs_on_cuda`). A config that asks for a GPU
    where there is none is a UserError."""
    if not runs_on_cuda(train, resources, cuda_available):
        if train.device == "cuda" or resources.use_gpu is True:
            raise UserError(f"train.device={train.device} / resources.use_gpu={resources.use_gpu} asks for a "
                            "GPU, but CUDA is not available here; set use_gpu: auto")
        return "cpu"
    return "cuda"


def planned_device(cfg: TrialConfig) -> Device:
    """Where the planner assumes ``cfg`` runs: on the GPU its worker is given, unless the config
    keeps it on the CPU (the driver that plans may have no GPU of its own)."""
    return "cpu" if wants_cpu(cfg.train, cfg.resources) else "cuda"


#: ``train.pad_to_multiple_of: auto`` on CUDA: cuDNN attention's plans are per row width.
CUDA_PAD_MULTIPLE = 64


def pad_multiple(train: TrainSpec, device: str) -> int:
    """The multiple a trial on ``device`` pads its rows' width to (``train.pad_to_multiple_of``;
    auto: :data:`CUDA_PAD_MULTIPLE`, at most ``train.max_length``, on CUDA; 1 on the CPU). 1 with
    ``train.padding_free``: packed rows have no padding to round."""
    if train.padding_free:
        return 1
    if train.pad_to_multiple_of != "auto":
        return train.pad_to_multiple_of
    return min(CUDA_PAD_MULTIPLE, train.max_length) if device == "cuda" else 1


def refused_cuda_lever(train: TrainSpec, resources: ResourcesSpec) -> str | None:
    """Why ``train``'s levers are refused with a CPU device; None when they go together."""
    levers = cuda_levers(train)
    if not levers or not wants_cpu(train, resources):
        return None
    where = "train.device: cpu" if train.device == "cpu" else "resources.use_gpu: false"
    return (f"train.{', train.'.join(levers)} is refused with {where}: torchao's NF4 weights and low-bit "
            "AdamW run on a CUDA GPU only; use adapter: lora or full and optimizer: adamw on the CPU, "
            "or run on a GPU")


# --- attention ----------------------------------------------------------------------------------


#: The attention implementations a model can be built with, fastest first (model.attn_implementation).
ATTENTIONS: tuple[str, ...] = ("flash_attention_2", "sdpa", "eager")


def attention(requested: str, device: str, flash_attn: bool, named: str | None = None,
              supported: tuple[str, ...] = ATTENTIONS) -> str:
    """The attention implementation a model is built with; any but ``auto`` as requested.

    ``auto``: the checkpoint's own choice (``named``: its config.json's ``attn_implementation``)
    where it can run here, else the fastest of :data:`ATTENTIONS` that the model ``supported``
    (transformers' ``_supports_flash_attn`` / ``_supports_sdpa``) and that runs here:
    flash_attention_2 on CUDA where flash-attn imports (``flash_attn``), then sdpa, then eager."""
    if requested != "auto":
        return requested

    def runs(impl: str) -> bool:
        return impl in supported and (impl != "flash_attention_2" or (device == "cuda" and flash_attn))

    if named in ATTENTIONS and runs(named):
        return named
    return next((impl for impl in ATTENTIONS if runs(impl)), "eager")


def refused_attention_support(requested: str, supported: tuple[str, ...], model_class: str) -> str | None:
    """Why ``model.attn_implementation: requested`` is refused for a model that supports only
    ``supported``; None when it is supported (or ``auto``, which picks a supported one)."""
    if requested == "auto" or requested in supported:
        return None
    return (f"model.attn_implementation: {requested} is refused: {model_class} does not support it (transformers "
            f"supports {', '.join(supported)} for it); use auto or one of those")


def planned_attention(requested: str) -> str:
    """The attention the memory model sizes: ``auto`` as sdpa, whichever of flash-attn and sdpa the
    worker picks (:func:`attention`): without padding both save the same tensors; with padding
    sdpa saves more (a mask: k/v repeated to every head, a bias per layer), the safe side."""
    return attention(requested, "cpu", flash_attn=False)


# --- liger-kernel -------------------------------------------------------------------------------

#: Model types whose modelling code liger-kernel is patched into (train/model.apply_liger).
LIGER_ARCHS = ("llama", "qwen2")


@functools.cache  # the planner asks once per configuration; the install does not change mid-process
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


def planned_liger(setting: str | bool, arch: str, device: str) -> bool:
    """Whether the memory model counts liger-kernel's savings: :func:`choose_liger`, with this
    process's liger-kernel standing for the workers' under ``auto`` (a driver without it predicts
    without them: the larger, safe side), and assumed under ``true`` (which runs only where the
    package is: elsewhere the trainer refuses the trial)."""
    installed = setting is True or liger_installed()
    return choose_liger(setting, arch, device == "cuda", installed)[0]


# --- checkpoint levels --------------------------------------------------------------------------


#: Attention implementations whose kernel is one torch op, which that policy can keep (``auto``
#: resolves to sdpa or flash_attention_2). eager is a chain of matmul, softmax and dropout ops.
KERNEL_ATTENTION: tuple[str, ...] = ("auto", "sdpa", "flash_attention_2")


def refused_attention(level: str, attn_implementation: str) -> str | None:
    """Why ``level`` is refused with ``attn_implementation``; None when they go together: a level
    whose attention is a region keeps the kernel's outputs, which needs a kernel that is one op."""
    if not Level(level).regions.attention or attn_implementation in KERNEL_ATTENTION:
        return None
    return (
        f"{level} with attn_implementation {attn_implementation} is refused: {attn_implementation} attention "
        f"is separate matmul and softmax ops, which {level}'s selective-checkpoint policy cannot keep, so "
        "backward would silently recompute them; use model.attn_implementation sdpa, flash_attention_2 or "
        "auto, or checkpoint_level L1 or full"
    )


# --- ranks --------------------------------------------------------------------------------------


def ranks_simulated(cfg: TrialConfig) -> bool:
    """Whether ``cfg`` runs as rank 0 alone through the fake process group (train/parallel.py):
    ``resources.simulate_ranks: true`` (``auto`` as the sweep's driver resolved it:
    :func:`resolve_simulation`) on a trial of several workers."""
    return cfg.resources.simulate_ranks is True and cfg.resources.workers_per_trial > 1


def processes(cfg: TrialConfig) -> int:
    """Worker processes (and GPUs) a trial takes: one when its ranks are simulated."""
    return 1 if ranks_simulated(cfg) else cfg.resources.workers_per_trial


def resolve_simulation(cfg: TrialConfig, cluster_gpus: float, use_gpu: bool) -> TrialConfig:
    """``cfg`` with ``simulate_ranks: auto`` decided for this cluster: simulated where the trial
    runs on GPUs and asks for more workers than the cluster has GPUs (on CPUs the workers are
    gloo processes, real at any count)."""
    if cfg.resources.simulate_ranks != "auto":
        return cfg
    simulate = use_gpu and cfg.resources.workers_per_trial > cluster_gpus
    return cfg.model_copy(update={"resources": cfg.resources.model_copy(update={"simulate_ranks": simulate})})
