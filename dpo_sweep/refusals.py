"""Settings refused in combination, each with the fix in its message, and what the levers need
to run: a CUDA GPU (torchao's NF4 weights and low-bit AdamW) and the packages the preflight
names. Read at validation (space.py) and by the preflight; the sections themselves are in
:mod:`dpo_sweep.config`."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dpo_sweep.config import DataSpec, ObjectivesSpec, ResourcesSpec, TrainSpec


#: (field, value) of the levers that run only on a CUDA GPU: torchao's NF4 base weights and its
#: low-bit AdamW (torchao.optim.AdamW8bit / AdamW4bit).
CUDA_LEVERS: tuple[tuple[str, str], ...] = (("adapter", "qlora"), ("optimizer", "adamw_8bit"),
                                            ("optimizer", "adamw_4bit"))
#: The packages each lever needs (what the preflight names in its pip install), by (field, value).
LEVER_PACKAGES: dict[tuple[str, str], tuple[str, ...]] = {
    ("adapter", "lora"): ("peft",), ("adapter", "qlora"): ("peft", "torchao"),
    ("optimizer", "adamw_8bit"): ("torchao",), ("optimizer", "adamw_4bit"): ("torchao",),
}


def refused_adaptive_clip(train: TrainSpec, resources: ResourcesSpec) -> str | None:
    """Why ``train.adaptive_clip`` is refused with these resources; None when they go together."""
    if not (train.adaptive_clip and resources.parallelism == "fsdp" and resources.workers_per_trial > 1):
        return None
    return ("train.adaptive_clip: true with resources.parallelism: fsdp is refused: each worker holds a "
            "shard of every parameter, so a per-parameter gradient norm would be a shard's; use "
            "parallelism: ddp, one worker, or adaptive_clip: false")


def refused_optimizer_in_backward(train: TrainSpec, grad_acc: int, resources: ResourcesSpec) -> str | None:
    """Why ``train.optimizer_in_backward`` is refused here; None when it is off or goes together."""
    if not train.optimizer_in_backward:
        return None
    conflicts = [what for what, bad in (
        (f"grad_acc {grad_acc} (each micro-step's gradients would be stepped on alone)", grad_acc > 1),
        ("train.grad_acc_schedule: seed (it accumulates)", train.grad_acc_schedule != "constant"),
        (f"train.max_grad_norm {train.max_grad_norm} (a global clip needs every gradient at once)",
         train.max_grad_norm is not None),
        ("train.adaptive_clip (it clips before the step)", train.adaptive_clip),
        ("train.precision: fp16 (the loss scaler unscales every gradient before the step)",
         train.precision == "fp16"),
        (f"resources.workers_per_trial {resources.workers_per_trial} (the gradients are all-reduced "
         "after backward)", resources.workers_per_trial > 1)) if bad]
    if not conflicts:
        return None
    return (f"train.optimizer_in_backward: true is refused with {'; '.join(conflicts)}; use grad_acc 1, "
            "max_grad_norm: null, adaptive_clip: false, a precision other than fp16 and one worker, or "
            "optimizer_in_backward: false")


def cuda_levers(train: TrainSpec) -> list[str]:
    """``field: value`` of each of ``train``'s levers that needs a CUDA GPU (CUDA_LEVERS)."""
    return [f"{field}: {getattr(train, field)}" for field, value in CUDA_LEVERS
            if getattr(train, field) == value]


def refused_held_out(data: DataSpec, objectives: ObjectivesSpec, search: dict | None) -> str | None:
    """Why a held-out objective or ``search.scheduler`` is refused (a bad scheduler, or no
    ``data.eval_pairs`` for them to score); None when they can run."""
    from pydantic import ValidationError

    from dpo_sweep.sections import SCHEDULER_KEY, scheduler_of

    try:
        scheduler_of(search)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"search.scheduler{'.' + where if where else ''}: {first['msg']}"
    if data.eval_pairs is not None:
        return None
    wants = [f"objectives.{n}" for n in objectives.held_out()]
    if (search or {}).get(SCHEDULER_KEY) is not None:
        wants.append("search.scheduler")
    if not wants:
        return None
    return (f"{', '.join(wants)} score(s) the held-out split, and this space has none; set data.eval_pairs "
            "(a count, e.g. 64, or a share, e.g. 0.1) or drop them")
