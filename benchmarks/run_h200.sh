#!/usr/bin/env bash
# One device call: our trainer on the H200 configurations, then TRL's DPOTrainer on the six it was
# measured on, in one fixed wall-clock budget; stops by itself.
#
#   bash benchmarks/run_h200.sh          (on the device; carry .devkit; results land in $OUT)
#
# Budget (seconds, env overrides): H200_TOTAL_S=520 for everything after this script starts;
# H200_TRL_S=190 of it is kept for TRL (the trainer stops *starting* configs when its share is
# spent; each child runs under `timeout`, capped by what is left). TRL gets whatever is left.
# Filters: H200_TRAINER_CONFIGS / H200_TRL_CONFIGS (comma-separated names; default all, in
# priority order), H200_SKIP_TRL=1, H200_SCALE=tiny (plumbing test on any machine),
# H200_RESULTS_DIR (default benchmarks/results/trainer_h200/new).
# Outputs (also under that folder): trainer_h200.csv, trainer_h200.md, trl_h200.csv,
# trainer_h200.run.json, trl_h200.run.json, h200_logs.tar.gz (each child's log) -> "$OUT".
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
T0=$(date +%s)
TOTAL_S=${H200_TOTAL_S:-520}
TRL_S=${H200_TRL_S:-190}
SCALE=${H200_SCALE:-h200}
RES=${H200_RESULTS_DIR:-benchmarks/results/trainer_h200/new}
LOGS=$(mktemp -d /tmp/h200_logs.XXXXXX)
OUT_DIR=${OUT:-$RES/out}
mkdir -p "$RES" "$OUT_DIR"
elapsed() { echo $(( $(date +%s) - T0 )); }
minutes() { awk -v s="$1" 'BEGIN { m = s / 60; if (m < 0) m = 0; printf "%.2f", m }'; }

if [ -f .devkit/install.sh ]; then
  timeout 120 bash .devkit/install.sh || echo "run_h200: devkit install failed (TRL and liger rows will fail)"
else
  echo "run_h200: no .devkit here (carry it): TRL and liger rows will fail"
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export H200_ENTRY="bash benchmarks/run_h200.sh (H200_TOTAL_S=$TOTAL_S H200_TRL_S=$TRL_S H200_SCALE=$SCALE)"
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>/dev/null || true

TRAINER_ARGS=(--preset-scale "$SCALE" --logs-dir "$LOGS/trainer" --out-dir "$RES")
[ -n "${H200_TRAINER_CONFIGS:-}" ] && TRAINER_ARGS+=(--configs "$H200_TRAINER_CONFIGS")
TRAINER_BUDGET=$(( TOTAL_S - TRL_S - $(elapsed) ))
[ "${H200_SKIP_TRL:-0}" = 1 ] && TRAINER_BUDGET=$(( TOTAL_S - $(elapsed) ))
echo "=== trainer_h200.py: $(minutes "$TRAINER_BUDGET") min budget ($(elapsed) s elapsed)"
python3 benchmarks/trainer_h200.py --max-minutes "$(minutes "$TRAINER_BUDGET")" "${TRAINER_ARGS[@]}"

if [ "${H200_SKIP_TRL:-0}" != 1 ]; then
  TRL_BUDGET=$(( TOTAL_S - $(elapsed) ))
  TRL_ARGS=(--preset-scale "$SCALE" --logs-dir "$LOGS/trl" --out-dir "$RES")
  [ -n "${H200_TRL_CONFIGS:-}" ] && TRL_ARGS+=(--configs "$H200_TRL_CONFIGS")
  echo "=== trl_dpo_h200.py: $(minutes "$TRL_BUDGET") min budget ($(elapsed) s elapsed)"
  python3 benchmarks/trl_dpo_h200.py --max-minutes "$(minutes "$TRL_BUDGET")" "${TRL_ARGS[@]}"
fi

python3 benchmarks/trainer_h200.py --out-dir "$RES" --render-only >/dev/null
tar -czf "$RES/h200_logs.tar.gz" -C "$LOGS" . 2>/dev/null || true
rm -rf "$LOGS"
for f in trainer_h200.csv trainer_h200.md trl_h200.csv trainer_h200.run.json trl_h200.run.json h200_logs.tar.gz; do
  [ -f "$RES/$f" ] && cp "$RES/$f" "$OUT_DIR/"
done
echo "=== summary ($(elapsed) s total; full table: $OUT_DIR/trainer_h200.md)"
python3 benchmarks/trainer_h200.py --out-dir "$RES" --summary
