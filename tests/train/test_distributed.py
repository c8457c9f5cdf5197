"""Two CPU workers (gloo) give the same losses as one worker with twice the micro-batch."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from testkit import free_port, make_cfg


def _worker(rank: int, world: int, port: int, parallelism: str, grad_acc: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from dpo_sweep.train.loop import run_trial

        cfg = make_cfg(micro_batch=2, grad_acc=grad_acc, steps=3,
                       resources={"use_gpu": False, "workers_per_trial": world, "parallelism": parallelism})
        res = run_trial(cfg, log=None, catch_failures=False)
        out[rank] = [(s.loss, s.grad_norm, s.reward_margin) for s in res.steps]
    finally:
        dist.destroy_process_group()


def run_world(world: int, parallelism: str, grad_acc: int) -> dict:
    with mp.Manager() as m:
        out = m.dict()
        mp.spawn(_worker, args=(world, free_port(), parallelism, grad_acc, out), nprocs=world, join=True)
        return dict(out)


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_two_workers_equal_one_with_twice_the_batch(parallelism):
    from dpo_sweep.train.loop import run_trial

    single = run_trial(make_cfg(micro_batch=4, grad_acc=2, steps=3), log=None)
    want = torch.tensor([(s.loss, s.grad_norm, s.reward_margin) for s in single.steps])
    got = run_world(2, parallelism, grad_acc=2)
    for rank in (0, 1):  # every rank returns the same (all-reduced) metrics
        torch.testing.assert_close(torch.tensor(got[rank]), want, rtol=2e-4, atol=2e-5, msg=f"rank {rank}")
