#!/usr/bin/env bash
# Session 9: attention fwd+bwd through the Gluon kernels (seeds/attention_gluon_train.py), issue 6's fwd+bwd
# targets: the sweep (bf16 precise, fp16 working copies, knobs; the harness's rule on the timing draw), then
# `crucible check --no-timing` on both fwd+bwd tasks for the seed (auto: fp16 where the range allows, else bf16),
# the bf16-only control and the rowsum-delta candidate. Logs in $OUT; the tables print last.
#   bash benchmarks/gpu_session9a.sh      (repo root, one H200, .whl carried; about 9 minutes)
set -uo pipefail
OUT=${OUT:-runs/gpu-session9a}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 270 python3 benchmarks/sweep_attention_train.py --budget 230 > "$OUT/sweep.log" 2>&1
for c in seeds/attention_bwd.py benchmarks/candidates/attention_train_fp16_o.py benchmarks/candidates/attention_train_bf16.py; do
  for task in attention_fwd_bwd attention_fwd_bwd_causal; do
    n=$(basename "$c" .py)_$task
    timeout 100 python3 -m agent.cli check "tasks/$task.py" "$c" --device cuda --no-timing --json > "$OUT/check_$n.json" 2> "$OUT/check_$n.err"
    echo "$c $task rc=$? $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r.get('verdict'), r.get('stage'), r.get('reason'), (r.get('message') or '')[:300])" "$OUT/check_$n.json" 2>&1 | tr '\n' ' ')"
  done
done 2>&1 | tee "$OUT/checks.log"
grep -v "^\[" "$OUT/sweep.log" | tail -30
