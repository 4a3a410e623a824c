#!/usr/bin/env bash
# `crucible bench` on several tasks in one H200 call, a few lines per task (benchmarks/show_report.py), reports kept.
#   bash benchmarks/gpu_bench_tasks.sh "TASK SEED BASELINES TIMEOUT_S [MODE]" ...
#   e.g. bash benchmarks/gpu_bench_tasks.sh "attention_fwd attention eager,compile 100 auto" "rmsnorm_bwd rmsnorm_bwd eager,compile,liger 80"
# TASK is tasks/TASK.py, SEED is $SEEDS/SEED.py (SEEDS defaults to seeds/); MODE is --timing-mode (default auto).
set -uo pipefail
OUT=${OUT:-runs/gpu-bench}; mkdir -p "$OUT"; export OUT
SEEDS=${SEEDS:-seeds}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
for spec in "$@"; do
  set -- $spec
  mode=${5:-auto}
  echo; echo "=== $(date +%T) crucible bench tasks/$1.py $SEEDS/$2.py --baselines $3 --timing-mode $mode"
  timeout "$4" python3 -m agent.cli bench "tasks/$1.py" "$SEEDS/$2.py" --baselines "$3" --timing-mode "$mode" --json \
    > "$OUT/bench_$1_$mode.json" 2> "$OUT/bench_$1_$mode.err"; echo "rc=$?"
  python3 benchmarks/show_report.py "$OUT/bench_$1_$mode.json" || tail -4 "$OUT/bench_$1_$mode.err"
done
