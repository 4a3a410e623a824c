#!/usr/bin/env bash
# Session 7: `crucible bench` on the causal attention fwd+bwd with its new backward tiles (one H200). Logs in $OUT.
#   bash benchmarks/gpu_session7i.sh      (repo root, .whl carried; about 1 minute)
set -uo pipefail
OUT=${OUT:-runs/gpu-session7i}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT="$OUT/bench0" bash benchmarks/gpu_bench_tasks.sh \
  "attention_fwd_bwd_causal attention_bwd eager 120" > "$OUT/gpu0.log" 2>&1
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" 2>/dev/null
cat "$OUT/gpu0.log"
