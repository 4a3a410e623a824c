#!/usr/bin/env bash
# Session 7: `crucible bench` on both cross-entropy tasks with the smem (Gluon) form as ModelNew's sm_90 default
# (GPU 0: the task, GPU 1: label smoothing + sum). Logs in $OUT.
#   bash benchmarks/gpu_session7f.sh      (repo root, .whl carried; about 2 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session7f}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
CUDA_VISIBLE_DEVICES=0 OUT="$OUT/bench0" bash benchmarks/gpu_bench_tasks.sh \
  "cross_entropy cross_entropy eager,compile,liger 150" > "$OUT/gpu0.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 OUT="$OUT/bench1" bash benchmarks/gpu_bench_tasks.sh \
  "cross_entropy_smooth_sum cross_entropy eager,compile 150" > "$OUT/gpu1.log" 2>&1 &
wait
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" 2>/dev/null
cat "$OUT/gpu0.log" "$OUT/gpu1.log"
