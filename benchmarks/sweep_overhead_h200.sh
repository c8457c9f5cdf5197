#!/usr/bin/env bash
# One device call that checks a trial costs its steps, not its start-up, on the H200:
#   1. tests/gpu/test_warm_worker_gpu.py: a warm worker's peaks against fresh processes';
#   2. benchmarks/sweep_overhead.py --model llama-3.2-1b --trials 5 (median wall per trial);
#   3. benchmarks/sweep_overhead.py --space search_spaces/llama-3.2-1b-40gb-quick.yaml (the share of
#      the main job's wall time the GPU trained).
# Usage on the device (carry .devkit): bash benchmarks/sweep_overhead_h200.sh
# Results: $OUT/sweep_overhead_h200.tgz (committed as a folder benchmarks/results/sweep_overhead/<label>/,
# with a README.md of provenance).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -f .devkit/install.sh ] && { timeout 120 bash .devkit/install.sh >/dev/null || echo "devkit install failed"; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
R=${OUT:-/tmp/out}/sweep_overhead_h200
mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$R/gpu.txt" 2>&1
( time timeout 240 python3 -m pytest -q -s -m gpu tests/gpu/test_warm_worker_gpu.py ) > "$R/gpu_test.log" 2>&1
echo "gpu test rc $?"; tail -3 "$R/gpu_test.log"
timeout 200 python3 benchmarks/sweep_overhead.py --model llama-3.2-1b --trials 5 --out "$R" > "$R/bench.log" 2>&1
echo "bench rc $?"; tail -12 "$R/bench.log"
timeout 300 python3 benchmarks/sweep_overhead.py --space search_spaces/llama-3.2-1b-40gb-quick.yaml --out "$R" > "$R/share.log" 2>&1
echo "share rc $?"; tail -6 "$R/share.log"
tar czf "${OUT:-/tmp/out}/sweep_overhead_h200.tgz" -C "$(dirname "$R")" sweep_overhead_h200
