#!/usr/bin/env bash
# Session 7's fourth call (two H200s): `crucible bench` on the attention forwards with the new causal default
# (persistent over pairs of query blocks): GPU 0 causal, GPU 1 non-causal (unchanged, for the same-day reading).
#   bash benchmarks/gpu_session7d.sh      (repo root, .whl carried; about 2 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session7d}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
CUDA_VISIBLE_DEVICES=0 OUT="$OUT/bench0" bash benchmarks/gpu_bench_tasks.sh \
  "attention_fwd_causal attention eager 100" > "$OUT/gpu0.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 OUT="$OUT/bench1" bash benchmarks/gpu_bench_tasks.sh \
  "attention_fwd attention eager 100" > "$OUT/gpu1.log" 2>&1 &
wait
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" 2>/dev/null
cat "$OUT/gpu0.log" "$OUT/gpu1.log"
