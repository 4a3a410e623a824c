#!/usr/bin/env bash
# Session 7's first call (two H200s). GPU 0: benchmarks/sweep_ce.py --resident (the resident cross-entropy form:
# each row read once), then `crucible bench` on RoPE and SwiGLU forwards as they stand. GPU 1: `crucible bench` on
# the norms' forwards and backwards as they stand (issue 5's bandwidth targets, before the helpers' variants).
#   bash benchmarks/gpu_session7a.sh      (repo root, .whl carried; about 4 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session7a}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
(CUDA_VISIBLE_DEVICES=0 python3 benchmarks/sweep_ce.py --resident --budget 85 > "$OUT/sweep_ce.log" 2>&1
 CUDA_VISIBLE_DEVICES=0 OUT="$OUT/bench0" bash benchmarks/gpu_bench_tasks.sh \
   "rope_fwd rope eager,compile,liger 70" "swiglu_fwd swiglu eager,compile,liger 70" > "$OUT/gpu0.log" 2>&1) &
CUDA_VISIBLE_DEVICES=1 OUT="$OUT/bench1" bash benchmarks/gpu_bench_tasks.sh \
  "rmsnorm_fwd rmsnorm eager,compile,liger 70" "layernorm_fwd layernorm eager,compile,liger 70" \
  "rmsnorm_bwd rmsnorm_bwd eager,compile,liger 70" "layernorm_bwd layernorm_bwd eager,compile,liger 70" \
  > "$OUT/gpu1.log" 2>&1 &
wait
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" 2>/dev/null
tail -25 "$OUT/sweep_ce.log"; cat "$OUT/gpu0.log" "$OUT/gpu1.log"
