#!/usr/bin/env bash
# Session 8: how often the harness accepts the Gluon attention forward (ModelNew on sm_90): `crucible check
# --no-timing` N times on each forward task, every check with fresh hidden seeds over all five distributions and
# the robustness shapes (run AV rejected the ping-pong 3-stage candidate on one element of one outliers draw).
#   N=5 bash benchmarks/gpu_session8f.sh      (repo root, .whl carried; about 15 s a check)
set -uo pipefail
OUT=${OUT:-runs/gpu-session8f}; mkdir -p "$OUT"; export OUT
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
for task in attention_fwd attention_fwd_causal; do
  for i in $(seq 1 "${N:-5}"); do
    timeout 90 python3 -m agent.cli check "tasks/$task.py" seeds/attention.py --device cuda --no-timing --json \
      > "$OUT/check_${task}_$i.json" 2> "$OUT/check_${task}_$i.err"
    echo "$task $i rc=$? $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r.get('verdict'), r.get('stage'), r.get('reason'), (r.get('message') or '')[:240])" "$OUT/check_${task}_$i.json" 2>&1 | tr '\n' ' ')"
  done
done | tee "$OUT/checks.log"
