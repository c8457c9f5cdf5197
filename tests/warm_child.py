"""Run trials one after another in one warm TrialWorker; print each one's peaks as JSON.

    python tests/warm_child.py '[{"preset": "qwen2-7b", "micro_batch": 1, "level": "none"}, ...]'

Each spec may also give ``length`` (tokens per sequence, default 512) and ``device`` (``cuda``,
the default: bf16; ``cpu``: fp32). Used by tests/gpu/test_warm_worker_gpu.py and
tests/sweep/test_warm_worker.py: a fresh process per trial against one process for all of them,
each in a process of its own so that nothing else a test session holds counts in the peaks.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # testkit

from dpo_sweep.sweep.protocol import OutcomeReport  # noqa: E402
from dpo_sweep.sweep.task import TrialTask  # noqa: E402
from dpo_sweep.sweep.warm_worker import TrialWorker  # noqa: E402
from testkit import make_cfg  # noqa: E402


def trial_cfg(spec: dict):
    length = spec.get("length", 512)
    half = length // 2 - 1  # prompt + response + bos/eos fill the length
    gpu = spec.get("device", "cuda") == "cuda"
    return make_cfg(resources={"use_gpu": gpu}, model={"preset": spec["preset"]},
                    data={"synthetic": {"pairs": 64, "prompt_tokens": half, "response_tokens": half}},
                    micro_batch=spec["micro_batch"], checkpoint_level=spec["level"],
                    device="cuda" if gpu else "cpu", precision="bf16" if gpu else "fp32",
                    max_length=length, steps=3, warmup_steps=1, lr=5e-6)


def main() -> None:
    worker = TrialWorker()
    out = []
    for spec in json.loads(sys.argv[1]):
        items = list(worker.run(TrialTask(trial_cfg(spec), trial_start=time.time())))
        row = [o for i in items if isinstance(i, dict) and (o := OutcomeReport.from_report(i))][0].result
        out.append({"status": row.status, "error": row.error, "torch_peak_alloc_gb": row.torch_peak_alloc_gb,
                    "peak_mem_gb": row.peak_mem_gb, "mem_source": row.mem_source})
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
