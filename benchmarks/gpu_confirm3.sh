#!/usr/bin/env bash
# Session 3's closing H200 call: the GPU cheat tests (burst mode, private baseline inputs), then `crucible bench`
# (sustained timing where compute-bound) on the seeds whose defaults changed this session. Reports in $OUT.
#   bash benchmarks/gpu_confirm3.sh        (repo root, GPU machine, .whl carried)
set -uo pipefail
OUT=${OUT:-runs/gpu-confirm3}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
echo "=== $(date +%T) GPU cheat tests"
CRUCIBLE_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider --tb=short tests/test_harness_gpu.py \
  tests/test_profiler_gpu.py > "$OUT/gpu_tests.txt" 2>&1; echo "rc=$?"
grep -E "^E |passed|failed|test_.*\.py:[0-9]+:" "$OUT/gpu_tests.txt" | head -12
bash benchmarks/gpu_bench_tasks.sh "attention_fwd attention eager,compile 60" \
  "attention_fwd_causal attention eager,compile 60" "attention_fwd_bwd attention_bwd eager,compile 70" \
  "cross_entropy cross_entropy eager,compile,liger 80" "moe_grouped_gemm moe eager,compile 60" \
  "linear_cross_entropy linear_cross_entropy eager,compile,liger 110" "adamw adamw eager,compile 60" 2>&1 \
  | grep -v "^warning"
