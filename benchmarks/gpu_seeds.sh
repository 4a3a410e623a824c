#!/usr/bin/env bash
# One H200 call for the issue-5 seeds still short of their targets: cross-entropy, linear + cross-entropy, AdamW.
# Each script checks every variant against float64 before timing it and prints its table last.
#   bash benchmarks/gpu_seeds.sh        (repo root, GPU machine, .whl carried: liger-kernel and friends)
set -uo pipefail
OUT=${OUT:-runs/gpu-seeds}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
for s in ce lce adamw; do
  echo; echo "=== $(date +%T) bench_$s"
  timeout 150 python3 benchmarks/bench_$s.py > "$OUT/bench_$s.log" 2>&1; echo "rc=$?"
  tail -${TAIL:-32} "$OUT/bench_$s.log"
done
