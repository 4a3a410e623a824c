#!/usr/bin/env bash
# Session 5's sweep call (two H200s, `nvidia-h200-x2`): GPU 0 runs each seed family's variant sweep in turn, GPU 1
# runs the GPU tests of the timer, then `crucible bench` on the tasks whose seeds no earlier run measured that way. Logs in $OUT (tarred by the caller).
#   bash benchmarks/gpu_session5a.sh      (repo root, .whl carried; about 9 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session5a}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
sweeps() {
  for spec in "attention_fwd 170" "ce 125" "norms 100" "moe 100"; do
    set -- $spec; script=benchmarks/sweep_$1.py
    [ -f "$script" ] || { echo "=== $script missing"; continue; }
    echo "=== $(date +%T) $script"
    timeout "$2" python3 "$script" > "$OUT/sweep_$1.txt" 2>&1; echo "rc=$?" >> "$OUT/sweep_$1.txt"
  done
}
CUDA_VISIBLE_DEVICES=0 sweeps > "$OUT/gpu0.log" 2>&1 &
gpu1() {
  echo "=== $(date +%T) GPU tests: timing isolation and reserve, harness, profiler"
  CRUCIBLE_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_timing_isolation.py \
    tests/test_timing_reserve.py tests/test_harness_gpu.py tests/test_profiler_gpu.py 2>&1 | tail -25
  OUT="$OUT/bench" bash benchmarks/gpu_bench_tasks.sh \
  "geglu_bwd geglu_bwd eager,compile,liger 60" "geglu_erf_bwd geglu_bwd eager,compile,liger 60" \
  "layernorm_bwd layernorm_bwd eager,compile,liger 60" "softmax_bwd softmax_bwd eager,compile,liger 60" \
  "rmsnorm_residual_fwd rmsnorm_residual eager,compile,liger 60" \
  "attention_fwd_bwd_causal attention_bwd eager 100"
}
CUDA_VISIBLE_DEVICES=1 gpu1 > "$OUT/gpu1.log" 2>&1 &
wait
cat "$OUT/gpu1.log"
for f in "$OUT"/sweep_*.txt; do echo; echo "##### $f"; tail -45 "$f"; done
