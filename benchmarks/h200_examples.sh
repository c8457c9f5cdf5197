#!/usr/bin/env bash
# The committed example sweeps (reports/examples/) in one device call: each named space through `dpo-sweep run`, its
# results folder packed into one file (a device call brings back at most 8 files).
#
#   bash benchmarks/h200_examples.sh NAME [NAME...]     (on the device; carry .devkit)
#   OUT=/tmp/x bash benchmarks/h200_examples.sh quickstart   (CPU: the plumbing, ~3 min)
#
# For each NAME (a file search_spaces/NAME.yaml):
#   - runs `python3 -m dpo_sweep run search_spaces/NAME.yaml --output $OUT/NAME-h200 --no-dashboard FLAGS` under
#     `timeout`, FLAGS being what the space's own `# Run the sweep:` header line puts after its
#     path (e.g. --full-grid), so the sweep is run as the space file documents it;
#   - writes $OUT/NAME-h200/command.txt: the exact command, its exit status and wall time;
#   - makes sure environment.json and report.html are there: the sweep writes both; after a
#     timeout or a crash `dpo-sweep report` makes the report from the rows already written and
#     environment.json is this machine's;
#   - packs the folder into $OUT/NAME-h200.tgz (it unpacks as NAME-h200/, for
#     reports/examples/) and removes the folder, so only the .tgz files come back.
# Budget (seconds, env overrides): H200_TOTAL_S=570 for everything from this script's start (a
# device command may run 10 minutes); each sweep's timeout is what is left less H200_RESERVE_S=30
# (the report, the tar), capped at H200_SPACE_S=540; a space is skipped when under 60 s would be left.
# PYTHON (default python3) runs dpo_sweep from this checkout.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
T0=$(date +%s)
TOTAL_S=${H200_TOTAL_S:-570}
RESERVE_S=${H200_RESERVE_S:-30}
SPACE_S=${H200_SPACE_S:-540}
PY=${PYTHON:-python3}
OUT_DIR=${OUT:?set OUT to the folder the results go to}
[ $# -ge 1 ] || { echo "usage: bash benchmarks/h200_examples.sh NAME [NAME...] (search_spaces/NAME.yaml)" >&2; exit 2; }
for name in "$@"; do
  [ -f "search_spaces/$name.yaml" ] || { echo "h200_examples: no search_spaces/$name.yaml" >&2; exit 2; }
done
mkdir -p "$OUT_DIR"
if [ -f .devkit/install.sh ]; then
  timeout 120 bash .devkit/install.sh >/dev/null || echo "h200_examples: devkit install failed"
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true

# The flags after the space's path on its "# Run the sweep:" header line (none when it has none).
run_flags() {
  sed -n "s|^# Run the sweep: *dpo-sweep run search_spaces/$1\.yaml||p" "search_spaces/$1.yaml" | head -n 1
}

summary=()
for name in "$@"; do
  dir="$OUT_DIR/$name-h200"
  left=$(( TOTAL_S - ($(date +%s) - T0) - RESERVE_S ))
  limit=$(( left < SPACE_S ? left : SPACE_S ))
  if [ "$limit" -lt 60 ]; then
    summary+=("$name: skipped (${left} s left of H200_TOTAL_S=$TOTAL_S)")
    continue
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  # shellcheck disable=SC2206  # the header's flags are words (e.g. --full-grid)
  cmd=("$PY" -m dpo_sweep run "search_spaces/$name.yaml" --output "$dir" --no-dashboard $(run_flags "$name"))
  echo "=== $name: ${cmd[*]} (timeout ${limit} s)"
  start=$(date +%s)
  timeout --kill-after=15 "$limit" "${cmd[@]}" 2>&1 | tee "$dir/console.log"
  rc=${PIPESTATUS[0]}
  wall=$(( $(date +%s) - start ))
  if [ ! -f "$dir/environment.json" ]; then
    "$PY" -c "import sys; from dpo_sweep.telemetry import write_environment; write_environment(sys.argv[1])" "$dir" \
      || echo "h200_examples: environment.json not written"
  fi
  if [ ! -f "$dir/report.html" ] && [ -f "$dir/results.csv" ]; then
    "$PY" -m dpo_sweep report "$dir" || echo "h200_examples: report of the rows written failed"
  fi
  {
    echo "command: timeout --kill-after=15 $limit ${cmd[*]}"
    echo "exit status: $rc$( [ "$rc" = 124 ] || [ "$rc" = 137 ] && echo " (stopped at the timeout)")"
    echo "wall time: $wall s"
    echo "started: $(date -u -d "@$start" +%Y-%m-%dT%H:%M:%SZ)"
    echo "git commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  } > "$dir/command.txt"
  # ray/ holds only Ray Train's empty storage markers
  tar -czf "$OUT_DIR/$name-h200.tgz" --exclude="$name-h200/ray" -C "$OUT_DIR" "$name-h200" && rm -rf "$dir"
  have=$(tar -tzf "$OUT_DIR/$name-h200.tgz" 2>/dev/null | grep -cE '/(environment\.json|report\.html|command\.txt)$')
  summary+=("$name: exit $rc, ${wall} s, $have/3 of command.txt, environment.json, report.html -> $OUT_DIR/$name-h200.tgz")
done
echo "=== summary ($(( $(date +%s) - T0 )) s in all)"
printf '%s\n' "${summary[@]}"
