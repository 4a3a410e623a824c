#!/usr/bin/env bash
# Session 6's second call (two H200s). GPU 0: the MoE layer sweep (bench_moe.py --layers), then `crucible bench` on
# the Mixtral-like layer with a longer step than run AA's. GPU 1: `crucible bench` on linear + cross-entropy with
# the dx_in_dweight candidate (run AA's step was too short). Logs in $OUT.
#   bash benchmarks/gpu_session6b.sh      (repo root, .whl carried; about 6 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session6b}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
(
  export CUDA_VISIBLE_DEVICES=0
  OUT="$OUT/moe" timeout 150 python3 benchmarks/bench_moe.py --layers
  OUT="$OUT/bench0" bash benchmarks/gpu_bench_tasks.sh "moe_layer_mixtral moe_layer eager,vendor 300"
) > "$OUT/gpu0.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 OUT="$OUT/bench1" SEEDS=benchmarks/candidates bash benchmarks/gpu_bench_tasks.sh \
  "linear_cross_entropy lce_dx_in_dweight eager,liger 330" > "$OUT/gpu1.log" 2>&1 &
wait
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" 2>/dev/null
cat "$OUT/gpu0.log" "$OUT/gpu1.log"
