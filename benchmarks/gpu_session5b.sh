#!/usr/bin/env bash
# Session 5's confirming call (two H200s, `nvidia-h200-x2`), after run V's sweeps changed defaults: GPU 0 the
# cross-entropy sweep (re-run: Liger had overwritten its inputs) and `crucible bench` on the attention tasks (the
# warp-specialised forward; the causal fwd+bwd that ran out of memory), GPU 1 `crucible bench` on the MoE grouped
# GEMM (4 stages, loop not flattened), AdamW and cross-entropy (the timer's output reserve and baseline isolation),
# the reserve's GPU tests and benchmarks/bench_child_overhead.py. Logs in $OUT.
#   bash benchmarks/gpu_session5b.sh      (repo root, .whl carried; about 8 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session5b}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
gpu0() {
  echo "=== $(date +%T) benchmarks/sweep_ce.py"
  timeout 125 python3 benchmarks/sweep_ce.py > "$OUT/sweep_ce.txt" 2>&1; echo "rc=$?" >> "$OUT/sweep_ce.txt"
  OUT="$OUT/bench0" bash benchmarks/gpu_bench_tasks.sh "attention_fwd attention eager,compile 100" \
    "attention_fwd_causal attention eager 90" "attention_fwd_bwd_causal attention_bwd eager 110"
}
gpu1() {
  echo "=== $(date +%T) GPU tests: timing reserve and isolation"
  CRUCIBLE_TEST_DEVICE=cuda timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_timing_reserve.py \
    tests/test_timing_isolation.py 2>&1 | tail -5
  OUT="$OUT/bench1" bash benchmarks/gpu_bench_tasks.sh "moe_grouped_gemm moe eager 150" \
    "adamw adamw eager,compile 80" "cross_entropy cross_entropy eager,compile,liger 80"
  echo "=== $(date +%T) benchmarks/bench_child_overhead.py"
  timeout 100 python3 benchmarks/bench_child_overhead.py > "$OUT/child_overhead.txt" 2>&1
  echo "rc=$?" >> "$OUT/child_overhead.txt"
}
CUDA_VISIBLE_DEVICES=0 gpu0 > "$OUT/gpu0.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 gpu1 > "$OUT/gpu1.log" 2>&1 &
wait
cat "$OUT/gpu0.log" "$OUT/gpu1.log"
tail -25 "$OUT/sweep_ce.txt"; tail -30 "$OUT/child_overhead.txt"
