"""Realistic failure rows for the report tests: a CUDA OOM as the trainer records it (one long
first line, then the traceback), and a sweep in which every trial ran out of memory."""
from __future__ import annotations

from typing import TYPE_CHECKING

from sweep_frames import trial

if TYPE_CHECKING:
    from dpo_sweep.records import TrialResult

CUDA_OOM = (
    "rank 0: CUDA out of memory. Tried to allocate 128.00 MiB. GPU 0 has a total capacity of 139.80 GiB "
    "of which 101.92 GiB is free. Including non-PyTorch memory, this process has 37.88 GiB memory in use. "
    "37.25 GiB allowed; Of the allocated memory 37.09 GiB is allocated by PyTorch, and 40.73 MiB is "
    "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation. See documentation for "
    "Memory Management (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage)\n"
    "Traceback (most recent call last):\n"
    '  File "/work/dpo_sweep/train/loop.py", line 212, in run_trial\n'
    "    loss.backward()\n"
    '  File "/usr/lib/python3/dist-packages/torch/_tensor.py", line 581, in backward\n'
    "    torch.autograd.backward(\n"
    "torch.OutOfMemoryError: CUDA out of memory."
)


def space_id(index: int, mb: int, level: str, ga: int, beta: float = 0.1) -> str:
    """A trial id in the shape space.expand gives them."""
    return f"t{index:03d}_mb{mb}_{level}_ga{ga}_b{beta:g}"


def llama_sweep() -> list[TrialResult]:
    """Five completed trials and one OOM, with the ids, model name and error of a real GPU sweep."""
    model = "meta-llama/Llama-3.2-1B-Instruct"
    out = [trial(space_id(i, mb, level, 16 // mb), mem, time_ms, std, mb=mb, level=level, ga=16 // mb,
                 model=model)
           for i, (mb, level, mem, time_ms, std) in enumerate((
               (4, "none", 23.89, 647.9, 0.0227), (4, "full", 16.64, 792.1, 0.0253),
               (8, "none", 31.78, 620.5, 0.0164), (8, "full", 17.27, 730.9, 0.0089),
               (16, "full", 17.37, 720.4, 0.0005)))]
    out.append(trial(space_id(5, 16, "none", 1), status="oom", mb=16, level="none", ga=1, model=model,
                     error=CUDA_OOM))
    return out


def all_oom_sweep() -> list[TrialResult]:
    """A sweep in which nothing completed."""
    return [trial(space_id(i, 2 ** i, "none", 1), status="oom", mb=2 ** i, level="none", error=CUDA_OOM)
            for i in range(3)]
