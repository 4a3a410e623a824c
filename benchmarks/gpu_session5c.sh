#!/usr/bin/env bash
# Session 5's last call (two H200s): the causal attention fwd+bwd task again after the harness's memory fixes
# (the parent drops the smoke stage's float64 truth before timing; the output reserve takes at most a quarter of
# the free memory), cross-entropy with sub=2, and the MoE grouped GEMM's new default beside run M's under
# `crucible bench`'s sustained timer. Logs in $OUT.
#   bash benchmarks/gpu_session5c.sh      (repo root, .whl carried; about 5 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session5c}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
CUDA_VISIBLE_DEVICES=0 OUT="$OUT/bench0" bash benchmarks/gpu_bench_tasks.sh \
  "attention_fwd_bwd_causal attention_bwd eager 110" "cross_entropy cross_entropy eager,compile,liger 80" \
  > "$OUT/gpu0.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 OUT="$OUT/bench1" bash benchmarks/gpu_bench_tasks.sh "moe_grouped_gemm moe eager 150" \
  > "$OUT/gpu1.log" 2>&1 &
wait
CUDA_VISIBLE_DEVICES=1 OUT="$OUT/bench1b" SEEDS=benchmarks/candidates bash benchmarks/gpu_bench_tasks.sh \
  "moe_grouped_gemm moe_grouped_flat3 eager 150" >> "$OUT/gpu1.log" 2>&1
cat "$OUT/gpu0.log" "$OUT/gpu1.log"
