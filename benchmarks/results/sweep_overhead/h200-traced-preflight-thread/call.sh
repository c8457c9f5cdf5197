#!/bin/bash
# As run (call 1), from the repository root with .devkit/ (the device kit) beside it: .devrun/trace/ was
# the tracer now in benchmarks/process_trace/ (its merge.py then counted from the command module's import);
# .devrun/base-a9dacff.tgz was `git archive a9dacff dpo_sweep benchmarks search_spaces | gzip`.
# Session 6, call 1 (issue 14): where the 40gb-quick main job's wall time goes, traced per process.
set -u
bash .devkit/install.sh >/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
( time python3 -m compileall -q -j 16 /tmp/site > /dev/null ) 2> $OUT/compileall.txt
timeout 60 python3 -c "import torch, transformers, ray.tune; from transformers.models.llama import modeling_llama" > /dev/null 2>&1
mkdir -p $OUT/base
DPO_TRACE_DIR=$OUT/base/trace PYTHONPATH=$PWD/.devrun/trace:$PYTHONPATH \
  timeout --kill-after=5 120 python3 benchmarks/sweep_overhead.py --space search_spaces/llama-3.2-1b-40gb-quick.yaml --out $OUT/base/share > $OUT/base.log 2>&1
echo "rc=$?" >> $OUT/base.log
python3 .devrun/trace/merge.py $OUT/base/trace > $OUT/base/timeline.txt 2>&1
(cd $OUT && tar czf base.tgz base && rm -rf base)
ls $OUT
