#!/usr/bin/env bash
# Session 7's third call (two H200s). GPU 0: benchmarks/sweep_attention_fwd.py (the overlap / pairs variants), then
# `crucible bench` on the RMSNorm and LayerNorm backwards with their new prefetch default. GPU 1:
# benchmarks/sweep_fwd_rows.py (RMSNorm / LayerNorm / RoPE forward row variants), then `crucible bench` on the SwiGLU
# forward with its new lean 1024 default. Logs in $OUT.
#   bash benchmarks/gpu_session7c.sh      (repo root, .whl carried; about 3 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session7c}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
(CUDA_VISIBLE_DEVICES=0 python3 benchmarks/sweep_attention_fwd.py --budget 90 > "$OUT/sweep_attention_fwd.log" 2>&1
 CUDA_VISIBLE_DEVICES=0 OUT="$OUT/bench0" bash benchmarks/gpu_bench_tasks.sh \
   "rmsnorm_bwd rmsnorm_bwd eager,compile,liger 70" "layernorm_bwd layernorm_bwd eager,compile,liger 70" \
   > "$OUT/gpu0.log" 2>&1) &
(CUDA_VISIBLE_DEVICES=1 python3 benchmarks/sweep_fwd_rows.py --budget 80 --out "$OUT" > "$OUT/sweep_fwd_rows.log" 2>&1
 CUDA_VISIBLE_DEVICES=1 OUT="$OUT/bench1" bash benchmarks/gpu_bench_tasks.sh \
   "swiglu_fwd swiglu eager,compile,liger 70" > "$OUT/gpu1.log" 2>&1) &
wait
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" 2>/dev/null
tail -30 "$OUT/sweep_attention_fwd.log"; tail -45 "$OUT/sweep_fwd_rows.log"; cat "$OUT/gpu0.log" "$OUT/gpu1.log"
