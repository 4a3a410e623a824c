#!/usr/bin/env bash
# Session 3's last H200 call (after run N): the fixes checked where run N failed them. attention fwd+bwd (contiguous
# gradients) and linear + CE (dx summed in fp32) through `crucible check` without timing; AdamW (pinned table
# copy) and cross-entropy (why the baselines gave no time: the warnings) through `crucible bench`.
#   bash benchmarks/gpu_confirm3b.sh        (repo root, GPU machine, .whl carried)
set -uo pipefail
OUT=${OUT:-runs/gpu-confirm3b}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
for spec in "attention_fwd_bwd attention_bwd 40" "linear_cross_entropy linear_cross_entropy 50"; do
  set -- $spec
  echo "=== $(date +%T) crucible check tasks/$1.py seeds/$2.py --no-timing"
  timeout "$3" python3 -m agent.cli check "tasks/$1.py" "seeds/$2.py" --no-timing --json > "$OUT/check_$1.json" 2>&1
  echo "rc=$?"; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d.get('verdict'), d.get('stage'), \
d.get('reason'), (d.get('message') or '')[:300], d.get('seconds'))" "$OUT/check_$1.json" 2>/dev/null || tail -3 "$OUT/check_$1.json"
done
bash benchmarks/gpu_bench_tasks.sh "adamw adamw eager,compile 40" "cross_entropy cross_entropy eager,compile,liger 65"
