#!/usr/bin/env bash
# Session 6's last call (two H200s). GPU 0: `crucible bench` on causal attention fwd+bwd (run AD ran out of memory:
# the parent held the float64 truth it computed for the output size), then linear + cross-entropy with its new GPU
# options (epilogue subtiles, dx_in_dweight + dx_split). GPU 1: both MoE layers with pregather as a Triton kernel
# (run AD rejected the torch gather: candidates may not compute with torch). Logs in $OUT.
#   bash benchmarks/gpu_session6e.sh      (repo root, .whl carried; about 6 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session6e}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
CUDA_VISIBLE_DEVICES=0 OUT="$OUT/bench0" bash benchmarks/gpu_bench_tasks.sh \
  "attention_fwd_bwd_causal attention_bwd eager 110" "linear_cross_entropy linear_cross_entropy eager,liger 220" \
  > "$OUT/gpu0.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 OUT="$OUT/bench1" bash benchmarks/gpu_bench_tasks.sh \
  "moe_layer_deepseek moe_layer eager,vendor 140" "moe_layer_mixtral moe_layer eager,vendor 225" \
  > "$OUT/gpu1.log" 2>&1 &
wait
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" 2>/dev/null
cat "$OUT/gpu0.log" "$OUT/gpu1.log"
