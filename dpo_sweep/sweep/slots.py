"""Where a sweep's trials run on the connected Ray cluster: GPU or CPU, how many at once, and the
warm workers that run them (:mod:`~dpo_sweep.sweep.warm_worker`). No Tune here: ``dpo-sweep run``
starts the warm workers as soon as Ray is up, before it imports Tune (:mod:`~dpo_sweep.commands.run`)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import ray

from dpo_sweep import space as space_mod
from dpo_sweep.config import TrialConfig
from dpo_sweep.core import trial_facts
from dpo_sweep.errors import UserError
from dpo_sweep.sweep import warm_worker
from dpo_sweep.sweep.task import Trainer
from dpo_sweep.sweep.trainable import TRIAL_CPUS


def absolute_paths(cfg: TrialConfig) -> TrialConfig:
    """Tune runs each trial in its own working directory: make local data/model paths absolute."""
    updates: dict[str, Any] = {}
    if cfg.data.path and not os.path.isabs(cfg.data.path) and os.path.exists(cfg.data.path):
        updates["data"] = cfg.data.model_copy(update={"path": os.path.abspath(cfg.data.path)})
    name = cfg.model.name_or_path
    if name and not os.path.isabs(name) and os.path.exists(name):
        updates["model"] = cfg.model.model_copy(update={"name_or_path": os.path.abspath(name)})
    return cfg.model_copy(update=updates) if updates else cfg


def resolve_use_gpu(setting: Any, cluster_gpus: float) -> bool:
    if setting == "auto":
        return cluster_gpus > 0
    if setting and cluster_gpus <= 0:
        raise UserError("resources.use_gpu: true, but the Ray cluster has no GPUs; use "
                        "use_gpu: auto or false, or join a GPU cluster with --address")
    return bool(setting)


def default_max_concurrent(use_gpu: bool, cluster_gpus: float, workers_per_trial: int) -> int:
    """All GPUs busy with one trial per ``workers_per_trial`` GPUs; on CPU one trial at a time
    (concurrent CPU trials would share cores and spoil each other's step times)."""
    if not use_gpu:
        return 1
    return max(1, int(cluster_gpus // workers_per_trial))


def check_fits(cfg: TrialConfig, cluster_cpus: float) -> None:
    need = trial_facts.processes(cfg) * cfg.resources.cpus_per_worker + TRIAL_CPUS
    if need > cluster_cpus + 1e-9:
        raise UserError(
            f"resources: a trial needs {need:g} CPUs ({cfg.resources.workers_per_trial} workers x "
            f"cpus_per_worker {cfg.resources.cpus_per_worker:g} + {TRIAL_CPUS:g} for the trial) "
            f"but the Ray cluster has {cluster_cpus:g}; lower resources.cpus_per_worker or "
            "resources.workers_per_trial")


@dataclass(frozen=True)
class TrialSlots:
    """How the sweep's trials run on the connected cluster."""

    use_gpu: bool
    concurrent: int  # trials at a time
    workers: int     # per trial


def trial_slots(sp: space_mod.Space, cluster: Mapping[str, float], max_concurrent: int | None) -> TrialSlots:
    """The trials' device and concurrency on ``cluster`` (``ray.cluster_resources()``); a
    :class:`UserError` when the space asks for what the cluster does not have."""
    cluster_gpus = float(cluster.get("GPU", 0))
    use_gpu = resolve_use_gpu(sp.spec.resources.use_gpu, cluster_gpus)
    check_fits(sp.trials[0], float(cluster.get("CPU", 0)))  # every trial has the space's resources
    workers = sp.spec.resources.workers_per_trial
    return TrialSlots(use_gpu, max_concurrent or default_max_concurrent(use_gpu, cluster_gpus, workers), workers)


def start_warm_workers(trials: Sequence[TrialConfig], slots: TrialSlots,
                       trainer: Trainer | None = None) -> warm_worker.WarmPool | None:
    """The sweep's warm workers (:mod:`~dpo_sweep.sweep.warm_worker`), one per concurrent trial,
    when its trials run in them; they start importing now. Only on a connected cluster: a Ray call
    here would start a Ray of its own otherwise."""
    if not (warm_worker.wanted(trials[0]) and ray.is_initialized()):
        return None
    name = f"dpo-sweep-workers-{os.getpid()}-{time.time_ns()}"
    return warm_worker.start_pool(name, slots.concurrent, trials, slots.use_gpu, trainer)
