"""Real CPU workers (gloo), 2 and 4 of them, under DDP and FSDP2 (full shard and ZeRO-2-like): the
same losses and gradient norms as one worker at the same effective batch (fp32). One spawn per
world size runs every parallelism in turn: the processes' start (imports) is most of the cost."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from testkit import free_port, make_cfg

EFFECTIVE_BATCH = 8
PARALLELISMS = {2: ("ddp", "fsdp", "fsdp_grad_op"), 4: ("ddp", "fsdp")}


def _cfg(world: int, parallelism: str = "ddp"):
    micro_batch = 2 if world > 1 else 4
    return make_cfg(micro_batch=micro_batch, grad_acc=EFFECTIVE_BATCH // (micro_batch * world), steps=3,
                    resources={"use_gpu": False, "workers_per_trial": world, "parallelism": parallelism})


def _figures(outcome) -> list[tuple[float, float, float]]:
    return [(s.loss, s.grad_norm, s.reward_margin) for s in outcome.steps]


def _worker(rank: int, world: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # several processes on few cores
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from dpo_sweep.train.loop import run_trial

        for parallelism in PARALLELISMS[world]:
            torch.manual_seed(0)
            res = run_trial(_cfg(world, parallelism), log=None, catch_failures=False)
            out[(parallelism, rank)] = _figures(res)
            out[(parallelism, rank, "simulated")] = res.result.ranks_simulated
    finally:
        dist.destroy_process_group()


def run_world(world: int) -> dict:
    with mp.Manager() as m:
        out = m.dict()
        mp.spawn(_worker, args=(world, free_port(), out), nprocs=world, join=True)
        return dict(out)


@pytest.fixture(scope="module")
def single():
    from dpo_sweep.train.loop import run_trial

    torch.manual_seed(0)
    return torch.tensor(_figures(run_trial(_cfg(1), log=None)))


@pytest.mark.parametrize("world", [2, 4])
def test_workers_equal_one_at_the_same_effective_batch(world, single):
    got = run_world(world)
    for parallelism in PARALLELISMS[world]:
        for rank in range(world):  # every rank returns the same (all-reduced) metrics
            torch.testing.assert_close(torch.tensor(got[(parallelism, rank)]), single, rtol=2e-4, atol=2e-5,
                                       msg=f"{parallelism} rank {rank} of {world}")
            assert got[(parallelism, rank, "simulated")] is False  # real peers: nothing simulated
