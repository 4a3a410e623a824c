#!/usr/bin/env bash
# Session 3's seed sweep on the H200, one call: attention (TMA / warp specialisation, --hopper), MoE (TMA grouped
# GEMM, 8x skew, backward, both layers), cross-entropy (staged form) and AdamW (lean host path). Each script checks
# every variant against float64 truth and prints its table last; logs and JSON are packed into $OUT/seeds3.tgz.
#   bash benchmarks/gpu_seeds3.sh        (repo root, GPU machine, .whl carried for Liger)
set -uo pipefail
OUT=${OUT:-runs/gpu-seeds3}; mkdir -p "$OUT/s3"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
for spec in "attention 200 --hopper" "moe 180" "ce 70" "adamw 70"; do
  set -- $spec
  echo "=== $(date +%T) bench_$1.py ${3:-}"
  OUT="$OUT/s3" timeout "$2" python3 "benchmarks/bench_$1.py" ${3:-} > "$OUT/s3/$1.txt" 2>&1; echo "rc=$?"
done
tar -czf "$OUT/seeds3.tgz" -C "$OUT" s3 && rm -rf "$OUT/s3"
