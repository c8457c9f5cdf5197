#!/bin/bash
# Call 4 (issue 14): the start-up order A/B on one machine: the 40gb-quick main job with the
# preflight beside Ray's start (551afb2), then with the preflight after Ray (the order of 75aded7).
set -u
bash .devkit/install.sh >/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 40 python3 -c "import torch, transformers, ray.tune; from transformers.models.llama import modeling_llama" > /dev/null 2>&1
for v in overlap sequential; do
  # the call copied the patched file from .devrun/; the same change: command_sequential.diff beside this file
  [ $v = sequential ] && patch -p0 dpo_sweep/sweep/command.py < benchmarks/results/sweep_overhead/h200-ab-preflight-beside-or-after-ray/command_sequential.diff
  timeout --kill-after=5 85 python3 benchmarks/sweep_overhead.py --space search_spaces/llama-3.2-1b-40gb-quick.yaml --out $OUT/$v/share > $OUT/$v.log 2>&1
  echo "rc=$?" >> $OUT/$v.log
  (cd $OUT && tar czf $v.tgz $v && rm -rf $v)
done
git checkout dpo_sweep/sweep/command.py 2>/dev/null
ls $OUT
