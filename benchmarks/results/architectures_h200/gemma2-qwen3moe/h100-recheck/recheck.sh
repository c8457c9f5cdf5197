#!/bin/bash
# Where does the memory outside torch's allocator live? gemma2-2b mb1/none: one trial in-process, then a one-trial sweep.
bash .devkit/install.sh >/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; R=$OUT/r; mkdir -p $R
python3 - <<'PY'
import sys, dataclasses; sys.path.insert(0, "benchmarks")
from pathlib import Path
import architectures as a
arch = dataclasses.replace(next(x for x in a.ARCHS if x.label == "gemma2-2b"), micro_batch=(1,), levels=("none",))
ck = a.make_checkpoint(arch, Path("/tmp/g/ckpt"))
Path("/tmp/g/space.yaml").write_text(a.space_text(arch, ck, smoke=False))
PY
(while true; do date +%T.%N >> $R/apps.log; nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader >> $R/apps.log; nvidia-smi --query-gpu=memory.used --format=csv,noheader >> $R/apps.log; sleep 0.5; done) &
(sleep 25; ps -eo pid,rss,args | grep -i "python\|ray" | cut -c1-200 > $R/ps_trial.txt) &
echo "=== trial $(date +%T)" >> $R/apps.log
timeout 120 python3 -m dpo_sweep trial /tmp/g/space.yaml --output /tmp/g/trial > $R/trial.log 2>&1; echo trial rc $?
echo "=== sweep $(date +%T)" >> $R/apps.log
(sleep 30; ps -eo pid,rss,args | grep -i "python\|ray" | cut -c1-200 > $R/ps_sweep.txt) &
timeout 150 python3 -m dpo_sweep run /tmp/g/space.yaml --output /tmp/g/sweep --no-dashboard --full-grid > $R/sweep.log 2>&1; echo sweep rc $?
echo "=== end $(date +%T)" >> $R/apps.log
for f in /tmp/g/trial/results.csv /tmp/g/sweep/results.csv; do python3 -c "
import csv,sys
for r in csv.DictReader(open('$f')): print('$f', r['trial_id'], 'nvml', r['peak_mem_gb'], 'reserved', r['torch_peak_reserved_gb'], 'alloc', r['torch_peak_alloc_gb'], 'pred', r['predicted_peak_gb'])
"; done
grep -v "^[0-9:.]*$" $R/apps.log | sort | uniq -c | sort -rn | head -30
