#!/usr/bin/env bash
# Session 6's first call (two H200s). GPU 0: linear + cross-entropy with dx_in_dweight (bench_lce.py, then
# `crucible bench` of the candidate that sets it beside the seed), then the Mixtral-like MoE layer. GPU 1: `crucible
# bench` on the MoE grouped GEMM forward and backward and the DeepSeek-like layer, each against the per-expert loop
# (eager) and the new `vendor` baseline (torch._grouped_mm). Logs in $OUT.
#   bash benchmarks/gpu_session6a.sh      (repo root, .whl carried; about 8 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session6a}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
(
  export CUDA_VISIBLE_DEVICES=0
  OUT="$OUT/lce" timeout 170 python3 benchmarks/bench_lce.py --no-compile
  OUT="$OUT/bench0" bash benchmarks/gpu_bench_tasks.sh "linear_cross_entropy linear_cross_entropy eager,liger 150"
  OUT="$OUT/bench0b" SEEDS=benchmarks/candidates bash benchmarks/gpu_bench_tasks.sh \
    "linear_cross_entropy lce_dx_in_dweight eager,liger 150"
  OUT="$OUT/bench0c" bash benchmarks/gpu_bench_tasks.sh "moe_layer_mixtral moe_layer eager,vendor 170"
) > "$OUT/gpu0.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 OUT="$OUT/bench1" bash benchmarks/gpu_bench_tasks.sh \
  "moe_grouped_gemm moe eager,vendor 150" "moe_grouped_gemm_bwd moe_bwd eager,vendor 170" \
  "moe_layer_deepseek moe_layer eager,vendor 170" > "$OUT/gpu1.log" 2>&1 &
wait
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" 2>/dev/null
cat "$OUT/gpu0.log" "$OUT/gpu1.log"
