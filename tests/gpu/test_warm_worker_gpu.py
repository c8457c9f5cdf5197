"""A warm worker's trial on a GPU reports a fresh process's peaks, also after a bigger model ran
in the same process before it: torch's peak allocation equal, NVML's within 1% or
0.3 GB (the CUDA context grows with the kernels earlier trials loaded). Each side runs in its
own child process, so that nothing this test session allocated counts in NVML's device-wide
number. CPU version: tests/sweep/test_warm_worker.py.

Run: python3 -m pytest tests/gpu/test_warm_worker_gpu.py   (skipped without CUDA; ~2 min on an H200)
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CHILD = Path(__file__).resolve().parents[1] / "warm_child.py"
SMALL = [{"preset": "llama-3.2-1b", "micro_batch": 2, "level": "none"},
         {"preset": "llama-3.2-1b", "micro_batch": 2, "level": "full"}]
BIGGER = {"preset": "qwen2-7b", "micro_batch": 1, "level": "none"}


def _run(specs: list[dict]) -> list[dict]:
    proc = subprocess.run([sys.executable, str(CHILD), json.dumps(specs)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    rows = json.loads(line[len("RESULT "):])
    assert all(r["status"] == "ok" for r in rows), rows
    return rows


def test_warm_trials_after_a_bigger_model_report_fresh_process_peaks():
    fresh = [_run([spec])[0] for spec in SMALL]
    warm = _run([BIGGER, *SMALL])
    assert warm[0]["torch_peak_alloc_gb"] > 2 * fresh[0]["torch_peak_alloc_gb"]  # it was bigger
    for f, w in zip(fresh, warm[1:]):
        print(f"fresh {f}\nwarm  {w}")
        assert w["mem_source"] == f["mem_source"] == "nvml"
        assert w["torch_peak_alloc_gb"] == pytest.approx(f["torch_peak_alloc_gb"], abs=0.001)
        assert abs(w["peak_mem_gb"] - f["peak_mem_gb"]) <= max(0.01 * f["peak_mem_gb"], 0.3)
