#!/bin/bash
# As run (call 2), from the repository root with .devkit/ (the device kit) beside it: .devrun/trace/ was
# the tracer now in benchmarks/process_trace/ (its merge.py then counted from the command module's import);
# .devrun/base-a9dacff.tgz was `git archive a9dacff dpo_sweep benchmarks search_spaces | gzip`.
# Session 6, call 2 (issue 14): the 40gb-quick main job, a9dacff (the session's start) against the
# working tree, alternating in one call, each traced per process; then the warm-worker GPU peaks test.
set -u
R=$PWD
bash .devkit/install.sh >/dev/null || exit 1
export PYTHONUNBUFFERED=1
python3 -m compileall -q -j 16 /tmp/site > /dev/null
mkdir -p /tmp/base && tar xzf .devrun/base-a9dacff.tgz -C /tmp/base
PYTHONPATH=/tmp/site:$R timeout 60 python3 -c "import torch, transformers, ray.tune; from transformers.models.llama import modeling_llama" > /dev/null 2>&1
for run in base1 new1 base2 new2; do
  case $run in base*) D=/tmp/base ;; *) D=$R ;; esac
  mkdir -p $OUT/$run
  (cd $D && DPO_TRACE_DIR=$OUT/$run/trace PYTHONPATH=$R/.devrun/trace:/tmp/site:$D \
    timeout --kill-after=5 110 python3 benchmarks/sweep_overhead.py --space search_spaces/llama-3.2-1b-40gb-quick.yaml --out $OUT/$run/share > $OUT/$run/bench.log 2>&1; echo "rc=$?" >> $OUT/$run/bench.log)
  python3 .devrun/trace/merge.py $OUT/$run/trace > $OUT/$run/timeline.txt 2>&1
  rm -rf $OUT/$run/trace
  grep -A3 "^| wall_s" $OUT/$run/bench.log | head -3
done
(cd $OUT && tar czf sweeps.tgz base1 new1 base2 new2 && rm -rf base1 new1 base2 new2)
( time PYTHONPATH=/tmp/site:$R timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_warm_worker_gpu.py ) > $OUT/gpu_test.log 2>&1
tail -3 $OUT/gpu_test.log
ls $OUT
