#!/usr/bin/env bash
# Session 6's fourth call (two H200s). GPU 0: the linear + cross-entropy GEMM sweep (sweep_lce.py: epilogue
# subtiles, warp specialisation, TMA stores, dx_split), then `crucible bench` on both attention fwd+bwd tasks with
# the warp-specialised precise forward. GPU 1: `crucible bench` on both MoE layers with pregather + warp
# specialisation, against the per-expert loop and torch._grouped_mm + PyTorch glue. Logs in $OUT.
#   bash benchmarks/gpu_session6d.sh      (repo root, .whl carried; about 7 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session6d}; mkdir -p "$OUT/lce"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
(
  export CUDA_VISIBLE_DEVICES=0
  OUT="$OUT/lce" timeout 140 python3 benchmarks/sweep_lce.py --budget 85 --no-compile
  OUT="$OUT/bench0" bash benchmarks/gpu_bench_tasks.sh "attention_fwd_bwd attention_bwd eager 150" \
    "attention_fwd_bwd_causal attention_bwd eager 150"
) > "$OUT/gpu0.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 OUT="$OUT/bench1" bash benchmarks/gpu_bench_tasks.sh \
  "moe_layer_deepseek moe_layer eager,vendor 170" "moe_layer_mixtral moe_layer eager,vendor 260" \
  > "$OUT/gpu1.log" 2>&1 &
wait
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" 2>/dev/null
cat "$OUT/gpu0.log" "$OUT/gpu1.log"
