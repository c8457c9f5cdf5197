"""A ``TorchConfig`` for Ray Train whose controller side never imports torch.

Why: every trial starts a fresh Ray Train controller process, and that process unpickles the
trainer's backend config. Ray's own ``TorchConfig`` lives in ``ray.train.torch.config``, which
imports torch at the top, which costs seconds and sits on the path of every trial's start-up (the
controller exists before any worker does);
benchmarks/results/sweep_overhead/cpu-reused-trial-processes/README.md has the start-up measured
before and after this module. Only the workers need torch.

So this module imports Ray alone. :class:`LazyTorchConfig` has ``TorchConfig``'s fields and is
passed to ``TorchTrainer(torch_config=...)``; its backend does what Ray's ``_TorchBackend`` does for
a process group on GPUs (nccl) or CPUs (gloo) - rendezvous address from rank 0, ``MASTER_ADDR`` /
``MASTER_PORT``, the torch distributed env vars, one ``init_process_group`` per worker, the
``timeout_s``-bounded shutdown - by running Ray's own worker-side functions, imported on the
worker where torch is loaded anyway. TPU set-up is not carried over (dpo-sweep runs on GPUs or CPUs).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import ray
from ray._private import ray_constants
from ray.exceptions import GetTimeoutError
from ray.train.backend import Backend, BackendConfig
from ray.train.constants import (  # torch-free module
    DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
    TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
)

logger = logging.getLogger(__name__)


def _on_worker(function: str, **kwargs: Any) -> Any:
    """Runs on a training worker: call ``ray.train.torch.config.<function>`` (torch is imported
    there, in the worker, not in the controller that sends this)."""
    from ray.train.torch import config as torch_config

    return getattr(torch_config, function)(**kwargs)


def _rendezvous_address() -> tuple[str, int]:
    from ray.train._internal.utils import get_address_and_port

    return get_address_and_port()


def _set_master(addr: str, port: int) -> None:
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)


class _TorchFuncContext:
    """``TorchConfig.train_func_context``: each worker's training thread on its own CUDA device."""

    def __enter__(self) -> None:
        from ray.train.torch.config import TorchConfigContextManager

        self._inner = TorchConfigContextManager()
        self._inner.__enter__()

    def __exit__(self, *exc: Any) -> bool:
        return bool(self._inner.__exit__(*exc))


class _LazyTorchBackend(Backend):
    share_cuda_visible_devices: bool = True  # as Ray's torch backend: NCCL needs to see peer GPUs

    def on_start(self, worker_group: Any, backend_config: "LazyTorchConfig") -> None:
        backend = backend_config.backend
        if backend is None:  # TorchTrainer fills it in; kept for direct use
            backend = "nccl" if worker_group.get_resources_per_worker().get("GPU", 0) > 0 else "gloo"
        if backend_config.init_method != "env":
            raise ValueError(f"init_method {backend_config.init_method!r}: only 'env' is supported")
        addr, port = worker_group.execute_single(0, _rendezvous_address)
        worker_group.execute(_set_master, addr=addr, port=port)
        worker_group.execute(_on_worker, "_set_torch_distributed_env_vars")
        ray.get([worker_group.execute_single_async(
            rank, _on_worker, "_setup_torch_process_group", backend=backend, world_rank=rank,
            world_size=len(worker_group), init_method="env://", timeout_s=backend_config.timeout_s)
            for rank in range(len(worker_group))])

    def on_shutdown(self, worker_group: Any, backend_config: "LazyTorchConfig") -> None:
        futures = worker_group.execute_async(_on_worker, "_shutdown_torch",
                                             destroy_process_group=len(worker_group) > 1)
        # The same bound (and environment variable) as Ray's torch backend.
        timeout_s = ray_constants.env_integer(TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
                                              DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S)
        try:
            ray.get(futures, timeout=timeout_s)
        except GetTimeoutError:
            # A worker stuck in a collective (its peer died): Ray kills the actors next.
            logger.warning(f"Torch process group shutdown timed out after {timeout_s} seconds")


@dataclass
class LazyTorchConfig(BackendConfig):
    """``ray.train.torch.TorchConfig``'s fields (backend ``None`` = nccl on GPUs, gloo on CPUs)."""

    backend: str | None = None
    init_method: str = "env"
    timeout_s: int = 1800

    @property
    def backend_cls(self) -> type[Backend]:
        return _LazyTorchBackend

    @property
    def train_func_context(self) -> type[_TorchFuncContext]:
        return _TorchFuncContext

    @property
    def framework(self) -> Any:
        from ray.train.v2._internal.util import TrainingFramework  # torch-free

        return TrainingFramework.TORCH

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "init_method": self.init_method, "timeout_s": self.timeout_s}
